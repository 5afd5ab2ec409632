"""Notebook 06, block lifetime: exercises, the ``allocator`` and ``table_sync`` puzzles,
``lifetime``."""
