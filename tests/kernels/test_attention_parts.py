"""The article kernel's replaceable parts (``attention.KernelParts``): the defaults are the
article's arithmetic (the kernel agrees with the torch oracle), a replaced part really runs
inside the kernel, and bad replacements are refused."""

from __future__ import annotations

import math

import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.teaching.oracles import clone_cache, kernel_device


def setup(head_dim=32, n=18, seed=0):
    cfg = pt.CacheConfig(num_layers=1, num_kv_heads=1, head_dim=head_dim, dtype="float32",
                         kv_cache_bytes=4 * 2 * 16 * head_dim * 4, max_slots=1, max_seq_len=32)
    cache = pt.PagedKVCache(cfg, kernel_device())
    cache.free_blocks = [2, 0, 3, 1]
    cache.ensure_capacity(0, n)
    g = torch.Generator().manual_seed(seed)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g).to(cache.buffer.device))
    q = torch.randn(1, 1, head_dim, generator=g)
    cpu = clone_cache(cache, "cpu")
    ref = TorchBackend().decode_attention(q.clone(), cpu, cpu.device_block_table(), 0,
                                          torch.tensor([n]), torch.tensor([0]), 0.25)
    return cache, q, ref, n


def run(cache, q, n, parts=attention.ARTICLE_PARTS):
    out = attention.decode(q.to(cache.buffer.device).clone(), cache, cache.device_block_table(),
                           0, [n], [0], 0.25, parts)
    return out.cpu()


def test_article_parts_match_the_oracle_and_the_backend_kernel():
    cache, q, ref, n = setup()
    torch.testing.assert_close(run(cache, q, n), ref, rtol=1e-5, atol=1e-5)
    assert attention.kernel_for(cache, "float32") is attention.make_paged_attention_kernel(
        "float32", 32, 16, 1, 2, 32, cache.config.BLOCK_ELEMS, cache.config.V_OFFSET_ELEMS)


def test_a_replaced_part_runs_inside_the_kernel():
    cache, q, ref, n = setup()

    def doubled(dot_products, HEAD_DIM, WARP_SIZE):     # scores twice as large
        return 2 * dot_products[0]
    out = run(cache, q, n, attention.ARTICLE_PARTS.replace(combine_warps=doubled))
    scaled = TorchBackend().decode_attention(
        q.clone(), clone_cache(cache, "cpu"), torch.from_numpy(cache.block_table), 0,
        torch.tensor([n]), torch.tensor([0]), 0.5)
    torch.testing.assert_close(out, scaled, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, ref, atol=1e-3)


def test_parts_are_checked():
    with pytest.raises(TypeError, match="no part named"):
        attention.ARTICLE_PARTS.replace(k_address=lambda *a: 0)
    with pytest.raises(TypeError, match="must be a plain Python function"):
        attention.ARTICLE_PARTS.replace(k_index=3)
    with pytest.raises(TypeError, match="must be a plain Python function"):
        attention.ARTICLE_PARTS.replace(k_index=print)
    with pytest.raises(TypeError, match="KernelParts"):
        attention.make_paged_attention_kernel("float32", 32, 16, 1, 2, 32, 1024, 512, parts=None)
    assert hash(attention.ARTICLE_PARTS) == hash(attention.KernelParts())


def test_default_parts_in_plain_python():
    assert attention.blocks_to_read(33, 16) == 3 and attention.blocks_to_read(32, 16) == 2
    assert attention.tokens_in_block(33, 2, 16) == 1 and attention.tokens_in_block(48, 2, 16) == 16
    assert attention.block_table_index(1, 3, 5, 16, 128) == 1 * 16 * 128 + 3 * 128 + 5
    assert attention.k_index(2, 3, 1, 4, 1024, 64, 32) == 2 * 1024 + 3 * 64 + 32 + 4
    assert attention.combine_warps([1.0, 2.0, 4.0], 80, 32) == 7.0
    m, d, acc = attention.softmax_update(-math.inf, 0.0, 0.0, 1.0, 3.0)
    assert (m, d, acc) == (1.0, 1.0, 3.0)
    m, d, acc = attention.softmax_update(m, d, acc, 2.0, 5.0)
    assert m == 2.0 and d == pytest.approx(math.exp(-1) + 1)
    assert acc == pytest.approx(3 * math.exp(-1) + 5)
    assert len(attention.DEPARTURES) >= 5 and all(d.article.startswith("kernels.cu")
                                                  for d in attention.DEPARTURES)


def test_the_articles_score_layout_builds_and_agrees_in_the_simulator():
    """ARTICLE_LAYOUT_PARTS writes the score back into dot_products[0] (kernels.cu:505, 508),
    the layout benchmarks/racecheck.py checks on a GPU.  Run sequentially (the simulator, or a
    GPU where the race does not strike) it computes the same attention; it is a separate
    kernel, and the default stays the port's own score cell."""
    cache, q, ref, n = setup(head_dim=64)
    own = attention.kernel_for(cache, "float32")
    article = attention.kernel_for(cache, "float32", attention.ARTICLE_LAYOUT_PARTS)
    assert own is not article
    assert own is attention.kernel_for(cache, "float32", attention.KernelParts())
    assert attention.ARTICLE_LAYOUT_PARTS.replaced() == ("token_score",)
    out = run(cache, q, n, attention.ARTICLE_LAYOUT_PARTS)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_body_parts_call_each_other_by_part_name_without_imports():
    """A reader's body part names the helpers (load, BLOCK_SIZE, token_score...) without
    importing them, and is called by its part name whatever its own name: the factory binds
    them.  Here a renamed walk_blocks that reads only the first block sees 16 of 18 tokens."""
    cache, q, ref, n = setup()

    def my_walk(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id, owns_dim,
                q_val, scale, dot_products, score):
        current_max = float32(-math.inf)                                      # noqa: F821
        d = float32(0.0)                                                      # noqa: F821
        acc = float32(0.0)                                                    # noqa: F821
        physical_block = block_table[slot * N_LAYERS * MAX_BLOCKS_PER_SEQ      # noqa: F821
                                     + layer * MAX_BLOCKS_PER_SEQ]             # noqa: F821
        for token in range(BLOCK_SIZE):                                        # noqa: F821
            e = (physical_block * BLOCK_ELEMS + token * KV_DIM                 # noqa: F821
                 + kv_head * HEAD_DIM + thread_id)                             # noqa: F821
            s = token_score(q_val, load(kv_cache, e), thread_id, scale,         # noqa: F821
                            dot_products, score)
            current_max, d, acc = softmax_update(current_max, d, acc, s,      # noqa: F821
                                                 load(kv_cache, e + V_OFFSET_ELEMS))  # noqa: F821
        return current_max, d, acc

    out = run(cache, q, n, attention.ARTICLE_PARTS.replace(walk_blocks=my_walk))
    cpu = clone_cache(cache, "cpu")
    first_block = TorchBackend().decode_attention(q.clone(), cpu, cpu.device_block_table(), 0,
                                                  torch.tensor([16]), torch.tensor([0]), 0.25)
    torch.testing.assert_close(out, first_block, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, ref, atol=1e-3)


def _doubled_score(x):                  # a reader's own helper, at the notebook's top level
    return 2 * x


def test_helpers_a_part_calls_become_device_functions():
    """A part may call plain functions of the reader's own, through a global name or a closure:
    each is compiled as a device function with the same bindings (on a GPU a kernel cannot call
    Python; the simulator would have hidden that), and the kernel uses them."""
    cache, q, ref, n = setup()
    offset = lambda: 0                                                  # noqa: E731

    def combine_twice(dot_products, HEAD_DIM, WARP_SIZE):
        total = float32(0.0)                                                  # noqa: F821
        for w in range(NUM_WARPS):                                            # noqa: F821
            total += dot_products[w + offset()]
        return _doubled_score(total)

    parts = attention.ARTICLE_PARTS.replace(combine_warps=combine_twice)
    compiled = attention.compile_parts(parts, {name: 1 for name in attention.BUILD_NAMES})
    device_type = type(compiled["walk_blocks"])
    py_func = compiled["combine_warps"].py_func
    assert isinstance(py_func.__globals__["_doubled_score"], device_type)
    assert [type(c.cell_contents) for c in py_func.__closure__] == [device_type]
    assert _doubled_score(1) == 2 and not isinstance(_doubled_score, device_type)

    out = run(cache, q, n, parts)
    scaled = TorchBackend().decode_attention(
        q.clone(), clone_cache(cache, "cpu"), torch.from_numpy(cache.block_table), 0,
        torch.tensor([n]), torch.tensor([0]), 0.5)
    torch.testing.assert_close(out, scaled, rtol=1e-5, atol=1e-5)


def test_build_options_are_checked():
    with pytest.raises(TypeError, match="lineinfo"):
        attention.make_paged_attention_kernel("float32", 32, 16, 1, 2, 32, 1024, 512,
                                              lineinfo="yes")
