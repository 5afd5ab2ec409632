"""The real kernels at the other shapes the engine serves, on a GPU (marker ``gpu``): head_dim
128 with 24 query / 8 KV heads (kanana-nano-2.1b, the Korean model the README recommends) and
SmolLM2-135M's 9 query / 3 KV heads (a group of 3: no power of two) at head_dim 64, hidden 576.
``test_gpu.py`` covers Llama-3.2-1B's shapes; each test here runs the same op through the numba
backend and through the torch oracle on the same inputs.  Tolerances as in ``test_gpu.py``
(``helpers/gpu_checks.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import paged_tutorial as pt
from helpers.gpu_checks import DTYPES, attention_backend, rel_err, rn, same_bits, ulps, within_one_rounding
from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend
from paged_tutorial.backends.numba_cuda.kernels import attention_fast, prefill_sdpa, split_kv
from paged_tutorial.backends.numba_cuda.runtime import launch
from paged_tutorial.backends.paged_reads import attention, gather_kv
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig, ModelConfig
from paged_tutorial.step_inputs import prefill_layout

pytestmark = pytest.mark.gpu


@dataclass(frozen=True)
class Shape:
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    layers: int = 4              # the cache's layers (a few: the kernels index any of them)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def qkv_dim(self) -> int:
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim

    def model_config(self, layers: int = 2, vocab: int = 4096) -> ModelConfig:
        return ModelConfig(vocab_size=vocab, hidden_size=self.hidden,
                           intermediate_size=self.intermediate, num_hidden_layers=layers,
                           num_attention_heads=self.n_heads, num_key_value_heads=self.n_kv_heads,
                           head_dim=self.head_dim, max_position_embeddings=4096,
                           tie_word_embeddings=True)


SHAPES = {
    "kanana-nano-2.1b": Shape(hidden=1792, n_heads=24, n_kv_heads=8, head_dim=128,
                              intermediate=8064),
    "smollm2-135m": Shape(hidden=576, n_heads=9, n_kv_heads=3, head_dim=64, intermediate=1536),
}
CTX = [1024, 977, 513, 2000, 31, 1500, 700, 1100]       # 8 slots, lengths ending mid-block


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request) -> Shape:
    return SHAPES[request.param]


@pytest.fixture(scope="module")
def nb():
    return NumbaBackend()


@pytest.fixture(scope="module")
def ref():
    return TorchBackend("cuda")


def qkv_views(x, s: Shape):
    q_dim, kv_dim = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    q = x[:, :q_dim].view(-1, s.n_heads, s.head_dim)
    k = x[:, q_dim:q_dim + kv_dim].view(-1, s.n_kv_heads, s.head_dim)
    v = x[:, q_dim + kv_dim:].view(-1, s.n_kv_heads, s.head_dim)
    return q, k, v


def scattered_cache(g, s: Shape, dtype_name: str, seed: int = 0) -> PagedKVCache:
    """Random cache contents, the free list shuffled (a sequence's blocks scattered), every
    slot of CTX allocated in every layer."""
    cfg = CacheConfig(num_layers=s.layers, num_kv_heads=s.n_kv_heads, head_dim=s.head_dim,
                      dtype=dtype_name, max_slots=len(CTX), max_seq_len=2048,
                      kv_cache_bytes=s.layers * sum(-(-n // 16) for n in CTX) * 2 * 16
                      * s.n_kv_heads * s.head_dim * 4 + (1 << 20))
    cache = PagedKVCache(cfg, device="cuda")
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g, device="cuda")
                       .to(cache.buffer.dtype))
    perm = torch.randperm(len(cache.free_blocks),
                          generator=torch.Generator().manual_seed(seed)).tolist()
    cache.free_blocks = [cache.free_blocks[i] for i in perm]
    for slot, n in enumerate(CTX):
        cache.ensure_capacity(slot, n)
    return cache


def rope_tables(s: Shape):
    inv = 1.0 / 10000.0 ** (torch.arange(0, s.head_dim, 2, device="cuda",
                                         dtype=torch.float32) / s.head_dim)
    ang = torch.arange(4096, device="cuda", dtype=torch.float32)[:, None] * inv
    return ang.cos(), ang.sin()


def decode_oracle(q, cache, bt, layer, lens, slots, scale):
    """float32 attention over the same (rounded) cached K/V, one sequence at a time."""
    out = q.float().clone()
    for b, (slot, n) in enumerate(zip(slots.tolist(), lens.tolist())):
        k, v = gather_kv(cache, bt, slot, layer, n)
        out[b] = attention(out[b:b + 1], k.float(), v.float(), scale, causal=False)[0]
    return out


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_norms_rope_and_swiglu(nb, ref, shape, dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    dt, s, T = DTYPES[dtype], shape, 300
    x, wn = rn(g, dt, T, s.hidden, scale=3), rn(g, dt, s.hidden)
    assert ulps(nb.rms_norm(x, wn, 1e-5), ref.rms_norm(x, wn, 1e-5)) <= 1
    xs = rn(g, dt, T, 2 * s.hidden)[:, s.hidden:]           # strided rows, as the engine has
    r1 = rn(g, dt, T, s.hidden)
    r2 = r1.clone()
    o1, o2 = nb.add_rms_norm(xs, r1, wn, 1e-5), ref.add_rms_norm(xs, r2, wn, 1e-5)
    assert max(ulps(o1, o2), ulps(r1, r2)) <= 1
    q, k, _ = qkv_views(rn(g, dt, T, s.qkv_dim), s)
    cos, sin = rope_tables(s)
    pos = torch.randint(0, 4096, (T,), generator=g, device="cuda", dtype=torch.int32)
    q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
    nb.rope(q1, k1, pos, cos, sin)
    ref.rope(q2, k2, pos, cos, sin)
    assert max(ulps(q1, q2), ulps(k1, k2)) <= 1
    gu = rn(g, dt, T, 2 * s.intermediate, scale=3)
    assert ulps(nb.silu_mul(gu), ref.silu_mul(gu)) <= 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_cache_write_and_fused_rope_write(nb, ref, shape, dtype):
    g = torch.Generator(device="cuda").manual_seed(2)
    dt, s = DTYPES[dtype], shape
    cache = scattered_cache(g, s, dtype)
    bt = cache.device_block_table()
    layer = s.layers - 1
    slots = torch.tensor([0] * 200 + list(range(1, 8)), dtype=torch.int32, device="cuda")
    positions = torch.tensor(list(range(200)) + [n - 1 for n in CTX[1:]], dtype=torch.int32,
                             device="cuda")
    kw, vw = rn(g, dt, len(slots), s.n_kv_heads, s.head_dim), \
        rn(g, dt, len(slots), s.n_kv_heads, s.head_dim)
    before = cache.buffer.clone()
    nb.write_kv(cache, kw, vw, bt, layer, slots, positions)
    ours = cache.buffer.clone()
    cache.buffer.copy_(before)
    ref.write_kv(cache, kw, vw, bt, layer, slots, positions)
    assert same_bits(ours, cache.buffer)
    # fused RoPE + write (numba) against the oracle's rope then write_kv
    x = rn(g, dt, len(slots), s.qkv_dim)
    cos, sin = rope_tables(s)
    a, b = x.clone(), x.clone()
    cache.buffer.copy_(before)
    nb.rope_write_kv(*qkv_views(a, s), positions, cos, sin, cache, bt, layer, slots)
    fused = cache.buffer.clone()
    cache.buffer.copy_(before)
    ref.rope_write_kv(*qkv_views(b, s), positions, cos, sin, cache, bt, layer, slots)
    assert ulps(a, b) <= 1 and within_one_rounding(fused, cache.buffer)


@pytest.mark.parametrize("n_tokens", [1, 4])
def test_fused_qkv_projection_rope_write(ref, shape, n_tokens):
    """The decode path's QKV projection + RoPE + cache write (a fused GEMV where the shape
    allows it) against the oracle's matmul, rope and write, in bfloat16."""
    s = shape
    g = torch.Generator(device="cuda").manual_seed(3)
    cache = scattered_cache(g, s, "bfloat16")
    other = scattered_cache(torch.Generator(device="cuda").manual_seed(3), s, "bfloat16")
    slots = torch.tensor([3, 0, 5, 7][:n_tokens], dtype=torch.int32, device="cuda")
    positions = torch.tensor([CTX[3] - 1, CTX[0] - 1, CTX[5] - 1, CTX[7] - 1][:n_tokens],
                             dtype=torch.int32, device="cuda")
    x = rn(g, torch.bfloat16, n_tokens, s.hidden)
    w = rn(g, torch.bfloat16, s.qkv_dim, s.hidden, scale=0.02)
    cos, sin = rope_tables(s)
    got = NumbaBackend().qkv_rope_write_kv(x, w, s.n_heads, positions, cos, sin, cache,
                                           cache.device_block_table(), 1, slots)
    want = ref.qkv_rope_write_kv(x, w, s.n_heads, positions, cos, sin, other,
                                 other.device_block_table(), 1, slots)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-2
    assert rel_err(cache.buffer, other.buffer) < 1e-3     # only the written rows can differ


@pytest.mark.parametrize("kernel", ["fast", "article", "triton"])
@pytest.mark.parametrize("batch", [1, 8])
def test_decode_attention(shape, kernel, batch):
    s = shape
    g = torch.Generator(device="cuda").manual_seed(4)
    cache = scattered_cache(g, s, "bfloat16")
    bt = cache.device_block_table()
    q = rn(g, torch.bfloat16, batch, s.n_heads, s.head_dim)
    slots = torch.arange(batch, dtype=torch.int32, device="cuda").flip(0)
    lens = torch.tensor(CTX[:batch], dtype=torch.int32, device="cuda").flip(0)
    want = decode_oracle(q, cache, bt, 2, lens, slots, s.scale)
    got = attention_backend(kernel).decode_attention(q.clone(), cache, bt, 2, lens, slots,
                                                     s.scale)
    assert rel_err(got, want) < 5e-3
    if kernel == "fast":            # its split blocks leave their tickets at zero
        tickets = launch.persistent_buffer("cuda", split_kv.TICKETS, 1, torch.int32,
                                           zero=True)
        assert int(tickets.abs().sum()) == 0
    # the torch oracle's batched decode (the torch backend on the GPU) reads the same
    batched = TorchBackend("cuda").decode_attention(q.clone(), cache, bt, 2, lens, slots,
                                                    s.scale, max_seq_len=max(CTX[:batch]))
    assert rel_err(batched, want) < 1e-2                 # its probabilities rounded to bf16


def test_prefill_attention(nb, ref, shape):
    s = shape
    g = torch.Generator(device="cuda").manual_seed(5)
    cu = [0, 600, 1024, 1025, 1300]
    q, k, v = qkv_views(rn(g, torch.bfloat16, cu[-1], s.qkv_dim), s)
    layout = prefill_layout(cu, "cuda")
    want = ref.prefill_attention(q.float(), k.float(), v.float(), layout, s.scale)
    got = nb.prefill_attention(q, k, v, layout, s.scale)
    assert prefill_sdpa.LAST_PATH == "varlen"
    assert rel_err(got, want) < 1e-2
    numba_kernel = NumbaBackend(options=KernelOptions(prefill="numba")).prefill_attention(q, k, v, layout, s.scale)
    assert rel_err(numba_kernel, want) < 5e-3
    got32 = nb.prefill_attention(q.float(), k.float(), v.float(), layout, s.scale)
    assert rel_err(got32, want) < 1e-5


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_prefill_after_a_cached_prefix(nb, shape, dtype):
    """The cached-prefix prefill on the GPU (every sequence in one masked attention) against
    float32 attention of each sequence alone over the same cached K/V."""
    s = shape
    g = torch.Generator(device="cuda").manual_seed(6)
    cache = scattered_cache(g, s, dtype)
    bt = cache.device_block_table()
    news = [CTX[0] - 1000, 1, CTX[2] - 512, CTX[3] - 1500, CTX[4], 77]   # 6 slots
    contexts = [n - m for n, m in zip(CTX, news)]
    cu = [0]
    for m in news:
        cu.append(cu[-1] + m)
    inputs = prefill_layout(cu, "cuda", context_lens=contexts, seq_slots=list(range(6)),
                            block_table=bt)
    q = rn(g, DTYPES[dtype], cu[-1], s.n_heads, s.head_dim)
    got = nb.prefill_attention_from_cache(q, cache, bt, 1, inputs, s.scale)
    want = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    for i, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        k, v = gather_kv(cache, bt, i, 1, contexts[i] + news[i])
        want[start:end] = attention(q[start:end].float(), k.float(), v.float(), s.scale,
                                    causal=True)
    assert rel_err(got, want) < (1e-2 if dtype == "bfloat16" else 1e-5)


def test_gemv_at_the_shape(nb, shape):
    """One token row through every matrix of a layer (the decode path's GEMV where it
    applies, cuBLAS otherwise) against float32."""
    s = shape
    g = torch.Generator(device="cuda").manual_seed(7)
    for n_out, k in [(s.qkv_dim, s.hidden), (s.hidden, s.n_heads * s.head_dim),
                     (2 * s.intermediate, s.hidden), (s.hidden, s.intermediate)]:
        x = rn(g, torch.bfloat16, 1, k)
        w = rn(g, torch.bfloat16, n_out, k, scale=0.02)
        assert rel_err(nb.linear(x, w), x.float() @ w.float().T) < 4e-3, (n_out, k)


def test_engine_tokens_numba_equal_torch_float32(shape):
    """Two layers of random float32 weights at the shape: greedy tokens of the numba engine
    equal those of the torch backend on the same GPU, with its decode steps replayed as CUDA
    graphs (the default there) and without."""
    model = pt.random_model(shape.model_config(), dtype="float32", seed=0, device="cuda")
    prompts = [[(7 * i + 3 * j) % 4000 + 1 for j in range(n)] for i, n in enumerate((5, 40, 17))]
    params = pt.SamplingParams(max_tokens=12, ignore_eos=True)
    results = {}
    for name, kw in {"numba": dict(backend="numba"), "torch": dict(backend="torch"),
                     "torch eager": dict(backend="torch", cuda_graphs=False)}.items():
        engine = pt.Engine(model, max_slots=3, max_seq_len=128, **kw)
        results[name] = [r.token_ids for r in engine.generate(prompts, params, chat=False)]
        graphs = engine.model_runner.graphs
        assert (graphs is not None and graphs.replays > 0) == (name != "torch eager"), name
    assert results["numba"] == results["torch"] == results["torch eager"]
