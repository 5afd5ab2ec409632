"""Decode attention over the paged cache: the article's ``pagedAttentionKernel``
(``src/kernels.cu:461-527``), ported to Numba line by line.

The port is deliberately *not* optimised: it is the kernel the article reads, and the chapter
notebooks run it.  Its shape:

- grid = (active slots, Q heads), one block per (sequence of the batch, query head);
  blockDim = head_dim threads (rounded up to whole warps), one per dimension (64 = 2 warps
  for Llama-3.2-1B).
- For every cached token, each thread multiplies one q*k element; five ``shfl_down_sync``
  (offsets 16, 8, 4, 2, 1) sum each warp into its lane 0; the warp leaders write one shared
  float each, ``syncthreads``, thread 0 adds them and scales, ``syncthreads``, and every thread
  reads the score.
- An online softmax (running max, correction ``exp(old_max - new_max)``, denominator ``d``,
  accumulator ``acc``) in which each thread owns one output dimension.
- The output is written over q (in place, ``kernels.cu:469,522``).

Two index spaces, as in the article: the compact ``active_slot`` (= blockIdx.x: the row of q,
seq_lens and active_slots) and the real cache ``slot = active_slots[active_slot]``, which is
what the block table is indexed by.

Where this port departs from the article, on purpose:
1. **head_dim (the article's limit 2).**  The article's reduction hard-codes two warps
   (``dot_products[0..1]``, threads 0 and 32), valid only for HEAD_DIM = 64.  Here the block
   has ``head_dim`` threads rounded up to whole warps (``block_threads``) and one shared float per
   warp; the extra lanes of a partial last warp hold a zero product and write nothing.  So any
   head_dim from 1 to 1024 works (16, 64, 80, 128, ...); for 64 it is exactly the article's
   two-warp path.  Larger head dims (more than 1024 threads per block) are rejected with a
   ValueError by ``make_paged_attention_kernel``.
2. **GQA ratio**: ``kv_head = q_head // q_per_kv`` for any ratio (the article hard-codes / 4).
3. **Scale** is the ``scale`` argument (the article divides by SQRT_HEAD_DIM = 8).
4. **A race removed (the article's limit 3).**  The article stores the summed score back into
   ``dot_products[0]``.  In the next token's step, thread 0 writes its warp's partial sum into
   that same ``dot_products[0]``, possibly before warp 1 has read the previous score: nothing
   orders warp 1's read after the second barrier against warp 0's next write.  The score here
   lives in its own shared cell, ``score[0]``; every write is then separated from the last read
   of the same cell by a barrier, with no extra barrier per token.
5. Constants (BLOCK_SIZE, N_LAYERS, MAX_BLOCKS_PER_SEQ, KV_DIM, BLOCK_ELEMS, V_OFFSET_ELEMS,
   HEAD_DIM) are closure constants taken from the cache's ``CacheConfig``, not literals
   repeated in the kernel (the article's ``kernels.cu:6`` TODO), and addresses are counted in
   elements (``*_ELEMS``) rather than bytes.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

from .dtypes import DTYPE_OPS

WARP_SIZE = 32
WARP_FULL_MASK = 0xFFFFFFFF     # the article's WARP_FULL_MASK on CUDA (32 lanes)
MAX_THREADS_PER_BLOCK = 1024


def check_head_dim(head_dim: int) -> None:
    """The decode kernel runs one thread per dimension in one block (see limit 2 above)."""
    if not 1 <= head_dim <= MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"paged_attention_kernel: head_dim={head_dim} is not supported: the kernel runs one "
            f"thread per head dimension in a single thread block, so head_dim must be between "
            f"1 and {MAX_THREADS_PER_BLOCK} (CUDA's limit of threads per block)")


def block_threads(head_dim: int) -> int:
    """Threads per block: head_dim rounded up to whole warps (64 -> 64, 16 -> 32, 80 -> 96)."""
    return -(-head_dim // WARP_SIZE) * WARP_SIZE


@functools.lru_cache(maxsize=None)
def make_paged_attention_kernel(dtype_name: str, HEAD_DIM: int, BLOCK_SIZE: int, N_LAYERS: int,
                                MAX_BLOCKS_PER_SEQ: int, KV_DIM: int, BLOCK_ELEMS: int,
                                V_OFFSET_ELEMS: int):
    """Compile (lazily, once per dtype and cache layout) the decode attention kernel.

    Launch: ``grid = (num_active_slots, num_q_heads)``, ``block = block_threads(HEAD_DIM)``."""
    check_head_dim(HEAD_DIM)
    NUM_WARPS = block_threads(HEAD_DIM) // WARP_SIZE       # the article: 2
    ops = DTYPE_OPS[dtype_name]
    load, store = ops.load, ops.store

    @cuda.jit
    def paged_attention_kernel(layer, q, q_row_stride, kv_cache, block_table, seq_lens,
                               active_slots, q_per_kv, scale):
        # --- kernels.cu:464-469: who am I? --------------------------------------------
        active_slot = cuda.blockIdx.x              # compact index: row of q / seq_lens
        slot = active_slots[active_slot]           # real cache slot: for the block table
        q_head = cuda.blockIdx.y
        thread_id = cuda.threadIdx.x               # one thread per head dimension
        kv_head = q_head // q_per_kv               # GQA (the article: q_head / 4)
        owns_dim = thread_id < HEAD_DIM            # False only in a partial last warp
        q_index = active_slot * q_row_stride + q_head * HEAD_DIM + thread_id
        q_val = float32(0.0)
        if owns_dim:
            q_val = load(q, q_index)               # read once; the output goes here too

        dot_products = cuda.shared.array(NUM_WARPS, float32)   # one partial sum per warp
        score = cuda.shared.array(1, float32)                  # the token's scaled q.k

        # --- kernels.cu:470-471: how many blocks to read ----------------------------------
        seq_len = seq_lens[active_slot]
        num_blocks = (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE

        # --- kernels.cu:473-476: online softmax state ---------------------------------
        current_max = float32(-math.inf)
        acc = float32(0.0)
        d = float32(0.0)                           # denominator

        for logical_block in range(num_blocks):         # kernels.cu:478
            # --- kernels.cu:480: logical -> physical, via the three-term index ----------
            physical_block = block_table[slot * N_LAYERS * MAX_BLOCKS_PER_SEQ
                                         + layer * MAX_BLOCKS_PER_SEQ + logical_block]
            # --- kernels.cu:481: the last block may be partly filled --------------------
            tokens_in_block = min(seq_len - logical_block * BLOCK_SIZE, BLOCK_SIZE)
            for token in range(tokens_in_block):       # kernels.cu:482
                # --- kernels.cu:484-485: physical block -> element addresses ------------
                k_index = (physical_block * BLOCK_ELEMS + token * KV_DIM
                           + kv_head * HEAD_DIM + thread_id)
                v_index = k_index + V_OFFSET_ELEMS

                # --- kernels.cu:486-493: one product each, warp shuffle tree ------------
                qk = float32(0.0)
                if owns_dim:
                    qk = q_val * load(kv_cache, k_index)
                qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 16)
                qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 8)
                qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 4)
                qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 2)
                qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 1)

                # --- kernels.cu:494-502: each warp's lane 0 publishes its sum ------------
                if thread_id % WARP_SIZE == 0:
                    dot_products[thread_id // WARP_SIZE] = qk
                cuda.syncthreads()

                # --- kernels.cu:503-507: thread 0 adds the warps and scales --------------
                if thread_id == 0:
                    total = float32(0.0)
                    for w in range(NUM_WARPS):
                        total += dot_products[w]
                    score[0] = total * float32(scale)  # own cell: see note 4 in the docstring
                cuda.syncthreads()
                dot_product = score[0]             # kernels.cu:508

                # --- kernels.cu:509-519: online softmax update ------------------------
                new_max = current_max
                if dot_product > current_max:
                    new_max = dot_product
                correction = math.exp(current_max - new_max)
                current_max = new_max
                exp_score = math.exp(dot_product - current_max)
                d = d * correction + exp_score
                if owns_dim:
                    acc = acc * correction + exp_score * load(kv_cache, v_index)

        # --- kernels.cu:522: the output overwrites q ----------------------------------
        if owns_dim:
            store(q, q_index, acc / d)

    return paged_attention_kernel
