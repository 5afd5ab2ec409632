"""``cpu_decode_ops``: the compiled norms, RoPE + cache write and decode attention of a CPU
decode step, against the torch ops they replace (``torch_ref.py``, ``paged_reads.py``): the
RoPE and the write bit for bit, the norms and the attention to float32 rounding; a table entry
that is not a block changes nothing and is named by the torch backend's check, as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.backends import cpu_decode_ops, cpu_matvec
from paged_tutorial.backends.paged_reads import attention, gather_kv
from paged_tutorial.backends.torch_ref import TorchBackend, rope_factors, rotate_half_pairs, \
    write_rows
from paged_tutorial.config import CacheConfig
from paged_tutorial.model.rope import rope_cos_sin

N_KV, D, N_Q = 3, 8, 9          # three KV heads of 8, three query heads each


def make_cache(lens: list[int], seed: int, layers: int = 2) -> pt.PagedKVCache:
    """A float32 cache whose slot i holds lens[i] random tokens in every layer (blocks taken in
    an interleaved order, so a sequence's blocks are not adjacent); unwritten rows hold NaN."""
    config = CacheConfig(num_layers=layers, num_kv_heads=N_KV, head_dim=D, dtype="float32",
                         kv_cache_bytes=48 * 2 * 16 * N_KV * D * 4, max_slots=len(lens),
                         max_seq_len=80)
    cache = pt.PagedKVCache(config)
    cache.buffer.fill_(float("nan"))
    for step in range(1, max(lens) + 1):
        for slot, n in enumerate(lens):
            if step <= n:
                cache.ensure_capacity(slot, step)
    generator = torch.Generator().manual_seed(seed)
    table = cache.device_block_table()
    for slot, n in enumerate(lens):
        for layer in range(layers):
            kv = torch.randn(n, 2, N_KV * D, generator=generator)
            write_rows(cache, kv, table, layer, torch.full((n,), slot), torch.arange(n))
    return cache


def rope_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [80, D/2] of a model with these heads."""
    config = pt.ModelConfig(vocab_size=16, hidden_size=24, intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=N_Q,
                            num_key_value_heads=N_KV, head_dim=D, max_position_embeddings=80)
    return rope_cos_sin(config, 80, device="cpu")


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_norms_equal_the_torch_ops_and_add_the_residual_in_place(rows):
    generator = torch.Generator().manual_seed(rows)
    x, residual = (torch.randn(rows, 96, generator=generator) * 3 for _ in range(2))
    weight = torch.rand(96, generator=generator) + 0.5
    want_residual = residual + x
    want = weight * (want_residual * torch.rsqrt(want_residual.pow(2).mean(-1, keepdim=True)
                                                 + 1e-5))
    got_residual = residual.clone()
    got = cpu_decode_ops.rms_norm(x, got_residual, weight, 1e-5)
    assert torch.equal(got_residual, want_residual)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    alone = residual.clone()
    torch.testing.assert_close(cpu_decode_ops.rms_norm(None, alone, weight, 1e-5),
                               weight * (residual * torch.rsqrt(
                                   residual.pow(2).mean(-1, keepdim=True) + 1e-5)),
                               rtol=2e-6, atol=2e-6)
    assert torch.equal(alone, residual)             # no x: the residual is only read


def test_rope_and_the_cache_write_are_the_torch_ops_bit_for_bit():
    """Tokens at the first row of a block, inside one, at its last row, and past the first
    block, of three slots: q and k rotated in place, k and v written to their rows."""
    cos, sin = rope_tables()
    lens = [40, 17, 33]
    positions = torch.tensor([0, 15, 16, 39, 31, 32], dtype=torch.int32)
    slots = torch.tensor([1, 1, 2, 0, 2, 2], dtype=torch.int32)
    qkv = torch.randn(6, (N_Q + 2 * N_KV) * D, generator=torch.Generator().manual_seed(4))
    caches = [make_cache(lens, seed=5) for _ in range(2)]
    table = caches[0].device_block_table()
    want = qkv.clone()
    q_dim = N_Q * D
    rotate_half_pairs(want[:, :q_dim + N_KV * D].view(6, N_Q + N_KV, D),
                      *rope_factors(positions, cos, sin, want.dtype))
    write_rows(caches[0], want[:, q_dim:].view(6, 2, N_KV * D), table, 1, slots, positions)
    got = qkv.clone()
    assert cpu_decode_ops.rope_write_kv(got, N_Q, D, positions, cos, sin, caches[1], table, 1,
                                        slots)
    assert torch.equal(got, want)
    assert torch.equal(caches[1].buffer.nan_to_num(7.0), caches[0].buffer.nan_to_num(7.0))


@pytest.mark.parametrize("lens", [[1], [16, 17, 5], [40, 33, 1, 16, 2, 31, 48, 9]])
def test_decode_attention_equals_each_sequence_alone(lens):
    """Lengths of one token, a whole block, a block and one, across three blocks; the slots
    in another order than the rows; rows past a sequence's length hold NaN in the cache."""
    cache = make_cache(lens, seed=len(lens))
    table = cache.device_block_table()
    order = list(reversed(range(len(lens))))
    slots = torch.tensor(order, dtype=torch.int32)
    seq_lens = torch.tensor([lens[s] for s in order], dtype=torch.int32)
    q = torch.randn(len(lens), N_Q, D, generator=torch.Generator().manual_seed(9))
    got = q.clone()
    assert cpu_decode_ops.decode_attention(got, cache, table, 1, slots, seq_lens, 0.35)
    for b, slot in enumerate(order):
        k, v = gather_kv(cache, table, slot, 1, lens[slot])
        want = attention(q[b:b + 1], k, v, 0.35, causal=False)[0]
        torch.testing.assert_close(got[b], want, rtol=2e-6, atol=2e-6)


def test_decode_attention_reads_q_from_the_projection_rows_in_place():
    """The decoder hands q as a view into the QKV rows (rows strided): answered in place."""
    cache = make_cache([20, 7], seed=2)
    table = cache.device_block_table()
    qkv = torch.randn(2, (N_Q + 2 * N_KV) * D, generator=torch.Generator().manual_seed(3))
    q = qkv[:, :N_Q * D].view(2, N_Q, D)
    want = TorchBackend("cpu").decode_attention(q.clone().contiguous(), cache, table, 0,
                                                torch.tensor([20, 7], dtype=torch.int32),
                                                torch.tensor([0, 1], dtype=torch.int32), 0.5)
    rest = qkv[:, N_Q * D:].clone()
    assert cpu_decode_ops.decode_attention(q, cache, table, 0, torch.tensor([0, 1]),
                                           torch.tensor([20, 7]), 0.5)
    torch.testing.assert_close(qkv[:, :N_Q * D].view(2, N_Q, D), want, rtol=2e-6, atol=2e-6)
    assert torch.equal(qkv[:, N_Q * D:], rest)


def test_a_non_finite_value_stays_non_finite():
    """The engine finds the layer where activations first went non-finite
    (``engine/numerical_faults.py``): the loops must carry a NaN or an inf forward, not hide
    it (the attention's sums may be reordered, but NaN and inf keep their meaning)."""
    cache = make_cache([20, 7], seed=1)
    table = cache.device_block_table()
    slots, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
    for bad in (float("nan"), float("inf")):
        q = torch.randn(2, N_Q, D)
        q[1, 4, 3] = bad                            # one value of query head 4 of row 1
        assert cpu_decode_ops.decode_attention(q, cache, table, 1, slots, lens, 0.5)
        assert torch.isfinite(q[0]).all() and not torch.isfinite(q[1, 4]).any()
        x = torch.randn(2, 16)
        x[0, 5] = bad
        out = cpu_decode_ops.rms_norm(x, torch.randn(2, 16), torch.ones(16), 1e-6)
        assert not torch.isfinite(out[0]).all() and torch.isfinite(out[1]).all()


@pytest.mark.parametrize("entry", [-1, 48, 1 << 20])
def test_a_wild_table_entry_changes_nothing_and_the_backend_names_it(entry):
    cache = make_cache([20, 7], seed=1)
    table = cache.device_block_table().clone()
    table[0, 1, 1] = entry                          # tokens 16.. of slot 0, layer 1
    q = torch.randn(2, N_Q, D)
    before, buffer = q.clone(), cache.buffer.clone()
    slots, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
    assert not cpu_decode_ops.decode_attention(q, cache, table, 1, slots, lens, 0.5)
    assert torch.equal(q, before)
    cos, sin = rope_tables()
    qkv = torch.randn(1, (N_Q + 2 * N_KV) * D)
    qkv_before = qkv.clone()
    position, slot = torch.tensor([19], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    assert not cpu_decode_ops.rope_write_kv(qkv, N_Q, D, position, cos, sin, cache, table, 1,
                                            slot)
    assert torch.equal(qkv, qkv_before)
    assert torch.equal(cache.buffer.nan_to_num(7.0), buffer.nan_to_num(7.0))
    backend = TorchBackend("cpu")
    with pytest.raises(ValueError, match=r"decode_attention: block_table\[slot=0, layer=1, "
                                         r"logical_block=1\]"):
        backend.decode_attention(q, cache, table, 1, lens, slots, 0.5)
    with pytest.raises(ValueError, match=r"qkv_rope_write_kv: block_table\[slot=0, layer=1, "
                                         r"logical_block=1\]"):
        backend.qkv_rope_write_kv(torch.randn(1, 24), torch.randn(qkv.shape[1], 24), N_Q,
                                  position, cos, sin, cache, table, 1, slot)


def test_a_length_past_the_table_or_a_slot_layer_or_shape_outside_it_is_refused():
    """Numba does not check indices: every index the loops would follow is checked first."""
    cache = make_cache([20, 7], seed=1)
    table = cache.device_block_table()
    q = torch.randn(1, N_Q, D)
    width = table.shape[2] * cache.config.BLOCK_SIZE
    for slot, layer, length in ((0, 1, width + 1), (2, 1, 5), (-1, 1, 5), (0, 1, 0),
                                (0, 2, 5), (0, -1, 5)):
        assert not cpu_decode_ops.decode_attention(
            q, cache, table, layer, torch.tensor([slot], dtype=torch.int32),
            torch.tensor([length], dtype=torch.int32), 0.5)
    one = (torch.tensor([0], dtype=torch.int32), torch.tensor([5], dtype=torch.int32))
    assert not cpu_decode_ops.decode_attention(torch.randn(1, 4, D), cache, table, 1, *one, 0.5)
    assert not cpu_decode_ops.decode_attention(q, cache, table, 1, torch.tensor(
        [0, 1], dtype=torch.int32), one[1], 0.5)
    cos, sin = rope_tables()
    for heads, layer, position in ((N_Q - 1, 1, 3), (N_Q, 2, 3), (N_Q, 1, 80)):
        qkv = torch.randn(1, (N_Q + 2 * N_KV) * D)
        assert not cpu_decode_ops.rope_write_kv(
            qkv, heads, D, torch.tensor([position], dtype=torch.int32), cos, sin, cache, table,
            layer, one[0])


def test_the_torch_backend_takes_the_loops_for_decode_rows_only():
    """Up to MAX_ROWS float32 CPU rows go to the loops; more rows, another dtype, or a tensor
    that records gradients keep the torch ops."""
    x = torch.zeros(cpu_matvec.MAX_ROWS, 4)
    assert cpu_decode_ops.takes(x, torch.ones(4))
    assert not cpu_decode_ops.takes(torch.zeros(cpu_matvec.MAX_ROWS + 1, 4))
    assert not cpu_decode_ops.takes(x.bfloat16())
    assert not cpu_decode_ops.takes(x, torch.ones(4, requires_grad=True))
    cache = make_cache([3], seed=0)
    assert cpu_decode_ops.takes_cache(cache, torch.zeros(2, dtype=torch.int32))
    assert not cpu_decode_ops.takes_cache(make_bf16_cache())


def make_bf16_cache() -> pt.PagedKVCache:
    config = CacheConfig(num_layers=1, num_kv_heads=N_KV, head_dim=D, dtype="bfloat16",
                         kv_cache_bytes=4 * 2 * 16 * N_KV * D * 2, max_slots=1, max_seq_len=32)
    return pt.PagedKVCache(config)


def test_engine_tokens_and_logits_with_the_loops_match_the_torch_ops():
    """A whole engine run of a random float32 model (several slots, blocks crossed) against
    the same run with every op of the torch backend's own (a subclass that overrides the ops,
    which the loops then leave alone)."""

    class TorchOpsOnly(TorchBackend):
        def rms_norm(self, x, weight, eps):
            x32 = x.float()
            return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))

        def rope(self, q, k, positions, cos, sin):       # the generic qkv path
            super().rope(q, k, positions, cos, sin)

        def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots,
                             scale, max_seq_len=None):
            from paged_tutorial.backends.paged_reads import (decode_attention_rows,
                                                             gather_kv_rows)
            k, v = gather_kv_rows(cache, block_table, active_slots, layer,
                                  max_seq_len or cache.config.max_seq_len)
            q.copy_(decode_attention_rows(q, k, v, seq_lens.long(), scale))
            return q

    tiny = pt.ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                          head_dim=8, max_position_embeddings=256, tie_word_embeddings=False)
    model = pt.random_model(tiny, dtype="float32", seed=3)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 97, n).tolist() for n in (3, 15, 30)]
    runs = []
    for backend in (TorchBackend("cpu"), TorchOpsOnly("cpu")):
        engine = pt.Engine(model, backend=backend, max_slots=3, max_seq_len=96)
        engine.record_logits = True
        steps = []
        results = engine.generate(prompts, max_tokens=24, on_step=steps.append)
        runs.append(([r.token_ids for r in results], [s.logits for s in steps]))
    (tokens, logits), (want_tokens, want_logits) = runs
    assert tokens == want_tokens
    for got, want in zip(logits, want_logits):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
