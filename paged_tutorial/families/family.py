"""``ModelFamily``: what one checkpoint architecture looks like to this engine.

A family says, for one architecture (Llama, Qwen2, Qwen3, ...):

* the Hugging Face tensor names and the shape each one has for a config (``tensor_shapes``);
* the llama.cpp (GGUF) name of each tensor, and whether llama.cpp's converter reordered the
  Q and K rows of its heads (it does for Llama only: ``gguf_rope_rows_interleaved``);
* which tensors are stacked into one at load (q/k/v and gate/up: ``packed_modules``);
* where each tensor goes in the forward pass (``layer_roles``): the optional roles
  ``qkv_bias`` (a bias on the QKV projection) and ``q_norm`` / ``k_norm`` (an RMSNorm over each
  head of q and of k, before RoPE) are the forward differences between the families.

A family reads only config attributes (``hidden_size``, ``q_dim``, ...), so this package
depends on nothing else in ``paged_tutorial``: the config, the loaders and the forward pass all
look families up here (``families/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

#: a tensor's shape for a config
ShapeOf = Callable[[Any], tuple[int, ...]]

#: the roles of ``LayerWeights`` (``model/decoder.py``) every family fills
REQUIRED_ROLES = ("input_norm", "qkv", "o", "post_norm", "gate_up", "down")
#: the roles a family may fill: its forward differences
OPTIONAL_ROLES = ("qkv_bias", "q_norm", "k_norm")


@dataclass(frozen=True)
class ModelFamily:
    #: short name (``llama``, ``qwen2``, ``qwen3``)
    name: str
    #: config.json ``architectures[0]`` and ``model_type``
    hf_architecture: str
    model_type: str
    #: GGUF ``general.architecture``; its hyperparameters are the ``<this>.*`` keys
    gguf_architecture: str
    #: the HF names of the embedding, the final norm and the LM head (shapes: ``tensor_shapes``)
    embed: str
    final_norm: str
    lm_head: str
    #: per-layer tensors: HF name after the layer prefix -> shape for a config
    layer_tensors: Mapping[str, ShapeOf]
    layer_prefix: str
    #: llama.cpp global name -> HF name; llama.cpp layer module -> HF module
    gguf_global_names: Mapping[str, str]
    gguf_layer_names: Mapping[str, str]
    #: llama.cpp's converter interleaved each head's Q/K rows (``permute``): undone at load
    gguf_rope_rows_interleaved: bool
    #: packed name (per layer) -> the HF tensors stacked in it, in row order
    packed_modules: Mapping[str, tuple[str, ...]]
    #: ``LayerWeights`` role -> per-layer name (HF or packed) of the tensor that fills it
    layer_roles: Mapping[str, str]
    #: config.json values this architecture assumes when the file leaves them out
    hf_defaults: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.layer_roles) - set(REQUIRED_ROLES) - set(OPTIONAL_ROLES)
        missing = set(REQUIRED_ROLES) - set(self.layer_roles)
        if unknown or missing:
            raise ValueError(f"family {self.name}: layer roles {sorted(unknown)} are unknown, "
                             f"{sorted(missing)} are missing")

    # --- names and shapes ----------------------------------------------------------------
    def layer_name(self, layer: int, name: str) -> str:
        return self.layer_prefix.format(i=layer) + name

    def tensor_shapes(self, config) -> dict[str, tuple[int, ...]]:
        """Every tensor a checkpoint of this family with ``config`` holds, with its shape, in
        model order (``lm_head`` only if untied)."""
        h, v = config.hidden_size, config.vocab_size
        per_layer = {name: shape(config) for name, shape in self.layer_tensors.items()}
        shapes = {self.embed: (v, h)}
        for layer in range(config.num_hidden_layers):
            shapes.update({self.layer_name(layer, n): s for n, s in per_layer.items()})
        shapes[self.final_norm] = (h,)
        if not config.tie_word_embeddings:
            shapes[self.lm_head] = (v, h)
        return shapes

    def num_parameters(self, config) -> int:
        total = 0
        for name, shape in self.tensor_shapes(config).items():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def packed_part_rows(self, config) -> dict[str, int]:
        """Rows of each packed part (per-layer name -> rows)."""
        return {part: self.layer_tensors[part](config)[0]
                for parts in self.packed_modules.values() for part in parts}

    def is_packed_part(self, name: str) -> bool:
        return any(name.endswith("." + part) for parts in self.packed_modules.values()
                   for part in parts)

    # --- GGUF ---------------------------------------------------------------------------
    def hf_name_from_gguf(self, name: str) -> str | None:
        """llama.cpp tensor name -> HF name (``blk.3.attn_q.weight`` ->
        ``model.layers.3.self_attn.q_proj.weight``); None when it has no HF counterpart."""
        if name in self.gguf_global_names:
            return self.gguf_global_names[name]
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() \
                and parts[2] in self.gguf_layer_names and parts[3] in ("weight", "bias"):
            return self.layer_name(int(parts[1]), f"{self.gguf_layer_names[parts[2]]}.{parts[3]}")
        return None

    def gguf_key(self, key: str) -> str:
        """A hyperparameter's GGUF key: ``attention.head_count`` -> ``qwen2.attention.head_count``."""
        return f"{self.gguf_architecture}.{key}"
