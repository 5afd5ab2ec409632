"""Every Numba kernel against ``TorchBackend`` on fresh random inputs.

Without a GPU this runs in Numba's CUDA simulator (shapes are kept small: each simulated thread
is a Python thread).  With a GPU visible and NUMBA_ENABLE_CUDASIM unset, the same tests run the
real kernels on the GPU.

What the inputs are built to catch: physical blocks scattered randomly through the cache (never
0, 1, 2, ...), sequence lengths that are not multiples of BLOCK_SIZE, several active slots with
non-contiguous, unordered slot ids, GQA ratios 3 and 4, q/k/v sliced out of a fused QKV
projection (strided rows), and output buffers poisoned with NaN so that an element the kernel
forgets to write shows up.

Tolerances: float32 ~1e-5 relative (the kernels sum in another order than torch); bfloat16 one
or two bf16 ulps (~1e-2 relative) against torch on the same bf16 inputs.  Elementwise bf16 ops
must also agree *bit for bit* on nearly every element, which shows that the kernels round where
torch rounds.
"""

import math

import numpy as np
import pytest
import torch
from numba import cuda   # a module global: the simulator swaps globals named ``cuda``

from paged_tutorial.backends.numba_cuda import SIMULATING, KernelOptions, NumbaBackend
from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.backends.numba_cuda.device import dtypes
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.step_inputs import prefill_layout
from paged_tutorial.config import CacheConfig
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.backends.sampling_rule import sample_reference

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.fixture(scope="module")
def nb():
    return NumbaBackend(options=KernelOptions(attention="article"))   # decode: the article's kernel


@pytest.fixture(scope="module")
def ref():
    return TorchBackend("cpu")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape, dtype=torch.float32, scale=1.0, device="cpu"):
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


@pytest.fixture
def poison(monkeypatch):
    """Make torch.empty return NaN-filled (float) or -7-filled (int) tensors while active."""
    real_empty = torch.empty

    def poisoned(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan") if t.is_floating_point() else -7)

    class Ctx:
        def __enter__(self):
            monkeypatch.setattr(torch, "empty", poisoned)

        def __exit__(self, *exc):
            monkeypatch.setattr(torch, "empty", real_empty)

    return Ctx()


def cpu(t):
    return t.detach().cpu()


def assert_close(actual, expected, dtype, *, exact_fraction=None, loose=False):
    """fp32: ~1e-5 relative.  bf16: ~1 ulp (``loose``: ~2-3 ulps, for attention whose torch
    reference itself rounds scores and probabilities to bf16)."""
    actual, expected = cpu(actual), cpu(expected)
    assert not torch.isnan(actual).any(), "an output element was not written (NaN poison)"
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        if dtype == torch.bfloat16:
            tol = 2e-2 if loose else 8e-3
        else:                                   # float16: 8x finer than bf16
            tol = 4e-3 if loose else 2e-3
        torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)
        if exact_fraction is not None:
            same = (actual.view(torch.int16) == expected.view(torch.int16)).float().mean().item()
            assert same >= exact_fraction, f"only {same:.3f} of elements bit-identical"


def fused_qkv(g, n_tokens, n_q, n_kv, head_dim, dtype, device):
    """q, k, v as strided views of one [T, (nH + 2 nKV) * D] projection output."""
    qkv = randn(g, n_tokens, (n_q + 2 * n_kv) * head_dim, dtype=dtype, device=device)
    q = qkv[:, :n_q * head_dim].view(n_tokens, n_q, head_dim)
    k = qkv[:, n_q * head_dim:(n_q + n_kv) * head_dim].view(n_tokens, n_kv, head_dim)
    v = qkv[:, (n_q + n_kv) * head_dim:].view(n_tokens, n_kv, head_dim)
    return qkv, q, k, v


# --- dtype helpers -----------------------------------------------------------------------

def test_bf16_round_trip_matches_torch(nb):
    """float32 -> bf16 bits (round to nearest even, NaN kept) and back, against torch."""
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(100).astype(np.float32) * 10,
        # exact ties: the low 16 bits are 0x8000 (round to even), and neighbours
        (np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0xBF808000, 0x7F7FFFFF, 0x00008000,
                   0x80018000], np.uint32)).view(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40], np.float32)])
    out_bits = np.zeros(len(x), np.int16)
    back = np.zeros(len(x), np.float32)

    @cuda.jit
    def convert(x, out_bits, back):
        for i in range(cuda.threadIdx.x, x.shape[0], cuda.blockDim.x):
            dtypes.store_bf16(out_bits, i, x[i])
            back[i] = dtypes.load_bf16(out_bits, i)

    if SIMULATING:
        convert[1, 32](x, out_bits, back)
    else:
        d_bits, d_back = cuda.to_device(out_bits), cuda.to_device(back)
        convert[1, 32](cuda.to_device(x), d_bits, d_back)
        out_bits, back = d_bits.copy_to_host(), d_back.copy_to_host()
    expected = torch.from_numpy(x).to(torch.bfloat16)
    ours = torch.from_numpy(out_bits).view(torch.bfloat16)
    nan = torch.isnan(expected)
    assert torch.isnan(ours[nan]).all()
    assert torch.equal(ours[~nan].view(torch.int16), expected[~nan].view(torch.int16))
    np.testing.assert_array_equal(back[~nan.numpy()], expected[~nan].float().numpy())


# --- per-token ops -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_embed(nb, ref, poison, dtype):
    g = gen(10)
    dt = DTYPES[dtype]
    weight = randn(g, 50, 96, dtype=dt, device=nb.device)
    ids = torch.randint(0, 50, (7,), generator=g, dtype=torch.int32).to(nb.device)
    with poison:
        out = nb.embed(weight, ids)
    assert torch.equal(cpu(out), ref.embed(cpu(weight), cpu(ids)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(nb, ref, poison, dtype):
    g = gen(11)
    dt = DTYPES[dtype]
    x = randn(g, 3, 200, dtype=dt, scale=3.0, device=nb.device)
    w = randn(g, 200, dtype=dt, device=nb.device)
    with poison:
        out = nb.rms_norm(x, w, 1e-5)
    assert_close(out, ref.rms_norm(cpu(x), cpu(w), 1e-5), dt, exact_fraction=0.97)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm(nb, ref, poison, dtype):
    g = gen(12)
    dt = DTYPES[dtype]
    # x is a strided view (every other row of a bigger matrix)
    x_big = randn(g, 6, 200, dtype=dt, device=nb.device)
    x = x_big[::2]
    residual = randn(g, 3, 200, dtype=dt, scale=2.0, device=nb.device)
    w = randn(g, 200, dtype=dt, device=nb.device)
    res_ref = cpu(residual).clone()
    expected = ref.add_rms_norm(cpu(x), res_ref, cpu(w), 1e-6)
    with poison:
        out = nb.add_rms_norm(x, residual, w, 1e-6)
    assert torch.equal(cpu(residual), res_ref), "residual += x must round like torch"
    assert_close(out, expected, dt, exact_fraction=0.97)


def rope_tables(max_pos, head_dim, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("dtype,head_dim", [("float32", 64), ("bfloat16", 64), ("bfloat16", 16),
                                            ("float16", 64)])
def test_rope(nb, ref, dtype, head_dim):
    g = gen(13)
    dt = DTYPES[dtype]
    n_tokens, n_q, n_kv = 5, 6, 2
    qkv, q, k, v = fused_qkv(g, n_tokens, n_q, n_kv, head_dim, dt, nb.device)
    cos, sin = rope_tables(64, head_dim)
    positions = torch.tensor([0, 3, 17, 63, 40], dtype=torch.int32)
    v_before = cpu(v).clone()
    q_ref, k_ref = cpu(q).clone(), cpu(k).clone()
    ref.rope(q_ref, k_ref, positions, cos, sin)
    nb.rope(q, k, positions.to(nb.device), cos.to(nb.device), sin.to(nb.device))
    assert_close(q, q_ref, dt, exact_fraction=0.97)
    assert_close(k, k_ref, dt, exact_fraction=0.97)
    assert torch.equal(cpu(v), v_before), "rope must not touch v"


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(nb, ref, poison, dtype):
    g = gen(14)
    dt = DTYPES[dtype]
    gate_up = randn(g, 4, 2 * 72, dtype=dt, scale=3.0, device=nb.device)
    with poison:
        out = nb.silu_mul(gate_up)
    assert_close(out, ref.silu_mul(cpu(gate_up)), dt, exact_fraction=0.97)


# --- the paged cache ---------------------------------------------------------------------

def make_cache(g, dtype, *, num_layers=2, n_kv=2, head_dim=64, max_slots=4, max_seq_len=64,
               num_blocks=48, device="cpu"):
    """A small cache whose whole buffer holds random values (so reading a wrong block gives a
    wrong answer), with an empty block table."""
    itemsize = 4 if dtype == "float32" else 2
    block_bytes = 2 * 16 * n_kv * head_dim * itemsize
    cfg = CacheConfig(num_layers=num_layers, num_kv_heads=n_kv, head_dim=head_dim, dtype=dtype,
                      kv_cache_bytes=num_blocks * block_bytes, max_slots=max_slots,
                      max_seq_len=max_seq_len)
    cache = PagedKVCache(cfg, device=device)
    cache.buffer.copy_(randn(g, cache.buffer.numel(), dtype=cache.buffer.dtype))
    return cache


def assign_blocks(g, cache, lens: dict):
    """Give slot s the blocks for lens[s] tokens in every layer, popping free_blocks at random
    positions: physical blocks end up scattered and out of order."""
    c = cache.config
    for slot, n in lens.items():
        for layer in range(c.num_layers):
            for logical in range(c.blocks_for_tokens(n)):
                pick = int(torch.randint(len(cache.free_blocks), (1,), generator=g))
                cache.block_table[slot, layer, logical] = cache.free_blocks.pop(pick)
                cache.mark_table_changed(slot, layer, logical)
    cache.check_invariants()
    owned = cache.block_table[cache.block_table >= 0]
    assert not np.array_equal(np.sort(owned), np.arange(len(owned))), "blocks not scattered"


def clone_cache(cache):
    """A CPU twin (same config, buffer and table) for the torch reference."""
    twin = PagedKVCache(cache.config)
    twin.buffer.copy_(cpu(cache.buffer))
    twin.block_table[...] = cache.block_table
    return twin


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv(nb, ref, dtype):
    g = gen(20)
    dt = DTYPES[dtype]
    cache = make_cache(g, dtype, device=nb.device)
    cache.buffer.fill_(float("nan"))         # poison: only the written rows may change
    assign_blocks(g, cache, {3: 37, 1: 21})
    twin = clone_cache(cache)
    # a prefill-like batch: slot 3 positions 0..36, slot 1 positions 5..20 (not in order)
    slots = torch.tensor([3] * 37 + [1] * 16, dtype=torch.int32)
    positions = torch.cat([torch.arange(37), torch.arange(5, 21).flip(0)]).to(torch.int32)
    _, _, k, v = fused_qkv(g, len(slots), 3, 2, 64, dt, nb.device)
    ref.write_kv(twin, cpu(k), cpu(v), twin.device_block_table(), 1, slots, positions)
    nb.write_kv(cache, k, v, cache.device_block_table(), 1, slots.to(nb.device),
                positions.to(nb.device))
    got, want = cpu(cache.buffer), twin.buffer
    bits = torch.int32 if dt == torch.float32 else torch.int16      # NaN-safe bitwise compare
    got, want = got.view(bits), want.view(bits)
    assert torch.equal(got, want)


def test_write_kv_unassigned_block_is_reported(nb):
    g = gen(21)
    cache = make_cache(g, "float32", device=nb.device)
    assign_blocks(g, cache, {0: 16})
    k = randn(g, 1, 2, 64, device=nb.device)
    if not nb.check_inputs:
        pytest.skip("host-side checks are off on the GPU")
    with pytest.raises(ValueError, match=r"logical_block=1\] is unassigned \(-1\)"):
        nb.write_kv(cache, k, k, cache.device_block_table(), 0,
                    torch.tensor([0], dtype=torch.int32), torch.tensor([16], dtype=torch.int32))
    # a wild entry (past NUM_BLOCKS) is refused before the kernel could write outside the cache
    cache.block_table[0, 0, 0] = cache.NUM_BLOCKS + 3
    with pytest.raises(ValueError, match=r"outside \[0, NUM_BLOCKS="):
        nb.write_kv(cache, k, k, cache.device_block_table(), 0,
                    torch.tensor([0], dtype=torch.int32), torch.tensor([5], dtype=torch.int32))


# --- decode attention: the article's kernel ----------------------------------------------

DECODE_CASES = [
    # dtype, head_dim, n_kv, q_per_kv, {slot: seq_len} in batch order
    pytest.param("float32", 64, 2, 4, {3: 17, 1: 23}, id="fp32-d64-gqa4"),
    pytest.param("bfloat16", 64, 2, 3, {2: 19, 0: 5, 3: 26}, id="bf16-d64-gqa3"),
    pytest.param("float32", 16, 1, 3, {1: 33, 3: 18}, id="fp32-d16-gqa3-partial-warp"),
    pytest.param("bfloat16", 80, 1, 2, {3: 20, 2: 9}, id="bf16-d80-3warps"),
    pytest.param("float16", 32, 1, 4, {0: 21, 2: 3}, id="fp16-d32-gqa4"),
]


@pytest.mark.parametrize("dtype,head_dim,n_kv,q_per_kv,lens", DECODE_CASES)
def test_decode_attention(nb, ref, dtype, head_dim, n_kv, q_per_kv, lens):
    g = gen(30 + head_dim)
    dt = DTYPES[dtype]
    layer = 1
    cache = make_cache(g, dtype, n_kv=n_kv, head_dim=head_dim, device=nb.device)
    assign_blocks(g, cache, lens)
    twin = clone_cache(cache)
    n_q = n_kv * q_per_kv
    _, q, _, _ = fused_qkv(g, len(lens), n_q, n_kv, head_dim, dt, nb.device)   # strided rows
    active = torch.tensor(list(lens), dtype=torch.int32)
    seq_lens = torch.tensor(list(lens.values()), dtype=torch.int32)
    scale = 1.0 / math.sqrt(head_dim)

    q_ref = cpu(q).clone()
    ref.decode_attention(q_ref, twin, twin.device_block_table(), layer, seq_lens, active, scale)
    # float32 oracle on the same (rounded) inputs: the kernel computes in float32 throughout
    c = cache.config
    twin32 = PagedKVCache(CacheConfig(
        num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        dtype="float32", kv_cache_bytes=c.NUM_BLOCKS * c.BLOCK_ELEMS * 4,
        max_slots=c.max_slots, max_seq_len=c.max_seq_len))
    twin32.buffer.copy_(twin.buffer.float())
    twin32.block_table[...] = twin.block_table
    q32 = cpu(q).float().clone()
    ref.decode_attention(q32, twin32, twin32.device_block_table(), layer, seq_lens, active, scale)

    out = nb.decode_attention(q, cache, cache.device_block_table(), layer,
                              seq_lens.to(nb.device), active.to(nb.device), scale)
    assert out is q, "the output is written over q"
    if dt == torch.float32:
        assert_close(q, q_ref, dt)
    else:
        assert_close(q, q32.to(dt), dt)                 # ~1 bf16 ulp of the fp32 result
        assert_close(q, q_ref, dt, loose=True)          # torch rounds scores/probs to bf16


def test_decode_attention_rejects_huge_head_dim(nb):
    cache = make_cache(gen(40), "float32", n_kv=1, head_dim=1056, num_blocks=2,
                       device=nb.device)
    q = torch.zeros(1, 1, 1056, device=nb.device)
    with pytest.raises(ValueError, match="head_dim=1056 is not supported"):
        nb.decode_attention(q, cache, cache.device_block_table(), 0,
                            torch.tensor([1], dtype=torch.int32),
                            torch.tensor([0], dtype=torch.int32), 0.1)
    assert attention.block_threads(64) == 64 and attention.block_threads(80) == 96


# --- prefill attention -------------------------------------------------------------------

PREFILL_CASES = [
    pytest.param("float32", 64, 2, 3, [0, 19, 20, 45], id="fp32-d64-gqa3"),
    pytest.param("bfloat16", 16, 1, 4, [0, 33, 50], id="bf16-d16-gqa4"),
    pytest.param("float16", 32, 2, 3, [0, 7, 30], id="fp16-d32-gqa3"),
]


@pytest.mark.parametrize("dtype,head_dim,n_kv,q_per_kv,cu", PREFILL_CASES)
def test_prefill_attention(nb, ref, poison, dtype, head_dim, n_kv, q_per_kv, cu):
    g = gen(50 + head_dim)
    dt = DTYPES[dtype]
    n_q = n_kv * q_per_kv
    _, q, k, v = fused_qkv(g, cu[-1], n_q, n_kv, head_dim, dt, nb.device)
    scale = 1.0 / math.sqrt(head_dim)
    layout, layout_dev = prefill_layout(cu), prefill_layout(cu, nb.device)
    expected = ref.prefill_attention(cpu(q), cpu(k), cpu(v), layout, scale)
    expected32 = ref.prefill_attention(cpu(q).float(), cpu(k).float(), cpu(v).float(), layout,
                                       scale)
    with poison:
        out = nb.prefill_attention(q, k, v, layout_dev, scale)
    if dt == torch.float32:
        assert_close(out, expected, dt)
    else:
        assert_close(out, expected32.to(dt), dt)
        assert_close(out, expected, dt, loose=True)


# --- sampling ----------------------------------------------------------------------------

def boundary_ok(logits, t, top_p, u, got, want):
    """Accept a different pick only when the reference itself sits on a rounding boundary:
    u * total within 1e-5 of a CDF step, or a top-p cut within 1e-5 of top_p."""
    p = torch.softmax(logits.double() / t, -1)
    sp, _ = torch.sort(p, descending=True)
    before = torch.cumsum(sp, 0) - sp
    if ((before - top_p).abs() < 1e-5).any():
        return True
    n_keep = int((before < top_p).sum())
    kept = torch.where(p >= sp[max(n_keep - 1, 0)], p, torch.zeros_like(p))
    cdf = torch.cumsum(kept, 0)
    target = u * cdf[-1]
    return bool(((cdf - target).abs() < 1e-5).any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample(nb, dtype):
    """Greedy and top-p rows in one launch, the logits read in their own dtype."""
    g = gen(60)
    n_rows, vocab = 8, 300
    logits = randn(g, n_rows, vocab, scale=3.0)
    logits[1, 10] = logits[1, 200] = logits[1].max() + 1.0      # greedy tie: first index wins
    logits = logits.to(dtype)
    stored, logits = logits, logits.float()       # the reference sees the stored values
    temperature = torch.tensor([0.0, 0.0, 0.7, 1.0, 1.3, 0.5, 0.9, 2.0])
    top_p = torch.tensor([1.0, 0.9, 0.9, 1.0, 0.5, 0.95, 0.3, 0.99])
    uniforms = torch.rand(n_rows, generator=g)
    uniforms[3] = 0.0
    want = sample_reference(logits, temperature, top_p, uniforms)
    got = cpu(nb.sample(stored.to(nb.device), temperature.to(nb.device), top_p.to(nb.device),
                        uniforms.to(nb.device)))
    assert got.dtype == torch.int64
    assert got[1] == 10
    for b in range(n_rows):
        if got[b] != want[b]:
            assert temperature[b] > 0 and boundary_ok(logits[b], float(temperature[b]),
                                                      float(top_p[b]), float(uniforms[b]),
                                                      got[b], want[b]), \
                f"row {b}: kernel picked {int(got[b])}, reference {int(want[b])}"


# --- construction ------------------------------------------------------------------------

def test_backend_names_and_mode_errors(nb):
    assert nb.name == ("numba-sim" if SIMULATING else "numba")
    wrong = "numba" if SIMULATING else "numba-sim"
    with pytest.raises(RuntimeError, match="new process") as err:
        NumbaBackend(wrong)
    assert "NUMBA_ENABLE_CUDASIM" in str(err.value)
    with pytest.raises(RuntimeError, match="new process"):
        NumbaBackend(simulate=not SIMULATING)
    assert NumbaBackend(simulate=SIMULATING).name == nb.name
