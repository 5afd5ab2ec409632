"""``measure.attention_bench`` on the CPU: its arguments, the sweep's winner, and the float32
reference every kernel is checked against (the timing itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.measure import attention_bench as bench


def test_cases_are_batch_colon_context_pairs():
    assert bench.parse_cases("1:1024,64:2048") == [(1, 1024), (64, 2048)]
    assert bench.parse_cases(None) == bench.CASES
    with pytest.raises(ValueError, match="BATCH:CONTEXT"):
        bench.parse_cases("1-1024")


def test_the_sweep_narrows_to_named_variants_and_split_counts():
    sweep = bench.sweep_for("wide-g8u1l2,narrow-g16u2l4", "0,1,4")
    assert [name for name, _ in sweep.variants] == ["wide-g8u1l2", "narrow-g16u2l4"]
    assert sweep.splits == (None, 1, 4)                  # 0: the package's own choice
    assert bench.sweep_for() == bench.Sweep()
    with pytest.raises(ValueError, match="unknown --variants \\['wide-nope'\\]"):
        bench.sweep_for("wide-nope")


def test_the_best_variant_has_the_smallest_geometric_mean_of_its_automatic_splits():
    sweep = bench.sweep_for("wide-g8u1l1,wide-g8u1l2")
    rows = [{"batch": 1, "context": 1024, "us": {
                "fast": 10.0, "fast wide-g8u1l1 w4 sauto": 1.0, "fast wide-g8u1l2 w8 sauto": 2.0,
                "fast wide-g8u1l1 w4 s1": 0.5}},
            {"batch": 64, "context": 2048, "us": {
                "fast": 40.0, "fast wide-g8u1l1 w4 sauto": 16.0, "fast wide-g8u1l2 w8 sauto": 4.0}}]
    best = bench.best_variant(rows, sweep)        # geomeans: sqrt(1*16) = 4 vs sqrt(2*4) = 2.83
    assert best["name"] == "wide-g8u1l2 w8" and best["num_warps"] == 8
    assert best["load_passes"] == 2 and best["geomean_us"] == pytest.approx(8 ** 0.5)
    per_case = bench.best_per_case(rows)
    assert [(b["name"], b["us"]) for b in per_case] == [("fast wide-g8u1l1 w4 s1", 0.5),
                                                         ("fast wide-g8u1l2 w8 sauto", 4.0)]
    assert bench.best_variant([{"us": {"fast": 1.0}}], sweep) is None


def test_the_reference_agrees_with_the_torch_backend_through_a_scattered_block_table():
    g = torch.Generator().manual_seed(0)
    cache, n_layers, kv_bytes = bench.build_cache(2, 48, g, device="cpu")
    assert n_layers == bench.N_INNER                       # a tiny cache: every rotation slot
    assert kv_bytes == 2 * 48 * bench.N_KV * bench.D * 2 * 2
    assert sorted(cache.block_table[:, :, :].ravel()) == list(range(cache.config.NUM_BLOCKS))
    q = torch.randn(2, bench.N_Q, bench.D, generator=g).to(torch.bfloat16)
    seq_lens = torch.tensor([48, 21], dtype=torch.int32)     # one ends mid-block
    slots = torch.tensor([1, 0], dtype=torch.int32)
    for layer in (0, 3):
        ours = bench.reference(q, cache, layer, seq_lens, slots)
        want = TorchBackend().decode_attention(q.clone(), cache,
                                               cache.device_block_table(), layer, seq_lens,
                                               slots, bench.SCALE)
        assert torch.allclose(ours, want.float(), atol=2e-2, rtol=2e-2)
        assert not torch.allclose(ours[0], ours[1], atol=1e-2)      # two different rows
