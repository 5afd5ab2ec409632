"""paged-tutorial: PagedAttention, run rather than read.

    import paged_tutorial as pt
    model = pt.load_model("smollm2-135m", dtype="float32")
    engine = pt.Engine(model, backend="auto", max_slots=2)
    print(engine.generate(["What is the capital of France?"])[0].text)

The package, by concern: ``engine/`` (serving), ``cache/`` (the paged KV cache), ``model/`` (the
Llama forward), ``loading/`` (weights and tokenizers), ``backends/`` (where the ops run: torch,
Numba CUDA, Triton), ``teaching/`` (exercises, puzzles, figures; never imported by the engine)
and ``config.py`` (the one definition of every shape and cache constant).
"""

from __future__ import annotations

import importlib

from paged_tutorial.backends.recording import OpCall, RecordingBackend
from paged_tutorial.cache import BlockEvent, PagedKVCache
from paged_tutorial.config import CacheConfig, ModelConfig, llama_3_2_1b_config
from paged_tutorial.engine import (Engine, GenerationResult, SamplingParams, StepReport,
                                   TokenStream)
from paged_tutorial.loading.models import Model, load_model, random_model

__version__ = "0.1.0"

__all__ = ["BlockEvent", "CacheConfig", "Engine", "GenerationResult", "Model", "ModelConfig",
           "OpCall", "PagedKVCache", "RecordingBackend", "SamplingParams", "StepReport",
           "TokenStream", "exercises", "llama_3_2_1b_config", "load_model", "random_model",
           "__version__"]

# ``pt.exercises`` (the notebooks' checker) is imported on first use: serving requests never
# loads the teaching code or its plotting libraries.
_LAZY = {"exercises": "paged_tutorial.teaching.exercises"}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module 'paged_tutorial' has no attribute {name!r}")
