"""Serving: the engine loop and what it drives.

``llm_engine`` (``Engine``, the frontend: add requests, step, stream, generate), ``engine_parts``
(what an Engine is built of), ``admission`` (what a caller submits, checked and encoded: the
one way in), ``limits`` (the limits a request keeps, ``AdmissionError``), ``engine_core``
(``EngineCore``, the step: schedule, run, commit), ``step_transaction`` (its guards: lock,
Ctrl-C, rollback, timings), ``request_registry`` (requests and their results), ``engine_lock``
(threads and re-entry), ``output_processor`` (text pieces and on_token callbacks),
``token_stream``, ``request`` (one sequence's state), ``sampling_params`` (``SamplingParams``,
validated when made), ``scheduler`` (which requests run this step, admission, preemption,
commit and rollback), ``model_runner`` (a step's inputs, the forward pass, sampling),
``numerical_faults`` (a non-finite request named), ``cuda_graphs`` (captured decode steps),
``interrupts`` (Ctrl-C deferred through the bookkeeping).

Its public names are imported on first use, so ``paged_tutorial.engine.limits`` and
``sampling_params`` (which the command line reads before torch loads) cost nothing heavy."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paged_tutorial.engine.llm_engine import Engine, GenerationResult, StepReport, \
        TokenStream
    from paged_tutorial.engine.sampling_params import SamplingParams

__all__ = ["Engine", "GenerationResult", "SamplingParams", "StepReport", "TokenStream"]

_LAZY_NAMES = {"Engine": "paged_tutorial.engine.llm_engine",
               "GenerationResult": "paged_tutorial.engine.llm_engine",
               "StepReport": "paged_tutorial.engine.llm_engine",
               "TokenStream": "paged_tutorial.engine.llm_engine",
               "SamplingParams": "paged_tutorial.engine.sampling_params"}


def __getattr__(name: str):
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module 'paged_tutorial.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    globals()[name] = value
    return value
