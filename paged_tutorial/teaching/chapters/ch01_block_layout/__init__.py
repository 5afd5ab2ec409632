"""Notebook 01, one block's layout: exercises, the ``block_layout`` puzzle, ``layout`` figures."""
