"""A GGUF's quantized matrices kept as the file stores them: rows of 32-value blocks.

The loader expands every GGUF tensor to the model's dtype, because the GEMMs of a prompt and
every GPU kernel read float values.  A decode step on the CPU reads each weight once per token
and does little with it, so there the bytes it reads decide its speed: the float32 expansion of
a Q4_1 matrix is 6.4x the file's bytes.  ``QuantizedRows`` keeps a matrix's file bytes, one row
of blocks per output row, in the row order of the HF-named float tensor (Q and K rows of a
Llama GGUF are un-permuted the same way), so the CPU's decode product
(``backends/cpu_quantized.py``) can multiply by the blocks themselves.  The values a block
stands for are exactly the float32 values the loader computed from it (``dequantize`` here is
that arithmetic), so only the order of the additions differs.

Block formats (32 values each; ``d`` and ``m`` are float16):
  Q8_0  d, 32 x int8 q                        value = d * q
  Q4_0  d, 16 bytes of nibbles                value = (q - 8) * d
  Q4_1  d, m, 16 bytes of nibbles             value = d * q + m
  (byte j of the nibbles holds value j in its low four bits, value j + 16 in its high four)

    rows = read_quantized_rows(path, config)     # {HF name: QuantizedRows} for Q8_0/Q4_0/Q4_1
    rows["model.layers.0.mlp.down_proj.weight"].shape      # (576, 1536), like the float tensor
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from paged_tutorial.config import ModelConfig
from paged_tutorial.loading.gguf_file import dequantize_blocks
from paged_tutorial.loading.weights import gguf_tensors_by_hf_name, open_gguf, unpermute_rope_rows

#: bytes per block of 32 values, per kind (the kinds the CPU's decode product reads)
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
VALUES_PER_BLOCK = 32


@dataclass(eq=False)
class QuantizedRows:
    """One matrix [n_out, n_in] as rows of GGUF blocks: ``data`` is uint8 [n_out, n_in // 32 *
    BLOCK_BYTES[kind]].  Compared by identity (a model holds one per weight)."""

    kind: str
    data: np.ndarray

    def __post_init__(self):
        if self.kind not in BLOCK_BYTES:
            raise ValueError(f"quantization {self.kind!r} is not kept as rows; "
                             f"kept: {sorted(BLOCK_BYTES)}")
        if self.data.dtype != np.uint8 or self.data.ndim != 2 \
                or self.data.shape[1] % BLOCK_BYTES[self.kind]:
            raise ValueError(f"{self.kind} rows must be uint8 [rows, blocks * "
                             f"{BLOCK_BYTES[self.kind]}], got {self.data.dtype} "
                             f"{list(self.data.shape)}")

    @property
    def n_blocks(self) -> int:
        return self.data.shape[1] // BLOCK_BYTES[self.kind]

    @property
    def shape(self) -> tuple[int, int]:
        return self.data.shape[0], self.n_blocks * VALUES_PER_BLOCK

    def dequantize(self) -> torch.Tensor:
        """The float32 values [n_out, n_in], as the loader computes them."""
        values = dequantize_blocks(np.ascontiguousarray(self.data).reshape(-1), self.kind)
        return torch.from_numpy(values.reshape(self.shape))

    @staticmethod
    def stack(parts: list["QuantizedRows"]) -> "QuantizedRows":
        """Rows of several matrices of one kind and width, one after another (q/k/v, gate/up)."""
        kinds = {p.kind for p in parts}
        widths = {p.data.shape[1] for p in parts}
        if len(kinds) != 1 or len(widths) != 1:
            raise ValueError(f"cannot stack rows of kinds {sorted(kinds)} and widths "
                             f"{sorted(widths)} into one matrix")
        return QuantizedRows(parts[0].kind, np.concatenate([p.data for p in parts]))


def quantized_rows(tensor, hf_name: str, config: ModelConfig) -> QuantizedRows | None:
    """A GGUF tensor's rows (None for a kind not kept, or a tensor that is not a matrix), in
    the row order of its HF-named float tensor."""
    kind = tensor.tensor_type.name
    if kind not in BLOCK_BYTES or len(tensor.shape) != 2 \
            or tensor.shape[1] % VALUES_PER_BLOCK:
        return None
    data = np.asarray(tensor.data).reshape(tensor.shape[0], -1)
    if config.family.gguf_rope_rows_interleaved:
        heads = (config.num_attention_heads if hf_name.endswith("self_attn.q_proj.weight")
                 else config.num_key_value_heads if hf_name.endswith("self_attn.k_proj.weight")
                 else None)
        if heads is not None:
            data = unpermute_rope_rows(torch.from_numpy(np.ascontiguousarray(data)),
                                       heads).numpy()
    return QuantizedRows(kind, np.ascontiguousarray(data))


def read_quantized_rows(path, config: ModelConfig) -> dict[str, QuantizedRows]:
    """The GGUF's Q8_0, Q4_0 and Q4_1 matrices as rows of blocks, by HF name."""
    path = Path(path).expanduser()
    out = {}
    for name, tensor in gguf_tensors_by_hf_name(open_gguf(path), config.family, path).items():
        rows = quantized_rows(tensor, name, config)
        if rows is not None:
            out[name] = rows
    return out


__all__ = ["BLOCK_BYTES", "QuantizedRows", "VALUES_PER_BLOCK", "quantized_rows",
           "read_quantized_rows"]
