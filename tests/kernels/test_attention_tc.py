"""The tensor-core decode attention (``kernels/attention_tc.py``) and its instruction
(``device/mma.py``), in Numba's CUDA simulator (the real kernels when a GPU is visible; the
full-size GPU check is ``tests/gpu/test_gpu_attention_tc.py``).

- ``mma_m16n8k16_bf16``: a 16 x 16 @ 16 x 8 product put together from the PTX fragment
  layouts, against NumPy; the emulation insists, as the hardware does, that all 32 lanes of a
  warp execute the same instruction.
- the kernel against a float32 oracle and against the fast kernel: scattered physical blocks,
  sequence lengths 1, 15, 16, 17, 100 and one of 250 crossing splits, GQA groups 1 to 16,
  head_dim 64, 128 and 80 (its last k-step takes 8-byte loads), one and several warps and
  splits, with and without prefetching the next block.
- the option: ``KernelOptions(attention="tensor_core")`` runs it; a float32 cache or head_dim
  40 fall back to the fast kernel with a warning naming the problem.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from numba import cuda

from paged_tutorial.backends.numba_cuda import SIMULATING, KernelOptions, NumbaBackend
from paged_tutorial.backends.numba_cuda.device.mma import mma_m16n8k16_bf16
from paged_tutorial.backends.numba_cuda.kernels import attention_fast, attention_tc, split_kv
from paged_tutorial.backends.numba_cuda.runtime import launch
from paged_tutorial.backends.torch_ref import TorchBackend
from helpers.mma_fragments import mma_kernel
from test_fast_kernels import assign, float32_twin, gen, make_cache, rel_err


@pytest.fixture(scope="module")
def nb():
    return NumbaBackend()


# --- the instruction -------------------------------------------------------------------------

@cuda.jit
def mma_in_two_branches(a32, d):
    lane = cuda.threadIdx.x
    w = a32[lane]
    if lane < 16:
        x = mma_m16n8k16_bf16(w, w, w, w, w, w, 0.0, 0.0, 0.0, 0.0)
    else:
        x = mma_m16n8k16_bf16(w, w, w, w, w, w, 1.0, 0.0, 0.0, 0.0)
    d[lane] = x[0]


def test_mma_m16n8k16_bf16_matches_numpy():
    g = gen(3)
    a = torch.randn(16, 16, generator=g).to(torch.bfloat16)
    b = torch.randn(16, 8, generator=g).to(torch.bfloat16)
    c = torch.randn(16, 8, generator=g)
    # a word holds two bf16, the lower index in the low half (a little-endian int32 view)
    a32 = a.contiguous().view(torch.int32).reshape(-1)
    bt32 = b.t().contiguous().view(torch.int32).reshape(-1)
    d = torch.zeros(16 * 8)
    if SIMULATING:
        mma_kernel[1, 32](a32.numpy(), bt32.numpy(), c.reshape(-1).numpy(), d.numpy())
    else:                                    # pragma: no cover - GPU
        dd = d.cuda()
        mma_kernel[1, 32](a32.cuda(), bt32.cuda(), c.reshape(-1).cuda(), dd)
        d = dd.cpu()
    want = a.double().numpy() @ b.double().numpy() + c.double().numpy()
    np.testing.assert_allclose(d.view(16, 8).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not SIMULATING, reason="the simulator's checks of a warp-wide instruction")
def test_mma_emulation_needs_the_whole_warp_at_one_instruction():
    a32 = np.arange(128, dtype=np.int32) * 0x00010001
    with pytest.raises(Exception, match="all 32 lanes"):
        mma_kernel[1, 16](a32, a32, np.zeros(128, np.float32), np.zeros(128, np.float32))
    with pytest.raises(Exception, match="same warp-wide instructions"):
        mma_in_two_branches[1, 32](a32, np.zeros(32, np.float32))


# --- the kernel ------------------------------------------------------------------------------

def run_case(nb, *, head_dim, n_kv, group, lens, max_seq_len=128, num_blocks=None, seed=0,
             **launch_args):
    """(tensor-core output, float32 oracle, fast kernel's output) for one random case."""
    g = gen(seed + head_dim + group)
    need = sum(-(-n // 16) for n in lens.values()) * 2        # 2 layers
    cache = make_cache(g, "bfloat16", n_kv=n_kv, head_dim=head_dim, max_seq_len=max_seq_len,
                       num_blocks=num_blocks or need + 7, device=nb.device)
    assign(g, cache, lens)
    n_q = n_kv * group
    # q as a strided view of a fused projection, as the engine passes it
    qkv = torch.randn(len(lens), (n_q + 2 * n_kv) * head_dim, generator=g).to(torch.bfloat16)
    q = qkv[:, :n_q * head_dim].view(len(lens), n_q, head_dim)
    slots = torch.tensor(list(lens), dtype=torch.int32)
    seq_lens = torch.tensor(list(lens.values()), dtype=torch.int32)
    scale = 1.0 / math.sqrt(head_dim)
    layer = 1
    want = q.float().clone()
    twin = float32_twin(cache)
    TorchBackend("cpu").decode_attention(want, twin, twin.device_block_table(), layer,
                                         seq_lens, slots, scale)
    args = (cache, cache.device_block_table(), layer, seq_lens.to(nb.device),
            slots.to(nb.device), scale)
    fast = attention_fast.decode_attention_fast(q.to(nb.device).clone(), *args)
    q_dev = qkv.clone().to(nb.device)[:, :n_q * head_dim].view(len(lens), n_q, head_dim)
    got = attention_tc.decode_attention_tc(q_dev, *args, **launch_args)
    assert got is q_dev
    return got, want, fast


TC_CASES = [
    # head_dim, n_kv, group, {slot: seq_len}, launch arguments
    pytest.param(64, 2, 4, {0: 1, 3: 15, 1: 16, 2: 17}, {}, id="d64-gqa4-short"),
    pytest.param(64, 1, 1, {1: 100, 0: 17}, {"n_splits": 1}, id="d64-gqa1-100"),
    pytest.param(128, 1, 8, {2: 100, 0: 1}, {"n_splits": 3}, id="d128-gqa8-3splits"),
    pytest.param(64, 2, 2, {0: 250, 1: 16}, {"n_splits": 4}, id="d64-gqa2-long-4splits"),
    pytest.param(128, 1, 2, {1: 250, 3: 15}, {}, id="d128-gqa2-long-auto-splits"),
    pytest.param(64, 1, 16, {0: 33}, {"num_warps": 2, "n_splits": 2}, id="d64-gqa16-2warps"),
    pytest.param(80, 1, 3, {0: 40, 1: 17}, {"prefetch": False}, id="d80-gqa3-noprefetch"),
    pytest.param(64, 1, 8, {0: 17, 1: 100}, {"num_warps": 3, "prefetch": False,
                                             "n_splits": 1}, id="d64-gqa8-3warps-noprefetch"),
]


@pytest.mark.parametrize("head_dim,n_kv,group,lens,launch_args", TC_CASES)
def test_tensor_core_decode_attention(nb, head_dim, n_kv, group, lens, launch_args):
    max_len = 256 if max(lens.values()) > 128 else 128
    got, want, fast = run_case(nb, head_dim=head_dim, n_kv=n_kv, group=group, lens=lens,
                               max_seq_len=max_len, **launch_args)
    assert rel_err(got, want) < 5e-3                  # bf16 P and output, float32 sums
    assert rel_err(got, fast) < 5e-3
    tickets = launch.persistent_buffer(nb.device, split_kv.TICKETS, 1, torch.int32,
                                       zero=True)
    assert int(tickets.abs().sum()) == 0, "the merging blocks must leave the tickets at zero"


def test_the_option_runs_the_tensor_core_kernel(nb, monkeypatch):
    tc = NumbaBackend(options=KernelOptions(attention="tensor_core"))
    calls = []
    real = attention_tc.decode_attention_tc
    monkeypatch.setattr(attention_tc, "decode_attention_tc",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    g = gen(5)
    lens = {0: 20, 2: 3}
    cache = make_cache(g, "bfloat16", n_kv=2, head_dim=64, device=nb.device)
    assign(g, cache, lens)
    q = torch.randn(2, 8, 64, generator=g).to(torch.bfloat16).to(nb.device)
    args = (cache, cache.device_block_table(), 0,
            torch.tensor(list(lens.values())).to(nb.device), torch.tensor(list(lens)).to(nb.device),
            0.125)
    got = tc.decode_attention(q.clone(), *args)
    assert calls and tc.attention_fallback is None
    want = nb.decode_attention(q.clone(), *args)
    assert rel_err(got, want) < 5e-3


def test_auto_takes_the_tensor_core_kernel_from_its_batch_on(nb, monkeypatch):
    """The default (``attention="auto"``): the fast kernel below ``MIN_BATCH`` sequences, the
    tensor-core kernel from there on, and the fast kernel without a word where the
    tensor-core one cannot run."""
    assert nb.options.attention == "auto"
    g = gen(7)
    small = MIN = attention_tc.MIN_BATCH
    cache = make_cache(g, "bfloat16", n_kv=2, head_dim=64, device=nb.device, max_slots=MIN)
    assert nb.decode_kernel_for(cache, 8, MIN - 1) == "fast"
    assert nb.decode_kernel_for(cache, 8, MIN) == "tensor_core"
    f32 = make_cache(g, "float32", n_kv=2, head_dim=64, device=nb.device, max_slots=MIN)
    odd = make_cache(g, "bfloat16", n_kv=1, head_dim=40, device=nb.device, max_slots=MIN)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nb.decode_kernel_for(f32, 8, 4 * MIN) == "fast"
        assert nb.decode_kernel_for(odd, 2, 4 * MIN) == "fast"
    assert nb.attention_fallback is None
    calls = []
    real = attention_tc.decode_attention_tc
    monkeypatch.setattr(attention_tc, "decode_attention_tc",
                        lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    lens = {slot: 1 + slot % 3 for slot in range(small)}
    assign(g, cache, lens)
    q = torch.randn(small, 8, 64, generator=g).to(torch.bfloat16).to(nb.device)
    args = (cache, cache.device_block_table(), 0,
            torch.tensor(list(lens.values())).to(nb.device),
            torch.tensor(list(lens)).to(nb.device), 0.125)
    got = nb.decode_attention(q.clone(), *args)
    nb.decode_attention(q[:small - 1].clone(), cache, args[1], 0, args[3][:-1], args[4][:-1],
                        0.125)
    assert calls == [small]                        # the smaller batch took the fast kernel
    want = NumbaBackend(options=KernelOptions(attention="fast")).decode_attention(q.clone(),
                                                                                  *args)
    assert rel_err(got, want) < 5e-3


@pytest.mark.parametrize("dtype,head_dim,problem", [("float32", 64, "bf16"),
                                                     ("bfloat16", 40, "multiple of 16")])
def test_the_option_falls_back_to_the_fast_kernel(nb, monkeypatch, dtype, head_dim, problem):
    tc = NumbaBackend(options=KernelOptions(attention="tensor_core"))
    monkeypatch.setattr(attention_tc, "decode_attention_tc",
                        lambda *a, **k: pytest.fail("the tensor-core kernel ran"))
    g = gen(6)
    lens = {1: 21}
    cache = make_cache(g, dtype, n_kv=1, head_dim=head_dim, device=nb.device)
    assign(g, cache, lens)
    dt = torch.float32 if dtype == "float32" else torch.bfloat16
    q = torch.randn(1, 2, head_dim, generator=g).to(dt).to(nb.device)
    args = (cache, cache.device_block_table(), 1, torch.tensor([21]).to(nb.device),
            torch.tensor([1]).to(nb.device), 1 / math.sqrt(head_dim))
    with pytest.warns(RuntimeWarning, match=problem) as record:
        got = tc.decode_attention(q.clone(), *args)
    assert "attention='fast'" in str(record[0].message)
    assert problem in tc.attention_fallback
    assert torch.equal(got, nb.decode_attention(q.clone(), *args))    # the fast kernel's


def test_unsupported_layouts_are_refused_with_the_reason():
    why = attention_tc.unsupported_reason
    assert why("bfloat16", 64, 4, 16) is None
    assert "bf16" in why("float16", 64, 4, 16)
    assert "multiple of 16" in why("bfloat16", 40, 4, 16)
    assert "at most 16" in why("bfloat16", 64, 32, 16)
    assert "BLOCK_SIZE 8" in why("bfloat16", 64, 4, 8)
    with pytest.raises(ValueError, match="multiple of 16"):
        attention_tc.make_tc_decode_kernel(40, 4, 2, 8, 160, 5120, 2560)
    g = gen(8)
    cache = make_cache(g, "float32", n_kv=1, head_dim=64)
    assign(g, cache, {0: 5})
    with pytest.raises(ValueError, match="attention='fast'"):
        attention_tc.decode_attention_tc(torch.zeros(1, 2, 64), cache,
                                         cache.device_block_table(), 0, torch.tensor([5]),
                                         torch.tensor([0]), 0.125)


def test_the_default_engine_at_its_threshold_runs_it_and_keeps_the_fast_kernels_tokens(
        monkeypatch):
    """The engine as a user gets it (``NumbaBackend()``, ``attention="auto"``) with
    ``MIN_BATCH`` requests decoding together: its decode attention is the tensor-core kernel,
    and its tokens and logits are those of the same engine with ``attention="fast"`` (logits
    within 1 %)."""
    import paged_tutorial as pt
    from paged_tutorial.config import ModelConfig

    config = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=256, tie_word_embeddings=False)
    model = pt.random_model(config, dtype="bfloat16", seed=4)
    batch = attention_tc.MIN_BATCH
    prompts = [np.random.default_rng(s).integers(0, 128, 3 + s % 4).tolist()
               for s in range(batch)]

    def decode_run(backend):
        engine = pt.Engine(model, backend=backend, max_slots=batch, max_seq_len=64)
        engine.record_logits = True
        steps = []
        results = engine.generate(prompts, pt.SamplingParams(max_tokens=2, ignore_eos=True),
                                  on_step=steps.append)
        return ([r.token_ids for r in results],
                [s.logits.float() for s in steps if s.kind == "decode"])

    calls = []
    real = attention_tc.decode_attention_tc
    monkeypatch.setattr(attention_tc, "decode_attention_tc",
                        lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    tokens, logits = decode_run(NumbaBackend())
    assert calls and all(n == batch for n in calls)
    calls.clear()
    want_tokens, want_logits = decode_run(NumbaBackend(options=KernelOptions(attention="fast")))
    assert not calls
    assert tokens == want_tokens
    assert len(logits) == len(want_logits) == 1
    for a, b in zip(logits, want_logits):
        assert float((a - b).norm() / b.norm()) < 1e-2
