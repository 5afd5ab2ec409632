"""The optimised paths against the references, at tiny shapes (Numba's CUDA simulator on a CPU;
the real kernels when a GPU is visible).  ``benchmarks/attention.py`` and ``decode.py`` repeat
these checks at full size on the GPU before timing anything.

- ``attention_fast``: the fast decode kernel (GQA-shared K/V reads, 8-byte loads, a warp per
  logical block, split-KV merged by the last block) against a float32 oracle, with one and
  several splits, sequence lengths that end mid-block and empty splits.
- ``rope_write_kv``: the fused RoPE + cache write, bit for bit against ``rope`` + ``write_kv``;
  its 16-byte kernel bit for bit against the scalar one and the torch backend (every dtype, GQA,
  strided q/k/v, a block-table entry of -1), and the layouts it must leave to the scalar one.
- the 16-byte bf16 kernels (norms, SwiGLU, embedding): bit for bit against the scalar ones
  (``KernelOptions(vector=False)``); the GEMV against float32 products; the greedy sampler
  split over several blocks against ``sample_reference``; the launch glue.
- ``prefill_sdpa``: torch SDPA prefill against the torch backend.
- ``triton_attention``: only where Triton can run (a GPU, or TRITON_INTERPRET=1).
- ``cuda_graphs``: the bucket arithmetic (capture itself needs a GPU).
"""

import math

import numpy as np
import pytest
import torch
from numba import cuda

from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend
from paged_tutorial.backends.numba_cuda.kernels import attention_fast, split_kv
from paged_tutorial.backends.numba_cuda.kernels.prefill_sdpa import prefill_attention_sdpa
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.step_inputs import prefill_layout
from paged_tutorial.config import CacheConfig
from paged_tutorial.engine.cuda_graphs import default_buckets
from paged_tutorial.cache.paged_cache import PagedKVCache, clone_cache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.fixture(scope="module")
def nb():
    return NumbaBackend()


def gen(seed):
    return torch.Generator().manual_seed(seed)


def make_cache(g, dtype, *, n_kv, head_dim, block_size=16, num_layers=2, max_slots=4,
               max_seq_len=64, num_blocks=40, device="cpu"):
    """A cache full of random values, blocks handed out in random order."""
    itemsize = 4 if dtype == "float32" else 2
    cfg = CacheConfig(num_layers=num_layers, num_kv_heads=n_kv, head_dim=head_dim, dtype=dtype,
                      kv_cache_bytes=num_blocks * 2 * block_size * n_kv * head_dim * itemsize,
                      max_slots=max_slots, max_seq_len=max_seq_len, block_size=block_size)
    cache = PagedKVCache(cfg, device=device)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g).to(cache.buffer.dtype))
    return cache


def assign(g, cache, lens):
    c = cache.config
    for slot, n in lens.items():
        for layer in range(c.num_layers):
            for logical in range(c.blocks_for_tokens(n)):
                pick = int(torch.randint(len(cache.free_blocks), (1,), generator=g))
                cache.block_table[slot, layer, logical] = cache.free_blocks.pop(pick)
                cache.mark_table_changed(slot, layer, logical)
    cache.check_invariants()


def float32_twin(cache):
    c = cache.config
    twin = PagedKVCache(CacheConfig(
        num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        dtype="float32", kv_cache_bytes=c.NUM_BLOCKS * c.BLOCK_ELEMS * 4, max_slots=c.max_slots,
        max_seq_len=c.max_seq_len, block_size=c.BLOCK_SIZE))
    twin.buffer.copy_(cache.buffer.cpu().float())
    twin.block_table[...] = cache.block_table
    return twin


def rel_err(a, b):
    a, b = a.detach().cpu().float(), b.detach().cpu().float()
    return float((a - b).norm() / b.norm())


FAST_CASES = [
    # dtype, head_dim, n_kv, q_per_kv, block_size, {slot: seq_len}, n_splits
    pytest.param("bfloat16", 64, 2, 4, 16, {3: 21, 1: 16}, 1, id="bf16-d64-gqa4-1split"),
    pytest.param("bfloat16", 16, 1, 4, 16, {2: 40, 0: 3}, 3, id="bf16-d16-3splits-empty"),
    pytest.param("float32", 8, 2, 3, 8, {1: 21, 3: 9}, 2, id="fp32-d8-gqa3-bs8"),
    pytest.param("float16", 32, 1, 2, 16, {0: 20}, 2, id="fp16-d32-gqa2"),
]


@pytest.mark.parametrize("dtype,head_dim,n_kv,qpk,block_size,lens,n_splits", FAST_CASES)
def test_fast_decode_attention(nb, dtype, head_dim, n_kv, qpk, block_size, lens, n_splits):
    g = gen(7 + head_dim)
    dt = DTYPES[dtype]
    layer = 1
    cache = make_cache(g, dtype, n_kv=n_kv, head_dim=head_dim, block_size=block_size,
                       device=nb.device)
    assign(g, cache, lens)
    n_q = n_kv * qpk
    # q as a strided view of a fused projection, as the engine passes it
    qkv = torch.randn(len(lens), (n_q + 2 * n_kv) * head_dim, generator=g).to(dt)
    q = qkv[:, :n_q * head_dim].view(len(lens), n_q, head_dim)
    slots = torch.tensor(list(lens), dtype=torch.int32)
    seq_lens = torch.tensor(list(lens.values()), dtype=torch.int32)
    scale = 1.0 / math.sqrt(head_dim)
    want = q.float().clone()
    twin = float32_twin(cache)
    TorchBackend("cpu").decode_attention(want, twin, twin.device_block_table(), layer, seq_lens,
                                         slots, scale)
    q_dev = qkv.to(nb.device)[:, :n_q * head_dim].view(len(lens), n_q, head_dim)
    out = attention_fast.decode_attention_fast(
        q_dev, cache, cache.device_block_table(), layer, seq_lens.to(nb.device),
        slots.to(nb.device), scale, n_splits=n_splits)
    assert out is q_dev
    tol = 1e-5 if dt == torch.float32 else (5e-3 if dt == torch.bfloat16 else 1e-3)
    assert rel_err(out, want) < tol
    tickets = launch_module().persistent_buffer(nb.device, split_kv.TICKETS, 1,
                                                torch.int32, zero=True)
    assert int(tickets.abs().sum()) == 0, "the merging blocks must leave the tickets at zero"


VARIANTS = [
    pytest.param(attention_fast.KernelShape(wide=False), id="8-byte-loads"),
    pytest.param(attention_fast.KernelShape(max_lanes=16, wide=False, update_passes=1,
                                            load_passes=1), id="g16-u1-l1"),
    pytest.param(attention_fast.KernelShape(update_passes=1, load_passes=1), id="wide-u1-l1"),
    pytest.param(attention_fast.KernelShape(update_passes=0, load_passes=0), id="whole-block"),
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_fast_decode_attention_variants(nb, variant):
    """The shape knobs that benchmarks/attention.py --sweep times compute the same function."""
    g = gen(11)
    cache = make_cache(g, "bfloat16", n_kv=1, head_dim=64, device=nb.device)
    lens = {1: 20, 3: 9}
    assign(g, cache, lens)
    q = torch.randn(2, 4, 64, generator=g).to(torch.bfloat16)
    slots = torch.tensor(list(lens), dtype=torch.int32)
    seq_lens = torch.tensor(list(lens.values()), dtype=torch.int32)
    want = q.float().clone()
    twin = float32_twin(cache)
    TorchBackend("cpu").decode_attention(want, twin, twin.device_block_table(), 1, seq_lens,
                                         slots, 0.125)
    got = attention_fast.decode_attention_fast(
        q.to(nb.device), cache, cache.device_block_table(), 1, seq_lens.to(nb.device),
        slots.to(nb.device), 0.125, num_warps=1, n_splits=2, shape=variant)
    assert rel_err(got, want) < 5e-3


def test_auto_is_the_backend_default(nb):
    assert nb.options.attention == "auto"          # fast, tensor cores for large batches
    article = NumbaBackend(options=KernelOptions(attention="article"))
    assert article.options.attention == "article"
    with pytest.raises(ValueError, match="attention="):
        KernelOptions(attention="nope")
    with pytest.raises(ValueError, match="prefill="):
        KernelOptions(prefill="flash")
    with pytest.raises(TypeError, match="KernelOptions"):
        NumbaBackend(options={"attention": "article"})
    assert attention_fast.lanes_per_token(64) == 8 and attention_fast.lanes_per_token(80) == 4
    assert not attention_fast.supports(18)
    assert split_kv.choose_splits(64, 8, 128, 4) >= 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_rope_write_kv_fused_is_bit_exact(nb, dtype):
    g = gen(3)
    dt = DTYPES[dtype]
    n_kv, head_dim, n_q = 2, 16, 4
    cache = make_cache(g, dtype, n_kv=n_kv, head_dim=head_dim, device=nb.device)
    assign(g, cache, {2: 30, 0: 18})
    other = make_cache(g, dtype, n_kv=n_kv, head_dim=head_dim, device=nb.device)
    other.buffer.copy_(cache.buffer)
    other.block_table[...] = cache.block_table
    other.mark_table_changed()      # a hand edit: on a GPU the device copy must hear of it
    slots = torch.tensor([2] * 5 + [0] * 3, dtype=torch.int32).to(nb.device)
    positions = torch.tensor([25, 26, 27, 28, 29, 15, 16, 17], dtype=torch.int32).to(nb.device)
    qkv = torch.randn(8, (n_q + 2 * n_kv) * head_dim, generator=g).to(dt).to(nb.device)
    cos = torch.rand(64, head_dim // 2, generator=g).to(nb.device)
    sin = torch.rand(64, head_dim // 2, generator=g).to(nb.device)

    def views(x):
        return (x[:, :n_q * head_dim].view(8, n_q, head_dim),
                x[:, n_q * head_dim:(n_q + n_kv) * head_dim].view(8, n_kv, head_dim),
                x[:, (n_q + n_kv) * head_dim:].view(8, n_kv, head_dim))

    a, b = qkv.clone(), qkv.clone()
    qa, ka, va = views(a)
    nb.rope_write_kv(qa, ka, va, positions, cos, sin, cache, cache.device_block_table(), 1,
                     slots)
    qb, kb, vb = views(b)
    nb.rope(qb, kb, positions, cos, sin)
    nb.write_kv(other, kb, vb, other.device_block_table(), 1, slots, positions)
    bits = torch.int32 if dt == torch.float32 else torch.int16
    assert torch.equal(a.view(bits), b.view(bits))
    assert torch.equal(cache.buffer.view(bits), other.buffer.view(bits))


class KernelSpy:
    """Which of rope_write_kv's kernels (scalar, 16-byte) the backend asked for."""

    def __init__(self, monkeypatch):
        from paged_tutorial.backends.numba_cuda.kernels import rope_write_kv

        self.used = []
        for name, tag in (("rope_write_kv_kernel", "scalar"),
                          ("rope_write_kv_vec_kernel", "vector")):
            make = getattr(rope_write_kv, name)

            def spy(dtype_name, make=make, tag=tag):
                self.used.append(tag)
                return make(dtype_name)

            monkeypatch.setattr(rope_write_kv, name, spy)


def rope_write_case(g, dtype, n_tokens, *, n_q=6, n_kv=2, head_dim=32, drop=False,
                    offset=0, device="cpu"):
    """A cache and the inputs of rope_write_kv for ``n_tokens`` tokens of two
    sequences (slot 2 from position 5, slot 0 from position 20).  q, k, v are column views of
    one fused projection, ``offset`` columns into a wider matrix; ``drop``: the entry of slot
    0's logical block 1 is -1 (its tokens are not written)."""
    dt = DTYPES[dtype]
    first = (n_tokens + 1) // 2
    slots = torch.tensor([2] * first + [0] * (n_tokens - first), dtype=torch.int32)
    positions = torch.tensor(list(range(5, 5 + first)) + list(range(20, 20 + n_tokens - first)),
                             dtype=torch.int32)
    cache = make_cache(g, dtype, n_kv=n_kv, head_dim=head_dim, device=device)
    assign(g, cache, {2: 5 + first, 0: 20 + n_tokens - first})
    if drop:
        assert ((slots == 0) & (positions // 16 == 1)).any(), "some token must be dropped"
        cache.block_table[0, 1, 1] = -1
        cache.mark_table_changed(0, 1, 1)
    width = (n_q + 2 * n_kv) * head_dim
    wide = torch.randn(n_tokens, width + offset, generator=g).to(dt).to(device)
    cos = torch.rand(64, head_dim // 2, generator=g).to(device)
    sin = torch.rand(64, head_dim // 2, generator=g).to(device)
    return cache, wide, offset, slots.to(device), positions.to(device), cos, sin


def qkv_split(wide, offset, n_q, n_kv, head_dim):
    t, d = wide.shape[0], head_dim
    qkv = wide[:, offset:]
    return (qkv[:, :n_q * d].view(t, n_q, d), qkv[:, n_q * d:(n_q + n_kv) * d].view(t, n_kv, d),
            qkv[:, (n_q + n_kv) * d:].view(t, n_kv, d))


def rope_write_reference(cache, wide, offset, slots, positions, cos, sin, n_q, n_kv, head_dim,
                         ref=None):
    """``ref``'s separate rope, then its write_kv of the tokens whose block is assigned, on
    ``cache``'s device (default: the torch backend on the CPU)."""
    ref = ref or TorchBackend("cpu", check_inputs=False)
    dev = cache.device
    wide = wide.to(dev).clone()
    q, k, v = qkv_split(wide, offset, n_q, n_kv, head_dim)
    positions, slots = positions.to(dev), slots.to(dev)
    ref.rope(q, k, positions, cos.to(dev), sin.to(dev))
    table = cache.device_block_table()
    bs = cache.config.BLOCK_SIZE
    keep = table[slots.long(), 1, (positions // bs).long()] >= 0
    ref.write_kv(cache, k[keep], v[keep], table, 1, slots[keep], positions[keep])
    return wide


def bits_of(t):
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16).cpu()


ROPE_VEC_CASES = [
    pytest.param(dtype, n, id=f"{dtype}-{n}tok")
    for dtype in ("bfloat16", "float16") for n in (1, 17, 40)
]


@pytest.mark.parametrize("dtype,n_tokens", ROPE_VEC_CASES)
def test_rope_write_kv_vector_kernel_is_bit_exact(nb, monkeypatch, dtype, n_tokens):
    """The 16-byte kernel against the scalar one and the torch backend: q (in place), k (in
    place) and the whole cache bit for bit, GQA 3, q/k/v strided views of one projection, and
    from 17 tokens on a block-table entry of -1 whose tokens the cache must not receive."""
    n_q, n_kv, d = 6, 2, 32
    g = gen(20 + n_tokens)
    cache, wide, off, slots, positions, cos, sin = rope_write_case(
        g, dtype, n_tokens, n_q=n_q, n_kv=n_kv, head_dim=d, drop=n_tokens >= 17,
        device=nb.device)
    scalar_cache, ref_cache = clone_cache(cache), clone_cache(cache, device="cpu")
    spy = KernelSpy(monkeypatch)
    vec_out, scalar_out = wide.clone(), wide.clone()
    NumbaBackend(check_inputs=False).rope_write_kv(
        *qkv_split(vec_out, off, n_q, n_kv, d), positions, cos, sin, cache,
        cache.device_block_table(), 1, slots)
    NumbaBackend(check_inputs=False, options=KernelOptions(vector=False)).rope_write_kv(
        *qkv_split(scalar_out, off, n_q, n_kv, d), positions, cos, sin, scalar_cache,
        scalar_cache.device_block_table(), 1, slots)
    assert spy.used == ["vector", "scalar"]
    ref_out = rope_write_reference(ref_cache, wide, off, slots, positions, cos, sin, n_q, n_kv,
                                   d)
    assert torch.equal(bits_of(vec_out), bits_of(scalar_out))
    assert torch.equal(bits_of(cache.buffer), bits_of(scalar_cache.buffer))
    assert torch.equal(bits_of(vec_out), bits_of(ref_out))
    assert torch.equal(bits_of(cache.buffer), bits_of(ref_cache.buffer))


ROPE_SCALAR_CASES = [
    # dtype, head_dim, column offset into the projection, why the 16-byte kernel cannot run
    pytest.param("bfloat16", 32, 1, id="bf16-misaligned-views"),
    pytest.param("float32", 32, 2, id="fp32-misaligned-views"),
    pytest.param("bfloat16", 24, 0, id="bf16-d24-half-not-a-multiple-of-8"),
    pytest.param("float16", 8, 0, id="fp16-d8-half-shorter-than-a-chunk"),
    pytest.param("float32", 12, 0, id="fp32-d12-half-not-a-multiple-of-4"),
    pytest.param("float32", 32, 0, id="fp32-aligned-keeps-the-scalar-kernel"),
]


@pytest.mark.parametrize("dtype,head_dim,offset", ROPE_SCALAR_CASES)
def test_rope_write_kv_falls_back_to_the_scalar_kernel(nb, monkeypatch, dtype, head_dim,
                                                       offset):
    """Layouts the 16-byte kernel cannot take go to the scalar kernel, with the right answer:
    the torch backend's bits, except float32 on a GPU, where the compiler fuses products
    into FMAs (the torch backend's kernels otherwise than Numba's), so the reference there is
    the numba backend's own separate rope and write_kv."""
    n_q, n_kv, n_tokens = 4, 2, 17
    g = gen(40 + head_dim + offset)
    cache, wide, off, slots, positions, cos, sin = rope_write_case(
        g, dtype, n_tokens, n_q=n_q, n_kv=n_kv, head_dim=head_dim, drop=True, offset=offset,
        device=nb.device)
    on_gpu_fp32 = dtype == "float32" and nb.device.type == "cuda"
    ref_cache = clone_cache(cache, device=cache.device if on_gpu_fp32 else "cpu")
    spy = KernelSpy(monkeypatch)
    out = wide.clone()
    NumbaBackend(check_inputs=False).rope_write_kv(
        *qkv_split(out, off, n_q, n_kv, head_dim), positions, cos, sin, cache,
        cache.device_block_table(), 1, slots)
    assert spy.used == ["scalar"]
    ref_out = rope_write_reference(ref_cache, wide, off, slots, positions, cos, sin, n_q, n_kv,
                                   head_dim, ref=NumbaBackend(check_inputs=False)
                                   if on_gpu_fp32 else None)
    assert torch.equal(bits_of(out), bits_of(ref_out))
    assert torch.equal(bits_of(cache.buffer), bits_of(ref_cache.buffer))


def codec_kernel(decode, encode, e):
    """A kernel: each thread encodes e float32 of x into four words, then decodes them."""
    @cuda.jit
    def codec(x, words, back):
        c = cuda.grid(1)
        if c < x.size // e:
            buf = cuda.local.array(8, np.float32)
            for j in range(e):
                buf[j] = x[c * e + j]
            w0, w1, w2, w3 = encode(buf)
            words[4 * c] = w0
            words[4 * c + 1] = w1
            words[4 * c + 2] = w2
            words[4 * c + 3] = w3
            decode(w0, w1, w2, w3, buf)
            for j in range(e):
                back[c * e + j] = buf[j]

    return codec


def test_chunk_codec_round_trips_and_rounds_as_a_store():
    """vector_io.chunk_codec: decode gives each element's value, encode rounds to nearest even
    as a scalar store does (float16: subnormals, overflow to inf, ties; bf16 and float32)."""
    from paged_tutorial.backends.numba_cuda.device.vector_io import chunk_codec, chunk_elems

    special = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 1e6, -1e6, 6e-8, 3e-8, 1e-5,
                        1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, np.inf, -np.inf,
                        1.0 + 3 * 2.0 ** -8, 3.0e38, 1e-40], dtype=np.float32)
    rng = np.random.default_rng(0)
    for dtype_name, dt in (("float16", torch.float16), ("bfloat16", torch.bfloat16),
                           ("float32", torch.float32)):
        decode, encode = chunk_codec(dtype_name)
        e = chunk_elems(torch.empty(0, dtype=dt).element_size())
        vals = np.concatenate([special, rng.standard_normal(61).astype(np.float32) * 100])
        vals = vals[:len(vals) // e * e]
        codec = codec_kernel(decode, encode, e)
        words = np.zeros(len(vals) // e * 4, dtype=np.int32)
        back = np.zeros_like(vals)
        codec[1, len(vals) // e](vals, words, back)
        want = torch.from_numpy(vals).to(dt)
        stored = torch.from_numpy(words).view(dt)
        assert torch.equal(stored.view(torch.int16 if e == 8 else torch.int32),
                           want.view(torch.int16 if e == 8 else torch.int32)), dtype_name
        assert torch.equal(torch.from_numpy(back), want.float()), dtype_name


def test_prefill_sdpa_matches_torch_backend():
    g = gen(5)
    n_q, n_kv, d, cu = 6, 2, 16, [0, 13, 14, 40]
    qkv = torch.randn(cu[-1], (n_q + 2 * n_kv) * d, generator=g)
    q = qkv[:, :n_q * d].view(-1, n_q, d)
    k = qkv[:, n_q * d:(n_q + n_kv) * d].view(-1, n_kv, d)
    v = qkv[:, (n_q + n_kv) * d:].view(-1, n_kv, d)
    want = TorchBackend("cpu").prefill_attention(q, k, v, prefill_layout(cu), 0.25)
    got = prefill_attention_sdpa(q, k, v, cu, 0.25)
    assert rel_err(got, want) < 1e-5


def test_triton_decode_kernel_where_triton_runs():
    triton_attention = pytest.importorskip("paged_tutorial.backends.triton_attention")
    if not triton_attention.available():
        pytest.skip("Triton needs a GPU here (or TRITON_INTERPRET=1)")
    g = gen(9)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cache = make_cache(g, "bfloat16", n_kv=2, head_dim=64, max_seq_len=128, num_blocks=40,
                       device=device)
    lens = {3: 37, 1: 90}
    assign(g, cache, lens)
    q = torch.randn(2, 8, 64, generator=g).to(torch.bfloat16)
    slots = torch.tensor(list(lens), dtype=torch.int32)
    seq_lens = torch.tensor(list(lens.values()), dtype=torch.int32)
    want = q.float().clone()
    twin = float32_twin(cache)
    TorchBackend("cpu").decode_attention(want, twin, twin.device_block_table(), 1, seq_lens,
                                         slots, 0.125)
    for splits in (1, 3):
        got = triton_attention.decode_attention_triton(
            q.clone().to(device), cache, cache.device_block_table(), 1, seq_lens.to(device),
            slots.to(device), 0.125, n_splits=splits)
        assert rel_err(got, want) < 1e-2


def test_graph_buckets():
    assert default_buckets(1) == [1]
    assert default_buckets(2) == [1, 2]
    assert default_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert default_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert np.all(np.diff(default_buckets(256)) > 0)


# --- 16-byte bf16 kernels, GEMV, split greedy sampling, launch glue ----------------------------

def bits16(t):
    return t.detach().cpu().view(torch.int16)


def ulps(a, b):
    """max |a - b| / (1e-2 |b| + 1e-3): <= 1 is one or two bf16 roundings apart."""
    a, b = a.detach().cpu().float(), b.detach().cpu().float()
    return float(((a - b).abs() / (1e-2 * b.abs() + 1e-3)).max())


def test_vector_kernels_match_scalar_ones(nb):
    """The 16-byte kernels against the scalar ones, on strided rows as the engine passes
    them: elementwise ops bit for bit (same rounding, element for element), norms within one
    rounding."""
    scalar = NumbaBackend(options=KernelOptions(vector=False))
    g = gen(21)
    bf = torch.bfloat16
    dev = nb.device
    hidden = 320                                  # 40 chunks: more than one per simulated thread
    x = (torch.randn(3, hidden, generator=g) * 3).to(bf).to(dev)
    w = torch.randn(hidden, generator=g).to(bf).to(dev)
    wide = torch.randn(3, 2 * hidden, generator=g).to(bf).to(dev)
    strided = wide[:, hidden:]                    # rows 2 * hidden apart, like o_proj's input
    assert nb._vec_rows(x, w) and nb._vec_rows(strided)
    # norms: the sum of squares is added in another order (8 elements per thread), so the
    # outputs may differ from the scalar kernel's by one rounding; the residual is exact
    assert ulps(nb.rms_norm(x, w, 1e-5), scalar.rms_norm(x, w, 1e-5)) <= 1
    assert ulps(nb.rms_norm(x, w, 1e-5),
                TorchBackend("cpu").rms_norm(x.cpu(), w.cpu(), 1e-5).to(dev)) <= 1
    r1, r2 = x.clone(), x.clone()
    a = nb.add_rms_norm(strided, r1, w, 1e-5)
    b = scalar.add_rms_norm(strided, r2, w, 1e-5)
    assert ulps(a, b) <= 1 and torch.equal(bits16(r1), bits16(r2))
    gate_up = (torch.randn(3, 2 * 48, generator=g) * 3).to(bf).to(dev)
    assert torch.equal(bits16(nb.silu_mul(gate_up)), bits16(scalar.silu_mul(gate_up)))
    table = torch.randn(20, hidden, generator=g).to(bf).to(dev)
    ids = torch.tensor([19, 0, 7], dtype=torch.int32).to(dev)
    assert torch.equal(bits16(nb.embed(table, ids)), bits16(table[ids.long()]))
    # a view that is not 16-byte aligned falls back to the scalar kernels, same results
    odd = wide[:, 1:hidden + 1]
    assert not nb._vec_rows(odd) and nb._vec_rows(odd.contiguous())


@pytest.mark.parametrize("n_rows", [1, 3])
def test_gemv_matches_float32_products(n_rows):
    from paged_tutorial.backends.numba_cuda.kernels import gemv

    nb = NumbaBackend(options=KernelOptions(gemv=True))
    g = gen(30 + n_rows)
    k = 8 * (32 * gemv.UNROLL + 1)                # rows split over 2 warps (k_split), a tail
    assert gemv.k_split(k) == 2
    x_wide = torch.randn(n_rows, 2 * k, generator=g).to(torch.bfloat16).to(nb.device)
    x = x_wide[:, :k]                             # strided rows
    w = torch.randn(3, k, generator=g).to(torch.bfloat16).to(nb.device)
    y = nb.linear(x, w)
    assert y.dtype == torch.bfloat16 and y.shape == (n_rows, w.shape[0])
    want = x.float().cpu() @ w.float().cpu().T
    assert rel_err(y, want) < 4e-3                # one bf16 rounding of float32 sums
    assert not NumbaBackend(options=KernelOptions(gemv=False)).gemv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_sampling_split_over_blocks(nb, dtype):
    """The greedy path over several blocks per row, reading the logits in their own dtype
    (bf16 logits are not copied to float32 first)."""
    from paged_tutorial.backends.numba_cuda.kernels import sampling
    from paged_tutorial.backends.sampling_rule import sample_reference

    g = gen(40)
    vocab = 700
    logits = torch.randn(4, vocab, generator=g) * 3
    logits[0, 650] = logits[0, 20] = 50.0         # a tie across the parts: the first id wins
    logits[1, 699] = 60.0                         # the winner in the last part
    logits[2, 5] = float("nan")                   # NaN counts as the largest, like argmax
    logits = logits.to(dtype)
    temperature = torch.zeros(4)
    got = nb.sample(logits.to(nb.device), temperature.to(nb.device),
                    torch.ones(4).to(nb.device), torch.rand(4, generator=g).to(nb.device))
    assert sampling.greedy_parts(4) > 1
    assert got.cpu().tolist() == [20, 699, 5, int(logits[3].float().argmax())]
    logits = logits.float()
    assert got.cpu().tolist() == sample_reference(logits, temperature, torch.ones(4),
                                                  torch.zeros(4)).tolist()
    tickets = launch_module().persistent_buffer(nb.device, "sample.tickets", 4, torch.int32,
                                                zero=True)
    assert int(tickets.abs().sum()) == 0, "the merging blocks must leave the tickets at zero"


def test_greedy_sampling_with_16_byte_loads_matches_the_scalar_path(nb):
    """bf16 logits whose rows allow it are scanned eight per 16-byte load (parts of several
    rounds of loads per thread here): the same ids as the scalar path and ``sample_reference``
    -- ties across parts, inside a 4-byte word and inside a chunk go to the smaller id, NaN
    wins, a row of -inf gives id 0 -- and a top-p row in the same launch (its logits read from
    the words) draws the scalar path's token."""
    from paged_tutorial.backends.numba_cuda.kernels import sampling
    from paged_tutorial.backends.sampling_rule import sample_reference

    n_rows, threads = 7, launch_module().SAMPLE_THREADS
    parts = sampling.greedy_parts(n_rows)
    vocab = parts * (threads * sampling.GREEDY_UNROLL + 8)      # a multiple of 8
    span = -(-vocab // parts)                     # the parts start at multiples of 8
    span += -span % 8
    g = gen(41)
    logits = torch.randn(n_rows, vocab, generator=g) * 3
    logits[0, vocab - 100] = logits[0, 20] = 50.0  # a tie across the parts
    logits[1, span + 2] = logits[1, span + 3] = 40.0   # a tie inside one word: the even id
    logits[2, span + 9] = logits[2, span + 13] = 40.0  # a tie inside one chunk
    logits[3, vocab - 1] = 60.0                   # the row's last logit
    logits[4, 301] = float("nan")
    logits[5] = float("-inf")
    logits = logits.to(torch.bfloat16).to(nb.device)
    temperature = torch.tensor([0.0] * 6 + [0.8])
    top_p = torch.tensor([1.0] * 6 + [0.9])
    uniforms = torch.rand(n_rows, generator=g)
    assert nb._vec_rows(logits), "the 16-byte path is taken"
    scalar = NumbaBackend(options=KernelOptions(vector=False))
    args = [t.to(nb.device) for t in (temperature, top_p, uniforms)]
    got = nb.sample(logits, *args).cpu().tolist()
    assert got == scalar.sample(logits, *args).cpu().tolist()
    assert got[:6] == [20, span + 2, span + 9, vocab - 1, 301, 0]
    assert got[:6] == sample_reference(logits.cpu().float()[:6], temperature[:6], top_p[:6],
                                       uniforms[:6]).tolist()


def launch_module():
    from paged_tutorial.backends.numba_cuda.runtime import launch

    return launch


def test_launch_glue_rows_words_and_buffers(nb):
    launch = launch_module()
    t = torch.zeros(3, 16, dtype=torch.bfloat16).to(nb.device)
    _, stride = launch.rows(t[:, :8], "t", words=True)
    assert stride == 8                            # 16 bf16 = 8 words between rows
    with pytest.raises(ValueError, match="row must be contiguous"):
        launch.rows(t.t(), "t")
    with pytest.raises(ValueError, match="word view"):
        launch.rows(t[:, 1:4], "t", words=True)
    a = launch.persistent_buffer(nb.device, "test.grow", 10, torch.int32, zero=True)
    assert launch.persistent_buffer(nb.device, "test.grow", 10, torch.int32) is a
    b = launch.persistent_buffer(nb.device, "test.grow", a.numel() + 1, torch.int32, zero=True)
    assert b.numel() > a.numel() and int(b.abs().sum()) == 0
    # a buffer another caller made first without zeros (a test looking at the tickets before
    # any kernel made them) is zeroed for the first caller that needs zeros, and only then:
    # the kernels' counters must start at zero, and a check of them must still see their state
    c = launch.persistent_buffer(nb.device, "test.late_zero", 4, torch.int32)
    c.fill_(7)
    assert int(launch.persistent_buffer(nb.device, "test.late_zero", 4, torch.int32,
                                        zero=True).abs().sum()) == 0
    c.fill_(3)
    assert int(launch.persistent_buffer(nb.device, "test.late_zero", 4, torch.int32,
                                        zero=True).sum()) == 3 * c.numel()


def fused_and_separate(wave: bool = True):
    """The five-kernel decoder layer (``fuse_norms``) and the default (the GEMV on); ``wave``:
    the one-wave GEMVs (each warp normalises the row itself) or the looping ones (the norm
    staged once per block in shared memory)."""
    return (NumbaBackend(options=KernelOptions(gemv=True, fuse_norms=True, gemv_wave=wave)),
            NumbaBackend(options=KernelOptions(gemv=True)))


@pytest.mark.parametrize("n_tokens", [1, 2])
def test_fused_qkv_rope_write_kv_matches_the_separate_ops(n_tokens):
    """gemv.qkv_rope_write_kv_kernel against the GEMV, then rope_write_kv: the same bits in
    q, k, v and in the cache (one kernel instead of two per layer at decode)."""
    fused = NumbaBackend(options=KernelOptions(gemv=True))
    separate = NumbaBackend(options=KernelOptions(gemv=True, fuse_epilogues=False))
    g = gen(50 + n_tokens)
    n_q, n_kv, d, hidden = 4, 2, 16, 64
    cache = make_cache(g, "bfloat16", n_kv=n_kv, head_dim=d, device=fused.device)
    assign(g, cache, {1: 20, 3: 9})
    other = make_cache(g, "bfloat16", n_kv=n_kv, head_dim=d, device=fused.device)
    other.buffer.copy_(cache.buffer)
    other.block_table[...] = cache.block_table
    other.mark_table_changed()
    slots = torch.tensor([1, 3][:n_tokens], dtype=torch.int32).to(fused.device)
    positions = torch.tensor([19, 8][:n_tokens], dtype=torch.int32).to(fused.device)
    x = torch.randn(n_tokens, hidden, generator=g).to(torch.bfloat16).to(fused.device)
    w = (torch.randn((n_q + 2 * n_kv) * d, hidden, generator=g) * 0.2).to(torch.bfloat16)
    cos = torch.rand(32, d // 2, generator=g).to(fused.device)
    sin = torch.rand(32, d // 2, generator=g).to(fused.device)
    got = fused.qkv_rope_write_kv(x, w.to(fused.device), n_q, positions, cos, sin, cache,
                                  cache.device_block_table(), 1, slots)
    want = separate.qkv_rope_write_kv(x, w.to(fused.device), n_q, positions, cos, sin, other,
                                      other.device_block_table(), 1, slots)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.equal(bits16(a), bits16(b))
    assert torch.equal(bits16(cache.buffer), bits16(other.buffer))


@pytest.mark.parametrize("hidden", [64, 72])
def test_fused_linear_silu_mul_matches_the_separate_ops(hidden):
    """gemv.linear_silu_mul_kernel (gate and up rows of one warp, the SwiGLU in the store)
    against the GEMV then silu_mul: the same bits (one kernel instead of two per layer)."""
    from paged_tutorial.backends.base import Backend

    nb = NumbaBackend(options=KernelOptions(gemv=True))
    g = gen(70 + hidden)
    inter = 24
    x = torch.randn(1, hidden, generator=g).to(torch.bfloat16).to(nb.device)
    w = (torch.randn(2 * inter, hidden, generator=g) * 0.3).to(torch.bfloat16).to(nb.device)
    got = nb.linear_silu_mul(x, w)
    want = Backend.linear_silu_mul(nb, x, w)
    assert got.shape == (1, inter)
    assert torch.equal(bits16(got), bits16(want))


def close_bits(a, b, max_ulps=1, share=0.02):
    """bf16 tensors equal but for a few elements one rounding apart: the fused kernels sum
    the norm's squares in another order than the norm kernel (another thread count)."""
    a, b = bits16(a).int(), bits16(b).int()
    diff = (a - b).abs()
    return int(diff.max()) <= max_ulps and float((diff > 0).float().mean()) <= share


@pytest.mark.parametrize("wave", [True, False])
def test_fused_norm_qkv_rope_write_kv_matches_the_separate_ops(wave):
    """gemv.norm_qkv_rope_write_kv_kernel (the norm in the prologue, RoPE and the cache write
    in the epilogue) against rms_norm, the GEMV, then rope_write_kv: q, k, v and the cache
    row equal but for a rounding of the norm's sum; the residual is left as it was."""
    fused, separate = fused_and_separate(wave)
    g = gen(51)
    n_q, n_kv, d, hidden = 4, 2, 16, 64
    cache = make_cache(g, "bfloat16", n_kv=n_kv, head_dim=d, device=fused.device)
    assign(g, cache, {1: 20, 3: 9})
    other = make_cache(g, "bfloat16", n_kv=n_kv, head_dim=d, device=fused.device)
    other.buffer.copy_(cache.buffer)
    other.block_table[...] = cache.block_table
    other.mark_table_changed()
    before = cache.buffer.clone()
    slots = torch.tensor([3], dtype=torch.int32).to(fused.device)
    positions = torch.tensor([8], dtype=torch.int32).to(fused.device)
    residual = (torch.randn(1, hidden, generator=g) * 2).to(torch.bfloat16).to(fused.device)
    norm_w = (1 + torch.randn(hidden, generator=g) * 0.2).to(torch.bfloat16).to(fused.device)
    w = (torch.randn((n_q + 2 * n_kv) * d, hidden, generator=g) * 0.2).to(torch.bfloat16)
    cos = torch.rand(32, d // 2, generator=g).to(fused.device)
    sin = torch.rand(32, d // 2, generator=g).to(fused.device)
    kept = residual.clone()
    args = (norm_w, 1e-5, w.to(fused.device), n_q, positions, cos, sin)
    got = fused.norm_qkv_rope_write_kv(None, residual, *args, cache,
                                       cache.device_block_table(), 1, slots)
    want = separate.norm_qkv_rope_write_kv(None, residual, *args, other,
                                           other.device_block_table(), 1, slots)
    assert torch.equal(residual, kept)
    from paged_tutorial.backends.numba_cuda.kernels import gemv
    assert gemv.norm_qkv_rope_write_kv_kernel.cache_info().currsize >= 1, "fused path taken"
    for a, b in zip(got, want):
        assert a.shape == b.shape and close_bits(a, b)
    assert close_bits(cache.buffer, other.buffer, share=1e-3)
    assert not torch.equal(bits16(cache.buffer), bits16(before)), "the cache was written"
    # with something left to add (h), the backend takes the separate ops: residual += h
    h = torch.randn(1, hidden, generator=g).to(torch.bfloat16).to(fused.device)
    fused.norm_qkv_rope_write_kv(h, residual, *args, cache, cache.device_block_table(), 1,
                                 slots)
    assert torch.equal(residual, (kept.float() + h.float()).to(torch.bfloat16))


@pytest.mark.parametrize("wave", [True, False])
def test_fused_o_proj_mlp_matches_the_separate_ops(wave):
    """The output projection adding into the residual, gate/up with the norm in its prologue
    and the SwiGLU in its epilogue, down adding into the residual (three kernels) against
    linear, add_rms_norm, linear_silu_mul, linear: the same residual + h."""
    fused, separate = fused_and_separate(wave)
    g = gen(71)
    hidden, inter, attn_dim = 64, 24, 32
    bf = torch.bfloat16
    dev = fused.device
    attn = torch.randn(1, attn_dim, generator=g).to(bf).to(dev)
    residual = (torch.randn(1, hidden, generator=g) * 2).to(bf).to(dev)
    o_w = (torch.randn(hidden, attn_dim, generator=g) * 0.3).to(bf).to(dev)
    norm_w = (1 + torch.randn(hidden, generator=g) * 0.2).to(bf).to(dev)
    gate_up = (torch.randn(2 * inter, hidden, generator=g) * 0.3).to(bf).to(dev)
    down = (torch.randn(hidden, inter, generator=g) * 0.3).to(bf).to(dev)
    r_fused, r_separate = residual.clone(), residual.clone()
    assert fused.o_proj_mlp(attn, r_fused, o_w, norm_w, 1e-5, gate_up, down) is None
    h = separate.o_proj_mlp(attn, r_separate, o_w, norm_w, 1e-5, gate_up, down)
    assert h is not None and h.shape == residual.shape
    want = (r_separate.float() + h.float()).to(bf)
    assert close_bits(r_fused, want, max_ulps=2, share=0.1)


@pytest.mark.parametrize("wave", [False, True])
@pytest.mark.parametrize("k", [64, 8 * (32 * 8 + 1)])
def test_gemv_loops_over_more_row_blocks_than_its_grid(k, wave):
    """The GEMV's grid is capped (``gemv.resident_blocks``) and each block loops over row
    blocks: every output row is still computed once, for short rows (one warp per row) and
    long ones (a row split over warps, partial sums in shared memory reused per row block).
    The one-wave launch (``gemv_wave``) gives every row block its own block on a GPU (in
    the simulator it stays capped) and computes the same rows."""
    from paged_tutorial.backends.numba_cuda.kernels import gemv

    nb = NumbaBackend(options=KernelOptions(gemv=True, gemv_wave=wave))
    g = gen(90 + k)
    n_out = 4 * gemv.rows_per_block(k) * gemv.resident_blocks() + 1
    assert gemv.grid(n_out, k) == gemv.resident_blocks()
    row_blocks = -(-n_out // gemv.rows_per_block(k, gemv.WAVE_WARPS))
    assert gemv.grid(n_out, k, gemv.WAVE_WARPS, wave=True) == (
        gemv.resident_blocks() if nb.simulated else row_blocks)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16).to(nb.device)
    w = torch.randn(n_out, k, generator=g).to(torch.bfloat16).to(nb.device)
    y = nb.linear(x, w)
    assert rel_err(y, x.float().cpu() @ w.float().cpu().T) < 4e-3
