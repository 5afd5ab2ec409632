"""Serving: vLLM's Python API (``LLM``, ``RequestOutput``) and an OpenAI-compatible HTTP server.

``llm`` (``LLM.generate`` / ``LLM.chat``), ``outputs`` (``RequestOutput``,
``CompletionOutput``), ``answers`` (one sampled answer on the engine: stop strings, stop
tokens, cancel), ``stop_text`` (stop strings over streamed text), ``prompts`` (prompts and
conversations to token ids), and the server: ``engine_loop`` (the thread that steps the
engine), ``api_models`` (the API's request and response bodies as pydantic types),
``openai_protocol`` (requests turned into SamplingParams, error bodies), ``api_logprobs``
(logprobs in OpenAI's shapes), ``structured_output`` (response_format: llguidance masking the
logits), ``app`` (the ASGI application), ``metrics`` (Prometheus text through
prometheus_client), ``server`` (uvicorn in the foreground, or on a background thread), ``cli``
(``serve_main``).
The server's modules import FastAPI, so they are not imported here.
"""

from paged_tutorial.serving.llm import LLM
from paged_tutorial.serving.outputs import CompletionOutput, RequestOutput

__all__ = ["LLM", "CompletionOutput", "RequestOutput"]
