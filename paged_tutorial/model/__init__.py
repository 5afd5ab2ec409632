"""The decoder forward pass over the paged cache, shared by every model family (``decoder``),
its rotary embedding tables (``rope``) and the sampling rule every backend must follow
(``sampling``)."""
