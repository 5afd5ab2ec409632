"""Notebook 00, the overview: its exercises and the article's whole flow (``flow``)."""
