"""FlashInfer's batch decode over our paged cache: a peer for ``benchmarks/attention.py``.

FlashInfer (``pip install flashinfer-python``; it compiles its kernels with the CUDA toolkit's
``nvcc`` on first use) reads a paged cache laid out as [pages, 2 (K, V), page_size, kv_heads,
head_dim] ("NHD"), which is our cache's own layout (``paged_reads.cache_view``), so it reads our
blocks where they are: each sequence's page list is its block-table row, flattened into
FlashInfer's ``indices`` / ``indptr`` / ``last_page_len``.  Its ``plan`` does the scheduling on
the host (how to split long sequences over the GPU) and its ``run`` launches the kernel, so a
plan is made per (layer, lengths, slots) once, outside the timed graphs.  Two variants:
FlashInfer's CUDA-core decode kernel, and ``use_tensor_cores=True`` (the query heads of a GQA
group as one tile on the tensor cores, through its prefill kernels).
"""

from __future__ import annotations

import torch

#: FlashInfer's recommended float workspace (split-KV partial results)
WORKSPACE_BYTES = 128 * 1024 * 1024


def page_lists(table: torch.Tensor, layer: int, seq_lens: torch.Tensor, slots: torch.Tensor,
               block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's description of the sequences ``slots`` (lengths ``seq_lens``) of ``layer``
    in the block table ``table`` [slots, layers, blocks]: (indptr [B + 1], sequence b's pages
    are indices[indptr[b]:indptr[b + 1]]; indices, the physical blocks in logical order;
    last_page_len [B], the tokens in each sequence's last page), int32 on the host."""
    lens = seq_lens.long().cpu()
    pages = (lens + block_size - 1) // block_size
    indices = torch.cat([table[int(s), layer, :int(n)].cpu()
                         for s, n in zip(slots.long().cpu(), pages)]).to(torch.int32)
    indptr = torch.zeros(len(pages) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages, 0)
    return indptr, indices, (lens - (pages - 1) * block_size).to(torch.int32)


def available() -> tuple[bool, str]:
    """(whether FlashInfer can run here, why not)."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:            # not installed, or a dependency missing
        return False, f"import flashinfer failed: {type(exc).__name__}: {exc}"
    return True, ""


class FlashInferDecode:
    """``fn(q, layer, seq_lens, slots) -> out`` over ``cache`` (Llama-style GQA, bf16), with a
    FlashInfer plan per (layer, lengths, slots), made on first use; ``prepare`` makes the plans
    a timed graph will replay before it is captured."""

    def __init__(self, cache, n_q_heads: int, scale: float, tensor_cores: bool):
        import flashinfer

        self.flashinfer = flashinfer
        self.cache, self.n_q_heads, self.scale = cache, n_q_heads, scale
        self.tensor_cores = tensor_cores
        c = cache.config
        self.kv = cache.buffer.view(c.NUM_BLOCKS, 2, c.BLOCK_SIZE, c.num_kv_heads, c.head_dim)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self.plans: dict[tuple, tuple] = {}

    @staticmethod
    def _key(layer, seq_lens, slots) -> tuple:
        """The plan's key: the lengths' and slots' tensors themselves (their addresses: reading
        their values would synchronise, which a graph capture forbids)."""
        return (layer, seq_lens.data_ptr(), slots.data_ptr())

    def prepare(self, layer: int, seq_lens: torch.Tensor, slots: torch.Tensor) -> None:
        """Plan (layer, seq_lens, slots) now: reads the lengths and the table on the host."""
        key = self._key(layer, seq_lens, slots)
        if key in self.plans:
            return
        c = self.cache.config
        indptr, indices, last = page_lists(self.cache.device_block_table(), layer, seq_lens,
                                           slots, c.BLOCK_SIZE)
        wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.tensor_cores)
        wrapper.plan(indptr.cuda(), indices.cuda(), last.cuda(), self.n_q_heads,
                     c.num_kv_heads, c.head_dim, c.BLOCK_SIZE, pos_encoding_mode="NONE",
                     q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
                     sm_scale=self.scale)
        out = torch.empty(len(last), self.n_q_heads, c.head_dim, dtype=torch.bfloat16,
                          device="cuda")
        self.plans[key] = (wrapper, indices, out)

    def __call__(self, q, layer, seq_lens, slots):
        """Attention of q [B, nH, D] (bf16) -> the plan's output buffer [B, nH, D]."""
        key = self._key(layer, seq_lens, slots)
        if key not in self.plans:
            self.prepare(layer, seq_lens, slots)
        wrapper, _, out = self.plans[key]
        return wrapper.run(q, self.kv, out=out)


__all__ = ["FlashInferDecode", "WORKSPACE_BYTES", "available", "page_lists"]
