"""``06.table_sync`` graded on a GPU through the numba backend (marker ``gpu``): the device table
the reader's sync fills is a CUDA tensor there, and the article's kernel reads it."""

from __future__ import annotations

import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.chapters.ch06_block_lifetime.table_sync import grade_on

pytestmark = pytest.mark.gpu


def test_the_sync_on_the_gpu():
    message = grade_on(ex.reveal("06.table_sync").code, backend="numba", device="cuda")
    assert "tokens equal to the stock engine's" in message


@pytest.mark.parametrize("what", ["copies nothing after a change",
                                  "copies only the first changed entry",
                                  "copies the whole table (the article's cost)"])
def test_wrong_syncs_on_the_gpu(what):
    from paged_tutorial.teaching.harness.base import Wrong
    from test_puzzles import WRONG

    with pytest.raises(Wrong):
        grade_on(WRONG["06.table_sync"][what], backend="numba", device="cuda")
