"""``measure.prefix_sharing_workload`` and ``measure.prefix_sharing_bench`` on the CPU: the
prompts share what they should, the counting and summing helpers, and a whole (tiny) run that
writes the JSON the chapter 09 notebook and ``make_tables.py`` read."""

from __future__ import annotations

import json
import types

import pytest

from paged_tutorial.measure import prefix_sharing_bench as bench
from paged_tutorial.measure import prefix_sharing_workload as workloads


def test_random_prompts_share_exactly_the_system_prompt():
    prompts, shared = workloads.random_prompts(512, 3, system_len=20, question_len=5)
    assert shared == 20 and [len(p) for p in prompts] == [25] * 3
    assert workloads.common_prefix(prompts) >= 20
    assert workloads.common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2


def test_an_unknown_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="pick one of \\('cpu', 'gpu', 'tiny'\\)"):
        workloads.workload("fast")


def test_prefill_phases_sum_the_prefill_steps_only():
    steps = [types.SimpleNamespace(kind="prefill", phase_seconds={"schedule": 0.1, "forward": 1.0}),
             types.SimpleNamespace(kind="decode", phase_seconds={"schedule": 5.0}),
             types.SimpleNamespace(kind="prefill", phase_seconds={"forward": 0.5})]
    assert bench.prefill_phases(steps) == {"schedule": 0.1, "forward": 1.5}


def test_a_tiny_run_writes_both_engines_and_both_waves(tmp_path):
    work = workloads.workload("tiny", requests=2, max_tokens=2, system_tokens=32,
                              question_tokens=4)
    assert work.requests == 2 and work.shared == 32 and work.backend == "torch"
    data = bench.run(work, repeats=1, out=tmp_path / "tiny.json")
    assert json.loads((tmp_path / "tiny.json").read_text()) == json.loads(json.dumps(data))
    assert data["command"] == "python benchmarks/prefix_sharing.py --tiny"
    assert data["shared_prefix_tokens"] == 32 and data["prompt_tokens"] == [36, 36]
    cold, warm = data["summary"]["cold"], data["summary"]["warm"]
    assert cold["same_tokens"] and warm["same_tokens"]
    # off: every prompt token computed in both waves; on: the shared whole blocks once (cold),
    # then none of them (warm)
    assert cold["prefill_tokens_off"] == warm["prefill_tokens_off"] == 2 * 36
    assert cold["prefill_tokens_on"] == 36 + (36 - 32)
    assert warm["prefill_tokens_on"] == 2 * (36 - 32)
    assert cold["peak_blocks_used_on"] < cold["peak_blocks_used_off"]
    assert "tokens" not in data["on"]["waves"]["cold"]     # counts kept, not the tokens
    assert data["on"]["waves"]["warm"]["num_cached_tokens"] == [32, 32]
