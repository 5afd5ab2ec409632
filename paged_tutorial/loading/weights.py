"""Reading checkpoints into ``{HF tensor name: torch.Tensor}`` plus a ``ModelConfig``.

Two on-disk formats are understood:

* a Hugging Face folder: ``config.json`` + one or more ``*.safetensors`` (sharded ones listed in
  ``model.safetensors.index.json``), optionally ``generation_config.json``;
* a llama.cpp GGUF file, whose tensors may be quantized (Q4_1, Q8_0, K-quants, ...).  They are
  read by ``gguf_file.py`` and dequantized on the target device by ``gguf_torch.py`` (the
  quantized bytes are copied, then expanded there; the ``gguf`` package on the host for rare
  quantizations) and renamed to the HF names.  Which names, and which shapes a config implies,
  is the checkpoint's family's to say (``families/``: Llama, Qwen2, Qwen3); a Llama's Q and K
  are also un-permuted: llama.cpp's converter reorders each head's rows so its RoPE can rotate
  adjacent pairs, while HF (and this engine) rotate the two halves of a head.

Both loaders check shapes with :func:`check_weights` from the file headers *before* reading any
data, so a config that does not match its weights fails at once, with the tensor's name and
both shapes, instead of a shape error deep inside a matmul.

Both read tensor by tensor and put each one on the target ``device`` in the target dtype before
reading the next: loading Llama-3.2-1B in bfloat16 onto a GPU holds one tensor at a time in host
memory, never a second copy of the model.  ``progress=True`` shows a tqdm bar (on stderr).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from paged_tutorial.config import (ConfigFieldError, ModelConfig, check_dtype, check_eos_token_ids,
                                   check_token_id)
from paged_tutorial.families import LLAMA, ModelFamily, family_for_gguf, family_of
from paged_tutorial.families.rope_scaling import llama3_rope_factors
from paged_tutorial.loading.gguf_file import GGUFFile
from paged_tutorial.loading.gguf_torch import dequantize_on

# --- the tensors of a checkpoint (names and shapes: the family's, ``families/``) -------------

_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.")
# Saved by some older checkpoints; a buffer recomputed from the config, never a weight.
IGNORED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq",)


def progress_bar(total: int, label: str, enabled: bool):
    """A tqdm bar over ``total`` tensors on stderr when ``enabled``, else a silent stand-in
    with the same ``update`` / ``close`` methods."""
    if enabled:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=label, unit="tensor", leave=False, dynamic_ncols=True)

    class _Silent:
        def update(self, n=1):
            pass

        def close(self):
            pass

    return _Silent()


def place_tensor(tensor: torch.Tensor, torch_dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` in ``torch_dtype``.  To a GPU, the copy goes first and the
    conversion runs there (the host holds only the tensor as read from the file)."""
    if device.type == "cpu":
        return tensor.to(torch_dtype)
    return tensor.to(device).to(torch_dtype)


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of this config's family has, with its shape (``lm_head`` only
    if untied)."""
    return family_of(config).tensor_shapes(config)


def _config_summary(config: ModelConfig) -> str:
    return (f"hidden_size={config.hidden_size}, intermediate_size={config.intermediate_size}, "
            f"vocab_size={config.vocab_size}, num_attention_heads={config.num_attention_heads}, "
            f"num_key_value_heads={config.num_key_value_heads}, head_dim={config.head_dim}, "
            f"num_hidden_layers={config.num_hidden_layers}, "
            f"tie_word_embeddings={config.tie_word_embeddings}")


def check_weights(config: ModelConfig, tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise ValueError unless ``tensors`` holds exactly the tensors ``config`` describes, each
    with the shape it implies.  A tied checkpoint may still carry an ``lm_head.weight``.
    The layer count is compared first, so a wild ``num_hidden_layers`` is named as such."""
    layers = {int(m.group(1)) for m in map(_HF_LAYER_RE.match, tensors) if m}
    if layers and config.num_hidden_layers != max(layers) + 1:
        raise ValueError(
            f"the config says num_hidden_layers={config.num_hidden_layers} but the checkpoint "
            f"holds {max(layers) + 1} layers (model.layers.0 to model.layers.{max(layers)}): "
            "the config does not belong to these weights; use the config.json shipped with them")
    family = family_of(config)
    expected = family.tensor_shapes(config)
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(
            f"checkpoint is missing required tensor {missing[0]!r}{more}: the file is incomplete "
            f"(re-download it) or is not a {family.hf_architecture} checkpoint matching its "
            f"config ({_config_summary(config)})")
    optional = {family.lm_head: (config.vocab_size, config.hidden_size)}
    unexpected = [name for name in tensors if name not in expected and name not in optional]
    if unexpected:
        raise ValueError(
            f"checkpoint has tensor {unexpected[0]!r}, which a {family.hf_architecture} does "
            f"not have here ({len(unexpected)} such tensor(s)); tensors the family does not "
            "have (biases, norms), extra layers or other architectures are not supported: "
            "use a plain "
            f"{family.hf_architecture} checkpoint whose config matches its weights "
            f"({_config_summary(config)})")
    present = {**expected, **{n: s for n, s in optional.items() if n in tensors}}
    for name, want in present.items():            # in model order: the embedding first
        found = tuple(tensors[name].shape)
        if found != want:
            raise ValueError(
                f"tensor {name!r} has shape {list(found)} but the config expects {list(want)} "
                f"({_config_summary(config)}): the config does not belong to these weights; "
                "use the config.json shipped with them")


# --- Hugging Face folders (config.json + safetensors) -----------------------------------------

HF_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; ValueError naming the file if it is not valid JSON."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): the file is truncated or "
                         "corrupt; re-download it") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, found {type(data).__name__}")
    return data


def _require_folder(folder: Path) -> None:
    if not folder.exists():
        raise FileNotFoundError(
            f"model folder {folder} does not exist: expected a folder with config.json and "
            "*.safetensors (a Hugging Face model download)")
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder} is a file, not a model folder: expected a folder with config.json and "
            "*.safetensors (a Hugging Face model download)")


def read_hf_config(folder: Path) -> ModelConfig:
    """``config.json`` (hub or transformers-5 spelling).  The stop ids of
    ``generation_config.json`` are merged with the others in one place: ``models.py``."""
    config_path = folder / HF_CONFIG
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{folder} has no {HF_CONFIG}: a Hugging Face model folder needs config.json next to "
            "its *.safetensors; download the complete model repository")
    try:
        return ModelConfig.from_hf_dict(read_json(config_path))
    except ValueError as exc:
        raise ValueError(f"{config_path}: {exc}") from exc


def read_generation_eos_ids(folder: Path) -> tuple[int, ...]:
    """The ``eos_token_id`` (int or list) of ``generation_config.json``; () when absent."""
    path = folder / GENERATION_CONFIG
    if not path.is_file():
        return ()
    try:
        return check_eos_token_ids(read_json(path).get("eos_token_id"))
    except ConfigFieldError as exc:
        raise ValueError(f"{path}: {exc.spelled({'eos_token_ids': 'eos_token_id'})}") from None


def safetensors_files(folder: Path) -> list[Path]:
    """The shard files named by ``model.safetensors.index.json``, else every ``*.safetensors``."""
    index_path = folder / SAFETENSORS_INDEX
    if index_path.is_file():
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index_path} has no 'weight_map': the index is corrupt; "
                             "re-download it")
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(
                f"{folder} lacks shard(s) {absent} listed in {SAFETENSORS_INDEX}: the download "
                "is incomplete; download the missing files")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in folder.iterdir()
                        if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
        hint = (f" (found {others}: only safetensors is read from a folder; pass a .gguf file "
                "directly, or convert .bin weights with transformers' save_pretrained)"
                if others else "")
        raise FileNotFoundError(
            f"{folder} has no *.safetensors weight files{hint}: download the model's "
            "*.safetensors files next to its config.json")
    return files


def _safetensors_error(path: Path, exc: Exception) -> ValueError:
    return ValueError(f"{path} is not a readable safetensors file ({exc}): it is truncated or "
                      "corrupt; re-download it")


def read_safetensors_file(path: Path, torch_dtype: torch.dtype,
                          device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, each converted to ``torch_dtype`` on ``device``."""
    return read_safetensors_files([path], torch_dtype, device)


#: safetensors dtypes a weight may be stored in: floating point, converted at load
FLOAT_SAFETENSORS_DTYPES = ("F64", "F32", "F16", "BF16")


def safetensors_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, read from the file headers only (no tensor data is read).

    Refused here, before any data is read: a tensor stored in two of the files (a stale
    second ``.safetensors`` left in the folder: which copy is right cannot be known), and a
    tensor whose dtype is not floating point (int8 or bool weights are quantized or broken
    checkpoints; converting them to floats would load nonsense silently)."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    stored_in: dict[str, Path] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name.endswith(IGNORED_TENSOR_SUFFIXES):
                        continue
                    if name in stored_in:
                        raise ValueError(
                            f"tensor {name!r} is stored both in {stored_in[name]} and in "
                            f"{path}: one of the files is stale (left from another download?); "
                            "keep only the model's own *.safetensors in the folder")
                    info = f.get_slice(name)
                    dtype = info.get_dtype()
                    if dtype not in FLOAT_SAFETENSORS_DTYPES:
                        raise ValueError(
                            f"{path}: tensor {name!r} is stored as {dtype}, not as a "
                            f"floating-point type ({', '.join(FLOAT_SAFETENSORS_DTYPES)}): "
                            "quantized or integer checkpoints are not supported; use the "
                            "model's unquantized safetensors (or a GGUF file)")
                    stored_in[name] = path
                    shapes[name] = tuple(info.get_shape())
        except SafetensorError as exc:
            raise _safetensors_error(path, exc) from exc
    return shapes


def read_safetensors_files(files: list[Path], torch_dtype: torch.dtype,
                           device: str | torch.device = "cpu", progress: bool = False,
                           total: int | None = None) -> dict[str, torch.Tensor]:
    """The tensors of ``files``, read one at a time and placed on ``device`` as ``torch_dtype``
    (see :func:`place_tensor`)."""
    from safetensors import SafetensorError, safe_open

    device = torch.device(device)
    label = f"loading {files[0].parent.name or files[0].name}" if files else "loading"
    bar = progress_bar(total if total is not None else 0, label, progress)
    tensors = {}
    try:
        for path in files:
            try:
                with safe_open(str(path), framework="pt") as f:
                    for name in f.keys():
                        if name.endswith(IGNORED_TENSOR_SUFFIXES):
                            continue
                        tensors[name] = place_tensor(f.get_tensor(name), torch_dtype, device)
                        bar.update()
            except SafetensorError as exc:
                raise _safetensors_error(path, exc) from exc
    finally:
        bar.close()
    return tensors


def load_safetensors_folder(path, dtype: str = "bfloat16", device: str | torch.device = "cpu",
                            progress: bool = False
                            ) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Config and weights (HF names, converted to ``dtype``, on ``device``) of a Hugging Face
    model folder.  Shapes are checked from the headers before any data is read.

    A tied model (no ``lm_head.weight``) stays tied: the engine reuses the embedding."""
    folder = Path(path).expanduser()
    torch_dtype = getattr(torch, check_dtype(dtype))
    _require_folder(folder)
    config = read_hf_config(folder)
    files = safetensors_files(folder)
    shapes = safetensors_shapes(files)
    check_weights(config, {name: torch.empty(shape, device="meta")
                           for name, shape in shapes.items()})
    tensors = read_safetensors_files(files, torch_dtype, device, progress, total=len(shapes))
    check_weights(config, tensors)
    return config, tensors


# --- GGUF ------------------------------------------------------------------------------------

GGUF_ROPE_FREQS = "rope_freqs.weight"     # Llama 3.1+ stores its RoPE scaling as this tensor

# What reading a truncated or garbled file raises: GGUFFormatError (a ValueError), or numpy's
# ValueError for an empty file it cannot map.
_GGUF_PARSE_ERRORS = (ValueError, IndexError, OverflowError)


def hf_name_from_gguf(name: str, family: ModelFamily = LLAMA) -> str | None:
    """llama.cpp tensor name -> HF name in ``family`` (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); None when it has no HF counterpart."""
    return family.hf_name_from_gguf(name)


def unpermute_rope_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (the inverse of ``permute`` in
    ``convert_hf_to_gguf.py``, as ``transformers``' GGUF loader does).

    llama.cpp stores each head's rows as interleaved pairs (x0, x_{d/2}, x1, x_{d/2+1}, ...) so
    it can rotate adjacent elements; HF keeps the two halves apart.  ``n_heads`` is the number of
    query heads for ``q_proj`` and of KV heads for ``k_proj``."""
    rows = weight.shape[0]
    half = rows // n_heads // 2
    return (weight.reshape(n_heads, half, 2, *weight.shape[1:])
            .transpose(1, 2).reshape(weight.shape))


def open_gguf(path: Path) -> GGUFFile:
    """``path`` parsed (``gguf_file.GGUFFile``); ValueError naming the file if it cannot be."""
    try:
        return GGUFFile.open(path)
    except _GGUF_PARSE_ERRORS as exc:
        raise ValueError(
            f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}): it is truncated "
            "or corrupt; re-download it") from exc


def read_gguf_metadata(reader: GGUFFile) -> dict[str, Any]:
    """Every key/value of the GGUF header as plain Python values (strings, numbers, lists)."""
    return dict(reader.fields)


def dequantize_gguf_tensor(tensor, device: torch.device) -> torch.Tensor:
    """One GGUF tensor as float32 on ``device``, in torch's (rows, cols) order."""
    try:
        return dequantize_on(tensor, device)
    except NotImplementedError as exc:
        raise ValueError(
            f"GGUF tensor {tensor.name!r} uses quantization {tensor.tensor_type.name}, which the "
            f"installed gguf package cannot dequantize ({exc}): upgrade gguf or use another "
            "quantization of the model") from exc


def _single_value(meta: Mapping[str, Any], key: str, path: Path):
    """A per-model hyperparameter; llama.cpp may store it per layer, which must then agree."""
    value = meta.get(key)
    if isinstance(value, list):
        if not value:
            raise ValueError(f"{path}: {key} is an empty list: it should hold one value (or "
                             "one per layer); the file is corrupt, re-download it")
        if any(v != value[0] for v in value):
            raise ValueError(f"{path}: {key} differs between layers ({value[:8]}); this "
                             "engine needs every layer to have the same shape")
        value = value[0]
    return value


# The GGUF key each ModelConfig field is read from (named in errors), after the architecture's
# prefix (``llama.``, ``qwen2.``, ...): ``gguf_field_names``.
_GGUF_HYPERPARAMETER_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length", "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base", "rope_scaling": "rope.scaling.type",
    "rope_scaling.rope_type": "rope.scaling.type",
    "rope_scaling.factor": "rope.scaling.factor",
    "rope_scaling.original_max_position_embeddings": "rope.scaling.original_context_length",
    "max_position_embeddings": "context_length",
}
_GGUF_TOKENIZER_KEYS = {"bos_token_id": "tokenizer.ggml.bos_token_id",
                        "eos_token_ids": "tokenizer.ggml.eos_token_id"}


def gguf_field_names(family: ModelFamily) -> dict[str, str]:
    """ModelConfig field -> the GGUF key it is read from in a file of ``family``."""
    return {**{field: family.gguf_key(key) for field, key in _GGUF_HYPERPARAMETER_KEYS.items()},
            **_GGUF_TOKENIZER_KEYS}


#: the keys of a Llama GGUF (``llama.*``)
GGUF_FIELD_NAMES = gguf_field_names(LLAMA)


def rope_scaling_from_gguf_keys(meta: Mapping[str, Any], family: ModelFamily = LLAMA
                                ) -> dict | None:
    """HF-style ``rope_scaling`` from ``<arch>.rope.scaling.type`` / ``.factor`` (checked by the
    config like any other: a linear type without a factor is an error, not plain RoPE)."""
    kind = meta.get(family.gguf_key("rope.scaling.type"))
    if kind is None or kind == "none":
        return None
    scaling = {"rope_type": kind}
    factor = meta.get(family.gguf_key("rope.scaling.factor"))
    if factor is not None:
        scaling["factor"] = factor
    return scaling


def rope_scaling_from_rope_freqs(rope_freqs: np.ndarray, meta: Mapping[str, Any],
                                 config: ModelConfig, path: Path) -> dict | None:
    """HF-style ``rope_scaling`` from a ``rope_freqs`` tensor (Llama 3.1+ GGUF files)."""
    if rope_freqs.shape == (config.head_dim // 2,) and np.allclose(rope_freqs, 1.0):
        return None
    names = gguf_field_names(config.family)
    old_context = meta.get(names["rope_scaling.original_max_position_embeddings"])
    scaling = {"rope_type": "llama3", "factor": float(rope_freqs.max()),
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192 if old_context is None else old_context}
    scaling = ModelConfig.from_fields(
        {**_fields_of(config), "rope_scaling": scaling},
        {**names, "rope_scaling.factor": GGUF_ROPE_FREQS}).rope_scaling
    if rope_freqs.shape != (config.head_dim // 2,) or not np.allclose(
            rope_freqs, llama3_rope_factors(config.rope_theta, config.head_dim,
                                            scaling).numpy(), rtol=1e-4):
        raise ValueError(
            f"{path}: {GGUF_ROPE_FREQS} holds per-frequency RoPE factors that are not Llama "
            "3's (factor, low_freq_factor=1, high_freq_factor=4, original context 8192); "
            "this engine supports default, linear and llama3 RoPE only")
    return scaling


def _fields_of(config: ModelConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def gguf_family(meta: Mapping[str, Any], path: Path) -> ModelFamily:
    """The family of ``general.architecture``, once its required keys are there."""
    try:
        family = family_for_gguf(meta.get("general.architecture"))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    required = ("embedding_length", "block_count", "feed_forward_length", "attention.head_count")
    missing = [family.gguf_key(k) for k in required if meta.get(family.gguf_key(k)) is None]
    if missing:
        raise ValueError(f"{path}: GGUF metadata lacks {missing}: the file is incomplete or "
                         "corrupt; re-download it")
    return family


def _gguf_vocab_size(meta: Mapping[str, Any], family: ModelFamily, path: Path):
    vocab = meta.get(family.gguf_key("vocab_size"))
    if vocab is not None:
        return vocab
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ValueError(f"{path}: GGUF metadata has neither {family.gguf_key('vocab_size')} "
                         "nor tokenizer.ggml.tokens, so the vocabulary size is unknown")
    return len(tokens)


GGUF_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                 "tokenizer.ggml.eom_token_id")


def gguf_eos_token_ids(meta: Mapping[str, Any]) -> tuple[int, ...]:
    """End-of-generation ids: eos plus llama.cpp's end-of-turn / end-of-message ids, each
    checked (a ConfigFieldError names the key)."""
    ids = []
    for key in GGUF_EOS_KEYS:
        if meta.get(key) is not None:
            try:
                ids.append(check_token_id("eos_token_ids", meta[key]))
            except ConfigFieldError as exc:
                raise exc.spelled({"eos_token_ids": key}) from None
    return tuple(dict.fromkeys(ids))


def config_from_gguf_metadata(meta: Mapping[str, Any], tensor_names: set[str],
                              rope_freqs: np.ndarray | None = None,
                              path: Path | str = "<gguf>") -> ModelConfig:
    """A ModelConfig from llama.cpp's ``<arch>.*`` and ``tokenizer.ggml.*`` keys, taken as
    written and checked by the same validator as config.json (errors name the GGUF key)."""
    path = Path(path)
    family = gguf_family(meta, path)
    names = gguf_field_names(family)

    def value(field, default=None):
        found = _single_value(meta, names[field], path)
        return default if found is None else found

    try:
        config = ModelConfig.from_fields(dict(
            vocab_size=_gguf_vocab_size(meta, family, path),
            hidden_size=value("hidden_size"),
            intermediate_size=value("intermediate_size"),
            num_hidden_layers=value("num_hidden_layers"),
            num_attention_heads=value("num_attention_heads"),
            num_key_value_heads=value("num_key_value_heads"),
            head_dim=value("head_dim"),
            rms_norm_eps=value("rms_norm_eps", 1e-5),
            rope_theta=value("rope_theta", 10000.0),
            rope_scaling=rope_scaling_from_gguf_keys(meta, family),
            max_position_embeddings=value("max_position_embeddings", 2048),
            tie_word_embeddings="output.weight" not in tensor_names,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=gguf_eos_token_ids(meta),
            architecture=family.hf_architecture,
        ), names)
        rope_dim_key = family.gguf_key("rope.dimension_count")
        rope_dim = _single_value(meta, rope_dim_key, path)
        if rope_dim is not None and rope_dim != config.head_dim:
            head_dim_from = (names["head_dim"] if meta.get(names["head_dim"]) is not None else
                             f"{names['hidden_size']} / {names['num_attention_heads']}")
            raise ConfigFieldError("head_dim", rope_dim,
                                   f"equal to head_dim ({config.head_dim} = {head_dim_from}): "
                                   "partial rotary embeddings are not supported", rope_dim_key)
        if rope_freqs is not None:
            config = config.replace(
                rope_scaling=rope_scaling_from_rope_freqs(rope_freqs, meta, config, path))
    except ValueError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ValueError(f"{path}: {exc}") from exc
    return config


def gguf_tensors_by_hf_name(reader, family: ModelFamily, path: Path) -> dict[str, Any]:
    by_name = {}
    for tensor in reader.tensors:
        if tensor.name == GGUF_ROPE_FREQS:
            continue
        hf_name = family.hf_name_from_gguf(tensor.name)
        if hf_name is None:
            raise ValueError(
                f"{path}: GGUF tensor {tensor.name!r} has no place in a {family.name} model "
                f"(general.architecture {family.gguf_architecture!r}); this engine reads the "
                "tensors llama.cpp's converter writes for that architecture only")
        by_name[hf_name] = tensor
    return by_name


def load_gguf(path, dtype: str = "bfloat16", device: str | torch.device = "cpu",
              progress: bool = False
              ) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """Config, dequantized weights (HF names and layout, in ``dtype``, on ``device``) and the
    GGUF metadata (which holds the tokenizer: ``tokenizer.ggml.*``, ``tokenizer.chat_template``).
    Tensors are read one at a time: each one's file bytes go to ``device`` as they are and are
    dequantized there (``gguf_torch.py``), then converted to ``dtype``, before the next."""
    path = Path(path).expanduser()
    torch_dtype = getattr(torch, check_dtype(dtype))
    if not path.is_file():
        raise FileNotFoundError(
            f"GGUF file {path} does not exist" + (" (it is a folder)" if path.is_dir() else "")
            + ": expected a llama.cpp .gguf model file")
    reader = open_gguf(path)
    meta = read_gguf_metadata(reader)
    family = gguf_family(meta, path)
    rope_freqs = next((dequantize_gguf_tensor(t, torch.device("cpu")).numpy()
                       for t in reader.tensors if t.name == GGUF_ROPE_FREQS), None)
    config = config_from_gguf_metadata(meta, {t.name for t in reader.tensors}, rope_freqs, path)
    gguf_tensors = gguf_tensors_by_hf_name(reader, family, path)
    # Shapes first (from the header, on the meta device): a mismatch fails before any dequantizing.
    check_weights(config, {name: torch.empty(t.shape, device="meta")
                           for name, t in gguf_tensors.items()})
    device = torch.device(device)
    bar = progress_bar(len(gguf_tensors), f"loading {path.name}", progress)
    tensors = {}
    try:
        for name, t in gguf_tensors.items():
            tensors[name] = place_tensor(_gguf_to_hf_tensor(name, t, config, device),
                                         torch_dtype, device)
            bar.update()
    finally:
        bar.close()
    return config, tensors, meta


def _gguf_to_hf_tensor(hf_name: str, tensor, config: ModelConfig,
                       device: torch.device) -> torch.Tensor:
    """Dequantize one tensor on ``device`` (float32) and, for Q and K of a family whose rows
    llama.cpp's converter interleaved (Llama), undo that order."""
    weight = dequantize_gguf_tensor(tensor, device)
    if not config.family.gguf_rope_rows_interleaved:
        return weight
    if hf_name.endswith("self_attn.q_proj.weight"):
        return unpermute_rope_rows(weight, config.num_attention_heads)
    if hf_name.endswith("self_attn.k_proj.weight"):
        return unpermute_rope_rows(weight, config.num_key_value_heads)
    return weight
