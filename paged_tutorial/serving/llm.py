"""``LLM``: vLLM's offline API over this package's ``Engine``.

    import paged_tutorial as pt
    llm = pt.LLM("smollm2-135m")
    outputs = llm.generate(["The capital of France is"],
                           pt.SamplingParams(temperature=0.8, top_k=20, max_tokens=16, stop=["."]))
    print(outputs[0].outputs[0].text)
    print(llm.chat([{"role": "user", "content": "Hi!"}])[0].outputs[0].text)

``generate`` takes raw prompts (no chat template, as vLLM); ``chat`` takes one conversation or a
list of them.  Every prompt is queued at once and the engine serves them by continuous batching
over its slots; the results come back in prompt order, one ``RequestOutput`` per prompt with
``SamplingParams.n`` answers each.

Randomness: an answer samples from the stream keyed by (its seed, its index among the prompt's
n answers), so a request with a seed gets the same answer wherever it sits in a batch.  A
request without a seed gets one from the LLM's own generator (``LLM(seed=...)`` makes a whole
run reproducible; None draws from the OS).

``LLM.engine`` is the step-level ``Engine`` underneath, for anyone who wants to watch the
cache.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from paged_tutorial.engine.llm_engine import Engine
from paged_tutorial.engine.limits import SEED_LIMIT
from paged_tutorial.engine.sampling_params import SamplingParams, is_integer
from paged_tutorial.loading.models import Model, load_model
from paged_tutorial.serving.answers import Answer
from paged_tutorial.serving.outputs import RequestMetrics, RequestOutput, position_logprobs
from paged_tutorial.serving.prompts import ChatTemplateOptions, EncodedPrompt, \
    encode_conversation, encode_prompt
from paged_tutorial.threads import configure_threads


class LLM:
    def __init__(self, model: str | Model, *, dtype: str | None = None, backend: str = "auto",
                 device: str | None = None, max_num_seqs: int = 4,
                 max_model_len: int | None = None, block_size: int = 16,
                 kv_cache_bytes: int | None = None, enable_prefix_caching: bool = False,
                 enforce_eager: bool = False, seed: int | None = None,
                 threads: int | None = None, async_scheduling: bool | None = None):
        """``model``: anything ``load_model`` accepts (an alias such as ``"smollm2-135m"``, a
        ``.gguf`` file, a model folder, a hub id) or a loaded ``Model``.  ``max_num_seqs`` is
        the engine's ``max_slots``, ``max_model_len`` its ``max_seq_len``;
        ``enforce_eager=True`` turns CUDA graphs off; ``async_scheduling`` launches each
        decode step before the previous one is read back (the engine's option; None: on with
        CUDA graphs).  ``threads``: how many threads torch's
        CPU ops use (None: chosen for this machine, ``threads.configure_threads``)."""
        if threads is not None:
            configure_threads(threads)
        if isinstance(model, Model):
            if dtype is not None and dtype != model.dtype:
                raise ValueError(f"the model is loaded in {model.dtype}; dtype={dtype!r} would "
                                 "need a reload: pass its name instead, or leave dtype out")
        else:
            model = load_model(model, dtype=dtype, device=device)
        if seed is not None and (not is_integer(seed) or not 0 <= seed < SEED_LIMIT):
            raise ValueError(f"seed must be None or an integer in [0, 2**64), got {seed!r}")
        self.engine = Engine(model, backend=backend, device=device, max_slots=max_num_seqs,
                             max_seq_len=max_model_len, block_size=block_size,
                             kv_cache_bytes=kv_cache_bytes, prefix_caching=enable_prefix_caching,
                             cuda_graphs=False if enforce_eager else None,
                             async_scheduling=async_scheduling)
        self._seeds = np.random.default_rng(seed)
        self._request_ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    # --- the two calls -------------------------------------------------------------------
    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams]
                 | None = None, *, use_tqdm: bool = False) -> list[RequestOutput]:
        """One RequestOutput per prompt (a string, ``{"prompt": ...}``,
        ``{"prompt_token_ids": [...]}``, or a list of these), in order."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a prompt or a list of prompts, got "
                            f"{type(prompts).__name__}")
        return self._run([encode_prompt(self.engine, p) for p in prompts], sampling_params,
                         use_tqdm)

    def chat(self, messages, sampling_params: SamplingParams | Sequence[SamplingParams]
             | None = None, *, use_tqdm: bool = False, chat_template: str | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """``messages``: one conversation (a list of ``{"role", "content"}`` dicts) or a list
        of conversations (one RequestOutput each); each is rendered by the model's chat
        template, or by ``chat_template`` (a Jinja template's text) when given.
        ``add_generation_prompt``: end with the assistant's turn header (the model answers);
        ``continue_final_message``: leave the last message open, so the model continues it
        (its end-of-turn cut off; not with ``add_generation_prompt``);
        ``chat_template_kwargs``: more variables for the template."""
        if isinstance(messages, list) and messages and isinstance(messages[0], dict):
            messages = [messages]
        if not isinstance(messages, list) or not messages:
            raise TypeError("chat takes a conversation (a list of message dicts) or a list of "
                            "conversations")
        template = ChatTemplateOptions.of(chat_template, add_generation_prompt,
                                          continue_final_message, chat_template_kwargs)
        return self._run([encode_conversation(self.engine, m, template) for m in messages],
                         sampling_params, use_tqdm)

    # --- underneath ----------------------------------------------------------------------
    def _per_prompt(self, sampling_params, count: int) -> list[SamplingParams]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        if isinstance(sampling_params, Sequence) and len(sampling_params) == count and all(
                isinstance(p, SamplingParams) for p in sampling_params):
            return list(sampling_params)
        raise TypeError(f"sampling_params must be a SamplingParams or a list of {count} "
                        f"(one per prompt)")

    def _run(self, prompts: list[EncodedPrompt], sampling_params,
             use_tqdm: bool) -> list[RequestOutput]:
        per_prompt = self._per_prompt(sampling_params, len(prompts))
        for prompt, params in zip(prompts, per_prompt):     # all admitted before any is queued
            self.engine.admission.check(prompt.token_ids, params)
        outputs, answers = [], []
        try:
            for prompt, params in zip(prompts, per_prompt):
                params = params.with_seed(int(self._seeds.integers(SEED_LIMIT, dtype=np.uint64)))
                group = [Answer(self.engine, j, params) for j in range(params.n)]
                for answer in group:
                    answer.submit(prompt.token_ids, sample_key=answer.index)
                answers.append(group)
                outputs.append(RequestOutput(str(next(self._request_ids)), prompt.text,
                                             list(prompt.token_ids)))
            self._serve([a for group in answers for a in group], use_tqdm)
        except BaseException:
            for answer in (a for group in answers for a in group):
                if answer.request is not None and answer.output is None:
                    answer.cancel()
                    self.engine.pop_result(answer.request_id)
            raise
        for output, group in zip(outputs, answers):
            output.outputs = [a.output for a in group]
            output.finished = True
            output.num_cached_tokens = group[0].num_cached_tokens
            prompt_logprobs = group[0].result.prompt_logprobs
            if prompt_logprobs is not None:
                output.prompt_logprobs = position_logprobs(prompt_logprobs,
                                                           self.engine.tokenizer)
            output.metrics = RequestMetrics.of([a.result for a in group])
        return outputs

    def _serve(self, answers: list[Answer], use_tqdm: bool) -> None:
        """Step the engine until every answer has finished."""
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(answers), desc="answers", unit="answer")
        try:
            waiting = list(answers)
            while waiting:
                for answer in [a for a in waiting if a.done]:
                    answer.finish()
                    waiting.remove(answer)
                    if bar is not None:
                        bar.update(1)
                if waiting:
                    self.engine.step()
        finally:
            if bar is not None:
                bar.close()

