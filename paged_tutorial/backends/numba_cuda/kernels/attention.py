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

**The kernel's parts.**  The kernel's body is four plain Python functions below, compiled as
device functions and run by every thread of the launch: ``walk_blocks`` (the loop over logical
blocks, the table lookup and the K/V addresses), ``token_score`` (one token's q.k: shuffle
tree, per-warp publish to shared memory, barriers, cross-warp combine, scale, hand-off),
``softmax_update`` (one online-softmax step) and ``write_output`` (the in-place store).  The
article's versions call five smaller steps (``blocks_to_read``, ``block_table_index``,
``tokens_in_block``, ``k_index``, ``combine_warps``).  ``KernelParts`` names all nine;
``ARTICLE_PARTS`` is the article's version of each, and a puzzle builds the same kernel with
some replaced by the reader's functions (``ARTICLE_PARTS.replace(walk_blocks=mine)``).  The
parts call each other, the device helpers (``load``, ``store``, ``cuda``) and the constants
(``BLOCK_SIZE``, ``HEAD_DIM``, ...) by name: ``compile_parts`` binds those names per build
(``BUILD_NAMES``), so the reader's functions need no imports.

Where this port departs from the article, on purpose: see ``DEPARTURES`` (one entry each, with
the article's lines; ``kernel_source`` (notebook 03) shows them next to the code).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from typing import Callable, NamedTuple

from numba import cuda, float32

from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel, global_names

# the article's WARP_FULL_MASK: all 32 lanes of a warp
from paged_tutorial.backends.warp import FULL_MASK as WARP_FULL_MASK  # noqa: E402
from paged_tutorial.backends.warp import WARP_SIZE  # noqa: E402

MAX_THREADS_PER_BLOCK = 1024


class Departure(NamedTuple):
    """One way this port differs from the article's kernel, and why."""

    title: str
    article: str            # the article's lines (``kernels.cu:...``) it concerns
    text: str               # what the article does, and what is wrong with it or limited
    fix: str = ""           # how the port does it instead
    puzzle: str = ""        # the puzzle in which the reader writes that fix herself


DEPARTURES: tuple[Departure, ...] = (
    Departure(
        "any head_dim (the article's limit 2)", "kernels.cu:494-507",
        "The article's reduction hard-codes two warps (dot_products[0..1], threads 0 and 32), "
        "valid only for HEAD_DIM = 64.  Any head_dim from 1 to 1024 works here (16, 64, 80, "
        "128, ...); for 64 it is exactly the article's two-warp path.  Larger head dims (more "
        "than 1024 threads per block) are refused with a ValueError.",
        fix="The block has head_dim threads rounded up to whole warps (block_threads) and one "
            "shared float per warp; the extra lanes of a partial last warp hold a zero product "
            "and write nothing.",
        puzzle="04.token_score"),
    Departure(
        "any GQA ratio", "kernels.cu:468",
        "kv_head = q_head // q_per_kv for any ratio; the article divides by 4."),
    Departure(
        "the scale is an argument", "kernels.cu:505",
        "The score is multiplied by the scale argument; the article divides by SQRT_HEAD_DIM = "
        "8, a second place where it assumes head_dim 64."),
    Departure(
        "a race removed (the article's limit 3)", "kernels.cu:502-508",
        "The article stores the summed score back into dot_products[0].  In the next token's "
        "step, thread 0 writes its warp's partial sum into that same dot_products[0], possibly "
        "before warp 1 has read the previous score: nothing orders warp 1's read after the "
        "second barrier against warp 0's next write.  The article's layout can still be built "
        "(ARTICLE_LAYOUT_PARTS), only to show the race: the simulator's shared-memory "
        "access log and benchmarks/racecheck.py (compute-sanitizer) both flag it.",
        fix="The score lives in its own shared cell, score[0]; every write is then separated "
            "from the last read of the same cell by a barrier, with no extra barrier per token.",
        puzzle="04.token_score"),
    Departure(
        "constants from one definition, addresses in elements", "kernels.cu:6, 16-19, 484-485",
        "BLOCK_SIZE, N_LAYERS, MAX_BLOCKS_PER_SEQ, KV_DIM, BLOCK_ELEMS, V_OFFSET_ELEMS and "
        "HEAD_DIM are closure constants taken from the cache's CacheConfig, not literals "
        "repeated in the kernel (the article's kernels.cu:6 TODO), and addresses are counted "
        "in elements (the *_ELEMS constants) rather than in bytes: a byte offset is the "
        "element index times the item size (2 for bf16)."),
    Departure(
        "storage dtypes", "kernels.cu:461",
        "The cache may hold bfloat16, float16 or float32 (dtypes.py load/store); every sum is "
        "float32, as in the article.  The article's kernel reads __nv_bfloat16 only."),
    Departure(
        "the body is made of device functions", "kernels.cu:470-522",
        "The loop over blocks (walk_blocks), the score of one token (token_score), the "
        "online-softmax update (softmax_update) and the store (write_output), and inside them "
        "the block count, the table index, the fill of a block, the K address and the "
        "cross-warp combine, are device functions (KernelParts) rather than inline code, so "
        "that a puzzle can compile the same kernel with any of them written by the reader.  "
        "Numba inlines them; the arithmetic is the article's."),
)


def check_head_dim(head_dim: int) -> None:
    """The decode kernel runs one thread per dimension in one block (see DEPARTURES[0])."""
    if not 1 <= head_dim <= MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"paged_attention_kernel: head_dim={head_dim} is not supported: the kernel runs one "
            f"thread per head dimension in a single thread block, so head_dim must be between "
            f"1 and {MAX_THREADS_PER_BLOCK} (CUDA's limit of threads per block)")


def block_threads(head_dim: int) -> int:
    """Threads per block: head_dim rounded up to whole warps (64 -> 64, 16 -> 32, 80 -> 96)."""
    return -(-head_dim // WARP_SIZE) * WARP_SIZE


# =========================================================================================
# The kernel's parts: plain Python, compiled as device functions by the kernel factory.
#
# Every part may call every other part, the device helpers and the build's constants by name:
# the factory compiles a copy of each function whose globals bind these names (``BUILD_NAMES``)
# to this build's versions, so a reader's ``walk_blocks`` calls her own ``token_score`` once
# both are hers.
# =========================================================================================

#: the names a part may use without importing them; the kernel factory binds each one
BUILD_NAMES = ("cuda", "math", "float32", "load", "store", "BLOCK_SIZE", "N_LAYERS",
               "MAX_BLOCKS_PER_SEQ", "KV_DIM", "BLOCK_ELEMS", "V_OFFSET_ELEMS", "HEAD_DIM",
               "NUM_WARPS", "WARP_SIZE", "WARP_FULL_MASK")


def blocks_to_read(seq_len, BLOCK_SIZE):
    """kernels.cu:471: how many logical blocks hold the sequence's ``seq_len`` tokens
    (the division rounded up: the last block may be partly filled)."""
    return (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE


def block_table_index(slot, layer, logical_block, N_LAYERS, MAX_BLOCKS_PER_SEQ):
    """kernels.cu:480: the flat block-table entry of (cache slot, layer, logical block): the
    article's three-term index over a table of [slots][N_LAYERS][MAX_BLOCKS_PER_SEQ]."""
    return slot * N_LAYERS * MAX_BLOCKS_PER_SEQ + layer * MAX_BLOCKS_PER_SEQ + logical_block


def tokens_in_block(seq_len, logical_block, BLOCK_SIZE):
    """kernels.cu:481: how many tokens of logical block ``logical_block`` hold data (BLOCK_SIZE
    for every block but possibly the last)."""
    return min(seq_len - logical_block * BLOCK_SIZE, BLOCK_SIZE)


def k_index(physical_block, token, kv_head, thread_id, BLOCK_ELEMS, KV_DIM, HEAD_DIM):
    """kernels.cu:484: the element of the cache buffer holding dimension ``thread_id`` of kv
    head ``kv_head``'s K vector for row ``token`` of ``physical_block`` (the article's byte
    address divided by the item size).  V is ``V_OFFSET_ELEMS`` further (kernels.cu:485)."""
    return physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM + thread_id


def combine_warps(dot_products, HEAD_DIM, WARP_SIZE):
    """kernels.cu:503-506 (thread 0, after the barrier): add the per-warp partial sums
    ``dot_products[w]`` into the whole q.k; the block has HEAD_DIM threads rounded up to whole
    warps, so ceil(HEAD_DIM / WARP_SIZE) cells (the article adds exactly two)."""
    total = float32(0.0)
    for w in range((HEAD_DIM + WARP_SIZE - 1) // WARP_SIZE):
        total += dot_products[w]
    return total


def walk_blocks(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id, owns_dim,
                q_val, scale, dot_products, score):
    """kernels.cu:470-485 and the loops around 486-519: every thread of the block walks the
    sequence's logical blocks, looks each one up in the block table, and for every token it
    holds loads this thread's K element, gets the token's score (``token_score``), loads its V
    element and folds both into the online softmax (``softmax_update``).  Returns the state
    (current_max, d, acc) after the last token.  A thread with ``owns_dim`` False (the tail of
    a partial last warp) reads nothing and works with zeros."""
    # --- kernels.cu:471: how many blocks to read ------------------------------------------
    num_blocks = blocks_to_read(seq_len, BLOCK_SIZE)
    # --- kernels.cu:473-476: online softmax state -----------------------------------------
    current_max = float32(-math.inf)
    acc = float32(0.0)
    d = float32(0.0)                                   # denominator
    # --- kernels.cu:478: one logical block at a time --------------------------------------
    for logical_block in range(num_blocks):
        # --- kernels.cu:480: logical -> physical, via the three-term index ------------------
        physical_block = block_table[block_table_index(slot, layer, logical_block, N_LAYERS,
                                                       MAX_BLOCKS_PER_SEQ)]
        # --- kernels.cu:481: the last block may be partly filled ----------------------------
        n_tokens = tokens_in_block(seq_len, logical_block, BLOCK_SIZE)
        # --- kernels.cu:482: one token of the block at a time -------------------------------
        for token in range(n_tokens):
            # --- kernels.cu:484-485: physical block -> element addresses --------------------
            k_elem = k_index(physical_block, token, kv_head, thread_id, BLOCK_ELEMS, KV_DIM,
                             HEAD_DIM)
            k = float32(0.0)
            if owns_dim:
                k = load(kv_cache, k_elem)
            # the token's score, kernels.cu:486-508 (token_score)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            # --- kernels.cu:509-519: online softmax update ------------------------------------
            v = float32(0.0)
            if owns_dim:
                v = load(kv_cache, k_elem + V_OFFSET_ELEMS)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def token_score(q_val, k, thread_id, scale, dot_products, score):
    """kernels.cu:486-508: the scaled q.k of one token, returned to every thread of the block.
    Each thread multiplies its q and k elements; five ``shfl_down_sync`` (16, 8, 4, 2, 1) sum
    each warp into its lane 0; lane 0 of every warp publishes the warp's sum in
    ``dot_products[warp]``; a barrier; thread 0 adds the warps (``combine_warps``), scales,
    and writes the score into its own shared cell ``score[0]``; a barrier; every thread reads
    it.  The next token's publish writes ``dot_products`` only, so no cell is written while
    another thread may still read it (the article's race, DEPARTURES)."""
    # --- kernels.cu:486-493: one product each, warp shuffle tree --------------------------
    qk = q_val * k
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 16)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 8)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 4)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 2)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 1)
    # --- kernels.cu:494-502: each warp's lane 0 publishes its sum --------------------------
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    # --- kernels.cu:503-508: thread 0 adds the warps and scales; all read ------------------
    if thread_id == 0:
        score[0] = combine_warps(dot_products, HEAD_DIM, WARP_SIZE) * scale
    cuda.syncthreads()
    return score[0]                                    # the port: the score's own cell


def token_score_in_dot_products(q_val, k, thread_id, scale, dot_products, score):
    """``token_score`` with the article's hand-off (kernels.cu:505, 508): the score is written
    back into ``dot_products[0]``, which thread 0 overwrites with the next token's warp sum
    while other warps may still be reading it.  Racy: built only to show the race
    (``ARTICLE_LAYOUT_PARTS``, benchmarks/racecheck.py, the shared-memory access log)."""
    # --- kernels.cu:486-493: one product each, warp shuffle tree --------------------------
    qk = q_val * k
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 16)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 8)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 4)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 2)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 1)
    # --- kernels.cu:494-502: each warp's lane 0 publishes its sum --------------------------
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    # --- kernels.cu:503-508: thread 0 adds, scales and writes back into dot_products[0] -----
    if thread_id == 0:
        dot_products[0] = combine_warps(dot_products, HEAD_DIM, WARP_SIZE) * scale
    cuda.syncthreads()
    return dot_products[0]


def softmax_update(current_max, d, acc, score, v):
    """kernels.cu:509-519: fold one token (its scaled score and this thread's V element) into
    the running max, the denominator d and the accumulator acc; returns the three new values.
    When the max rises, the old d and acc are rescaled by exp(old max - new max)."""
    new_max = current_max
    if score > current_max:
        new_max = score
    correction = math.exp(current_max - new_max)
    exp_score = math.exp(score - new_max)
    return new_max, d * correction + exp_score, acc * correction + exp_score * v


def write_output(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    """kernels.cu:522: this thread's output dimension, acc / d, written over q at the very
    element the thread read its q from (kernels.cu:469): the output is in place.  Threads past
    HEAD_DIM (a partial last warp) own no element and write nothing."""
    if thread_id < HEAD_DIM:
        store(q, active_slot * q_row_stride + q_head * HEAD_DIM + thread_id, acc / d)


@dataclasses.dataclass(frozen=True)
class KernelParts:
    """The replaceable steps of the kernel: plain Python functions with the signatures of the
    article's versions above.  The small steps (block count, table index, fill of a block, K
    address, cross-warp combine) are called by the article's body parts (``walk_blocks``,
    ``token_score``, ``softmax_update``, ``write_output``); a reader's body part may call them
    or do the arithmetic itself.  Hashable: the kernel factory caches one kernel per set."""

    blocks_to_read: Callable = blocks_to_read
    block_table_index: Callable = block_table_index
    tokens_in_block: Callable = tokens_in_block
    k_index: Callable = k_index
    combine_warps: Callable = combine_warps
    walk_blocks: Callable = walk_blocks
    token_score: Callable = token_score
    softmax_update: Callable = softmax_update
    write_output: Callable = write_output

    def replace(self, **parts: Callable) -> "KernelParts":
        """A copy with some parts replaced (``parts`` named as the fields)."""
        names = set(PART_NAMES)
        unknown = sorted(set(parts) - names)
        if unknown:
            raise TypeError(f"KernelParts: no part named {', '.join(unknown)}; the parts are "
                            f"{', '.join(PART_NAMES)}")
        for name, fn in parts.items():
            if not isinstance(fn, types.FunctionType):
                raise TypeError(f"KernelParts.{name} must be a plain Python function (def ...), "
                                f"got {type(fn).__name__}")
        return dataclasses.replace(self, **parts)

    def replaced(self) -> tuple[str, ...]:
        """The names of the parts that differ from the article's."""
        return tuple(n for n in PART_NAMES if getattr(self, n) is not getattr(ARTICLE_PARTS, n))


#: every part's name, in the order the kernel reaches them
PART_NAMES = tuple(f.name for f in dataclasses.fields(KernelParts))
#: the article's arithmetic for every part
ARTICLE_PARTS = KernelParts()
#: the article's layout of the score hand-off (the race of DEPARTURES), everything else as
#: ARTICLE_PARTS; for showing the race only
ARTICLE_LAYOUT_PARTS = ARTICLE_PARTS.replace(token_score=token_score_in_dot_products)


def compile_parts(parts: KernelParts, constants: dict) -> dict:
    """Every part of ``parts`` as a device function, by part name.  Each is compiled from a
    copy of the function whose globals are its own module's (or notebook's) plus
    ``constants`` (the ``BUILD_NAMES``) and every other compiled part, so the parts call
    each other by their part names whatever the functions themselves are called; a part name
    that a reader's function finds bound to a function she wrote herself stays hers.

    A plain Python function that a part calls (a helper the reader wrote beside it, through
    a global name or a closure) is compiled the same way, as a device function: the
    simulator would run it as Python anyway, and on a GPU a kernel cannot call Python."""
    missing = sorted(set(BUILD_NAMES) - set(constants))
    if missing:
        raise ValueError(f"compile_parts: constants lack {', '.join(missing)}")
    bound = dict(constants)
    namespaces: list[tuple[dict, set]] = []
    helpers: dict = {}
    for name in PART_NAMES:
        bound[name] = _as_device_function(getattr(parts, name), bound, namespaces, helpers)
    for namespace, own in namespaces:       # compiled lazily: bind before the first call
        namespace.update((n, v) for n, v in bound.items() if n not in own)
    return bound


def own_function(value) -> bool:
    """A plain function the reader wrote (not the package's): a part's name bound to one in
    her namespace calls hers, never the build's part of that name."""
    return _is_helper(value) and not str(value.__module__).startswith("paged_tutorial.")


def _as_device_function(fn: types.FunctionType, bound: dict, namespaces: list, helpers: dict):
    """``fn`` as a device function whose globals get ``bound`` (filled in by the caller
    before the first call) and whose plain-function globals and closure cells are device
    functions too, recursively (``helpers`` holds the ones made, so each is made once)."""
    if fn in helpers:
        return helpers[fn]
    namespace = dict(fn.__globals__)
    cells = None
    if fn.__closure__ is not None:
        cells = tuple(types.CellType() for _ in fn.__closure__)
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, cells)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__doc__ = fn.__doc__
    copy.__module__ = fn.__module__
    device_fn = cuda.jit(device=True)(copy)
    helpers[fn] = device_fn                 # before recursing: a helper may call itself
    own: set = set()                        # part names this function's globals define
    namespaces.append((namespace, own))
    for name in global_names(fn.__code__):
        value = namespace.get(name)
        if name in PART_NAMES and own_function(value):
            own.add(name)
            namespace[name] = _as_device_function(value, bound, namespaces, helpers)
        elif name not in BUILD_NAMES and name not in PART_NAMES and _is_helper(value):
            namespace[name] = _as_device_function(value, bound, namespaces, helpers)
    for cell, original in zip(cells or (), fn.__closure__ or ()):
        try:
            value = original.cell_contents
        except ValueError:                  # a free variable not assigned yet
            continue
        cell.cell_contents = (_as_device_function(value, bound, namespaces, helpers)
                              if _is_helper(value) else value)
    return device_fn


def _is_helper(value) -> bool:
    """A plain Python function (``def`` or ``lambda``), not a compiled one or a builtin."""
    return isinstance(value, types.FunctionType)


def check_build_options(lineinfo: bool) -> None:
    if not isinstance(lineinfo, bool):
        raise TypeError(f"lineinfo must be True or False, got {lineinfo!r}")


def make_paged_attention_kernel(dtype_name: str, HEAD_DIM: int, BLOCK_SIZE: int, N_LAYERS: int,
                                MAX_BLOCKS_PER_SEQ: int, KV_DIM: int, BLOCK_ELEMS: int,
                                V_OFFSET_ELEMS: int, parts: KernelParts = ARTICLE_PARTS,
                                lineinfo: bool = False):
    """Compile (lazily, once per dtype, cache layout, set of parts and build option) the decode
    attention kernel.

    ``parts``: the body and its steps (``KernelParts``; ``ARTICLE_LAYOUT_PARTS`` rebuilds the
    article's racy score hand-off).  ``lineinfo``: compile with source line information so
    that compute-sanitizer names source lines (on a GPU; the simulator ignores it).

    Launch: ``grid = (num_active_slots, num_q_heads)``, ``block = block_threads(HEAD_DIM)``."""
    check_head_dim(HEAD_DIM)
    if not isinstance(parts, KernelParts):
        raise TypeError(f"make_paged_attention_kernel: parts must be a KernelParts, got "
                        f"{type(parts).__name__}")
    check_build_options(lineinfo)
    return build_kernel(dtype_name, HEAD_DIM, BLOCK_SIZE, N_LAYERS, MAX_BLOCKS_PER_SEQ, KV_DIM,
                         BLOCK_ELEMS, V_OFFSET_ELEMS, parts, lineinfo)


@functools.lru_cache(maxsize=64)
def build_kernel(dtype_name, HEAD_DIM, BLOCK_SIZE, N_LAYERS, MAX_BLOCKS_PER_SEQ, KV_DIM,
                  BLOCK_ELEMS, V_OFFSET_ELEMS, parts, lineinfo):
    from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

    NUM_WARPS = block_threads(HEAD_DIM) // WARP_SIZE       # the article: 2
    jit_options = {"lineinfo": True} if lineinfo and not SIMULATING else {}
    ops = DTYPE_OPS[dtype_name]
    load = ops.load
    compiled = compile_parts(parts, {
        "cuda": cuda, "math": math, "float32": float32, "load": ops.load, "store": ops.store,
        "BLOCK_SIZE": BLOCK_SIZE, "N_LAYERS": N_LAYERS, "MAX_BLOCKS_PER_SEQ": MAX_BLOCKS_PER_SEQ,
        "KV_DIM": KV_DIM, "BLOCK_ELEMS": BLOCK_ELEMS, "V_OFFSET_ELEMS": V_OFFSET_ELEMS,
        "HEAD_DIM": HEAD_DIM, "NUM_WARPS": NUM_WARPS, "WARP_SIZE": WARP_SIZE,
        "WARP_FULL_MASK": WARP_FULL_MASK})
    walk_blocks = compiled["walk_blocks"]
    write_output = compiled["write_output"]

    @cached_kernel(**jit_options)
    def paged_attention_kernel(layer, q, q_row_stride, kv_cache, block_table, seq_lens,
                               active_slots, q_per_kv, scale):
        # --- kernels.cu:464-469: who am I? --------------------------------------------
        active_slot = cuda.blockIdx.x              # compact index: row of q / seq_lens
        slot = active_slots[active_slot]           # real cache slot: for the block table
        q_head = cuda.blockIdx.y
        thread_id = cuda.threadIdx.x               # one thread per head dimension
        kv_head = q_head // q_per_kv               # GQA (the article: q_head / 4)
        owns_dim = thread_id < HEAD_DIM            # False only in a partial last warp
        q_val = float32(0.0)
        if owns_dim:                               # read once; the output goes here too
            q_val = load(q, active_slot * q_row_stride + q_head * HEAD_DIM + thread_id)

        dot_products = cuda.shared.array(NUM_WARPS, float32)   # one partial sum per warp
        score = cuda.shared.array(1, float32)                  # the token's scaled q.k

        # the body, kernels.cu:470-521: blocks, scores, online softmax (walk_blocks)
        seq_len = seq_lens[active_slot]
        current_max, d, acc = walk_blocks(kv_cache, block_table, slot, layer, seq_len,
                                          kv_head, thread_id, owns_dim, q_val,
                                          float32(scale), dot_products, score)

        # --- kernels.cu:522: the output overwrites q ----------------------------------
        write_output(q, q_row_stride, active_slot, q_head, thread_id, acc, d)

    return paged_attention_kernel


def kernel_for(cache, dtype_name: str, parts: KernelParts = ARTICLE_PARTS,
               lineinfo: bool = False):
    """The kernel for ``cache``'s layout (its ``CacheConfig`` constants), ``parts`` and the
    build option of ``make_paged_attention_kernel``."""
    c = cache.config
    return make_paged_attention_kernel(dtype_name, c.head_dim, c.BLOCK_SIZE, c.num_layers,
                                       c.MAX_BLOCKS_PER_SEQ, c.KV_DIM, c.BLOCK_ELEMS,
                                       c.V_OFFSET_ELEMS, parts, lineinfo)


def launch_decode(kernel, q, cache, block_table, layer: int, seq_lens, active_slots,
                  scale: float):
    """Launch a kernel of ``make_paged_attention_kernel`` on q [B, nH, D] (output in place):
    grid (B, nH), ``block_threads(head_dim)`` threads.  ``block_table``, ``seq_lens`` and
    ``active_slots`` are contiguous int32 tensors where the kernel runs.  The one launch of
    this kernel: ``NumbaBackend.decode_attention`` and ``decode`` both end here."""
    from paged_tutorial.backends.numba_cuda.runtime import launch

    n_seqs, n_q_heads, _ = q.shape
    if n_seqs == 0:
        return q
    qa, q_rs = launch.rows(q, "q")
    launch.launch(kernel, (n_seqs, n_q_heads), block_threads(cache.config.head_dim),
                  int(layer), qa, q_rs, launch.flat(cache.buffer, "cache.buffer"),
                  launch.flat(block_table), launch.flat(seq_lens), launch.flat(active_slots),
                  n_q_heads // cache.config.num_kv_heads, float(scale))
    return q


def decode(q, cache, block_table, layer: int, seq_lens, active_slots, scale: float,
           parts: KernelParts = ARTICLE_PARTS, lineinfo: bool = False):
    """Run the article's kernel on q [B, nH, D] (in place) and return q, for notebooks and
    puzzles: checks q against the cache, builds the kernel and launches it with
    ``launch_decode``, then waits for it (on a GPU).  ``seq_lens`` / ``active_slots`` may be
    lists or tensors; every tensor must live where this process's kernels run (the CPU in the
    simulator, the GPU otherwise).  ``parts`` replaces steps of the kernel (see
    ``KernelParts``); ``lineinfo`` is the build option of ``make_paged_attention_kernel``."""
    import torch

    from paged_tutorial.backends.numba_cuda.device.dtypes import ops_for
    from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

    c = cache.config
    if q.dtype != cache.buffer.dtype:
        raise TypeError(f"attention.decode: q is {q.dtype}, the cache holds {cache.buffer.dtype}")
    if q.dim() != 3 or q.shape[2] != c.head_dim or q.shape[1] % c.num_kv_heads:
        raise ValueError(f"attention.decode: q must be [B, n_q_heads, {c.head_dim}] with n_q_heads "
                         f"a multiple of the cache's {c.num_kv_heads} kv heads, got "
                         f"{tuple(q.shape)}")
    kernel = kernel_for(cache, ops_for(q.dtype).name, parts, lineinfo)
    dev = q.device
    lens = torch.as_tensor(seq_lens).to(device=dev, dtype=torch.int32).contiguous()
    slots = torch.as_tensor(active_slots).to(device=dev, dtype=torch.int32).contiguous()
    table = block_table.to(device=dev, dtype=torch.int32).contiguous()
    launch_decode(kernel, q, cache, table, layer, lens, slots, scale)
    if not SIMULATING:
        torch.cuda.synchronize()
    return q
