"""What the notebooks use and the engine never imports: ``exercises`` (the checker),
``chapters`` (one folder per notebook: its exercises, puzzles and figures, the learner's answers
graded inside the real kernels and engine) over ``harness`` (what every chapter shares),
``oracles`` (reference attention and poisoned caches), ``memory_use`` (an experiment of the
notebooks) and ``results`` (the one reader of the committed benchmark results)."""
