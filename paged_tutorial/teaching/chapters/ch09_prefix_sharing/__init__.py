"""Notebook 09, prefix sharing: exercises, the ``prefix_sharing`` puzzle, ``sharing`` figures."""
