"""The engine on GPUs older than the H200 (Colab's T4: compute capability 7.5, float16, no
programmatic dependent launch), proven on the H200 (marker ``gpu``).

- every kernel the engine launched, in bfloat16 and in float16, compiles for sm_75: the PTX
  names that target, holds no ``griddepcontrol`` (Hopper's overlapped launches) and, where a
  ``ptxas`` is found (Triton ships one), assembles to sm_75 machine code; the
  tensor-core attention (``NEEDS_NEWER_GPU``: ``mma.sync`` on bf16 needs sm_80), when an
  earlier test launched it, must instead fail to become sm_75 code (an error naming sm_80,
  or PTX that ptxas refuses for sm_75), and the backend never launches it there;
- the path a T4 takes (float16, every launch plain) gives the tokens of the H200's path in
  float16 (overlapped launches), and first-step logits within 1 % of the torch backend's.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

pytestmark = pytest.mark.gpu

CONFIG = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                     max_position_embeddings=512, tie_word_embeddings=False)
T4_CC = (7, 5)
#: kernels that cannot exist on a T4, left out of the sm_75 compile (why); one must fail to
#: become sm_75 code (``refused_for_sm75``)
NEEDS_NEWER_GPU = {
    "paged_attention_tc_kernel": "bf16 mma.sync needs sm_80; on a T4 the backend runs "
                                 "the fast kernel instead (attention_tc.unsupported_reason)",
}


def run(dtype: str, backend, n_new=12, n_prompts=2):
    """Greedy tokens and logits of ``n_prompts`` random prompts (one prompt: decode at batch 1,
    where the bf16 GEMV kernels run)."""
    model = pt.random_model(CONFIG, dtype=dtype, seed=5, device="cuda")
    prompts = [np.random.default_rng(s).integers(0, CONFIG.vocab_size, n).tolist()
               for s, n in ((1, 9), (2, 30))][:n_prompts]
    engine = pt.Engine(model, backend=backend, max_slots=2, max_seq_len=128)
    engine.record_logits = True
    logits = []
    out = engine.generate(prompts, max_tokens=n_new, on_step=lambda r: logits.append(r.logits))
    return [r.token_ids for r in out], logits


def ptxas() -> str | None:
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    return path if os.path.exists(path) else None


def test_the_t4_path_gives_the_h200_paths_tokens():
    from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend

    plain = NumbaBackend(options=KernelOptions(overlap=False))
    assert not plain.overlap
    tokens_t4, logits_t4 = run("float16", plain)
    tokens, _ = run("float16", NumbaBackend())
    assert tokens_t4 == tokens
    _, logits_torch = run("float16", "torch", n_new=1)
    a, b = logits_t4[0].float(), logits_torch[0].float()
    assert float((a - b).norm() / b.norm()) < 1e-2
    # the bf16 kernels too (both layer variants), for the next test
    run("bfloat16", NumbaBackend(), n_new=3, n_prompts=1)
    run("bfloat16", NumbaBackend(options=KernelOptions(fuse_norms=True)), n_new=3, n_prompts=1)
    # ... and the looping GEMVs (the one-wave launch off), both layer variants
    for fuse in (False, True):
        run("bfloat16", NumbaBackend(options=KernelOptions(fuse_norms=fuse, gemv_wave=False)),
            n_new=3, n_prompts=1)


def refused_for_sm75(py_func, argtypes, assembler, tmp_path) -> None:
    """A kernel that needs sm_80 cannot become sm_75 code: either its compilation for sm_75
    fails naming sm_80 (the intrinsic's own check, when its device functions are compiled
    afresh), or the PTX holds the bf16 ``mma.sync`` and ptxas refuses it for sm_75."""
    from numba import cuda

    try:
        ptx, _ = cuda.compile(py_func, argtypes, device=False, cc=T4_CC, output="ptx",
                              abi="numba")
    except Exception as exc:                      # noqa: BLE001 - any compile error will do
        assert "sm_80" in str(exc), exc
        return
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    if assembler:
        path = tmp_path / f"{py_func.__name__}.ptx"
        path.write_text(ptx)
        done = subprocess.run([assembler, "--gpu-name", "sm_75", str(path), "-o",
                               str(path.with_suffix(".cubin"))], capture_output=True, text=True)
        assert done.returncode != 0, f"ptxas made sm_75 code of {py_func.__name__}"


def test_every_launched_kernel_compiles_for_sm75(tmp_path):
    from numba import cuda
    from paged_tutorial.backends.numba_cuda.runtime import launch

    kernels = launch.launched_kernels()
    if len(kernels) < 8:                          # run alone: launch the engine's kernels first
        test_the_t4_path_gives_the_h200_paths_tokens()
        kernels = launch.launched_kernels()
    names = {f.__name__ for f, _ in kernels}
    assert {"qkv_rope_write_kv", "norm_qkv_rope_write_kv", "paged_attention_fast_kernel",
            "rms_norm"} <= names, names
    assembler = ptxas()
    failures = []
    for py_func, argtypes in kernels:
        if py_func.__name__ in NEEDS_NEWER_GPU:
            refused_for_sm75(py_func, argtypes, assembler, tmp_path)
            continue
        ptx, _ = cuda.compile(py_func, argtypes, device=False, cc=T4_CC, output="ptx",
                              abi="numba")
        if ".target sm_75" not in ptx or "griddepcontrol" in ptx:
            failures.append((py_func.__name__, "target or griddepcontrol"))
            continue
        if assembler:
            path = tmp_path / f"{py_func.__name__}.ptx"
            path.write_text(ptx)
            done = subprocess.run([assembler, "--gpu-name", "sm_75", str(path), "-o",
                                   str(path.with_suffix(".cubin"))], capture_output=True,
                                  text=True)
            if done.returncode:
                failures.append((py_func.__name__, done.stderr[-300:]))
    assert not failures, failures
    # and for the H200 itself the overlapped kernels do hold the instructions
    py_func, argtypes = next(k for k in kernels if k[0].__name__ == "norm_qkv_rope_write_kv")
    ptx, _ = cuda.compile(py_func, argtypes, device=False, cc=(9, 0), output="ptx",
                          abi="numba")
    assert "griddepcontrol.wait" in ptx
    print(f"{len(kernels)} kernels compiled for sm_75; ptxas: {assembler}")
