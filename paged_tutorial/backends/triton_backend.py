"""``TritonAttentionBackend``: the numba backend with the Triton decode attention kernel
(``triton_attention.py``) in place of its own: the peer the benchmarks time the Numba kernels
against.  Every other op is ``NumbaBackend``'s.  Needs Triton and a GPU (or
``TRITON_INTERPRET=1`` on a CPU, slowly: ``triton_attention.available()``)."""

from __future__ import annotations

from paged_tutorial.backends.numba_cuda import NumbaBackend
from paged_tutorial.backends.triton_attention import available, decode_attention_triton


class TritonAttentionBackend(NumbaBackend):
    """``NumbaBackend`` whose ``decode_attention`` is the Triton kernel."""

    def __init__(self, *args, **kwargs):
        if not available():
            raise RuntimeError("TritonAttentionBackend needs Triton on a CUDA GPU (or "
                               "TRITON_INTERPRET=1): install triton, or use NumbaBackend")
        super().__init__(*args, **kwargs)

    def describe(self) -> str:
        return super().describe() + ", Triton decode attention"

    def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                         max_seq_len=None):
        lens32, slots32 = self.checked_decode_inputs(q, cache, block_table, layer,
                                                     seq_lens, active_slots)
        if q.shape[0] == 0:
            return q
        return decode_attention_triton(q, cache, block_table, layer, lens32, slots32, scale)
