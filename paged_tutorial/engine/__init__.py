"""Serving: the engine loop and what it drives.

``llm_engine`` (``Engine``, the frontend: add requests, step, stream, generate), ``engine_core``
(``EngineCore``, the loop: a step commits or rolls back), ``prompts`` (what a caller submits,
checked and encoded), ``request_registry`` (requests and their results), ``engine_lock`` (threads
and re-entry), ``output_processor`` (text pieces and on_token callbacks), ``token_stream``,
``request`` (one sequence's state), ``sampling_params`` (``SamplingParams``, validated when made),
``scheduler`` (which requests run this step, admission, preemption, commit and rollback),
``model_runner`` (a step's inputs, the forward pass, sampling), ``numerical_faults`` (a
non-finite request named), ``cuda_graphs`` (captured decode steps), ``interrupts`` (Ctrl-C
deferred through the bookkeeping), ``devices`` (which devices an Engine can use)."""

from paged_tutorial.engine.llm_engine import Engine, GenerationResult, StepReport, TokenStream
from paged_tutorial.engine.sampling_params import SamplingParams

__all__ = ["Engine", "GenerationResult", "SamplingParams", "StepReport", "TokenStream"]
