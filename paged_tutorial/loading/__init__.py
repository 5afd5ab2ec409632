"""Weights in, tokens out: ``models`` (``load_model``: a name, a folder or a file to a ``Model``),
``weights`` (safetensors and GGUF readers, shape checks), ``packed_weights`` (q/k/v and gate/up
packed once at load), ``tokenizer`` (tokenizer and chat template), ``catalog`` (the models this
package knows by name) and ``model_choice`` (which model suits this machine)."""
