"""``flashinfer_peer``: the page lists FlashInfer is given are our block table's rows, and a
machine without FlashInfer (or without a GPU) is told why instead of failing."""

from __future__ import annotations

import torch

from paged_tutorial.measure import flashinfer_peer


def test_page_lists_are_each_sequences_blocks_in_logical_order():
    table = torch.arange(2 * 3 * 4, dtype=torch.int32).reshape(2, 3, 4)    # [slots, layers, blocks]
    seq_lens = torch.tensor([33, 16], dtype=torch.int32)       # 3 pages (1 token in the last), 1
    slots = torch.tensor([1, 0], dtype=torch.int32)
    indptr, indices, last = flashinfer_peer.page_lists(table, 2, seq_lens, slots, block_size=16)
    assert indptr.tolist() == [0, 3, 4]
    assert indices.tolist() == table[1, 2, :3].tolist() + table[0, 2, :1].tolist()
    assert last.tolist() == [1, 16]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_without_a_gpu_or_flashinfer_it_says_why():
    ok, why = flashinfer_peer.available()
    if not torch.cuda.is_available():
        assert (ok, why) == (False, "no CUDA GPU")
    else:
        assert ok or why.startswith("import flashinfer failed")
