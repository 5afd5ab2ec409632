"""The K|V buffer: one flat allocation, K of a block then V ``V_OFFSET`` bytes later."""

from __future__ import annotations

import torch

from paged_tutorial.cache.kv_buffer import KVBuffer
from paged_tutorial.config import CacheConfig


def test_the_buffer_holds_num_blocks_blocks_of_k_then_v():
    config = CacheConfig(num_layers=2, num_kv_heads=2, head_dim=8, dtype="bfloat16",
                         kv_cache_bytes=6 * 2 * 16 * 16 * 2, max_slots=1, max_seq_len=64)
    kv = KVBuffer(config, torch.device("cpu"))
    assert kv.tensor.dtype == torch.bfloat16 and not kv.tensor.any()
    assert kv.tensor.numel() * 2 == config.NUM_BLOCKS * config.BLOCK_BYTES
    assert config.BLOCK_BYTES == 2 * config.V_OFFSET == 2 * 16 * 16 * 2
    assert kv.k_byte_offset(0, 0) == 0
    assert kv.k_byte_offset(3, 0) == 3 * config.BLOCK_BYTES
    # a token's row is KV_DIM values, head after head
    assert kv.k_byte_offset(1, 5, kv_head=1, dim=3) == \
        config.BLOCK_BYTES + 5 * 16 * 2 + 1 * 8 * 2 + 3 * 2
    assert kv.v_byte_offset(1, 5, 1, 3) == kv.k_byte_offset(1, 5, 1, 3) + config.V_OFFSET
    # the last V element of the last block is the buffer's last element
    last = kv.v_byte_offset(config.NUM_BLOCKS - 1, 15, 1, 7)
    assert last // 2 == kv.tensor.numel() - 1
