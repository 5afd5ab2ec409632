"""Exercises of notebook 03: logical block -> physical block -> address.  Right answers are
computed from the package (``PagedKVCache``, and ``oracles.kernel_read_trace``, the NumPy
replay of the decode kernel's addressing) for the article's Llama-3.2-1B cache."""

from __future__ import annotations

from paged_tutorial.teaching.exercises.answers import Integer, Numbers
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import small_article_cache


def _llama():
    from paged_tutorial.config import llama_3_2_1b_config

    return llama_3_2_1b_config()

FLAT = (1, 3, 5)                  # slot, layer, logical block
V_AT = (3, 5, 2, 10)              # physical block, token in block, kv head, dim


def block_loop(seq_len: int) -> tuple[int, int]:
    """(blocks the kernel reads, tokens it reads from the last one) for ``seq_len``, from the
    NumPy replay of the kernel's loop."""
    from paged_tutorial.teaching.oracles import kernel_read_trace

    cache = small_article_cache()
    trace = kernel_read_trace(cache, layer=0, slot=0, seq_len=seq_len, q_head=0, q_per_kv=4)
    return int(trace.num_blocks), int(trace.tokens_in_block[-1])


def _loop_exercise(seq_len: int, extra: tuple = ()) -> Exercise:
    return Exercise(
        f"03.blocks_for_{seq_len}",
        f"The decode kernel runs for a sequence of seq_len = {seq_len}: (how many logical blocks "
        "it reads, how many tokens it reads from the last one).",
        Numbers(Integer(), 2, ("num_blocks", "tokens in the last block")),
        lambda: block_loop(seq_len),
        explain=lambda e: (f"ceil({seq_len}/16) = {e[0]} blocks; the last one holds "
                           f"min({seq_len} - {e[0] - 1}*16, 16) = {e[1]} "
                           + ("token" if e[1] == 1 else "tokens")),
        hint="num_blocks = ceil(seq_len / 16); tokens_in_block = min(seq_len - lb*16, 16)",
        mistakes=(
            Mistake(lambda: (seq_len // 16, block_loop(seq_len)[1]),
                    "seq_len // 16 rounds down: a partly filled block must be read too"),
            Mistake(lambda: (seq_len // 16 + 1, block_loop(seq_len)[1]),
                    "seq_len // 16 + 1 is one too many when seq_len is a multiple of 16"),
            *extra,
        ))


EXERCISES = (
    Exercise(
        "03.flat_index",
        "Flat block-table index of (slot {}, layer {}, logical block {}) in the article's "
        "table.".format(*FLAT),
        Integer(), lambda: small_article_cache().flat_index(*FLAT),
        explain=lambda e: (f"{FLAT[0]}*16*128 + {FLAT[1]}*128 + {FLAT[2]} = {e} (of "
                           f"{small_article_cache().config.block_table_entries} entries)"),
        hint=("slot*N_LAYERS*MAX_BLOCKS_PER_SEQ + layer*MAX_BLOCKS_PER_SEQ + logical_block with "
              "the article's N_LAYERS and MAX_BLOCKS_PER_SEQ")),
    Exercise(
        "03.v_byte_offset",
        "Byte offset of V for physical block {}, token {} of the block, kv head {}, dim {} "
        "(bf16).".format(*V_AT),
        Integer(), lambda: small_article_cache().v_byte_offset(*V_AT),
        explain=lambda e: f"3*BLOCK_BYTES + V_OFFSET + 5*KV_DIM*2 + 2*64*2 + 10*2 = {e} bytes",
        hint=("block start + V_OFFSET + token row + head slice + element, all in bytes "
              "(bf16 = 2)"),
        mistakes=(
            Mistake(lambda: small_article_cache().k_byte_offset(*V_AT),
                    "that is the K address: V lives V_OFFSET bytes further"),
            Mistake(lambda: small_article_cache().v_byte_offset(*V_AT) // 2,
                    "that counts elements: the question asks for bytes"),
        )),
    _loop_exercise(33),
    _loop_exercise(48, extra=(
        Mistake(lambda: (block_loop(48)[0], 48 % 16),
                "48 % 16 = 0, but the last block is full: min(48 - 2*16, 16) = 16"),)),
    Exercise(
        "03.gqa_reads",
        "Llama-3.2-1B has 32 query heads and 8 KV heads.  In one decode step of one layer, how "
        "many thread blocks of the article's kernel read each K element of a sequence's cache?",
        Integer(), lambda: _llama().q_per_kv,
        explain=lambda e: (f"one block per query head, and 32 / 8 = {e} query heads share each KV "
                           "head: every K and V element is read that many times"),
        hint="the grid has one thread block per (batch row, query head); which query heads "
             "read KV head kv_head = q_head // 4?",
        mistakes=(
            Mistake(lambda: 1, "one read per element is the fast kernel's grid (one block per KV "
                               "head), not the article's (one block per query head)"),
            Mistake(lambda: _llama().num_key_value_heads,
                    "8 is the number of KV heads: count the query heads that share one of them"),
            Mistake(lambda: _llama().num_attention_heads,
                    "not every query head reads every KV head: kv_head = q_head // 4"),
        )),
)
