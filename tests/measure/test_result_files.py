"""``measure.result_files`` and ``measure.comparison``: where a run's JSON goes, and the relative
error every GPU check reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from paged_tutorial.measure.comparison import rel_err
from paged_tutorial.measure.result_files import result_path, write_json


def test_write_json_names_the_file_by_stem_and_date_and_makes_the_folder(tmp_path):
    data = {"date": "2026-01-02", "rows": [{"batch": 1, "ms": 0.5}]}
    folder = tmp_path / "new" / "results"
    path = write_json(data, "decode-quick", folder)
    assert path == folder / "decode-quick-2026-01-02.json"
    assert json.loads(path.read_text()) == data


def test_write_json_needs_the_runs_date(tmp_path):
    with pytest.raises(KeyError, match="date"):
        write_json({"rows": []}, "decode", tmp_path)


def test_rel_err_is_the_norm_of_the_difference_over_the_reference():
    ref = torch.tensor([3.0, 4.0], dtype=torch.bfloat16)
    assert rel_err(ref, ref) == 0.0
    assert rel_err(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.5 / 5.0)


def test_write_json_to_a_named_file_keeps_the_name(tmp_path):
    data = {"date": "2026-01-02", "text": "블록"}
    path = write_json(data, "prefix-sharing-cpu", tmp_path / "sub" / "mine.json", indent=2)
    assert path == tmp_path / "sub" / "mine.json"
    assert json.loads(path.read_text()) == data
    assert "블록" in path.read_text()                     # written as it reads, not escaped


def test_result_path_is_the_file_or_the_dated_name_in_the_folder(tmp_path):
    assert result_path("kernels", "2026-01-02", tmp_path) == tmp_path / "kernels-2026-01-02.json"
    assert result_path("kernels", "2026-01-02", "a/b.json") == Path("a/b.json")
