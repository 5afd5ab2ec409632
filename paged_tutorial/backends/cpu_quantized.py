"""The projections of a CPU decode step read from the GGUF's blocks, not from float32 copies.

A decode step multiplies a few activation rows by every weight matrix, so its time is the
time to stream the weights through a core.  The embedded SmolLM2's matrices are Q4_1 in its
file (20 bytes per 32 values) and float32 in memory (128 bytes): ``matvec`` here reads the
file's blocks (``loading/gguf_rows.py``), 6.4x fewer bytes, and computes the same sums.  A
block of 32 values stands for ``d * q + m`` with q an integer, so a row's dot product with x is,
block by block, ``d * sum(q * x) + m * sum(x)``: the per-block sums of x are taken once per
activation row and shared by every weight row.  The values are exactly the float32 values the
loader expands the blocks to; the sums run in another order than the BLAS's, so logits agree
with HF's to rounding, as ``cpu_matvec.py``'s do.

Layout.  The rows are regrouped once, when the matrix is made, into tiles of ``TILE_ROWS``
rows whose bytes for block k, byte j lie side by side for all the tile's rows
(``quants[tile, k, j, row]``), so the innermost loop runs over rows: contiguous loads that the
compiler turns into vector instructions, one accumulator per row, and no sum across a vector
inside the loop.  A 4-bit byte holds value j (low nibble) and value j + 16 (high nibble) of its
block, as in the file; ``hi = floor(q / 16)`` and ``lo = q - 16 hi`` split it in float
arithmetic, which stays in 32-bit vector lanes.  With several activation rows each byte is
split once and its halves serve every row (``*_rows``).  Q4_0 becomes ``d * q + m`` with ``m = -8 d``;
Q8_0 (signed bytes, ``d * q``) has its own loop.

The torch backend takes this path for the matrices a model loaded from a GGUF keeps as blocks
(``TorchBackend.use_quantized_rows``), on the CPU, for float32 steps of at most
``cpu_matvec.MAX_ROWS`` rows.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

from paged_tutorial.backends.numba_env import decide_numba_environment
from paged_tutorial.loading.gguf_file import float16_values
from paged_tutorial.loading.gguf_rows import BLOCK_BYTES, VALUES_PER_BLOCK, QuantizedRows

#: weight rows per tile: the tile's partial sums (TILE_ROWS floats per activation row) stay
#: in the core's first-level cache while its blocks stream past
TILE_ROWS = 128

_compiled: dict[str, object] = {}      # the loops below, compiled by Numba on first use
#: each model's rows regrouped once, however many engines serve the model
_matrices: "weakref.WeakKeyDictionary[QuantizedRows, QuantizedMatrix]" = \
    weakref.WeakKeyDictionary()
_matrices_lock = threading.Lock()


def _nibble_product(x, quants, d, m, out, sums, acc, first_tile, end_tile):
    """out[b, o] = sum over blocks k of d[o, k] * sum_j q[o, k, j] * x[b, 32k + j]
    + m[o, k] * sum_j x[b, 32k + j] for the rows o of tiles first_tile .. end_tile - 1, with
    4-bit ``quants`` [tiles, blocks, 16, TILE_ROWS] (uint8: value j low, value j + 16 high),
    ``d``, ``m`` [tiles, blocks, TILE_ROWS]; ``sums``, ``acc`` are scratch [B, TILE_ROWS]."""
    _, n_blocks, _, rows_per_tile = quants.shape
    n_rows, n_out = x.shape[0], out.shape[1]
    for t in range(first_tile, end_tile):
        for b in range(n_rows):
            for r in range(rows_per_tile):
                acc[b, r] = 0.0
            for k in range(n_blocks):
                base = k * 32
                x_sum = np.float32(0.0)
                for j in range(32):
                    x_sum += x[b, base + j]
                for r in range(rows_per_tile):
                    sums[b, r] = 0.0
                for j in range(16):
                    x_lo = x[b, base + j]
                    x_hi = x[b, base + 16 + j]
                    for r in range(rows_per_tile):
                        q = np.float32(quants[t, k, j, r])
                        hi = np.floor(q * np.float32(0.0625))
                        lo = q - np.float32(16.0) * hi
                        sums[b, r] += lo * x_lo + hi * x_hi
                for r in range(rows_per_tile):
                    acc[b, r] += d[t, k, r] * sums[b, r] + m[t, k, r] * x_sum
        first = t * rows_per_tile
        for b in range(n_rows):
            for r in range(min(rows_per_tile, n_out - first)):
                out[b, first + r] = acc[b, r]


def _nibble_product_rows(x, quants, d, m, out, sums, acc, first_tile, end_tile, values, highs):
    """``_nibble_product`` for several activation rows: each byte is split once, into
    ``values`` (q = 16 hi + lo) and ``highs`` (hi), scratch [TILE_ROWS], and every row adds
    ``q * x_lo + hi * (x_hi - 16 x_lo)`` (= lo * x_lo + hi * x_hi) from them."""
    _, n_blocks, _, rows_per_tile = quants.shape
    n_rows, n_out = x.shape[0], out.shape[1]
    for t in range(first_tile, end_tile):
        for b in range(n_rows):
            for r in range(rows_per_tile):
                acc[b, r] = 0.0
        for k in range(n_blocks):
            base = k * 32
            for b in range(n_rows):
                for r in range(rows_per_tile):
                    sums[b, r] = 0.0
            for j in range(16):
                for r in range(rows_per_tile):
                    q = np.float32(quants[t, k, j, r])
                    values[r] = q
                    highs[r] = np.floor(q * np.float32(0.0625))
                for b in range(n_rows):
                    x_lo = x[b, base + j]
                    x_rest = x[b, base + 16 + j] - np.float32(16.0) * x_lo
                    for r in range(rows_per_tile):
                        sums[b, r] += values[r] * x_lo + highs[r] * x_rest
            for b in range(n_rows):
                x_sum = np.float32(0.0)
                for j in range(32):
                    x_sum += x[b, base + j]
                for r in range(rows_per_tile):
                    acc[b, r] += d[t, k, r] * sums[b, r] + m[t, k, r] * x_sum
        first = t * rows_per_tile
        for b in range(n_rows):
            for r in range(min(rows_per_tile, n_out - first)):
                out[b, first + r] = acc[b, r]


def _byte_product_rows(x, quants, d, out, sums, acc, first_tile, end_tile, values):
    """``_byte_product`` for several activation rows: each byte converted once, into
    ``values`` (scratch [TILE_ROWS]), and used by every row."""
    _, n_blocks, _, rows_per_tile = quants.shape
    n_rows, n_out = x.shape[0], out.shape[1]
    for t in range(first_tile, end_tile):
        for b in range(n_rows):
            for r in range(rows_per_tile):
                acc[b, r] = 0.0
        for k in range(n_blocks):
            base = k * 32
            for b in range(n_rows):
                for r in range(rows_per_tile):
                    sums[b, r] = 0.0
            for j in range(32):
                for r in range(rows_per_tile):
                    values[r] = np.float32(quants[t, k, j, r])
                for b in range(n_rows):
                    xj = x[b, base + j]
                    for r in range(rows_per_tile):
                        sums[b, r] += values[r] * xj
            for b in range(n_rows):
                for r in range(rows_per_tile):
                    acc[b, r] += d[t, k, r] * sums[b, r]
        first = t * rows_per_tile
        for b in range(n_rows):
            for r in range(min(rows_per_tile, n_out - first)):
                out[b, first + r] = acc[b, r]


def _byte_product(x, quants, d, out, sums, acc, first_tile, end_tile):
    """out[b, o] = sum over blocks k of d[o, k] * sum_j q[o, k, j] * x[b, 32k + j] for the rows
    of tiles first_tile .. end_tile - 1, with signed 8-bit ``quants`` [tiles, blocks, 32,
    TILE_ROWS] and ``d`` [tiles, blocks, TILE_ROWS]."""
    _, n_blocks, _, rows_per_tile = quants.shape
    n_rows, n_out = x.shape[0], out.shape[1]
    for t in range(first_tile, end_tile):
        for b in range(n_rows):
            for r in range(rows_per_tile):
                acc[b, r] = 0.0
            for k in range(n_blocks):
                base = k * 32
                for r in range(rows_per_tile):
                    sums[b, r] = 0.0
                for j in range(32):
                    xj = x[b, base + j]
                    for r in range(rows_per_tile):
                        sums[b, r] += np.float32(quants[t, k, j, r]) * xj
                for r in range(rows_per_tile):
                    acc[b, r] += d[t, k, r] * sums[b, r]
        first = t * rows_per_tile
        for b in range(n_rows):
            for r in range(min(rows_per_tile, n_out - first)):
                out[b, first + r] = acc[b, r]


def _compiled_loop(name: str):
    """One of the loops above compiled (once per process; Numba caches the machine code)."""
    if name not in _compiled:
        decide_numba_environment()
        from numba import njit

        _compiled[name] = njit(fastmath=True, nogil=True, cache=True)(
            {"nibbles": _nibble_product, "nibbles, rows": _nibble_product_rows,
             "bytes": _byte_product, "bytes, rows": _byte_product_rows}[name])
    return _compiled[name]


def _tiles(a: np.ndarray, n_tiles: int) -> np.ndarray:
    """[rows, blocks, ...] -> [tiles, blocks, ..., TILE_ROWS], rows padded with zeros."""
    pad = n_tiles * TILE_ROWS - a.shape[0]
    a = np.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
    a = a.reshape(n_tiles, TILE_ROWS, *a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


class QuantizedMatrix:
    """A weight matrix [n_out, n_in] in GGUF blocks, regrouped for ``matvec`` (module doc)."""

    def __init__(self, rows: QuantizedRows):
        self.kind = rows.kind
        self.shape = rows.shape
        n_out, n_blocks = rows.shape[0], rows.n_blocks
        blocks = np.ascontiguousarray(rows.data).reshape(n_out, n_blocks, BLOCK_BYTES[rows.kind])
        n_tiles = -(-n_out // TILE_ROWS)
        d = float16_values(blocks[:, :, 0:2])
        if rows.kind == "Q8_0":
            self.quants = _tiles(blocks[:, :, 2:].view(np.int8), n_tiles)
            self.d, self.m = _tiles(d, n_tiles), None
        else:
            m = float16_values(blocks[:, :, 2:4]) if rows.kind == "Q4_1" else np.float32(-8.0) * d
            self.quants = _tiles(blocks[:, :, -16:], n_tiles)
            self.d, self.m = _tiles(d, n_tiles), _tiles(m, n_tiles)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.quants, self.d, self.m) if a is not None)

    def matvec(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, n_in] float32 (CPU) @ this.T -> new [B, n_out] float32."""
        n_out, n_in = self.shape
        if x.dim() != 2 or x.shape[1] != n_in or x.dtype != torch.float32:
            raise ValueError(f"a {self.kind} matrix {list(self.shape)} multiplies float32 "
                             f"rows [B, {n_in}], got {x.dtype} {list(x.shape)}")
        xs = x.contiguous().numpy()
        out = torch.empty(x.shape[0], n_out, dtype=torch.float32)
        sums, acc = (np.empty((x.shape[0], TILE_ROWS), np.float32) for _ in range(2))
        tiles = (0, self.quants.shape[0])
        one_row = x.shape[0] == 1
        if self.m is None:
            arrays = (xs, self.quants, self.d, out.numpy(), sums, acc, *tiles)
            if one_row:
                _compiled_loop("bytes")(*arrays)
            else:
                _compiled_loop("bytes, rows")(*arrays, np.empty(TILE_ROWS, np.float32))
        else:
            arrays = (xs, self.quants, self.d, self.m, out.numpy(), sums, acc, *tiles)
            if one_row:
                _compiled_loop("nibbles")(*arrays)
            else:
                _compiled_loop("nibbles, rows")(*arrays, *(np.empty(TILE_ROWS, np.float32)
                                                           for _ in range(2)))
        return out


def compile_products() -> None:
    """Compile both loops now (or read them from Numba's disk cache) by one tiny product each,
    so that no first product compiles, or imports, in the middle of a request."""
    for kind in ("Q4_1", "Q8_0"):
        matrix = QuantizedMatrix(QuantizedRows(kind, np.zeros((1, BLOCK_BYTES[kind]), np.uint8)))
        for rows in (1, 2):
            matrix.matvec(torch.zeros(rows, VALUES_PER_BLOCK))


def quantized_matrix(rows: QuantizedRows) -> QuantizedMatrix:
    """``rows`` regrouped for ``matvec``: made on the first call, then the same object."""
    with _matrices_lock:
        matrix = _matrices.get(rows)
        if matrix is None:
            matrix = _matrices[rows] = QuantizedMatrix(rows)
        return matrix


__all__ = ["QuantizedMatrix", "TILE_ROWS", "VALUES_PER_BLOCK", "compile_products",
           "quantized_matrix"]
