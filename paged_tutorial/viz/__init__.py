"""Figures and widgets for the notebooks, drawn from what the engine actually holds or did.

Modules by chapter: ``layout`` (01-02: a block's bytes, the block table as a heatmap, memory
over a run, and the layout / placement figures of the puzzles 01.kv_offset and 02.locate),
``addresses`` (03: where the decode kernel reads, and the read maps of the address puzzles),
``warps`` (04: demo kernels of one warp's shuffles, lane diagrams, warp coverage),
``softmax`` (05: the online softmax token by token), ``lifetime`` (06: the physical block map
over a recorded run, with an ipywidgets slider), and ``kernel_source`` (03-05: the article's
kernel as the package runs it, piece by piece next to kernels.cu lines, and the port's
departures).  ``kernels`` only re-exports the first round's names.

Nothing here changes the engine: recordings come from public hooks
(``backends.numba_cuda.access_log``, the cache's event listeners) and the references the
figures compare with live in ``paged_tutorial.oracles``.  matplotlib is imported lazily by each
function, so the engine never needs it.
"""
