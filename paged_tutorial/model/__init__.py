"""The Llama forward pass over the paged cache (``llama``), its rotary embedding tables
(``rope``) and the sampling rule every backend must follow (``sampling``)."""
