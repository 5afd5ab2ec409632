"""Notebook 05: exercises, the ``online_softmax`` and ``output_store`` puzzles, figures."""
