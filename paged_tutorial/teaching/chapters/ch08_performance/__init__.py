"""Notebook 08, performance: the committed GPU measurements drawn (``performance``)."""
