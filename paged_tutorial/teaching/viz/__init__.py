"""Figures and widgets for the notebooks, drawn from what the engine actually holds or did.

Modules by chapter: ``flow`` (00: the article's whole flow, free_blocks -> table -> kernel ->
addresses -> softmax -> release, filled in from a live engine), ``layout`` (00-02: a block's
bytes, the block table with its ids coloured by the step that popped them, one table row as
arrows into the block pool, memory over a run, the paper's memory-use bars, and the layout /
placement figures of the puzzles 01.kv_offset and 02.locate),
``addresses`` (03: where the decode kernel reads, and the read maps of the address puzzles),
``warps`` (04: demo kernels of one warp's shuffles, lane diagrams, warp coverage),
``softmax`` (05: the online softmax token by token), ``races`` (05: what NVIDIA's race checker
found in the article's shared-memory layout, read from the committed result), ``lifetime`` (06:
the physical block map over a recorded run, with an ipywidgets slider), ``performance`` (08: the
decode ladder and the attention kernels, drawn from the committed GPU measurements), and
``kernel_source`` (03-05: the article's kernel as the package runs it, piece by piece next to
kernels.cu lines, and the port's departures).  The committed results they draw come from
``paged_tutorial.teaching.results``.

Nothing here changes the engine: recordings come from public hooks
(``backends.numba_cuda.runtime.access_log``, the cache's event listeners) and the references the
figures compare with live in ``paged_tutorial.teaching.oracles``.  matplotlib is imported
lazily by each function, so the engine never needs it.
"""
