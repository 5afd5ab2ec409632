"""The K|V buffer: ``NUM_BLOCKS`` blocks of ``BLOCK_BYTES`` in one flat allocation (article,
part 6).  A block is K of ``BLOCK_SIZE`` tokens, then V of the same tokens ``V_OFFSET`` bytes
later (``src/main.cpp:866-872``); within K (and V) a token's row is ``KV_DIM`` values, head by
head."""

from __future__ import annotations

import torch

from paged_tutorial.config import CacheConfig

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class KVBuffer:
    """The flat buffer (``tensor``, zeros at first) and the article's byte addresses into it."""

    def __init__(self, config: CacheConfig, device: torch.device):
        self.config = config
        self.tensor = torch.zeros(config.NUM_BLOCKS * config.BLOCK_ELEMS,
                                  dtype=TORCH_DTYPES[config.dtype], device=device)

    def k_byte_offset(self, physical_block: int, token_in_block: int, kv_head: int = 0,
                      dim: int = 0) -> int:
        """Byte offset of K element (token_in_block, kv_head, dim) of a physical block."""
        c = self.config
        return (physical_block * c.BLOCK_BYTES + token_in_block * c.KV_DIM * c.ITEMSIZE
                + kv_head * c.head_dim * c.ITEMSIZE + dim * c.ITEMSIZE)

    def v_byte_offset(self, physical_block: int, token_in_block: int, kv_head: int = 0,
                      dim: int = 0) -> int:
        """The V element's offset: its K element's, ``V_OFFSET`` bytes later."""
        return self.k_byte_offset(physical_block, token_in_block, kv_head, dim) + \
            self.config.V_OFFSET
