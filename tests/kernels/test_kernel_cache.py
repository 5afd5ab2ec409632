"""The kernel disk cache (``runtime/kernel_cache.py``) without a GPU: where it lives, what its
key holds, and that every kernel goes through it.  The key is computed in child processes that
import numba-cuda for the GPU (``NUMBA_ENABLE_CUDASIM=0``: decorating a kernel needs no GPU,
only compiling one does), with different hash seeds, so a key that changed from process to
process (a cache that never hits) would show.  The GPU check that a second process compiles
nothing is in tests/gpu/test_kernel_cache_gpu.py."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paged_tutorial.backends.numba_cuda.runtime import kernel_cache

KERNELS_DIR = Path(kernel_cache.SOURCE_ROOT) / "kernels"

# Each entry: a name -> an expression building one kernel (a factory's first kernel when it
# returns several).  Pairs differ in one closure constant only.
KEY_SCRIPT = r"""
import hashlib, json, pickle, sys
from paged_tutorial.backends.numba_cuda.kernels import (attention, attention_fast, elementwise,
                                                        gemv, norms, prefill, rope)

class Codegen:                      # stands for the GPU's code generator (compute capability)
    def magic_tuple(self):
        return ("sm_90",)

def fast(head_dim):
    return attention_fast.make_fast_decode_kernel("bfloat16", head_dim, 3, 16, 30, 64,
                                                  192, 16 * 192, 16 * 192 // 2)

def article(head_dim):
    return attention.make_paged_attention_kernel("float32", head_dim, 16, 2, 8, 64, 1024, 512)

built = {
    "fast_decode_64": fast(64), "fast_decode_128": fast(128),
    "article_64": article(64), "article_128": article(128),
    "prefill_64": prefill.make_prefill_kernel("float32", 64, 16),
    "prefill_128": prefill.make_prefill_kernel("float32", 128, 16),
    "rms_norm_bf16": norms.rms_norm_kernels("bfloat16")[0],
    "rms_norm_f32": norms.rms_norm_kernels("float32")[0],
    "rms_norm_vec_1": norms.rms_norm_vec_kernels(1)[0],
    "rms_norm_vec_2": norms.rms_norm_vec_kernels(2)[0],
    "gemv_576": gemv.gemv_kernel(2, 576), "gemv_1536": gemv.gemv_kernel(2, 1536),
    "silu_mul_bf16": elementwise.silu_mul_kernel("bfloat16"),
    "silu_mul_f16": elementwise.silu_mul_kernel("float16"),
    "rope_bf16": rope.rope_kernel("bfloat16"), "rope_f32": rope.rope_kernel("float32"),
}
keys = {}
for name, kernel in built.items():
    cache = kernel._cache
    assert type(cache).__name__ == "PackageKernelCache", (name, type(cache))
    key = cache._index_key((), Codegen())
    keys[name] = [hashlib.sha256(pickle.dumps(key)).hexdigest(), cache.cache_path,
                  cache._impl.filename_base]
print(json.dumps(keys))
"""


def _keys(seed: int, cache_root: Path) -> dict:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONHASHSEED": str(seed),
           "NUMBA_CACHE_DIR": str(cache_root)}
    done = subprocess.run([sys.executable, "-c", KEY_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def keys_of_two_processes(tmp_path_factory):
    root = tmp_path_factory.mktemp("numba-cache")
    return _keys(1, root), _keys(2, root), root


def test_a_kernels_key_is_the_same_in_every_process(keys_of_two_processes):
    first, second, _ = keys_of_two_processes
    assert first == second


def test_factory_constants_are_part_of_the_key(keys_of_two_processes):
    first, _, _ = keys_of_two_processes
    pairs = [("fast_decode_64", "fast_decode_128"), ("article_64", "article_128"),
             ("prefill_64", "prefill_128"), ("rms_norm_bf16", "rms_norm_f32"),
             ("rms_norm_vec_1", "rms_norm_vec_2"), ("gemv_576", "gemv_1536"),
             ("silu_mul_bf16", "silu_mul_f16"), ("rope_bf16", "rope_f32")]
    for a, b in pairs:
        # the same kernel source (so the same index file) but never the same entry
        assert first[a][2] == first[b][2], (a, b)
        assert first[a][0] != first[b][0], f"{a} and {b} would share a cache entry"


def test_the_cache_lives_in_the_users_cache_folder(keys_of_two_processes):
    first, _, root = keys_of_two_processes
    expected = root / "paged_tutorial" / f"kernels-{kernel_cache.source_digest()[:16]}"
    assert {Path(path) for _, path, _ in first.values()} == {expected}
    assert expected.is_dir()


def test_cache_root_respects_numba_and_xdg_settings(tmp_path):
    home = Path.home()
    assert kernel_cache.cache_root({}) == home / ".cache" / "paged_tutorial" / "numba"
    assert kernel_cache.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == \
        tmp_path / "paged_tutorial" / "numba"
    assert kernel_cache.cache_root({"NUMBA_CACHE_DIR": str(tmp_path / "n"),
                                    "XDG_CACHE_HOME": "/elsewhere"}) == \
        tmp_path / "n" / "paged_tutorial"
    site = Path(kernel_cache.__file__).resolve().parents[4]
    assert site not in kernel_cache.cache_root({}).parents


def test_any_backend_source_change_starts_a_fresh_cache(tmp_path):
    for name in ("kernels/a.py", "device/b.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("X = 1\n")
    before = kernel_cache.source_digest.__wrapped__(tmp_path)
    (tmp_path / "device/b.py").write_text("X = 2\n")          # a device function's file
    assert kernel_cache.source_digest.__wrapped__(tmp_path) != before


def test_module_constants_a_kernel_reads_are_listed():
    LIMIT = 7                                                # noqa: F841 (a local, not read)

    def body(out):
        out[0] = SCALE_FOR_TEST + len(NAMES_FOR_TEST)

    globals().update(SCALE_FOR_TEST=3, NAMES_FOR_TEST=("a", "b"))
    try:
        assert kernel_cache.global_constants(body) == (("NAMES_FOR_TEST", ("a", "b")),
                                                       ("SCALE_FOR_TEST", 3))
    finally:
        del globals()["SCALE_FOR_TEST"], globals()["NAMES_FOR_TEST"]


def test_a_helper_the_kernel_calls_is_part_of_the_key():
    """A learner's part calling a helper from her notebook: editing the helper must not find
    the kernel compiled from the old one."""
    def make(helper_body: str):
        namespace = {"__name__": "notebook"}
        exec(f"def helper(x):\n    return {helper_body}\n"
             "def body(out):\n    out[0] = helper(1)\n", namespace)
        return namespace["body"]

    assert kernel_cache.kernel_key(make("x + 1")) == kernel_cache.kernel_key(make("x + 1"))
    assert kernel_cache.kernel_key(make("x + 1")) != kernel_cache.kernel_key(make("x + 2"))


def test_values_without_a_stable_text_are_uncacheable():
    assert kernel_cache.describe((1, "a", 2.5)) == "(1, 'a', 2.5)"
    assert kernel_cache.describe(frozenset({"b", "a"})) == kernel_cache.describe({"a", "b"})
    with pytest.raises(kernel_cache.Uncacheable):
        kernel_cache.describe(object())


def test_every_kernel_is_made_through_cached_kernel():
    """A ``@cuda.jit`` kernel (not a device function) in kernels/ would compile in every
    process again."""
    offenders = []
    for path in sorted(KERNELS_DIR.glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*@cuda\.jit\b", line) and "device=True" not in line:
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert not offenders, "use @cached_kernel: " + "; ".join(offenders)


def _compile(names, loaded=0):
    """What PackageKernelCache reports for kernels loaded from the cache, then compiled."""
    for _ in range(loaded):
        kernel_cache.COMPILE_STATS.loaded += 1
        kernel_cache._kernel_ready("cached")
    for name in names:
        kernel_cache._compile_started()
        kernel_cache.COMPILE_STATS.compiled += 1
        kernel_cache._kernel_ready(name)


def test_progress_bar_only_when_something_compiles(monkeypatch, tmp_path):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_cache, "COMPILE_STATS", kernel_cache.CompileStats())
    quiet = io.StringIO()
    with kernel_cache.compile_progress(file=quiet, key="model A"):
        _compile([], loaded=3)                              # everything from the cache
    assert quiet.getvalue() == ""
    first = io.StringIO()
    with kernel_cache.compile_progress(file=first, key="model B"):
        _compile(["rms_norm", "silu_mul"], loaded=1)
    assert "compiling kernels (first run only)" in first.getvalue()
    assert kernel_cache.remembered_kernel_count("model B") == 3
    assert kernel_cache.remembered_kernel_count("model A") == 3
    again = io.StringIO()                                   # after a source change, say
    with kernel_cache.compile_progress(file=again, key="model B"):
        _compile(["rms_norm", "silu_mul", "rope"])
    text = again.getvalue()
    assert "compiling 3 kernels (first run only)" in text and "3/3" in text


def test_device_functions_are_refused():
    with pytest.raises(ValueError, match="device functions"):
        kernel_cache.cached_kernel(device=True)(lambda x: x)
