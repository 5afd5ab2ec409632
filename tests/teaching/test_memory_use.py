"""The PagedAttention paper's Fig. 2 redone on this engine's cache (paged_tutorial.teaching.memory_use):
request lengths drawn with the paper's dataset means, and how each policy's memory splits into
token states, reservation and internal fragmentation, checked against hand-counted cases."""

from __future__ import annotations

import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.teaching import memory_use as mu


def one_slot_cache(max_seq_len: int = 2048, layers: int = 2):
    config = pt.CacheConfig(num_layers=layers, num_kv_heads=1, head_dim=2, dtype="float32",
                            kv_cache_bytes=(max_seq_len // 16) * layers * 2 * 16 * 2 * 4,
                            max_slots=1, max_seq_len=max_seq_len)
    return pt.PagedKVCache(config)


def test_paper_numbers_as_cited():
    token_states = {k: v["token states"] for k, v in mu.PAPER_FIGURE_2.items()}
    assert token_states == {"Orca (Max)": 20.4, "Orca (Pow2)": 26.8, "Orca (Oracle)": 38.2,
                            "vLLM": 96.3}
    for name in ("Orca (Max)", "Orca (Pow2)", "Orca (Oracle)"):      # each bar adds up to 100
        assert sum(mu.PAPER_FIGURE_2[name].values()) == pytest.approx(100.0, abs=0.15)
    assert mu.PAPER_DATASETS["ShareGPT"] == {"input": 161.31, "output": 337.99}
    assert mu.PAPER_DATASETS["Alpaca"] == {"input": 19.31, "output": 58.45}
    assert set(mu.PAPER_NAME.values()) == set(mu.PAPER_FIGURE_2)


@pytest.mark.parametrize("dataset", sorted(mu.PAPER_DATASETS))
def test_draw_lengths_matches_the_means_and_is_deterministic(dataset):
    lengths = mu.draw_lengths(dataset, 400, seed=0)
    assert lengths.shape == (400, 2) and lengths.dtype.kind == "i"
    target = mu.PAPER_DATASETS[dataset]
    assert lengths[:, 0].mean() == pytest.approx(target["input"], rel=5e-3)
    assert lengths[:, 1].mean() == pytest.approx(target["output"], rel=5e-3)
    assert lengths.min() >= 1 and lengths.sum(axis=1).max() <= 2048
    assert np.array_equal(lengths, mu.draw_lengths(dataset, 400, seed=0))
    assert not np.array_equal(lengths, mu.draw_lengths(dataset, 400, seed=1))
    with pytest.raises(ValueError, match="unknown dataset"):
        mu.draw_lengths("OpenOrca", 3)


def test_contiguous_reservations():
    max_len = 2048
    assert mu.contiguous_reservation(mu.POLICIES[0], 10, 25, max_len) == 2048
    assert mu.contiguous_reservation(mu.POLICIES[1], 10, 25, max_len) == 10 + 32   # the paper's
    assert mu.contiguous_reservation(mu.POLICIES[1], 10, 32, max_len) == 10 + 32   # example
    assert mu.contiguous_reservation(mu.POLICIES[1], 1500, 600, max_len) == 2048   # capped
    assert mu.contiguous_reservation(mu.POLICIES[2], 10, 25, max_len) == 35
    with pytest.raises(ValueError):
        mu.contiguous_reservation(mu.POLICIES[3], 10, 25, max_len)


def test_memory_use_by_hand():
    """One request, 10 prompt tokens, 3 output tokens: the K/V of 10, 11, 12 tokens are written
    at its three samples; a 16-token block holds 16 slots each time."""
    cache = one_slot_cache(max_seq_len=64)
    use = mu.memory_use(cache, [[10, 3]])
    assert use.samples == 3
    stored = 10 + 11 + 12
    final = 13
    paged = use.slots[mu.POLICIES[3]]
    assert paged == {"token states": stored, "reservation": 3 * final - stored,
                     "internal fragmentation": 3 * (16 - final)}
    maxed = use.slots[mu.POLICIES[0]]
    assert maxed == {"token states": stored, "reservation": 3 * final - stored,
                     "internal fragmentation": 3 * (64 - final)}
    assert use.slots[mu.POLICIES[2]]["internal fragmentation"] == 0
    assert cache.num_free == cache.NUM_BLOCKS                # every request's blocks released
    percent = use.percent()
    for parts in percent.values():
        assert sum(parts.values()) == pytest.approx(100.0)
    assert percent[mu.POLICIES[3]]["token states"] == pytest.approx(100 * stored / (3 * 16))


def test_memory_use_orders_the_policies_as_the_paper_does():
    cache = one_slot_cache()
    percent = mu.memory_use(cache, mu.draw_lengths("ShareGPT", 60, seed=3)).percent()
    share = [percent[p]["token states"] for p in mu.POLICIES]
    assert share == sorted(share)                            # Max < Pow2 < Oracle < paged
    assert share[-1] > 95.0


def test_memory_use_refuses_a_request_longer_than_the_cache_allows():
    with pytest.raises(ValueError, match="max_seq_len"):
        mu.memory_use(one_slot_cache(max_seq_len=64), [[60, 10]])
