"""The block table: the article's flat index, -1 = unassigned, and the changed-entries sync."""

from __future__ import annotations

import numpy as np
import torch

from paged_tutorial.cache.block_table import BlockTable
from paged_tutorial.config import CacheConfig

CONFIG = CacheConfig(num_layers=3, num_kv_heads=1, head_dim=8, dtype="float32",
                     kv_cache_bytes=20 * 2 * 16 * 8 * 4, max_slots=2, max_seq_len=64)


def test_starts_unassigned_with_the_articles_shape():
    table = BlockTable(CONFIG, torch.device("cpu"))
    assert table.entries.shape == (2, 3, CONFIG.MAX_BLOCKS_PER_SEQ)
    assert table.entries.dtype == np.int32 and (table.entries == -1).all()


def test_flat_index_is_the_articles_three_terms_and_numpys_order():
    table = BlockTable(CONFIG, torch.device("cpu"))
    m = CONFIG.MAX_BLOCKS_PER_SEQ
    for slot, layer, logical in [(0, 0, 0), (0, 2, 3), (1, 0, 1), (1, 2, m - 1)]:
        index = table.flat_index(slot, layer, logical)
        assert index == slot * 3 * m + layer * m + logical
        assert index == np.ravel_multi_index((slot, layer, logical), table.entries.shape)


def test_only_changed_entries_are_synced_and_each_once():
    table = BlockTable(CONFIG, torch.device("cpu"))
    table.assign(0, 1, 2, 7)
    table.assign(1, 0, 0, 3)
    device = table.device_table()
    assert table.entries_synced == 2 and int(device[0, 1, 2]) == 7
    table.device_table()
    assert table.entries_synced == 2                      # nothing changed since
    assert table.unassign(0, 1, 2) == 7 and table.entries[0, 1, 2] == -1
    table.device_table()
    assert table.entries_synced == 3
    table.entries[1, 2, 0] = 5                            # a hand edit, marked
    table.mark_changed(1, 2, 0)
    table.device_table()
    assert table.entries_synced == 4
    table.mark_changed()                                  # everything
    table.device_table()
    assert table.entries_synced == 4 + table.entries.size


def test_counts_and_owners_come_from_the_entries():
    table = BlockTable(CONFIG, torch.device("cpu"))
    table.assign(0, 0, 0, 4)
    table.assign(1, 0, 0, 4)
    table.assign(1, 2, 1, 9)
    counts = table.reference_counts()
    assert counts.shape == (CONFIG.NUM_BLOCKS,) and counts[4] == 2 and counts[9] == 1
    assert counts.sum() == 3
    assert table.blocks_owned(1) == 2 and table.blocks_owned(1, 2) == 1
    assert table.owner_map()[9] == table.flat_index(1, 2, 1)


def test_bulk_edits_change_the_entries_they_name_and_sync_each_once():
    table = BlockTable(CONFIG, torch.device("cpu"))
    table.assign_columns(1, 2, np.array([[4, 5], [6, 7], [8, 9]]))     # [layers, columns]
    assert table.entries[1, :, 2:4].tolist() == [[4, 5], [6, 7], [8, 9]]
    table.assign_entries(0, np.array([0, 2]), np.array([1, 0]), [11, 12])
    assert table.entries[0, 0, 1] == 11 and table.entries[0, 2, 0] == 12
    assert table.num_changed == 8
    table.device_table()
    assert table.entries_synced == 8 and table.num_changed == 0
    assert table.unassign_column(1, 3).tolist() == [5, 7, 9]
    assert (table.entries[1, :, 3] == -1).all() and table.num_changed == 3
    layers, logicals, blocks = table.unassign_slot(1)
    assert (layers.tolist(), logicals.tolist(), blocks.tolist()) == ([0, 1, 2], [2, 2, 2],
                                                                     [4, 6, 8])
    assert (table.entries[1] == -1).all()
    table.device_table()
    assert table.entries_synced == 8 + 6     # (1, *, 3) changed twice, sent once
