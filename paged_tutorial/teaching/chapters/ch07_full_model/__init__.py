"""Notebook 07, the full model: its exercises."""
