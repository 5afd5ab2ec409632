"""Fixtures and helpers for tests/loading/test_loading.py (kept out of conftest.py on purpose).

The SmolLM2 fixtures are session-scoped: reading the 98 MB GGUF takes a few seconds for us and
about ten for transformers, so each is done once per test run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# `pytest tests/...` puts tests/ (not the repository root) on sys.path; make the package
# importable without an install.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from paged_tutorial.config import ModelConfig  # noqa: E402
from paged_tutorial.families import FAMILIES, LLAMA  # noqa: E402
from paged_tutorial.loading.models import find_embedded_smollm2, random_model, save_hf_folder  # noqa: E402
from paged_tutorial.loading.tokenizer import Tokenizer, bytes_to_unicode  # noqa: E402
from paged_tutorial.loading.weights import load_gguf  # noqa: E402


# --- the embedded SmolLM2 GGUF ---------------------------------------------------------------

@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    return find_embedded_smollm2()


@pytest.fixture(scope="session")
def ours_smollm2(smollm2_gguf):
    """(config, tensors, metadata) from our loader, in float32."""
    return load_gguf(smollm2_gguf, "float32")


@pytest.fixture(scope="session")
def our_smollm2_tokenizer(ours_smollm2) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(ours_smollm2[2])


@pytest.fixture(scope="session")
def hf_smollm2_state_dict(hf_smollm2) -> dict[str, torch.Tensor]:
    """transformers' own GGUF load of the same file (conftest's session-wide ``hf_smollm2``,
    float32): the reference for dequantize + unpermute."""
    return {k: v.detach() for k, v in hf_smollm2.state_dict().items()}


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


# --- tiny random Llamas ----------------------------------------------------------------------

def tiny_config(**changes) -> ModelConfig:
    """A 2-layer GQA Llama small enough to build, save and load in milliseconds."""
    fields = dict(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                  rope_theta=10000.0, max_position_embeddings=128, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_ids=(2,))
    fields.update(changes)
    return ModelConfig(**fields)


def write_tiny_folder(path: Path, config: ModelConfig | None = None, seed: int = 0):
    """save_hf_folder of a random tiny model; returns the Model."""
    model = random_model(config or tiny_config(), seed=seed)
    save_hf_folder(model, path)
    return model


def edit_config_json(folder: Path, **changes) -> dict:
    """Rewrite config.json with ``changes`` (a value of None deletes the key)."""
    path = folder / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return data


# --- tiny GGUF files written like llama.cpp's converter ----------------------------------------

def llama_cpp_permute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``permute`` of llama.cpp's convert_hf_to_gguf.py (HF half-split -> interleaved pairs)."""
    return (weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
            .transpose(1, 2).reshape(weight.shape))


def _gguf_name(hf_name: str, n_layers: int, family=LLAMA) -> str:
    candidates = list(family.gguf_global_names) + [
        f"blk.{i}.{m}.{kind}" for i in range(n_layers) for m in family.gguf_layer_names
        for kind in ("weight", "bias")]
    return next(c for c in candidates if family.hf_name_from_gguf(c) == hf_name)


def tiny_tokens(vocab_size: int) -> list[str]:
    tokens = list(bytes_to_unicode().values())
    return tokens + [f"<|extra_{i}|>" for i in range(vocab_size - len(tokens))]


def write_tiny_gguf(path: Path, model, *, architecture: str = "llama", quantize=(),
                    rope_freqs: np.ndarray | None = None, extra_tensors=None,
                    metadata=None) -> Path:
    """Write ``model`` as a llama.cpp GGUF of ``architecture``: llama.cpp's names for that
    family (``llama`` when it is not a served one), Q/K rows permuted as llama.cpp's converter
    does for Llama, F32 unless a tensor's HF name ends with one of ``quantize`` (then Q8_0).
    ``metadata`` replaces header values (``{"llama.attention.head_count": 0}``; None drops the
    key)."""
    import gguf

    family = next((f for f in FAMILIES if f.gguf_architecture == architecture), LLAMA)
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    arch = architecture
    values = {
        f"{arch}.block_count": cfg.num_hidden_layers,
        f"{arch}.context_length": cfg.max_position_embeddings,
        f"{arch}.embedding_length": cfg.hidden_size,
        f"{arch}.feed_forward_length": cfg.intermediate_size,
        f"{arch}.attention.head_count": cfg.num_attention_heads,
        f"{arch}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{arch}.rope.dimension_count": cfg.head_dim,
        f"{arch}.rope.freq_base": float(cfg.rope_theta),
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        "tokenizer.ggml.bos_token_id": cfg.bos_token_id,
        "tokenizer.ggml.eos_token_id": cfg.eos_token_ids[0] if cfg.eos_token_ids else None,
    }
    if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:   # as llama.cpp writes it
        values[f"{arch}.attention.key_length"] = cfg.head_dim
        values[f"{arch}.attention.value_length"] = cfg.head_dim
    values.update(metadata or {})
    for key, value in values.items():
        if value is not None:
            add_gguf_value(writer, key, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tiny_tokens(cfg.vocab_size))
    tensors = dict(model.weights)
    for hf_name, weight in tensors.items():
        w = weight.float()
        if family.gguf_rope_rows_interleaved and hf_name.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, cfg.num_attention_heads)
        elif family.gguf_rope_rows_interleaved and hf_name.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, cfg.num_key_value_heads)
        _add_tensor(writer, _gguf_name(hf_name, cfg.num_hidden_layers, family), w.numpy(),
                    quantized=hf_name.endswith(tuple(quantize)))
    if rope_freqs is not None:
        _add_tensor(writer, "rope_freqs.weight", rope_freqs.astype(np.float32), quantized=False)
    for name, value in (extra_tensors or {}).items():
        _add_tensor(writer, name, value.astype(np.float32), quantized=False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_gguf_value(writer, key: str, value) -> None:
    """One header value, typed as llama.cpp's converter would type it: whole numbers uint32
    (int64 when negative or large), other numbers float32, bools, strings, arrays."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        if 0 <= value < 2 ** 32:
            writer.add_uint32(key, value)
        else:
            writer.add_int64(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def _add_tensor(writer, name: str, values: np.ndarray, quantized: bool) -> None:
    import gguf

    if not quantized:
        writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
        return
    qtype = gguf.GGMLQuantizationType.Q8_0
    data = gguf.quants.quantize(values, qtype)
    writer.add_tensor(name, data, raw_dtype=qtype)   # the writer derives the shape from bytes
