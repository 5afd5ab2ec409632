"""What the stored notebooks promise a reader, checked on the files (no kernel started):
exercises and puzzles ship unsolved (their stored output is the checker's "not solved yet"),
every exercise of a notebook has its cell, no private names or patched backends, the article
section named, a Korean summary per section and the glossary linked, and no test machinery in
the prose.  Covers the notebooks of round 2's part A (00, 01, 02, 06, 07)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import paged_tutorial.exercises as ex

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SECTIONS = {
    "00_overview.ipynb": "KV cache 를 16토큰 블록으로 쪼개기",
    "01_block_layout.ipynb": "블록 하나가 담는 것: K 는 앞, V 는 V_OFFSET 뒤",
    "02_block_table.ipynb": "block table: slot·레이어·논리 블록 세 항목의 배열",
    "06_block_lifetime.ipynb": "물리 블록의 수명: free_blocks 가 관리한다",
    "07_full_model.ipynb": "이 글의 한계",
}
CHECK = re.compile(r'pt\.exercises\.check\("([0-9]{2}\.\w+)"')


def cells(name):
    return json.loads((NOTEBOOKS / name).read_text())["cells"]


def text_of(cell) -> str:
    return "".join(cell["source"])


def outputs_of(cell) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_exercises_and_puzzles_ship_unsolved(name):
    checked = set()
    for cell in cells(name):
        if cell["cell_type"] != "code":
            continue
        for item in CHECK.findall(text_of(cell)):
            checked.add(item)
            out = outputs_of(cell)
            assert f"✘ not solved yet [{item}]" in out, (item, out)
            assert "✔ correct" not in out
    prefix = name[:2] + "."
    assert checked == set(ex.names(prefix)), f"no cell for {set(ex.names(prefix)) - checked}"


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_no_private_names_or_patched_backends(name):
    for cell in cells(name):
        source = text_of(cell)
        assert not re.search(r"\.\s*_[A-Za-z]", source), source
        assert not re.search(r"backend\.\w+\s*=", source), source


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_reader_facing_text(name):
    markdown = "\n".join(text_of(c) for c in cells(name) if c["cell_type"] == "markdown")
    assert SECTIONS[name] in markdown                       # the article section it follows
    assert "(GLOSSARY.md)" in markdown
    sections = len(re.findall(r"^## ", markdown, flags=re.M))
    assert markdown.count("요약") >= max(sections - 1, 1)    # a Korean summary per section
    for machinery in ("PAGED_TUTORIAL_MODEL", "nbval", "test suite", "CI run", "threads"):
        assert machinery not in markdown, machinery


def test_glossary_maps_the_articles_terms():
    glossary = (NOTEBOOKS / "GLOSSARY.md").read_text()
    for korean, english in (("논리 블록", "logical block"), ("물리 블록", "physical block"),
                            ("보정 인자", "correction factor"), ("워프 셔플", "warp shuffle"),
                            ("반납", "release"), ("할당", "allocation"), ("슬롯", "slot")):
        line = next((ln for ln in glossary.splitlines() if ln.startswith(f"| {korean}")), "")
        assert english in line, (korean, english)
