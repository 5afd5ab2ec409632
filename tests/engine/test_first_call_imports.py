"""Ctrl-C during the first call after construction: nothing on the generate, stream or chat path
imports a module for the first time once the engine is built (``engine/first_call.py``), so an
interrupt there cannot leave a module half-initialised.  Each check runs in a fresh interpreter,
where nothing is imported yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CALLS = {
    "engine.generate": "engine.generate(['Hi'], pt.SamplingParams(max_tokens=2))",
    "engine.stream": "list(engine.stream('Hi', pt.SamplingParams(max_tokens=2)))",
    "llm.chat": "llm.chat([{'role': 'user', 'content': 'Hi'}], pt.SamplingParams(max_tokens=2))",
    "llm.generate, sampled": "llm.generate('Hi', pt.SamplingParams(max_tokens=3, "
                             "temperature=0.8, top_k=5, top_p=0.9, stop=['.'], seed=1))",
}


def run_fresh(code: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("call", sorted(CALLS))
def test_the_first_call_after_construction_imports_nothing(call):
    got = run_fresh(f"""
        import json, sys
        import paged_tutorial as pt
        llm = pt.LLM("smollm2-135m", dtype="float32", max_num_seqs=2, max_model_len=128)
        engine = llm.engine
        before = set(sys.modules)
        {CALLS[call]}
        print(json.dumps(sorted(set(sys.modules) - before)))
    """)
    assert got == [], f"first imported by {call} after construction: {got[:20]}"


INTERRUPTED_FIRST_CALL = """
    import _thread, importlib, json, sys, threading, time
    import numpy as np
    import paged_tutorial as pt
    from paged_tutorial.config import ModelConfig

    tiny = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       max_position_embeddings=256, tie_word_embeddings=False)
    model = pt.random_model(tiny, dtype="float32", seed=0)
    engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=96, block_size=4)
    prompts = [[int(t) for t in np.random.default_rng(3).integers(1, 97, n)] for n in (9, 14)]
    before = set(sys.modules)
    timer = threading.Timer({delay}, _thread.interrupt_main)
    interrupted = False
    try:
        timer.start()
        first = [r.token_ids for r in engine.generate(prompts, max_tokens=12)]
        time.sleep(0.2)                  # a late interrupt lands here, still caught below
    except KeyboardInterrupt:
        interrupted = True
    timer.cancel()
    half = [name for name, module in sys.modules.items()
            if getattr(getattr(module, "__spec__", None), "_initializing", False)]
    new = sorted(set(sys.modules) - before)
    for name in new:                     # each module the call imported imports afresh
        importlib.reload(importlib.import_module(name))
    engine.scheduler.check_invariants()
    engine.cache.check_invariants()
    idle = (not engine.has_unfinished() and engine.num_requests == 0
            and sorted(engine.scheduler.free_slots) == [0, 1]
            and [engine.cache.blocks_owned(s) for s in range(2)] == [0, 0])
    again = [r.token_ids for r in engine.generate(prompts, max_tokens=12)]
    solo = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=96, block_size=4)
    want = [solo.generate([p], max_tokens=12)[0].token_ids for p in prompts]
    print(json.dumps({{"interrupted": interrupted, "half_initialised": half, "new": new,
                      "idle": idle, "again_equals_solo": again == want}}))
"""


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(delay=st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=0.4)))
def test_ctrl_c_during_the_first_call_leaves_the_interpreter_and_engine_usable(delay):
    """A KeyboardInterrupt at a random instant of the first generate after construction (or
    just after it): no module is left half-initialised, nothing was imported by the call, the
    engine is idle and consistent, and the next generate gives a solo run's tokens."""
    got = run_fresh(INTERRUPTED_FIRST_CALL.format(delay=delay))
    assert got["half_initialised"] == [] and got["new"] == [], got
    assert got["idle"] and got["again_equals_solo"], got
