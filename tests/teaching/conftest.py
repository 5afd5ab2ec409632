"""Every teaching test keeps the checker's progress record in its own temporary file (never
the user's cache folder) and starts with none of the verdicts an earlier test of the same
process got (nor the worked solutions it revealed), and starts and ends in English."""

from __future__ import annotations

import importlib

import pytest

from paged_tutorial.teaching.language import set_language

#: the module (the package's ``progress`` name is the function that prints the table)
progress_record = importlib.import_module("paged_tutorial.teaching.exercises.progress")


@pytest.fixture(autouse=True)
def own_progress_record(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGED_TUTORIAL_PROGRESS", str(tmp_path / "progress.json"))
    monkeypatch.setattr(progress_record, "_SEEN", {})      # this process's verdicts: the test's own
    monkeypatch.setattr(progress_record, "_REVEALED", set())   # and the solutions it revealed
    set_language("en")
    yield
    set_language("en")
