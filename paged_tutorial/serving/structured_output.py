"""Structured output: an answer held to a JSON grammar by masking the sampler's logits.

``json_processor(tokenizer, vocab_size, schema=None)`` returns a logits processor for
``SamplingParams(logits_processors=[...])`` (``fn(output_token_ids, logits) -> logits``): before
every token it lets through only the tokens that keep the text a prefix of valid JSON (of any
object with ``schema=None``, the API's ``{"type": "json_object"}``; of the JSON schema given,
``{"type": "json_schema"}``), and once the JSON is complete only the end-of-sequence tokens.
The grammar work is xgrammar's (a maintained library, also vLLM's default): a
``GrammarCompiler`` built once per tokenizer turns the schema into a token-level automaton, a
``GrammarMatcher`` per answer follows the tokens drawn and fills the bitmask of allowed ones.

One processor may serve several answers (``n``): it keeps one matcher per answer, keyed by the
answer's list of output tokens (the engine hands each request's own list), and replays an
answer's tokens into a fresh matcher when that list no longer extends what it followed (a
preempted request recomputed).

``StructuredOutputsParams(json=schema)`` is vLLM's offline spelling of the same request
(``structured_outputs_processor(params, tokenizer, vocab_size)`` turns it into the processor).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch


@dataclass(frozen=True)
class StructuredOutputsParams:
    """vLLM's ``StructuredOutputsParams``: ``json`` a JSON schema (a dict or its text), or
    ``json_object=True`` for any JSON object."""
    json: dict | str | None = None
    json_object: bool | None = None

    def __post_init__(self):
        if (self.json is None) == (not self.json_object):
            raise ValueError("StructuredOutputsParams takes one of json=<schema> or "
                             "json_object=True")


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise RuntimeError("structured output needs xgrammar: pip install "
                           "'paged-tutorial[serve]'") from None
    return xgrammar


def preload() -> bool:
    """Import xgrammar (and the transformers tokenizer class it reads) now, when the server is
    built, rather than inside the first request that asks for JSON; False when it is not
    installed (such a request is then a 400 saying how to install it)."""
    try:
        _xgrammar()
        from transformers import PreTrainedTokenizerFast  # noqa: F401
    except (RuntimeError, ImportError):
        return False
    return True


@lru_cache(maxsize=4)
def _compiler(tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]):
    """One grammar compiler per tokenizer (it caches the grammars it compiled)."""
    xgr = _xgrammar()
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size,
                                              stop_token_ids=list(stop_token_ids) or None)
    return xgr.GrammarCompiler(info, max_threads=1)


def compile_json(tokenizer, vocab_size: int, stop_token_ids, schema: dict | str | None):
    """The compiled grammar of any JSON object (``schema=None``) or of ``schema``; a schema
    xgrammar cannot read raises ``ValueError`` naming the problem."""
    compiler = _compiler(tokenizer, vocab_size, tuple(stop_token_ids))
    if schema is None:
        return compiler.compile_builtin_json_grammar()
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        return compiler.compile_json_schema(text)
    except Exception as exc:                      # noqa: BLE001 - xgrammar's own error types
        raise ValueError(f"the JSON schema cannot be used: {exc}") from None


class JSONLogitsProcessor:
    """Masks every token that would leave the grammar (one matcher per answer)."""

    def __init__(self, compiled, vocab_size: int):
        self.xgr = _xgrammar()
        self.compiled = compiled
        self.vocab_size = vocab_size
        self.bitmask = self.xgr.allocate_token_bitmask(1, vocab_size)
        self.answers: dict[int, list] = {}      # id(output list) -> [matcher, tokens followed]

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        state = self.answers.get(id(output_token_ids))
        if state is None or len(output_token_ids) < state[1]:
            state = [self.xgr.GrammarMatcher(self.compiled), 0]
            self.answers[id(output_token_ids)] = state
        matcher = state[0]
        for token in output_token_ids[state[1]:]:
            if not matcher.is_terminated():
                matcher.accept_token(token)
        state[1] = len(output_token_ids)
        if matcher.is_terminated():
            return logits
        matcher.fill_next_token_bitmask(self.bitmask)
        row = logits.view(1, -1)
        self.xgr.apply_token_bitmask_inplace(row, self.bitmask.to(row.device),
                                             vocab_size=self.vocab_size)
        return logits


def json_processor(tokenizer, vocab_size: int, stop_token_ids,
                   schema: dict | str | None = None) -> JSONLogitsProcessor:
    return JSONLogitsProcessor(compile_json(tokenizer, vocab_size, stop_token_ids, schema),
                               vocab_size)


def structured_outputs_processor(params: StructuredOutputsParams, tokenizer, vocab_size: int,
                                 stop_token_ids) -> JSONLogitsProcessor:
    schema: Any = None if params.json_object else params.json
    return json_processor(tokenizer, vocab_size, stop_token_ids, schema)
