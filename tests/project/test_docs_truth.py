"""What the README and the docs quote is what the code and the committed files say: the
Reference list names every page, ``--help`` and the model messages name every model and
architecture the catalog and the families serve, the clone URL is called a placeholder while it
is one, and ``docs/measured.md``'s tables name the result files they were made from."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from paged_tutorial.cli.options import build_parser
from paged_tutorial.families import FAMILIES
from paged_tutorial.loading import models
from paged_tutorial.loading.catalog import KNOWN_MODELS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def reference_section(text: str) -> str:
    return text.split("## Reference", 1)[1]


def test_the_reference_list_names_every_page_in_docs():
    listed = set(re.findall(r"\(docs/([\w-]+\.md)\)", reference_section(README)))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - listed == set(), "pages missing from the README's Reference list"


def test_help_and_the_missing_model_message_name_every_model_and_architecture():
    help_text = " ".join(build_parser("paged-tutorial").format_help().split())
    for text in (help_text, models.ACCEPTED_SOURCES):
        for model in KNOWN_MODELS:
            assert model.alias in text
        for family in FAMILIES:
            assert family.hf_architecture in text
        assert "Llama-architecture" not in text


def test_the_clone_url_is_called_a_placeholder_while_it_is_one():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import colab_cell
    finally:
        sys.path.remove(str(ROOT / "tools"))
    install = " ".join(README.split("## Install", 1)[1].split("## Test", 1)[0].split())
    assert colab_cell.INSTALL_SOURCE.removesuffix(".git") in install
    assert "placeholder" in install and "no public address" in install
    assert "placeholder" in colab_cell.__doc__ or "no public home" in colab_cell.__doc__


def test_the_readme_quotes_no_test_count_without_a_committed_run():
    """Test counts come and go with every change; the README points at the tool that records
    them rather than quoting a count that nothing regenerates."""
    test_section = README.split("## Test", 1)[1].split("## The chapter path", 1)[0]
    assert not re.search(r"\b\d+ (passed|skipped|selected|deselected)\b", test_section)


def test_measured_md_names_the_newest_result_files():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import make_tables
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    page = (ROOT / "docs" / "measured.md").read_text(encoding="utf-8")
    block = page.split(make_tables.START, 1)[1].split(make_tables.END, 1)[0]
    assert make_tables.sources_line(ROOT / "benchmarks" / "results") in block
    done = subprocess.run([sys.executable, "benchmarks/make_tables.py", "--no-plots"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == block.strip(), \
        "docs/measured.md is stale: run python benchmarks/make_tables.py --doc docs/measured.md"


def test_ci_runs_the_readmes_test_command():
    command = README.split("## Test", 1)[1].split("```bash", 1)[1].split("```", 1)[0].strip()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert command in [line.strip() for line in ci.splitlines()], \
        f".ci/run does not run the README's test command {command!r}"
