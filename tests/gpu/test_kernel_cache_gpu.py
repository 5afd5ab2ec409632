"""The kernel disk cache on a GPU (marker ``gpu``): a second process compiles nothing, gets the
same tokens, and still launches through the fast path; a model of another head_dim compiles
its own kernels instead of reusing the first one's.  Each run is a fresh process with its own
``NUMBA_CACHE_DIR`` (a temporary folder), so the user's cache is not touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
import paged_tutorial as pt
from paged_tutorial.backends.numba_cuda.runtime import launch
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import COMPILE_STATS, cache_dir

head_dim, dtype = int(sys.argv[1]), sys.argv[2]
config = pt.ModelConfig(vocab_size=512, hidden_size=4 * head_dim, intermediate_size=512,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=head_dim, rms_norm_eps=1e-5, rope_theta=10000.0,
                        max_position_embeddings=256, tie_word_embeddings=False,
                        bos_token_id=1, eos_token_ids=(2,))
model = pt.random_model(config, dtype=dtype, seed=0, device="cuda")
engine = pt.Engine(model, backend="numba", max_slots=2, max_seq_len=128)
engine.warm_up()
tokens = [r.token_ids for r in engine.generate([[5, 6, 7, 8, 9] * 4, [3, 4]],
                                               max_tokens=8, chat=False)]
print("RESULT " + json.dumps({"compiled": COMPILE_STATS.compiled, "loaded": COMPILE_STATS.loaded,
                              "load_seconds": COMPILE_STATS.load_seconds,
                              "key_seconds": COMPILE_STATS.key_seconds,
                              "first_lookup_seconds": COMPILE_STATS.first_lookup_seconds,
                              "tokens": tokens, "cache_dir": str(cache_dir()),
                              "fast_launch_errors": {str(k): v for k, v in
                                                     launch.FAST_LAUNCH_ERRORS.items()}}))
"""


def _run(cache: Path, head_dim: int = 64, dtype: str = "bfloat16") -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env.pop("PAGED_TUTORIAL_KERNEL_CACHE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(head_dim), dtype], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_second_process_compiles_nothing(tmp_path, dtype):
    first = _run(tmp_path, dtype=dtype)
    second = _run(tmp_path, dtype=dtype)
    assert first["compiled"] > 0, first
    assert second["compiled"] == 0 and second["loaded"] == first["compiled"] + first["loaded"]
    assert second["tokens"] == first["tokens"]
    assert not second["fast_launch_errors"], second["fast_launch_errors"]
    assert Path(second["cache_dir"]).parent == tmp_path / "paged_tutorial"
    # the parts of a hit are counted: keys once per kernel, the first lookup's set-up apart
    assert 0 < second["key_seconds"] < second["load_seconds"], second
    assert 0 < second["first_lookup_seconds"] <= second["load_seconds"], second


def test_a_cache_hit_loads_a_cubin(tmp_path):
    """What the cache keeps for a kernel is its linked cubin for this GPU, beside the PTX: the
    second process hands the driver the cubin, not PTX to JIT-compile."""
    _run(tmp_path, dtype="float32")
    code = r"""
import pickle, sys
from pathlib import Path
from numba import cuda
cc = cuda.get_current_device().compute_capability
found = 0
for path in Path(sys.argv[1]).rglob("*.nbc"):
    library = pickle.loads(path.read_bytes())["codelibrary"]   # the kernel's _reduce_states()
    # keyed by the compute capability, with the arch variant where there is one: (9, 0, 'a')
    assert any(tuple(key[:2]) == tuple(cc) and cubin
               for key, cubin in library._cubin_cache.items()), (path, list(library._cubin_cache))
    found += 1
print("CUBINS", found)
"""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert int(done.stdout.split("CUBINS")[-1]) > 0


def test_another_head_dim_compiles_its_own_kernels(tmp_path):
    first = _run(tmp_path, head_dim=64)
    other = _run(tmp_path, head_dim=128)
    assert other["compiled"] > 0, other          # the kernels whose closures hold HEAD_DIM
    again = _run(tmp_path, head_dim=128)
    assert again["compiled"] == 0 and again["tokens"] == other["tokens"]
    assert _run(tmp_path, head_dim=64)["compiled"] == 0 < first["compiled"]
