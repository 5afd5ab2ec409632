"""Notebook 03, the kernel's addresses: exercises, the ``block_walk`` puzzle, figures."""
