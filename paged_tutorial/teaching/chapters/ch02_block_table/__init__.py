"""Notebook 02, the block table: exercises, the ``block_table`` and ``kernel_addresses`` puzzles."""
