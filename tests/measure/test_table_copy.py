"""The article's whole-table copies against changed-entries-only sync (paged_tutorial.measure.table_copy
and benchmarks/table_copy.py): the wrapper really copies the host table into the table the
attention reads, the measurement's bookkeeping adds up, and the benchmark's --dry-run runs the
same code path on a CPU in seconds.  The GPU numbers themselves are measured by the benchmark,
never here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.measure import table_copy
from paged_tutorial.backends.torch_ref import TorchBackend
from helpers.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]


def tiny_model(layers: int = 3):
    config = pt.ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                            num_hidden_layers=layers, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=8)
    return pt.random_model(config, seed=0)


def test_wrapper_copies_the_whole_host_table_before_attention():
    cache = pt.PagedKVCache(pt.CacheConfig(num_layers=2, num_kv_heads=1, head_dim=8,
                                           dtype="float32", kv_cache_bytes=8 * 2 * 16 * 8 * 4,
                                           max_slots=2, max_seq_len=64))
    cache.ensure_capacity(0, 20)
    device_table = torch.full(cache.block_table.shape, 12345, dtype=torch.int32)  # stale copy
    backend = table_copy.WholeTableCopyBackend(TorchBackend("cpu"), copy_whole_table=True)
    q = torch.randn(1, 2, 8)
    backend.decode_attention(q, cache, device_table, 0, torch.tensor([20], dtype=torch.int32),
                             torch.tensor([0], dtype=torch.int32), 0.35)
    assert backend.copies == 1
    assert np.array_equal(device_table.numpy(), cache.block_table)

    stale = torch.from_numpy(cache.block_table.copy())
    off = table_copy.WholeTableCopyBackend(TorchBackend("cpu"), copy_whole_table=False)
    cache.ensure_capacity(1, 5)                 # the host changes, the forwarding arm copies nothing
    off.decode_attention(torch.randn(1, 2, 8), cache, stale, 0,
                         torch.tensor([20], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                         0.35)
    assert off.copies == 0 and not np.array_equal(stale.numpy(), cache.block_table)
    assert "changed entries only" in off.name and "whole table" in backend.name


def test_measure_decode_counts_and_tokens():
    model = tiny_model(layers=3)
    block_bytes = pt.CacheConfig.for_model(model.config).BLOCK_BYTES
    out = table_copy.measure_decode(model, "torch", batch=2, prompt_len=14, steps=4, warmup=1,
                                    max_seq_len=64, kv_cache_bytes=40 * block_bytes)
    assert out["tokens_identical"] is True
    assert out["timed_decode_steps"] == 4
    decode_steps = 1 + 4            # warm-up, then timed (the prefill samples the first token)
    assert out["article_entries_copied"] == decode_steps * 3 * out["table_entries"]
    assert out["table_entries"] == 2 * 3 * 4 and out["table_bytes"] == 4 * out["table_entries"]
    # prefill: 1 block x 3 layers x 2 slots; decode crosses position 16 once: 3 x 2 more
    assert out["engine_entries_synced"] == 6 + 6
    assert out["article_ms_per_step"] > 0 and out["engine_ms_per_step"] > 0
    assert "engine_graphs_ms_per_step" not in out          # graphs only on the numba backend


def test_measure_decode_refuses_a_run_that_does_not_fit():
    with pytest.raises(ValueError, match="max_seq_len"):
        table_copy.run_decode(tiny_model(), TorchBackend("cpu"), batch=1, prompt_len=60, steps=8,
                              warmup=1, max_seq_len=64, kv_cache_bytes=None)


def test_time_one_copy_on_cpu():
    out = table_copy.time_one_copy(4096, "cpu", repeats=5)
    assert set(out) == {"copy_idle_ms"} and out["copy_idle_ms"] >= 0


def test_benchmark_dry_run(tmp_path):
    env = child_env()
    done = subprocess.run([sys.executable, "benchmarks/table_copy.py", "--dry-run", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    files = list(tmp_path.glob("table-copy-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["dry_run"] is True and data["tokens_identical"] is True
    assert data["model_layers"] == 16 and data["table_entries"] == 4096       # the article's table
    assert data["copies_per_decode_step"] == 16
    for key in ("date", "device", "article_ms_per_step", "engine_ms_per_step",
                "per_copy_ms_from_steps", "copy_idle_ms"):
        assert key in data


def test_dry_run_without_out_writes_nothing(monkeypatch, capsys):
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("table_copy")
    results = ROOT / "benchmarks" / "results"
    before = set(results.iterdir())
    data = bench.main(["--dry-run", "--steps", "2"])
    assert set(results.iterdir()) == before
    assert data["timed_decode_steps"] == 2
    assert json.loads(capsys.readouterr().out)["dry_run"] is True
