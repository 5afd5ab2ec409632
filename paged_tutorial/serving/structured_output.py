"""Structured output: an answer held to a JSON grammar by masking the sampler's logits.

``json_processor(tokenizer, vocab_size, stop_token_ids, schema=None)`` returns a logits
processor for ``SamplingParams(logits_processors=[...])`` (``fn(output_token_ids, logits) ->
logits``): before every token it sets to ``-inf`` the logit of every token that would leave the
text no longer a prefix of valid JSON (of any object with ``schema=None``, the API's
``{"type": "json_object"}``; of the JSON schema given, ``{"type": "json_schema"}``), and it lets
an end-of-sequence token through only where the JSON is complete (once it is, and nothing can
follow, only those).

The grammar work is llguidance's (a maintained library with no Python dependencies, one of
vLLM's structured-output backends): an ``LLTokenizer`` built once per tokenizer (from the
``tokenizers`` JSON the project's tokenizer wraps, so transformers is not needed) knows every
token's bytes; the schema becomes a grammar, and an ``LLMatcher`` per answer follows the tokens
drawn and computes the bitmask of the allowed ones.

One processor may serve several answers (``n``): it keeps one matcher per answer, keyed by the
answer's list of output tokens (the engine hands each request's own list), and replays an
answer's tokens into a fresh matcher when that list no longer extends what it followed (a
preempted request recomputed).  After an answer's end-of-sequence token (``ignore_eos``), or a
token the grammar refuses (set by something other than this mask), the answer has left the
grammar and its logits pass unchanged.

``StructuredOutputsParams(json=schema)`` is vLLM's offline spelling of the same request
(``structured_outputs_processor(params, tokenizer, vocab_size, stop_token_ids)`` turns it into
the processor).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

# OpenAI's {"type": "json_object"}: any JSON object (llguidance's spelling of it)
ANY_JSON_OBJECT = {"type": "object"}


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


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise RuntimeError("structured output needs llguidance: pip install "
                           "'paged-tutorial[serve]'") from None
    return llguidance


def preload() -> bool:
    """Import llguidance now, when the server is built, rather than inside the first request
    that asks for JSON; False when it is not installed (such a request is then a 400 saying how
    to install it)."""
    try:
        _llguidance()
    except RuntimeError:
        return False
    return True


@lru_cache(maxsize=4)
def _grammar_tokenizer(tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]):
    """llguidance's view of ``tokenizer`` (every token's bytes, its end-of-sequence token: the
    first of ``stop_token_ids``), built once per tokenizer: it takes about a second.  Its
    vocabulary is the model's ``vocab_size`` (a model may pad its embedding past the tokenizer's
    last id), never less than the tokenizer's.  (Older llguidance releases take a single
    end-of-sequence id, so the processor copies the first one's bit in the mask to the others.)"""
    llg = _llguidance()
    backend = tokenizer.backend                      # a `tokenizers.Tokenizer`
    size = max(vocab_size, backend.get_vocab_size(with_added_tokens=True))
    return llg.LLTokenizer(backend.to_str(), n_vocab=size,
                           eos_token=stop_token_ids[0] if stop_token_ids else None)


def compile_json(tokenizer, vocab_size: int, stop_token_ids, schema: dict | str | None):
    """The grammar (llguidance's text) of any JSON object (``schema=None``) or of ``schema``,
    checked against the tokenizer; a schema llguidance cannot use raises ``ValueError`` naming
    the problem."""
    llg = _llguidance()
    grammar_tokenizer = _grammar_tokenizer(tokenizer, vocab_size, tuple(stop_token_ids))
    if schema is None:
        schema = ANY_JSON_OBJECT
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the JSON schema is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"the JSON schema must be a JSON object, got {type(schema).__name__}")
    grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    problem = llg.LLMatcher.validate_grammar(grammar, grammar_tokenizer)
    if problem:
        raise ValueError(f"the JSON schema cannot be used: {problem}")
    return grammar_tokenizer, grammar


@dataclass(frozen=True)
class GrammarRecipe:
    """A ``JSONLogitsProcessor`` as it crosses to another process (``engine_process.py``): its
    grammar and stop tokens, built again there against that process's tokenizer."""
    grammar: str
    stop_token_ids: tuple[int, ...]

    def processor(self, tokenizer, vocab_size: int) -> "JSONLogitsProcessor":
        return JSONLogitsProcessor(_grammar_tokenizer(tokenizer, vocab_size, self.stop_token_ids),
                                   self.grammar, self.stop_token_ids)


class JSONLogitsProcessor:
    """Masks every token that would leave the grammar (one matcher per answer)."""

    def __init__(self, grammar_tokenizer, grammar: str, stop_token_ids):
        self.llg = _llguidance()
        self.grammar_tokenizer = grammar_tokenizer
        self.grammar = grammar
        self.stop_token_ids = tuple(stop_token_ids)   # the first is llguidance's own
        self.answers: dict[int, list] = {}     # id(output list) -> [matcher, tokens followed]

    def recipe(self) -> GrammarRecipe:
        return GrammarRecipe(self.grammar, self.stop_token_ids)

    def _matcher(self, output_token_ids: list[int]):
        """The answer's matcher, having followed every token of ``output_token_ids``."""
        state = self.answers.get(id(output_token_ids))
        if state is None or len(output_token_ids) < state[1]:
            state = [self.llg.LLMatcher(self.grammar_tokenizer, self.grammar), 0]
            self.answers[id(output_token_ids)] = state
        matcher = state[0]
        for token in output_token_ids[state[1]:]:
            if not matcher.is_error():
                matcher.consume_token(token)   # an end-of-sequence token stops it for good
        state[1] = len(output_token_ids)
        return matcher

    def _left_the_grammar(self, matcher, output_token_ids: list[int]) -> bool:
        return matcher.is_error() or bool(output_token_ids
                                          and output_token_ids[-1] in self.stop_token_ids)

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        matcher = self._matcher(output_token_ids)
        if self._left_the_grammar(matcher, output_token_ids):
            return logits
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:logits.shape[-1]]
        if len(self.stop_token_ids) > 1:
            allowed[list(self.stop_token_ids[1:])] = allowed[self.stop_token_ids[0]]
        refused = torch.from_numpy(allowed == 0).to(logits.device)
        logits.view(-1, logits.shape[-1]).masked_fill_(refused, float("-inf"))
        return logits


def json_processor(tokenizer, vocab_size: int, stop_token_ids,
                   schema: dict | str | None = None) -> JSONLogitsProcessor:
    grammar_tokenizer, grammar = compile_json(tokenizer, vocab_size, stop_token_ids, schema)
    return JSONLogitsProcessor(grammar_tokenizer, grammar, stop_token_ids)


def structured_outputs_processor(params: StructuredOutputsParams, tokenizer, vocab_size: int,
                                 stop_token_ids) -> JSONLogitsProcessor:
    schema: Any = None if params.json_object else params.json
    return json_processor(tokenizer, vocab_size, stop_token_ids, schema)
