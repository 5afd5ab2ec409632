"""What the notebooks use and the engine never imports: ``exercises`` and ``puzzles`` (the
learner's answers, graded inside the real kernels and engine), ``viz`` (figures and widgets drawn
from what the engine did), ``oracles`` (reference attention and poisoned caches), ``memory_use``
and ``table_copy`` (two experiments of the notebooks) and ``results`` (the one reader of the
committed benchmark results)."""
