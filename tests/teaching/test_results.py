"""``results.newest``: the newest dated benchmark JSON, or a plain message saying what is
missing and how to make it."""

from __future__ import annotations

import json

from paged_tutorial.teaching import results


def test_newest_dated_file_wins_and_other_names_are_ignored(tmp_path):
    for name in ("decode-2026-11-30.json", "decode-2026-12-02.json",
                 "decode-2026-12-09-quick.json", "decode_extra-2026-12-10.json",
                 "racecheck-dryrun-2026-12-05.json"):
        (tmp_path / name).write_text(json.dumps({"gpu": "G", "name": name}))
    got = results.newest("decode", folder=tmp_path)
    assert got.found and got.data["name"] == "decode-2026-12-02.json"
    assert got.describe() == "benchmarks/results/decode-2026-12-02.json: measured on G, 2026-12-02"
    assert got.get("gpu") == "G" and got.get("missing", "x", default=3) == 3
    assert [d for d, _ in results.dated_files("decode", tmp_path)] == ["2026-11-30", "2026-12-02"]
    assert not results.newest("racecheck", folder=tmp_path).found   # the dry run is not it


def test_missing_results_say_so_plainly(tmp_path):
    got = results.newest("profile", how_to_make="python benchmarks/profile_step.py",
                               folder=tmp_path)
    assert not got.found and got.data is None and got.get("x") is None
    assert "profile-<date>.json is missing" in got.describe()
    assert "python benchmarks/profile_step.py" in got.describe()
    assert str(tmp_path) not in got.describe()            # no machine paths in a notebook


def test_a_dry_run_is_not_a_measurement(tmp_path):
    (tmp_path / "table-copy-2026-01-01.json").write_text(json.dumps({"dry_run": False, "x": 1}))
    (tmp_path / "table-copy-2026-02-01.json").write_text(json.dumps({"dry_run": True}))
    got = results.newest("table-copy", how_to_make="python benchmarks/table_copy.py",
                         folder=tmp_path)
    assert not got.found and "table-copy-2026-02-01.json is a --dry-run result" in got.describe()
    (tmp_path / "table-copy-2026-03-01.json").write_text(json.dumps({"dry_run": False, "x": 2}))
    got = results.newest("table-copy", folder=tmp_path)
    assert got.data == {"dry_run": False, "x": 2} and got.path.name == "table-copy-2026-03-01.json"


def test_the_repository_results_are_found():
    folder = results.results_dir()
    assert folder.name == "results" and folder.parent.name == "benchmarks"
    assert results.newest("decode").found


def test_holding_skips_newer_runs_without_that_part(tmp_path):
    """A run that skipped a part (``attention.py --skip-prefill``) does not hide an older run
    that has it; without ``holding`` the newest run wins as before."""
    (tmp_path / "attention-2026-01-01.json").write_text(json.dumps({"prefill": {"us": {}},
                                                                    "gpu": "A"}))
    (tmp_path / "attention-2026-02-01.json").write_text(json.dumps({"rows": [], "gpu": "B"}))
    assert results.newest("attention", folder=tmp_path).data["gpu"] == "B"
    older = results.newest("attention", folder=tmp_path, holding="prefill")
    assert older.data["gpu"] == "A" and "2026-01-01" in older.describe()
    none = results.newest("attention", folder=tmp_path, holding="profile")
    assert not none.found and "missing" in none.describe()
