"""What the stored notebooks promise a reader, checked on the files (no kernel started): every
exercise and puzzle of a notebook has its cell and ships unsolved (a cell that grades a named
wrong answer on purpose shows it wrong), no private names or patched backends, the article's
section named, a Korean summary per section and the glossary linked, no test machinery in the
prose, no machine paths or addresses in the outputs; the kernel chapters show the kernel from
the package's source without giving their puzzles away."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import paged_tutorial.teaching.exercises as ex

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
#: notebook -> the article's section titles (Korean) it follows
SECTIONS = {
    "00_overview.ipynb": ("KV cache 를 16토큰 블록으로 쪼개기",),
    "01_block_layout.ipynb": ("블록 하나가 담는 것: K 는 앞, V 는 V_OFFSET 뒤",),
    "02_block_table.ipynb": ("block table: slot·레이어·논리 블록 세 항목의 배열",),
    "03_address_arithmetic.ipynb": ("pagedAttentionKernel: 네 상태를 함께 받는 유일한 커널",
                                    "논리 블록 → 물리 블록 → 바이트 주소"),
    "04_warp_shuffle_reduction.ipynb": ("점수 하나: 워프 셔플 리덕션",),
    "05_online_softmax.ipynb": ("online softmax: 블록을 훑으며 가중 평균", "출력은 입력 자리에: in-place"),
    "05b_your_kernel.ipynb": ("pagedAttentionKernel: 네 상태를 함께 받는 유일한 커널",),
    "06_block_lifetime.ipynb": ("물리 블록의 수명: free_blocks 가 관리한다",),
    "07_full_model.ipynb": ("이 글의 한계",),
    "08_performance.ipynb": ("pagedAttentionKernel: 네 상태를 함께 받는 유일한 커널",),
    "09_prefix_sharing.ipynb": ("block table: slot·레이어·논리 블록 세 항목의 배열",
                                "물리 블록의 수명: free_blocks 가 관리한다"),
    "10_serving.ipynb": ("물리 블록의 수명: free_blocks 가 관리한다",),
}
#: the kernel chapters talk about threads; the others must not need to
KERNEL_CHAPTERS = ("03_address_arithmetic.ipynb", "04_warp_shuffle_reduction.ipynb",
                   "05_online_softmax.ipynb", "08_performance.ipynb", "05b_your_kernel.ipynb")
MACHINERY = ("PAGED_TUTORIAL_MODEL", "nbval", "test suite", "CI run", "sweep", "earlier run",
             "wide-g", "narrow-g")
CHECK = re.compile(r'pt\.exercises\.check\("([0-9]{2}\.\w+)",\s*(\w+)\)')


def cells(name):
    return json.loads((NOTEBOOKS / name).read_text())["cells"]


def text_of(cell) -> str:
    return "".join(cell["source"])


def outputs_of(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append("".join(o.get("text", "")))
        parts.append("".join(o.get("data", {}).get("text/plain", "")))
    return "".join(parts)


def test_every_notebook_is_covered():
    assert {p.name for p in NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")} == set(SECTIONS)


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_exercises_and_puzzles_ship_unsolved(name):
    asked = set()
    for cell in cells(name):
        if cell["cell_type"] != "code":
            continue
        for item, given in CHECK.findall(text_of(cell)):
            out = outputs_of(cell)
            assert "✔ correct" not in out, (item, out)
            own = getattr(ex.get(item), "function_name", "answer")
            if given in ("answer", own):
                assert f"✘ not solved yet [{item}]" in out, (item, out)
                asked.add(item)
            else:                                       # a wrong answer shown on purpose
                assert f"✘ not yet [{item}]" in out, (item, out)
    chapter = name.split("_")[0] + "."                   # "05." ; "05b." has none of its own
    assert asked == set(ex.names(chapter)), set(ex.names(chapter)) ^ asked


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_no_private_names_or_patched_backends(name):
    for cell in cells(name):
        if cell["cell_type"] != "code":
            continue
        source = text_of(cell)
        assert not re.search(r"(?<![\w])_[A-Za-z]\w*|\.\s*_[A-Za-z]", source), source
        assert not re.search(r"backend\.\w+\s*=", source), source


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_reader_facing_text(name):
    markdown = "\n".join(text_of(c) for c in cells(name) if c["cell_type"] == "markdown")
    for section in SECTIONS[name]:
        assert section in markdown, section
    assert "(GLOSSARY.md)" in markdown
    sections = len(re.findall(r"^## ", markdown, flags=re.M))
    assert markdown.count("요약") >= max(sections - 1, 1), (sections, markdown.count("요약"))
    machinery = MACHINERY + (() if name in KERNEL_CHAPTERS else ("threads",))
    for word in machinery:
        assert word not in markdown, word


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_outputs_hold_no_machine_paths_or_addresses(name):
    text = json.dumps([c.get("outputs", []) for c in cells(name)])
    for pattern in (r"/(home|work|tmp|usr|root)/", r"0x[0-9a-f]{8,}", r"wide-g\d", r"narrow-g\d"):
        assert not re.search(pattern, text), pattern


@pytest.mark.parametrize("name", KERNEL_CHAPTERS[:3])
def test_the_kernel_is_shown_from_its_source(name):
    sources = [text_of(c) for c in cells(name) if c["cell_type"] == "code"]
    assert any(re.search(r'kernel_source\("\d{3}-\d{3}"', s) for s in sources)
    if name.startswith("03"):
        assert any("departures()" in s for s in sources)
        out = "".join(outputs_of(c) for c in cells(name))
        assert "a race removed" in out and "any head_dim" in out


def test_puzzle_answers_are_not_shown_before_the_puzzle():
    """kernel_source shows the device functions a listing calls unless with_parts=False; for the
    parts that are puzzles of the notebook, they must stay hidden."""
    for name, part in (("03_address_arithmetic.ipynb", "walk_blocks"),
                       ("03_address_arithmetic.ipynb", "blocks_to_read"),
                       ("03_address_arithmetic.ipynb", "tokens_in_block"),
                       ("03_address_arithmetic.ipynb", "k_index"),
                       ("04_warp_shuffle_reduction.ipynb", "token_score"),
                       ("04_warp_shuffle_reduction.ipynb", "combine_warps"),
                       ("05_online_softmax.ipynb", "softmax_update"),
                       ("05_online_softmax.ipynb", "write_output")):
        out = "".join(outputs_of(c) for c in cells(name))
        assert f"def {part}(" not in out, name


def test_glossary_maps_the_articles_terms():
    glossary = (NOTEBOOKS / "GLOSSARY.md").read_text()
    for korean, english in (("논리 블록", "logical block"), ("물리 블록", "physical block"),
                            ("보정 인자", "correction factor"), ("워프 셔플", "warp shuffle"),
                            ("반납", "release"), ("할당", "allocation"), ("슬롯", "slot")):
        line = next((ln for ln in glossary.splitlines() if ln.startswith(f"| {korean}")), "")
        assert english in line, (korean, english)


def test_kernel_source_captions_quote_the_articles_section_titles():
    """The captions above the kernel's source name the article's sections exactly as the
    notebooks quote them (a title is cited, never translated or reworded)."""
    from paged_tutorial.teaching.chapters.ch03_address_arithmetic.kernel_source import (
        ARTICLE_SECTIONS)

    quoted = {title for titles in SECTIONS.values() for title in titles}
    for first, last, title in ARTICLE_SECTIONS:
        assert title in quoted, f"kernels.cu:{first}-{last} is captioned {title!r}, not a title " \
                                "the notebooks quote from the article"
