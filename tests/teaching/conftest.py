"""Every teaching test keeps the checker's progress record in its own temporary file (never
the user's cache folder), and starts and ends in English."""

from __future__ import annotations

import pytest

from paged_tutorial.teaching.language import set_language


@pytest.fixture(autouse=True)
def own_progress_record(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGED_TUTORIAL_PROGRESS", str(tmp_path / "progress.json"))
    set_language("en")
    yield
    set_language("en")
