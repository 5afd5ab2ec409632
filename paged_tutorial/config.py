"""Model and cache configuration: the one place every constant is defined.

The article's engine defines its cache constants twice (``src/main.cpp:32-37`` and again in
``src/kernels.cu:16-19``, with a TODO at ``kernels.cu:6`` asking for one definition).  Here
``CacheConfig`` derives them once from the model and the cache size, and both the host code
(``cache/``) and the kernels (``backends/``) read them from the same object.

Names follow the article: ``BLOCK_SIZE``, ``KV_DIM``, ``V_OFFSET``, ``BLOCK_BYTES``,
``NUM_BLOCKS``, ``MAX_BLOCKS_PER_SEQ``.  Byte quantities are in bytes (as in the article);
the ``*_ELEMS`` twins are the same offsets counted in cache elements, which is what a kernel
indexing a typed array needs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

DTYPE_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


def check_dtype(dtype: str) -> str:
    """Normalise a dtype name ("bf16", "torch.bfloat16", ...) or raise a clear ValueError."""
    name = str(dtype).replace("torch.", "").lower()
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
            "float": "float32"}.get(name, name)
    if name not in DTYPE_ITEMSIZE:
        raise ValueError(
            f"unsupported dtype {dtype!r}: choose one of {sorted(DTYPE_ITEMSIZE)}")
    return name


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-architecture model (HF ``LlamaConfig`` field names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model config: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"model config: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads}) for grouped-query "
                "attention")
        if self.head_dim % 2:
            raise ValueError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        rope_type = self.rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported RoPE type {rope_type!r} in rope_scaling: this engine implements "
                f"{', '.join(SUPPORTED_ROPE_TYPES)}")

    # --- derived sizes -------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def n_heads(self) -> int:
        return self.num_attention_heads

    @property
    def n_kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def q_per_kv(self) -> int:
        """Query heads sharing one K/V head (the article's ``q_head / 4`` is this ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def rope_type(self) -> str:
        if not self.rope_scaling:
            return "default"
        return str(self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default")))

    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        per_layer = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + 3 * h * i + 2 * h
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + emb + h

    # --- constructors --------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Read a ``config.json`` in the hub's spelling (``rope_theta`` + ``rope_scaling``) or in
        transformers 5's (``rope_parameters``)."""
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        model_type = d.get("model_type", "llama")
        if model_type != "llama" or archs[0] != "LlamaForCausalLM":
            raise ValueError(
                f"unsupported architecture {archs[0]!r} (model_type {model_type!r}): this engine "
                "runs Llama-architecture models (LlamaForCausalLM) only")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"config.json lacks required field(s) {missing}")
        n_heads = int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or d["hidden_size"] // n_heads
        rope_params = d.get("rope_parameters")
        rope_scaling = d.get("rope_scaling")
        rope_theta = d.get("rope_theta")
        if isinstance(rope_params, Mapping):
            rope_theta = rope_params.get("rope_theta", rope_theta)
            if rope_params.get("rope_type", "default") != "default":
                rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if isinstance(rope_scaling, Mapping):
            rope_scaling = dict(rope_scaling)
            if "type" in rope_scaling and "rope_type" not in rope_scaling:
                rope_scaling["rope_type"] = rope_scaling.pop("type")
            if rope_scaling.get("rope_type") == "default":
                rope_scaling = None
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=n_heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or n_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling or None,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            architecture=archs[0],
        )

    def to_hf_dict(self) -> dict:
        """A hub-style ``config.json`` dict (used to build HF reference models in tests)."""
        d = {
            "architectures": [self.architecture], "model_type": "llama",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False,
        }
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            d["eos_token_id"] = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 \
                else self.eos_token_ids[0]
        return d

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def llama_3_2_1b_config() -> ModelConfig:
    """Llama-3.2-1B-Instruct's public config: the model the article's engine hard-codes."""
    return ModelConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
    )


def smollm2_135m_config() -> ModelConfig:
    """SmolLM2-135M-Instruct's shapes (what the embedded GGUF's metadata says): for GPU runs
    with random weights where the 98 MB GGUF cannot travel."""
    return ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
        rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=1, eos_token_ids=(2,))


# The article's defaults (src/main.cpp:15,29,32-38).
BLOCK_SIZE_DEFAULT = 16
GPU_KV_CACHE_BYTES_DEFAULT = 2 * 1024 ** 3
CPU_KV_CACHE_BYTES_DEFAULT = 256 * 1024 ** 2


@dataclass(frozen=True)
class CacheConfig:
    """Layout of the paged KV cache, with the article's constant names.

    One flat buffer of ``NUM_BLOCKS`` blocks.  A block holds ``BLOCK_SIZE`` tokens of one
    layer of one sequence: first their K vectors (``BLOCK_SIZE x KV_DIM`` elements), then,
    ``V_OFFSET`` bytes later, their V vectors.  K and V are stored in the model's dtype.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    kv_cache_bytes: int = GPU_KV_CACHE_BYTES_DEFAULT
    max_slots: int = 2
    max_seq_len: int = 2048
    block_size: int = BLOCK_SIZE_DEFAULT

    def __post_init__(self):
        object.__setattr__(self, "dtype", check_dtype(self.dtype))
        for name in ("num_layers", "num_kv_heads", "head_dim", "max_slots", "max_seq_len",
                     "block_size", "kv_cache_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"cache config: {name} must be a positive integer, got {value!r}")
        if self.NUM_BLOCKS < 1:
            raise ValueError(
                f"kv_cache_bytes={self.kv_cache_bytes} holds no block: one block of "
                f"{self.block_size} tokens needs BLOCK_BYTES={self.BLOCK_BYTES} bytes; "
                "raise kv_cache_bytes")

    @classmethod
    def for_model(cls, model: ModelConfig, **kwargs) -> "CacheConfig":
        return cls(num_layers=model.num_hidden_layers, num_kv_heads=model.num_key_value_heads,
                   head_dim=model.head_dim, **kwargs)

    # --- the article's constants ---------------------------------------------------------
    @property
    def BLOCK_SIZE(self) -> int:
        """Tokens per block (16 in the article)."""
        return self.block_size

    @property
    def ITEMSIZE(self) -> int:
        """Bytes per stored K/V element (bf16: 2)."""
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def KV_DIM(self) -> int:
        """Elements of one token's K (or V) across all KV heads: n_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def V_OFFSET(self) -> int:
        """Bytes from a block's start to its V half: BLOCK_SIZE * KV_DIM * itemsize."""
        return self.BLOCK_SIZE * self.KV_DIM * self.ITEMSIZE

    @property
    def BLOCK_BYTES(self) -> int:
        """Bytes of one block: K half plus V half."""
        return 2 * self.V_OFFSET

    @property
    def NUM_BLOCKS(self) -> int:
        """Physical blocks the cache buffer holds."""
        return self.kv_cache_bytes // self.BLOCK_BYTES

    @property
    def MAX_BLOCKS_PER_SEQ(self) -> int:
        """Logical blocks one (slot, layer) can own: ceil(max_seq_len / BLOCK_SIZE)."""
        return math.ceil(self.max_seq_len / self.BLOCK_SIZE)

    # --- the same offsets in elements (what kernels index with) ---------------------------
    @property
    def V_OFFSET_ELEMS(self) -> int:
        return self.V_OFFSET // self.ITEMSIZE

    @property
    def BLOCK_ELEMS(self) -> int:
        return self.BLOCK_BYTES // self.ITEMSIZE

    @property
    def block_table_entries(self) -> int:
        return self.max_slots * self.num_layers * self.MAX_BLOCKS_PER_SEQ

    @property
    def cache_bytes_used(self) -> int:
        """Bytes actually allocated (NUM_BLOCKS whole blocks)."""
        return self.NUM_BLOCKS * self.BLOCK_BYTES

    def blocks_for_tokens(self, n_tokens: int) -> int:
        """Blocks one (slot, layer) needs to hold n_tokens."""
        return -(-n_tokens // self.BLOCK_SIZE)

    def summary(self) -> dict:
        return {name: getattr(self, name) for name in (
            "BLOCK_SIZE", "KV_DIM", "V_OFFSET", "BLOCK_BYTES", "NUM_BLOCKS", "MAX_BLOCKS_PER_SEQ")}
