"""paged-tutorial: PagedAttention, run rather than read.

    import paged_tutorial as pt
    model = pt.load_model("smollm2-135m", dtype="float32")
    engine = pt.Engine(model, backend="auto", max_slots=2)
    print(engine.generate(["What is the capital of France?"])[0].text)

    llm = pt.LLM("smollm2-135m")             # vLLM's API over the same engine
    print(llm.generate(["The capital of France is"], pt.SamplingParams(max_tokens=8))[0]
          .outputs[0].text)

The package, by concern: ``engine/`` (serving), ``cache/`` (the paged KV cache), ``model/`` (the
decoder forward), ``families/`` (each checkpoint architecture served: Llama, Qwen2, Qwen3),
``loading/`` (weights and tokenizers), ``backends/`` (where the ops run: torch, Numba CUDA,
Triton), ``serving/`` (vLLM's ``LLM`` API and the OpenAI-compatible server), ``teaching/``
(exercises, puzzles, figures; never imported by the engine) and ``config.py`` (the one
definition of every shape and cache constant).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paged_tutorial.backends.recording import OpCall, RecordingBackend
    from paged_tutorial.cache import BlockEvent, PagedKVCache
    from paged_tutorial.config import CacheConfig, ModelConfig, llama_3_2_1b_config
    from paged_tutorial.engine.limits import AdmissionError
    from paged_tutorial.engine import (Engine, GenerationResult, SamplingParams, StepReport,
                                       TokenStream)
    from paged_tutorial.loading.models import Model, load_model, random_model
    from paged_tutorial.inputs import TextPrompt, TokensPrompt
    from paged_tutorial.serving import LLM, CompletionOutput, RequestOutput

__version__ = "0.1.0"

__all__ = ["AdmissionError", "BlockEvent", "CacheConfig", "CompletionOutput", "Engine", "GenerationResult", "LLM",
           "Model", "ModelConfig", "OpCall", "PagedKVCache", "RecordingBackend", "RequestOutput",
           "SamplingParams", "StepReport", "TextPrompt", "TokenStream", "TokensPrompt",
           "exercises", "llama_3_2_1b_config",
           "load_model", "random_model", "__version__"]

# Every public name is imported on first use (``pt.Engine`` imports the engine then): ``import
# paged_tutorial`` itself costs nothing, so ``python -m paged_tutorial`` reaches its own Ctrl-C
# handling before torch loads, and serving requests never loads ``pt.exercises`` (the
# notebooks' checker) or its plotting libraries.
_LAZY_NAMES = {
    "OpCall": "paged_tutorial.backends.recording",
    "RecordingBackend": "paged_tutorial.backends.recording",
    "BlockEvent": "paged_tutorial.cache", "PagedKVCache": "paged_tutorial.cache",
    "CacheConfig": "paged_tutorial.config", "ModelConfig": "paged_tutorial.config",
    "llama_3_2_1b_config": "paged_tutorial.config",
    "AdmissionError": "paged_tutorial.engine.limits",
    "Engine": "paged_tutorial.engine", "GenerationResult": "paged_tutorial.engine",
    "SamplingParams": "paged_tutorial.engine", "StepReport": "paged_tutorial.engine",
    "TokenStream": "paged_tutorial.engine",
    "Model": "paged_tutorial.loading.models", "load_model": "paged_tutorial.loading.models",
    "random_model": "paged_tutorial.loading.models",
    "LLM": "paged_tutorial.serving", "RequestOutput": "paged_tutorial.serving",
    "CompletionOutput": "paged_tutorial.serving",
    "TextPrompt": "paged_tutorial.inputs", "TokensPrompt": "paged_tutorial.inputs",
}
_LAZY_MODULES = {"exercises": "paged_tutorial.teaching.exercises"}


def __getattr__(name: str):
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    elif name in _LAZY_MODULES:
        value = importlib.import_module(_LAZY_MODULES[name])
    else:
        raise AttributeError(f"module 'paged_tutorial' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
