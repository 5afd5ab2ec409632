"""The real kernels at Llama-3.2-1B shapes, on a GPU (marker ``gpu``; skipped with the reason in
the simulator, see conftest.py).  What the simulator cannot show: every kernel compiles for the
real target (libdevice bit casts, 16-byte PTX loads and stores, shuffles), agrees with torch at
full size (scattered blocks, 32 q / 8 KV heads, contexts of ~2000 tokens, a 128256-token
vocabulary), runs on torch's stream through the fast launch path, and can be captured in a
CUDA graph.  Timings live in ``benchmarks/``.

Tolerances (``helpers/gpu_checks.py``): elementwise ops within one or two roundings
(``ulps`` <= 1), attention and matrix products by ||a - b|| / ||b|| against float32
references.  ``test_gpu_shapes.py`` runs the same ops at head_dim 128 and at 9 / 3 heads.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers.gpu_checks import DTYPES, attention_backend, rel_err, rn, same_bits, ulps, within_one_rounding
from paged_tutorial.backends.numba_cuda import SIMULATING, KernelOptions, NumbaBackend
from paged_tutorial.backends.numba_cuda.kernels import attention_fast, split_kv
from paged_tutorial.backends.numba_cuda.kernels import gemv, prefill_sdpa, sampling
from paged_tutorial.backends.numba_cuda.runtime import launch
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.backends.paged_reads import attention
from paged_tutorial.step_inputs import prefill_layout
from paged_tutorial.config import CacheConfig, llama_3_2_1b_config
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.backends.sampling_rule import sample_reference

pytestmark = pytest.mark.gpu

CTX = [1024, 977, 513, 2000, 31, 1500, 700, 1100]       # 8 slots, lengths ending mid-block
M = llama_3_2_1b_config()
H, NH, NKV, D, INTER, V = (M.hidden_size, M.n_heads, M.n_kv_heads, M.head_dim,
                           M.intermediate_size, M.vocab_size)
SCALE = 1.0 / math.sqrt(D)


@pytest.fixture(scope="module")
def dev():
    return torch.device("cuda")


@pytest.fixture(scope="module")
def nb():
    return NumbaBackend()


@pytest.fixture(scope="module")
def ref(dev):
    return TorchBackend(dev)


def qkv_views(x):
    q = x[:, :NH * D].view(-1, NH, D)
    k = x[:, NH * D:(NH + NKV) * D].view(-1, NKV, D)
    v = x[:, (NH + NKV) * D:].view(-1, NKV, D)
    return q, k, v


def scattered_cache(g, dtype_name, max_slots=8):
    cfg = CacheConfig.for_model(M, dtype=dtype_name, kv_cache_bytes=1 << 30,
                                max_slots=max_slots)
    cache = PagedKVCache(cfg, device="cuda")
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g, device="cuda")
                       .to(cache.buffer.dtype))
    perm = torch.randperm(len(cache.free_blocks),
                          generator=torch.Generator().manual_seed(len(CTX))).tolist()
    cache.free_blocks = [cache.free_blocks[i] for i in perm]
    for slot, n in enumerate(CTX[:max_slots]):
        cache.ensure_capacity(slot, n)
    return cache


def decode_oracle(ref, q, cache, bt, layer, lens, slots):
    """float32 attention over the same (rounded) cached K/V."""
    out = q.float().clone()
    for b, (slot, n) in enumerate(zip(slots.tolist(), lens.tolist())):
        k, v = ref.gather_kv(cache, bt, slot, layer, n)
        out[b] = attention(out[b:b + 1], k.float(), v.float(), SCALE, causal=False)[0]
    return out


def test_not_simulating():
    assert not SIMULATING and torch.cuda.is_available()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_row_and_elementwise_ops_at_full_size(nb, ref, dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    dt = DTYPES[dtype]
    T = 1024
    w = rn(g, dt, V, H)
    ids = torch.randint(0, V, (T,), generator=g, device="cuda", dtype=torch.int32)
    assert same_bits(nb.embed(w, ids), ref.embed(w, ids))
    x, wn = rn(g, dt, T, H, scale=3), rn(g, dt, H)
    assert ulps(nb.rms_norm(x, wn, 1e-5), ref.rms_norm(x, wn, 1e-5)) <= 1
    wide = rn(g, dt, T, 2 * H)
    xs = wide[:, H:]                                        # strided rows, as the engine has
    r1 = rn(g, dt, T, H)
    r2 = r1.clone()
    o1, o2 = nb.add_rms_norm(xs, r1, wn, 1e-5), ref.add_rms_norm(xs, r2, wn, 1e-5)
    assert max(ulps(o1, o2), ulps(r1, r2)) <= 1
    q, k, _ = qkv_views(rn(g, dt, T, (NH + 2 * NKV) * D))
    inv = 1.0 / 500000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D)
    ang = torch.arange(4096, device="cuda", dtype=torch.float32)[:, None] * inv
    cos, sin = ang.cos(), ang.sin()
    pos = torch.randint(0, 4096, (T,), generator=g, device="cuda", dtype=torch.int32)
    q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
    nb.rope(q1, k1, pos, cos, sin)
    ref.rope(q2, k2, pos, cos, sin)
    assert max(ulps(q1, q2), ulps(k1, k2)) <= 1
    gu = rn(g, dt, T, 2 * INTER, scale=3)
    assert ulps(nb.silu_mul(gu), ref.silu_mul(gu)) <= 1


def test_vector_kernels_against_scalar_kernels_at_full_size(nb):
    """The 16-byte bf16 kernels against the scalar kernels, on the GPU (both compiled for it):
    elementwise ops bit for bit; norms within one rounding (the sum of squares is added in
    another order), the residual bit for bit."""
    scalar = NumbaBackend(options=KernelOptions(vector=False))
    g = torch.Generator(device="cuda").manual_seed(2)
    bf = torch.bfloat16
    for T in (1, 64, 2048):
        x, wn = rn(g, bf, T, H, scale=3), rn(g, bf, H)
        assert ulps(nb.rms_norm(x, wn, 1e-5), scalar.rms_norm(x, wn, 1e-5)) <= 1
        xs = rn(g, bf, T, 2 * H)[:, :H]
        r1 = rn(g, bf, T, H)
        r2 = r1.clone()
        assert ulps(nb.add_rms_norm(xs, r1, wn, 1e-5), scalar.add_rms_norm(xs, r2, wn, 1e-5)) <= 1
        assert same_bits(r1, r2)
        gu = rn(g, bf, T, 2 * INTER, scale=3)
        assert same_bits(nb.silu_mul(gu), scalar.silu_mul(gu))


def test_launch_path_follows_new_tensors(nb, ref):
    """The fast launch path keys compiled kernels by argument *types* only: every call must
    read its own tensors (no stale pointers), including a freshly allocated one."""
    g = torch.Generator(device="cuda").manual_seed(3)
    wn = rn(g, torch.bfloat16, H)
    for _ in range(3):
        x = rn(g, torch.bfloat16, 4, H)
        assert same_bits(nb.rms_norm(x, wn, 1e-5), ref.rms_norm(x, wn, 1e-5))
    assert any(launch._launchers.values()), "the GPU launches went through the fast path"
    assert not launch.FAST_LAUNCH_ERRORS


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_cache_writes_bit_exact(nb, ref, dtype):
    g = torch.Generator(device="cuda").manual_seed(4)
    dt = DTYPES[dtype]
    cache = scattered_cache(g, dtype)
    bt = cache.device_block_table()
    layer = 5
    slots = torch.tensor([0] * 1024 + list(range(1, 8)), dtype=torch.int32, device="cuda")
    positions = torch.tensor(list(range(1024)) + [n - 1 for n in CTX[1:]], dtype=torch.int32,
                             device="cuda")
    kw, vw = rn(g, dt, len(slots), NKV, D), rn(g, dt, len(slots), NKV, D)
    before = cache.buffer.clone()
    nb.write_kv(cache, kw, vw, bt, layer, slots, positions)
    ours = cache.buffer.clone()
    cache.buffer.copy_(before)
    ref.write_kv(cache, kw, vw, bt, layer, slots, positions)
    assert same_bits(ours, cache.buffer)
    # the fused RoPE + write against rope then write_kv, on q/k/v views of one projection
    x = rn(g, dt, len(slots), (NH + 2 * NKV) * D)
    cos = torch.rand(4096, D // 2, generator=g, device="cuda")
    sin = torch.rand(4096, D // 2, generator=g, device="cuda")
    a, b = x.clone(), x.clone()
    cache.buffer.copy_(before)
    nb.rope_write_kv(*qkv_views(a), positions, cos, sin, cache, bt, layer, slots)
    fused = cache.buffer.clone()
    cache.buffer.copy_(before)
    qb, kb, vb = qkv_views(b)
    nb.rope(qb, kb, positions, cos, sin)
    nb.write_kv(cache, kb, vb, bt, layer, slots, positions)
    assert same_bits(a, b) and same_bits(fused, cache.buffer)


@pytest.mark.parametrize("kernel", ["fast", "article", "triton"])
@pytest.mark.parametrize("batch", [1, 8])
def test_decode_attention_at_full_size(ref, kernel, batch):
    g = torch.Generator(device="cuda").manual_seed(5)
    cache = scattered_cache(g, "bfloat16")
    bt = cache.device_block_table()
    q = rn(g, torch.bfloat16, batch, NH, D)
    slots = torch.arange(batch, dtype=torch.int32, device="cuda").flip(0)
    lens = torch.tensor(CTX[:batch], dtype=torch.int32, device="cuda").flip(0)
    want = decode_oracle(ref, q, cache, bt, 3, lens, slots)
    got = attention_backend(kernel).decode_attention(q.clone(), cache, bt, 3, lens, slots,
                                                     SCALE)
    assert rel_err(got, want) < 5e-3
    tickets = launch.persistent_buffer("cuda", split_kv.TICKETS, 1, torch.int32,
                                       zero=True)
    assert int(tickets.abs().sum()) == 0


def test_torch_decode_takes_lengths_made_on_the_host(ref):
    """Notebooks pass torch.tensor([n]) (host) lengths and slots with a cache on the GPU: the
    oracle moves them to q's device instead of failing on mixed devices."""
    g = torch.Generator(device="cuda").manual_seed(6)
    cache = scattered_cache(g, "float32")
    bt = cache.device_block_table()
    q = rn(g, torch.float32, 2, NH, D)
    lens, slots = torch.tensor(CTX[:2], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32)
    host = ref.decode_attention(q.clone(), cache, bt, 3, lens, slots, SCALE)
    device = ref.decode_attention(q.clone(), cache, bt, 3, lens.cuda(), slots.cuda(), SCALE)
    assert torch.equal(host, device)


def test_prefill_attention_one_varlen_call(nb, ref):
    g = torch.Generator(device="cuda").manual_seed(6)
    cu = [0, 600, 1024, 1025, 2048]
    q, k, v = qkv_views(rn(g, torch.bfloat16, cu[-1], (NH + 2 * NKV) * D))
    layout = prefill_layout(cu, "cuda")
    want = ref.prefill_attention(q.float(), k.float(), v.float(), layout, SCALE)
    got = nb.prefill_attention(q, k, v, layout, SCALE)
    assert prefill_sdpa.LAST_PATH == "varlen"
    assert rel_err(got, want) < 1e-2
    per_seq = prefill_sdpa.prefill_attention_sdpa(q, k, v, cu, SCALE)
    assert rel_err(got, per_seq) < 1e-2
    numba_kernel = NumbaBackend(options=KernelOptions(prefill="numba")).prefill_attention(q, k, v, layout, SCALE)
    assert rel_err(numba_kernel, want) < 5e-3
    # float32 has no flash kernel: the per-sequence fallback, same function
    got32 = nb.prefill_attention(q.float(), k.float(), v.float(), layout, SCALE)
    assert prefill_sdpa.LAST_PATH == "per-sequence" and rel_err(got32, want) < 1e-5


@pytest.mark.parametrize("n_rows", [1, 2, 4])
def test_gemv_at_llama_shapes(nb, n_rows, monkeypatch):
    """The GEMV kernel at every Llama matrix, for 1, 2 and 4 token rows (the engine uses it
    at one row, gemv.MAX_ROWS; benchmarks/kernel_speeds.py times it at more)."""
    monkeypatch.setattr(gemv, "MAX_ROWS", 4)
    g = torch.Generator(device="cuda").manual_seed(7)
    for n_out, k in [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (V, 2048)]:
        x = rn(g, torch.bfloat16, n_rows, k)
        w = rn(g, torch.bfloat16, n_out, k, scale=0.02)
        got = nb.linear(x, w)
        want = x.float() @ w.float().T
        assert rel_err(got, want) < 4e-3, (n_out, k)


def test_sampling_full_vocabulary(nb):
    g = torch.Generator(device="cuda").manual_seed(8)
    for batch in (1, 8, 64):
        logits = torch.randn(batch, V, generator=g, device="cuda") * 4
        temp = torch.rand(batch, generator=g, device="cuda") * 1.5
        temp[::2] = 0.0                                  # greedy and sampled rows mixed
        top_p = torch.rand(batch, generator=g, device="cuda") * 0.9 + 0.1
        u = torch.rand(batch, generator=g, device="cuda")
        got = nb.sample(logits, temp, top_p, u).cpu()
        want = sample_reference(logits, temp, top_p, u).cpu()
        assert (got != want).sum() <= max(1, batch // 16), (got.tolist(), want.tolist())
        assert torch.equal(got[::2], want[::2])          # greedy: exact
        assert sampling.greedy_parts(batch) >= 1


def test_cuda_graph_captures_numba_launches(nb, ref):
    g = torch.Generator(device="cuda").manual_seed(9)
    cache = scattered_cache(g, "bfloat16")
    bt = cache.device_block_table()
    qd = rn(g, torch.bfloat16, 8, NH, D)
    lens = torch.tensor(CTX, dtype=torch.int32, device="cuda")
    slots = torch.arange(8, dtype=torch.int32, device="cuda")
    x, wn = rn(g, torch.bfloat16, 1, H), rn(g, torch.bfloat16, H)
    w = rn(g, torch.bfloat16, 2048, H, scale=0.02)
    static_q = qd.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                        # compile outside the capture
        nb.decode_attention(static_q, cache, bt, 2, lens, slots, SCALE)
        nb.linear(nb.rms_norm(x, wn, 1e-5), w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_q.copy_(qd)
        nb.decode_attention(static_q, cache, bt, 2, lens, slots, SCALE)
        out = nb.linear(nb.rms_norm(x, wn, 1e-5), w)
    for _ in range(2):                                   # replays repeat the same result
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(static_q, decode_oracle(ref, qd, cache, bt, 2, lens, slots)) < 5e-3
        assert rel_err(out, ref.rms_norm(x, wn, 1e-5).float() @ w.float().T) < 4e-3


@pytest.mark.parametrize("wave", [True, False])
def test_fused_decoder_layer_at_full_size(wave):
    """``fuse_norms``: five kernels per layer at Llama-3.2-1B shapes (batch 1): the norm in
    the QKV and gate/up GEMVs' prologues, RoPE and the cache write in the QKV GEMV's
    epilogue, the residual adds in the output and down projections'; against the same ops
    unfused (the norms sum their squares in the same order here: the same thread count)."""
    fused = NumbaBackend(options=KernelOptions(fuse_norms=True, gemv_wave=wave))
    separate = NumbaBackend()
    g = torch.Generator(device="cuda").manual_seed(10)
    cache = scattered_cache(g, "bfloat16")
    other = scattered_cache(torch.Generator(device="cuda").manual_seed(10), "bfloat16")
    slots = torch.tensor([3], dtype=torch.int32, device="cuda")
    positions = torch.tensor([CTX[3] - 1], dtype=torch.int32, device="cuda")
    residual = rn(g, torch.bfloat16, 1, H)
    norm_w = 1 + rn(g, torch.bfloat16, H, scale=0.1)
    w = rn(g, torch.bfloat16, (NH + 2 * NKV) * D, H, scale=0.02)
    cos = torch.rand(4096, D // 2, generator=g, device="cuda")
    sin = torch.rand(4096, D // 2, generator=g, device="cuda")
    args = (norm_w, 1e-5, w, NH, positions, cos, sin)
    got = fused.norm_qkv_rope_write_kv(None, residual, *args, cache,
                                       cache.device_block_table(), 6, slots)
    want = separate.norm_qkv_rope_write_kv(None, residual, *args, other,
                                           other.device_block_table(), 6, slots)
    for a, b in zip(got, want):
        assert within_one_rounding(a, b)
    assert within_one_rounding(cache.buffer, other.buffer)
    attn = rn(g, torch.bfloat16, 1, NH * D)
    o_w = rn(g, torch.bfloat16, H, NH * D, scale=0.02)
    gate_up = rn(g, torch.bfloat16, 2 * INTER, H, scale=0.02)
    down = rn(g, torch.bfloat16, H, INTER, scale=0.02)
    r_fused, r_sep = residual.clone(), residual.clone()
    assert fused.o_proj_mlp(attn, r_fused, o_w, norm_w, 1e-5, gate_up, down) is None
    h = separate.o_proj_mlp(attn, r_sep, o_w, norm_w, 1e-5, gate_up, down)
    assert rel_err(r_fused, r_sep.float() + h.float()) < 1e-2


@pytest.mark.parametrize("n_tokens", [1, 4])
def test_qkv_rope_write_kv_at_full_size(n_tokens):
    """QKV projection + RoPE + cache write with the Numba GEMV (at one row) against cuBLAS's
    projection: the same rotation and cache rows, within a rounding of the two products."""
    fused = NumbaBackend()
    separate = NumbaBackend(options=KernelOptions(gemv=False))
    g = torch.Generator(device="cuda").manual_seed(10)
    cache = scattered_cache(g, "bfloat16")
    other = scattered_cache(torch.Generator(device="cuda").manual_seed(10), "bfloat16")
    assert torch.equal(cache.buffer, other.buffer)
    slots = torch.tensor([3, 0, 5, 7][:n_tokens], dtype=torch.int32, device="cuda")
    positions = torch.tensor([CTX[3] - 1, CTX[0] - 1, CTX[5] - 1, CTX[7] - 1][:n_tokens],
                             dtype=torch.int32, device="cuda")
    x = rn(g, torch.bfloat16, n_tokens, H)
    w = rn(g, torch.bfloat16, (NH + 2 * NKV) * D, H, scale=0.02)
    cos = torch.rand(4096, D // 2, generator=g, device="cuda")
    sin = torch.rand(4096, D // 2, generator=g, device="cuda")
    got = fused.qkv_rope_write_kv(x, w, NH, positions, cos, sin, cache,
                                  cache.device_block_table(), 6, slots)
    want = separate.qkv_rope_write_kv(x, w, NH, positions, cos, sin, other,
                                      other.device_block_table(), 6, slots)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-2
    assert rel_err(cache.buffer, other.buffer) < 1e-3     # only the written rows can differ
