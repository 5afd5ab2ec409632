"""Model families: one module per checkpoint architecture (``llama``, ``qwen2``, ``qwen3``), each
a ``ModelFamily`` (``family.py``) holding its tensor names, shapes, packing and forward
differences, and the registry that finds a checkpoint's family by its architecture.

A Hugging Face folder is looked up by ``config.json``'s ``architectures[0]`` and ``model_type``,
a GGUF file by ``general.architecture``.  Anything else is refused with a message naming the
architecture and the ones served.  Adding a family: write its module, add it to ``FAMILIES``
(``docs/models.md`` walks through it)."""

from __future__ import annotations

from paged_tutorial.families.family import ModelFamily
from paged_tutorial.families.llama import LLAMA
from paged_tutorial.families.qwen2 import QWEN2
from paged_tutorial.families.qwen3 import QWEN3

#: every family this engine serves
FAMILIES: tuple[ModelFamily, ...] = (LLAMA, QWEN2, QWEN3)
_BY_HF_ARCHITECTURE = {f.hf_architecture: f for f in FAMILIES}
_BY_GGUF_ARCHITECTURE = {f.gguf_architecture: f for f in FAMILIES}


class UnsupportedArchitecture(ValueError):
    """A checkpoint whose architecture no family serves."""


def served_hf_architectures() -> str:
    return ", ".join(f"{f.hf_architecture} (model_type {f.model_type!r})" for f in FAMILIES)


def family_for_hf(architecture: str, model_type: str) -> ModelFamily:
    """The family of a config.json: ``architectures[0]`` and ``model_type`` must name the same
    served family."""
    family = _BY_HF_ARCHITECTURE.get(architecture)
    if family is None or model_type != family.model_type:
        raise UnsupportedArchitecture(
            f"unsupported architecture {architecture!r} (model_type {model_type!r}): this "
            f"engine runs {served_hf_architectures()}; use a checkpoint of one of these")
    return family


def family_for_gguf(architecture) -> ModelFamily:
    """The family of a GGUF file's ``general.architecture``."""
    family = _BY_GGUF_ARCHITECTURE.get(architecture)
    if family is None:
        served = ", ".join(repr(a) for a in _BY_GGUF_ARCHITECTURE)
        raise UnsupportedArchitecture(
            f"GGUF architecture {architecture!r} is not supported: this engine runs "
            f"general.architecture {served}; use a GGUF of one of these")
    return family


def family_of(config) -> ModelFamily:
    """The family of a ``ModelConfig`` (its ``architecture``, checked when it was made)."""
    family = _BY_HF_ARCHITECTURE.get(config.architecture)
    if family is None:
        raise UnsupportedArchitecture(
            f"unsupported architecture {config.architecture!r}: this engine runs "
            f"{served_hf_architectures()}")
    return family


__all__ = ["FAMILIES", "ModelFamily", "UnsupportedArchitecture", "family_for_gguf",
           "family_for_hf", "family_of", "LLAMA", "QWEN2", "QWEN3"]
