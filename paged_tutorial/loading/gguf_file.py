"""Reading a GGUF file quickly: the header parsed with ``struct`` and whole tensors dequantized
with NumPy.

``gguf.GGUFReader`` builds a NumPy view for every value of the header, so the 49152-token
vocabulary and 48900 merges of SmolLM2's GGUF cost hundreds of thousands of small array
objects, and ``gguf.quants.dequantize`` walks a tensor in groups of rows on a memory-mapped
array.  Here the header is read once from the bytes of the file (numeric arrays in one
``np.frombuffer``), tensors are views of one ``np.memmap`` of the file, and the common
quantizations (F32, F16, BF16, Q8_0, Q4_0, Q4_1) are dequantized over the whole tensor at
once, in float32 with the same operations as ``gguf.quants`` (so the values are identical);
other quantizations go to ``gguf.quants.dequantize``.

    file = GGUFFile.open(path)
    file.fields["general.architecture"]      # 'llama'
    values = file.dequantize(file.tensors[0])   # float32, torch's (rows, cols) order

Layout of a GGUF file (version 2 and 3, little-endian): magic ``GGUF``, version (u32), tensor
count (u64), key/value count (u64); the key/values (key: u64 length + UTF-8; value type (u32)
and value; an array is its item type (u32), count (u64) and items); per tensor its name, number
of dimensions (u32), dimensions (u64 each, innermost first), type (u32) and offset (u64) from the
data section, which starts at the next multiple of ``general.alignment`` (default 32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
#: GGUF value type -> struct format of one scalar
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
                   10: "Q", 11: "q", 12: "d"}
_U64 = struct.Struct("<Q")
_SCALAR_DTYPES = {k: np.dtype("<" + f) if f != "?" else np.dtype(bool)
                  for k, f in _SCALAR_FORMATS.items()}


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file this reader understands (truncated, corrupt, or another
    version)."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any            # gguf.GGMLQuantizationType
    shape: tuple[int, ...]      # torch order (outermost first)
    data: np.ndarray            # the tensor's bytes in the file (uint8, memory-mapped)


class _Cursor:
    """Reads little-endian values from ``buffer`` starting at ``offset``."""

    def __init__(self, buffer, offset: int = 0):
        self.buffer, self.offset = buffer, offset

    def scalar(self, fmt: str):
        value, = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        end = self.offset + n
        if end > len(self.buffer):
            raise GGUFFormatError(f"a string of {n} bytes runs past the end of the file")
        text = bytes(self.buffer[self.offset:end]).decode("utf-8")
        self.offset = end
        return text

    def strings(self, count: int) -> list[str]:
        """``count`` strings in a row (a vocabulary, merges): one tight loop, no per-item
        method calls."""
        buffer, offset, size = self.buffer, self.offset, len(self.buffer)
        unpack, out = _U64.unpack_from, []
        append = out.append
        for _ in range(count):
            n, = unpack(buffer, offset)
            offset += 8
            if offset + n > size:
                raise GGUFFormatError(f"a string of {n} bytes runs past the end of the file")
            append(str(buffer[offset:offset + n], "utf-8"))
            offset += n
        self.offset = offset
        return out

    def value(self, value_type: int):
        if value_type == STRING:
            return self.string()
        if value_type == ARRAY:
            item_type, count = self.scalar("I"), self.scalar("Q")
            if item_type in _SCALAR_DTYPES:
                dtype = _SCALAR_DTYPES[item_type]
                end = self.offset + count * dtype.itemsize
                if end > len(self.buffer):
                    raise GGUFFormatError(f"an array of {count} values runs past the end")
                items = np.frombuffer(self.buffer, dtype, count, self.offset).tolist()
                self.offset = end
                return items
            if item_type == STRING:
                return self.strings(count)
            return [self.value(item_type) for _ in range(count)]
        fmt = _SCALAR_FORMATS.get(value_type)
        if fmt is None:
            raise GGUFFormatError(f"unknown GGUF value type {value_type}")
        return self.scalar(fmt)


@dataclass
class GGUFFile:
    path: Path
    version: int
    fields: dict[str, Any]          # every key/value of the header as Python values
    tensors: list[GGUFTensor]

    @classmethod
    def open(cls, path) -> "GGUFFile":
        """Parse ``path``; ``GGUFFormatError`` (a ValueError) for anything that is not a
        readable little-endian GGUF v2/v3 file."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        path = Path(path)
        # copy-on-write: tensors can be handed to torch without a copy; the file never changes
        mapped = np.memmap(path, dtype=np.uint8, mode="c")
        buffer = memoryview(mapped)
        try:
            if bytes(buffer[:4]) != GGUF_MAGIC:
                raise GGUFFormatError(f"it does not start with {GGUF_MAGIC!r}")
            cur = _Cursor(buffer, 4)
            version = cur.scalar("I")
            if version not in (2, 3):
                raise GGUFFormatError(f"GGUF version {version} (this reader knows 2 and 3, "
                                      "little-endian)")
            n_tensors, n_fields = cur.scalar("Q"), cur.scalar("Q")
            fields = {}
            for _ in range(n_fields):
                key = cur.string()
                fields[key] = cur.value(cur.scalar("I"))
            infos = []
            for _ in range(n_tensors):
                name = cur.string()
                dims = [cur.scalar("Q") for _ in range(cur.scalar("I"))]
                infos.append((name, dims, cur.scalar("I"), cur.scalar("Q")))
            alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
            start = -(-cur.offset // alignment) * alignment
            tensors = []
            for name, dims, raw_type, offset in infos:
                tensor_type = GGMLQuantizationType(raw_type)
                block, block_bytes = GGML_QUANT_SIZES[tensor_type]
                count = int(np.prod(dims, dtype=np.int64)) if dims else 1
                nbytes = count // block * block_bytes
                begin = start + offset
                if begin + nbytes > len(mapped):
                    raise GGUFFormatError(f"tensor {name!r} runs past the end of the file")
                tensors.append(GGUFTensor(name, tensor_type, tuple(reversed(dims)),
                                          mapped[begin:begin + nbytes]))
        except (struct.error, UnicodeDecodeError, KeyError, OverflowError) as exc:
            raise GGUFFormatError(f"{type(exc).__name__}: {exc}") from exc
        except ValueError as exc:               # an unknown tensor type, among others
            if isinstance(exc, GGUFFormatError):
                raise
            raise GGUFFormatError(str(exc)) from exc
        return cls(path, version, fields, tensors)

    @staticmethod
    def dequantize(tensor: GGUFTensor) -> np.ndarray:
        """The tensor as float32, shaped ``tensor.shape``."""
        return dequantize(tensor).reshape(tensor.shape)


def float16_values(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 bytes [..., 2] -> float32 [...]."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)[..., 0]


def dequantize(tensor: GGUFTensor) -> np.ndarray:
    """A tensor's values as a flat float32 array (see the module docstring)."""
    from gguf import GGMLQuantizationType as Q

    raw, kind = tensor.data, tensor.tensor_type
    if kind == Q.F32:
        return raw.view("<f4").astype(np.float32)          # a copy: the mapping is read-only
    if kind == Q.F16:
        return raw.view("<f2").astype(np.float32)
    if kind == Q.BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if kind.name in _BLOCK_WIDTHS:
        return dequantize_blocks(raw, kind.name)
    from gguf.quants import dequantize as gguf_dequantize

    block, block_bytes = _quant_size(kind)
    rows = np.asarray(raw).reshape(-1, tensor.shape[-1] // block * block_bytes)
    return np.asarray(gguf_dequantize(rows, kind), dtype=np.float32).reshape(-1)


#: bytes per block of 32 values: d (f16) + 32 x int8 | d + 16 bytes of nibbles | d, m + nibbles
_BLOCK_WIDTHS = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
#: blocks dequantized at a time: the temporaries stay in the CPU's cache
_CHUNK_BLOCKS = 1 << 14


def dequantize_blocks(raw: np.ndarray, name: str) -> np.ndarray:
    """Q8_0, Q4_0 and Q4_1 bytes (flat uint8) -> flat float32: the arithmetic of
    ``gguf.quants`` (float32: d * q, plus m for Q4_1), over chunks of whole blocks written
    into one output array."""
    width = _BLOCK_WIDTHS[name]
    blocks = raw.reshape(-1, width)
    out = np.empty((blocks.shape[0], 32), dtype=np.float32)
    for first in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        b = blocks[first:first + _CHUNK_BLOCKS]
        o = out[first:first + _CHUNK_BLOCKS]
        d = float16_values(b[:, :2])[:, None]
        if name == "Q8_0":
            o[:] = b[:, 2:].view(np.int8)
            o *= d
            continue
        qs = b[:, width - 16:]
        o[:, :16] = qs & 0x0F                       # element j in the low nibble,
        o[:, 16:] = qs >> 4                         # element j + 16 in the high one
        if name == "Q4_0":
            o -= np.float32(8.0)
            o *= d
        else:
            o *= d
            o += float16_values(b[:, 2:4])[:, None]
    return out.reshape(-1)


def _quant_size(kind) -> tuple[int, int]:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[kind]
