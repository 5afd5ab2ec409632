"""GGUF tensors dequantized on the device they will live on.

A quantized tensor is a fraction of its float32 size (Q4_1: 20 bytes per 32 values, 5/32 of
float32), so for a GPU the loader moves the file's bytes there as they are and expands them
with torch on the GPU: the host copies 6x fewer bytes and does none of the arithmetic.  For the
CPU the NumPy code of ``gguf_file.dequantize`` runs instead: it works in cache-sized chunks on
one thread, where torch's whole-tensor operations were slower here (and far slower with the
cores shared: its worker threads wait on each other).

The torch arithmetic is the one ``gguf_file.dequantize`` (and the ``gguf`` package) does, one
float32 operation at a time (``d * q``, then ``+ m`` for Q4_1; ``(q - 8) * d`` for Q4_0), so the
values are bit-identical on every device: no fused multiply-add, no other order.

    values = dequantize_on(tensor, torch.device("cuda"))   # float32, shaped tensor.shape

Quantizations other than F32, F16, BF16, Q8_0, Q4_0 and Q4_1 are dequantized on the host by
``gguf_file.dequantize`` (the ``gguf`` package's code) and then moved.
"""

from __future__ import annotations

import numpy as np
import torch

from paged_tutorial.loading.gguf_file import GGUFTensor, dequantize

#: bytes per block of 32 values, and the byte where the quants start: d (f16) + 32 x int8 |
#: d + 16 bytes of nibbles | d, m + 16 bytes of nibbles
_BLOCKS = {"Q8_0": (34, 2), "Q4_0": (18, 2), "Q4_1": (20, 4)}
_PLAIN = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def dequantize_on(tensor: GGUFTensor, device: torch.device) -> torch.Tensor:
    """``tensor``'s values as float32 on ``device``, shaped ``tensor.shape``."""
    name = tensor.tensor_type.name
    if device.type == "cpu" or not (name in _PLAIN or name in _BLOCKS):
        values = torch.from_numpy(np.ascontiguousarray(dequantize(tensor))).to(device)
    else:
        # the mapping is copy-on-write, so torch takes the bytes without a copy on the host
        values = dequantize_bytes(torch.from_numpy(tensor.data).to(device), name)
    return values.reshape(tensor.shape)


def dequantize_bytes(raw: torch.Tensor, name: str) -> torch.Tensor:
    """A tensor's file bytes (uint8, on any device) as flat float32 values on that device, for
    the quantizations named in the module docstring."""
    if name in _PLAIN:
        return raw.view(_PLAIN[name]).to(torch.float32)
    return _dequantize_blocks(raw, name)


def _dequantize_blocks(raw: torch.Tensor, name: str) -> torch.Tensor:
    width, first_quant = _BLOCKS[name]
    blocks = raw.reshape(-1, width)
    halves = blocks.view(torch.float16)                    # every block starts on an even byte
    d = halves[:, :1].to(torch.float32)
    quants = blocks[:, first_quant:]
    if name == "Q8_0":
        return (quants.view(torch.int8).to(torch.float32) * d).reshape(-1)
    # element j in the low nibble, element j + 16 in the high one
    q = torch.cat((quants & 0x0F, quants >> 4), dim=1).to(torch.float32)
    if name == "Q4_0":
        return ((q - 8.0) * d).reshape(-1)
    return (q * d + halves[:, 1:2].to(torch.float32)).reshape(-1)
