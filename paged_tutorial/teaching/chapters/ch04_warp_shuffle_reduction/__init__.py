"""Notebook 04, the warp reduction: exercises, the ``score_handoff`` puzzle, figures."""
