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

from paged_tutorial.families import FAMILIES, family_for_hf, family_of

DTYPE_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def check_dtype(dtype: str) -> str:
    """Normalise a dtype name ("bf16", "torch.bfloat16", ...) or raise a clear ValueError."""
    name = str(dtype).replace("torch.", "").lower()
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
            "float": "float32"}.get(name, name)
    if name not in DTYPE_ITEMSIZE:
        raise ValueError(
            f"unsupported dtype {dtype!r}: choose one of {sorted(DTYPE_ITEMSIZE)}")
    return name


class ConfigFieldError(ValueError):
    """A model-config field whose value is outside what the engine accepts.

    ``field`` is the ModelConfig name (``num_attention_heads``); ``shown_as`` is how the file
    spells it (``llama.attention.head_count`` in a GGUF), used in the message."""

    def __init__(self, field: str, value: Any, expected: str, shown_as: str | None = None):
        self.field, self.value, self.expected = field, value, expected
        self.shown_as = shown_as or field
        super().__init__(f"{self.shown_as} must be {expected}, got {describe_value(value)}")

    def spelled(self, names: Mapping[str, str]) -> "ConfigFieldError":
        """The same error with the field named as ``names`` spells it (else unchanged)."""
        shown = names.get(self.field)
        if shown is None:
            return self
        return ConfigFieldError(self.field, self.value, self.expected, f"{shown} ({self.field})")


ABSENT = object()      # the value of a ConfigFieldError for a key the file does not have


def describe_value(value: Any) -> str:
    """``4.5 (float)``: the value and its type, short enough for one error line."""
    if value is ABSENT:
        return "nothing (the key is absent)"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = "null" if value is None else type(value).__name__
    return f"{text} ({kind})"


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_int(field: str, value: Any) -> int:
    """``value`` if it is an integer >= 1; a float (even 4.0) or a bool is refused, never
    truncated."""
    if not _is_integer(value) or value <= 0:
        raise ConfigFieldError(field, value, "a positive integer (1, 2, ...)")
    return value


def check_token_id(field: str, value: Any) -> int:
    if not _is_integer(value) or value < 0:
        raise ConfigFieldError(field, value, "a token id (an integer >= 0)")
    return value


FLOAT32_MAX = 3.4028234663852886e38     # the tables RoPE builds are float32


def check_number(field: str, value: Any, *, above: float = 0.0, at_least: float | None = None,
                 below: float = FLOAT32_MAX) -> float:
    """``value`` as a float if it is a finite number in range: > ``above`` (or >= ``at_least``
    when given) and < ``below``.  Bools and strings are refused."""
    in_range = _is_real(value) and (value >= at_least if at_least is not None
                                    else value > above) and value < below  # NaN fails both
    if not in_range:
        low = f"at least {at_least:g}" if at_least is not None else f"above {above:g}"
        raise ConfigFieldError(field, value, f"a finite number {low} and below {below:.3g}")
    return float(value)


def check_positive_finite(field: str, value: Any) -> float:
    return check_number(field, value)


def check_scale_factor(field: str, value: Any) -> float:
    """A RoPE scaling factor: stretches wavelengths, so at least 1 (as transformers checks)."""
    return check_number(field, value, at_least=1.0)


# What each RoPE type needs in rope_scaling (besides rope_type), with the check for each key.
ROPE_SCALING_KEYS = {
    "default": {},
    "linear": {"factor": check_scale_factor},
    "llama3": {"factor": check_scale_factor, "low_freq_factor": check_positive_finite,
               "high_freq_factor": check_positive_finite,
               "original_max_position_embeddings": check_positive_int},
}
SUPPORTED_ROPE_TYPES = tuple(ROPE_SCALING_KEYS)
ROPE_SCALING_EXAMPLE = '{"rope_type": "linear", "factor": 2.0}'


def check_rope_scaling(value: Any) -> dict | None:
    """None for plain RoPE, else a dict with ``rope_type`` (the older key ``type`` is read too)
    and every key that type needs, each checked."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigFieldError("rope_scaling", value,
                               f"null or an object such as {ROPE_SCALING_EXAMPLE}")
    scaling = dict(value)
    if "rope_type" not in scaling and "type" in scaling:
        scaling["rope_type"] = scaling.pop("type")
    rope_type = scaling.get("rope_type", "default")
    if not isinstance(rope_type, str) or rope_type not in ROPE_SCALING_KEYS:
        raise ConfigFieldError(
            "rope_scaling.rope_type", rope_type,
            f"a RoPE type this engine implements ({', '.join(SUPPORTED_ROPE_TYPES)})")
    if rope_type == "default":
        return None
    for key, check in ROPE_SCALING_KEYS[rope_type].items():
        if key not in scaling:
            raise ConfigFieldError(f"rope_scaling.{key}", ABSENT,
                                   f"given for RoPE type {rope_type!r} (it needs "
                                   f"{', '.join(ROPE_SCALING_KEYS[rope_type])})")
        scaling[key] = check(f"rope_scaling.{key}", scaling[key])
    if rope_type == "llama3" and scaling["low_freq_factor"] >= scaling["high_freq_factor"]:
        raise ConfigFieldError("rope_scaling.low_freq_factor", scaling["low_freq_factor"],
                               f"below high_freq_factor ({scaling['high_freq_factor']:g})")
    return scaling


def check_eos_token_ids(value: Any) -> tuple[int, ...]:
    """An id, a list of ids, or none (null / absent) -> a tuple of ids."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(check_token_id("eos_token_ids", v) for v in value)
    if _is_integer(value):
        return (check_token_id("eos_token_ids", value),)
    raise ConfigFieldError("eos_token_ids", value, "a token id or a list of token ids")


def check_model_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The one validator both readers (config.json, GGUF metadata) and ModelConfig itself go
    through: every field checked by name, value and accepted range, in a fixed order, and
    returned normalised (``head_dim`` / ``num_key_value_heads`` of None derived as Llama derives
    them, rope_scaling in one spelling, eos ids as a tuple).  Raises ConfigFieldError."""
    out = dict(fields)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads"):
        check_positive_int(name, out[name])
    heads = out["num_attention_heads"]
    if out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = heads
    kv_heads = check_positive_int("num_key_value_heads", out["num_key_value_heads"])
    if heads % kv_heads:
        raise ConfigFieldError(
            "num_key_value_heads", kv_heads,
            f"a divisor of num_attention_heads ({heads}) for grouped-query attention")
    if out.get("head_dim") is None:
        if out["hidden_size"] % heads:
            raise ConfigFieldError(
                "num_attention_heads", heads,
                f"a divisor of hidden_size ({out['hidden_size']}) when head_dim is not given "
                "(head_dim = hidden_size / num_attention_heads)")
        out["head_dim"] = out["hidden_size"] // heads
        if out["head_dim"] % 2:
            raise ConfigFieldError(
                "hidden_size", out["hidden_size"],
                f"a multiple of 2 x num_attention_heads ({2 * heads}) when head_dim is not "
                "given (head_dim = hidden_size / num_attention_heads must be even for RoPE)")
    head_dim = check_positive_int("head_dim", out["head_dim"])
    if head_dim % 2:
        raise ConfigFieldError("head_dim", head_dim, "even (RoPE rotates pairs)")
    out["rms_norm_eps"] = check_number("rms_norm_eps", out["rms_norm_eps"], below=1.0)
    # RoPE's base wavelength: frequencies theta^(-2i/d) must fall with i, so above 1.
    out["rope_theta"] = check_number("rope_theta", out["rope_theta"], above=1.0)
    out["rope_scaling"] = check_rope_scaling(out.get("rope_scaling"))
    check_positive_int("max_position_embeddings", out["max_position_embeddings"])
    if not isinstance(out["tie_word_embeddings"], bool):
        raise ConfigFieldError("tie_word_embeddings", out["tie_word_embeddings"],
                               "true or false")
    if out.get("bos_token_id") is not None:
        check_token_id("bos_token_id", out["bos_token_id"])
    out["eos_token_ids"] = check_eos_token_ids(out.get("eos_token_ids"))
    if not isinstance(out["architecture"], str) or out["architecture"] not in SERVED_ARCHITECTURES:
        raise ConfigFieldError("architecture", out["architecture"],
                               f"one of {', '.join(SERVED_ARCHITECTURES)}")
    return out


#: the ``architecture`` values a ModelConfig may hold: one per family (``families/``)
SERVED_ARCHITECTURES = tuple(f.hf_architecture for f in FAMILIES)


# config.json spells these differently from ModelConfig.
HF_FIELD_NAMES = {"eos_token_ids": "eos_token_id", "architecture": "architectures"}


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a model of one of the served families (HF ``LlamaConfig`` field names;
    ``architecture`` names the family: ``families/``).

    Every field is checked on construction (:func:`check_model_fields`); ``head_dim`` or
    ``num_key_value_heads`` given as None are derived (hidden_size / num_attention_heads, and
    no grouping).  ``from_fields`` is what the file readers call: the same checks, with errors
    naming the field as the file spells it."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None
    head_dim: int | None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self):
        checked = check_model_fields({f.name: getattr(self, f.name)
                                      for f in dataclasses.fields(self)})
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any],
                    names: Mapping[str, str] | None = None) -> "ModelConfig":
        """A config from raw values as read from a file; a ConfigFieldError names the field as
        ``names`` spells it (``{"num_attention_heads": "llama.attention.head_count"}``)."""
        try:
            return cls(**fields)
        except ConfigFieldError as exc:
            raise exc.spelled(names or {}) from None

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
        return self.rope_scaling["rope_type"] if self.rope_scaling else "default"

    @property
    def family(self):
        """The ``ModelFamily`` of this architecture (``families/``)."""
        return family_of(self)

    def num_parameters(self) -> int:
        return self.family.num_parameters(self)

    # --- constructors --------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Read a ``config.json`` in the hub's spelling (``rope_theta`` + ``rope_scaling``) or in
        transformers 5's (``rope_parameters``).  Values are taken as written and checked by
        :func:`check_model_fields`: nothing is converted, so 4.5 heads is refused, not 4."""
        archs = d.get("architectures")
        if archs is None or archs == []:
            archs = ["LlamaForCausalLM"]
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ConfigFieldError("architectures", archs,
                                   'a list of strings such as ["LlamaForCausalLM"]')
        family = family_for_hf(archs[0], d.get("model_type", "llama"))
        d = dict(d)
        for key, default in family.hf_defaults.items():    # what transformers assumes
            if d.get(key) is None:
                d[key] = default
        if d.get("use_sliding_window"):
            raise ValueError(
                "use_sliding_window is true: sliding-window attention is not supported "
                "(every layer here attends to the whole sequence); use a checkpoint with "
                "use_sliding_window false")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"config.json lacks required field(s) {missing}")
        rope_params = d.get("rope_parameters")
        rope_scaling = d.get("rope_scaling")
        rope_theta = d.get("rope_theta", 10000.0)
        if rope_params is not None:
            if not isinstance(rope_params, Mapping):
                raise ConfigFieldError("rope_parameters", rope_params,
                                       'null or an object such as {"rope_type": "default", '
                                       '"rope_theta": 10000.0}')
            rope_theta = rope_params.get("rope_theta", rope_theta)
            if rope_params.get("rope_type", "default") != "default":
                rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        return cls.from_fields(dict(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads"), head_dim=d.get("head_dim"),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            bos_token_id=d.get("bos_token_id"), eos_token_ids=d.get("eos_token_id"),
            architecture=archs[0],
        ), HF_FIELD_NAMES)

    def to_hf_dict(self) -> dict:
        """A hub-style ``config.json`` dict (used to build HF reference models in tests)."""
        d = {
            "architectures": [self.architecture], "model_type": self.family.model_type,
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
