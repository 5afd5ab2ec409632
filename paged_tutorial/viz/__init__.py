"""Figures and widgets for the notebooks, drawn from what the engine actually holds.

Modules by topic: ``layout`` (a block's bytes, the block table as a heatmap), ``kernels``
(address traces, lane diagrams of the warp reduction, online-softmax curves) and
``lifetime`` (the physical block map over a recorded run, with an ipywidgets slider).
matplotlib is imported lazily by each function, so the engine never needs it.
"""
