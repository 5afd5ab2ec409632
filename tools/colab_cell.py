"""The first cell of every notebook (what makes it run on Google Colab), and the README's
"open in Colab" links, both built from ONE constant: ``INSTALL_SOURCE``.

    python tools/colab_cell.py --print            # show the cell
    python tools/colab_cell.py --write            # put it first in every notebooks/*.ipynb
    python tools/colab_cell.py --check            # exit 1 if a notebook's first cell is stale
    python tools/colab_cell.py --readme           # rewrite README.md's chapter table (its links)

INSTALL_SOURCE is where the cell clones the tutorial from: the repository's clone URL.  The
repository has no public home yet: whoever publishes it (or a fork) sets INSTALL_SOURCE to its
URL here and runs ``--write --readme``.  A reader can also edit the constant at the top of the
cell itself (a fork, or a folder uploaded to the Colab machine).  When the source cannot be
cloned the cell stops with a message saying so and what to change.

The cell does nothing outside Colab, so local runs and the test suite (nbval) see no output.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

#: the repository the Colab cell clones (README, "Install" and "The chapter path")
INSTALL_SOURCE = "https://github.com/paged-tutorial/paged-tutorial.git"
#: the branch the "open in Colab" links point at
BRANCH = "main"

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CELL_TAG = "colab-install"
CHECKOUT = "/content/paged-tutorial"
README_START, README_END = "<!-- colab:start -->", "<!-- colab:end -->"

CELL_TEMPLATE = '''\
# Colab only: fetch the tutorial and install what the notebooks need (does nothing elsewhere).
# INSTALL_SOURCE: the tutorial's git repository (or your fork, or a folder you uploaded here).
INSTALL_SOURCE = "{source}"
import sys
if "google.colab" in sys.modules:
    import os, subprocess
    checkout = INSTALL_SOURCE if os.path.isdir(INSTALL_SOURCE) else "{checkout}"
    if not os.path.isdir(checkout) and subprocess.run(
            ["git", "clone", "-q", "--depth", "1", INSTALL_SOURCE, checkout]).returncode:
        raise RuntimeError(
            f"Could not clone {{INSTALL_SOURCE}} (git's message is above): it is unreachable or "
            "not a git repository. Set INSTALL_SOURCE at the top of this cell to the tutorial's "
            "repository (its clone URL, your fork, or a folder uploaded to this machine) and "
            "run the cell again.")
    sys.path.insert(0, os.path.join(checkout, "tools"))
    import colab_setup
    colab_setup.install(checkout)
'''


def cell_source(source: str = INSTALL_SOURCE) -> str:
    return CELL_TEMPLATE.format(source=source, checkout=CHECKOUT)


def colab_url(notebook_name: str, source: str = INSTALL_SOURCE, branch: str = BRANCH) -> str:
    """Colab's address for a notebook of a GitHub repository (clone URL -> owner/name)."""
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", source)
    if not match:
        raise ValueError(f"INSTALL_SOURCE {source!r} is not a GitHub clone URL: Colab opens "
                         "notebooks from GitHub (https://github.com/OWNER/NAME.git)")
    owner, name = match.groups()
    return (f"https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/"
            f"notebooks/{notebook_name}")


def make_cell(source: str = INSTALL_SOURCE) -> dict:
    text = cell_source(source)
    return {"cell_type": "code", "execution_count": None,
            "metadata": {"tags": [CELL_TAG]}, "outputs": [],
            "source": text.splitlines(keepends=True)}


def _is_install_cell(cell: dict) -> bool:
    text = "".join(cell.get("source", []))
    return CELL_TAG in cell.get("metadata", {}).get("tags", []) or \
        text.startswith("# Colab only:")


def _keys_ordered_like(cell: dict, old: dict | None) -> dict:
    """``cell`` with its keys in the order ``old`` had them (new keys after, sorted); without
    an old cell, sorted, as Jupyter writes them.  So a notebook whose install cell is already
    current is written back byte for byte."""
    order = list(old) if old is not None else []
    keys = [k for k in order if k in cell] + sorted(k for k in cell if k not in order)
    return {k: cell[k] for k in keys}


def apply_to_notebook(path: Path, source: str = INSTALL_SOURCE) -> bool:
    """Make the install cell the notebook's first cell (replacing an older one); True if the
    file changed.  Everything else in the notebook is kept as it is, and a notebook whose cell
    is already current is not rewritten (its bytes stay the same)."""
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    cells = notebook["cells"]
    new = make_cell(source)
    cells_had_install_cell = bool(cells) and _is_install_cell(cells[0])
    old = cells[0] if cells_had_install_cell else None
    if cells_had_install_cell:
        new["execution_count"] = old.get("execution_count")
        if "id" in old:                                   # nbformat 4.5 cell ids stay stable
            new["id"] = old["id"]
        new["metadata"] = {**old.get("metadata", {}), "tags": sorted(
            set(old.get("metadata", {}).get("tags", [])) | {CELL_TAG})}
        cells[0] = new
    else:
        cells.insert(0, new)
    if notebook.get("nbformat_minor", 0) >= 5 and "id" not in cells[0]:
        cells[0]["id"] = "colab-install"
    cells[0] = _keys_ordered_like(cells[0], old)
    updated = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    if updated == text:
        return False
    path.write_text(updated, encoding="utf-8")
    return True


def stale_notebooks(folder: Path = NOTEBOOKS, source: str = INSTALL_SOURCE) -> list[str]:
    """Notebooks whose first cell is not the current install cell."""
    stale = []
    for path in sorted(folder.glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        if not cells or "".join(cells[0].get("source", [])) != cell_source(source):
            stale.append(path.name)
    return stale


BADGE = "[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
README_HEADER = ["| notebook | article section it follows | what you write there | open in Colab |",
                 "|---|---|---|---|"]
_ROW = re.compile(r"^\| \[(?P<stem>[^\]]+)\]\(notebooks/[^)]+\) \| (?P<middle>.*) \| "
                  + re.escape(BADGE) + r"\([^)]*\) \|$")


def chapter_descriptions(readme_text: str) -> dict[str, str]:
    """notebook stem -> the hand-written middle cells of its row in the README's chapter table
    (article section | what you write), as they stand between the markers."""
    start, end = readme_text.find(README_START), readme_text.find(README_END)
    if start < 0 or end < 0:
        return {}
    rows = readme_text[start:end].splitlines()
    return {m["stem"]: m["middle"] for m in map(_ROW.match, rows) if m}


def readme_block(folder: Path = NOTEBOOKS, source: str = INSTALL_SOURCE,
                 descriptions: dict[str, str] | None = None) -> str:
    """The README's chapter table: one row per notebook, its Colab link built from
    ``source``.  The middle cells (article section, what you write) are the README's own
    words, kept from ``descriptions``; a notebook without a row yet gets empty cells to fill."""
    descriptions = descriptions or {}
    rows = list(README_HEADER)
    for path in sorted(folder.glob("*.ipynb")):
        middle = descriptions.get(path.stem, " | ")
        rows.append(f"| [{path.stem}](notebooks/{path.name}) | {middle} | "
                    f"{BADGE}({colab_url(path.name, source)}) |")
    return "\n".join([README_START, *rows, README_END])


def update_readme(readme: Path = ROOT / "README.md", folder: Path = NOTEBOOKS,
                  source: str = INSTALL_SOURCE) -> bool:
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(README_START) + ".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme} has no {README_START} ... {README_END} block")
    block = readme_block(folder, source, chapter_descriptions(text))
    updated = pattern.sub(lambda _: block, text)
    if updated == text:
        return False
    readme.write_text(updated, encoding="utf-8")
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--print", action="store_true", help="print the cell")
    p.add_argument("--write", action="store_true", help="update every notebook's first cell")
    p.add_argument("--check", action="store_true", help="exit 1 if a notebook is stale")
    p.add_argument("--readme", action="store_true", help="rewrite the Colab links of README.md's chapter table")
    args = p.parse_args(argv)
    if not (args.print or args.write or args.check or args.readme):
        p.error("choose --print, --write, --check and/or --readme")
    if args.print:
        print(cell_source(), end="")
    if args.write:
        for path in sorted(NOTEBOOKS.glob("*.ipynb")):
            if apply_to_notebook(path):
                print(f"updated {path.relative_to(ROOT)}")
    if args.readme and update_readme():
        print("updated README.md")
    if args.check:
        stale = stale_notebooks()
        if stale:
            print(f"stale Colab cell in: {', '.join(stale)} "
                  "(run python tools/colab_cell.py --write)")
            return 1
        print("every notebook starts with the current Colab cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
