"""Prompts as vLLM takes them, turned into token ids for the engine.

A prompt is a string (encoded as the model's tokenizer does by default, with its BOS token when
it has one: no chat template, as in vLLM's ``LLM.generate``), ``{"prompt": text}``, or
``{"prompt_token_ids": [ids]}``.  A conversation (``LLM.chat``, ``/v1/chat/completions``) is a
list of ``{"role", "content"}`` messages, rendered by the model's chat template.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EncodedPrompt:
    text: str | None          # what RequestOutput.prompt shows (None for token ids)
    token_ids: list[int]


def encode_prompt(engine, prompt) -> EncodedPrompt:
    """One prompt in any of the forms above -> its text and token ids (checked by the
    engine: integers inside the vocabulary, not empty)."""
    if isinstance(prompt, dict):
        unknown = set(prompt) - {"prompt", "prompt_token_ids"}
        if unknown or len(prompt) != 1:
            raise ValueError(f"a prompt dict has exactly one key, 'prompt' or "
                             f"'prompt_token_ids'; got {sorted(prompt)}")
        if "prompt" in prompt:
            return encode_prompt(engine, prompt["prompt"])
        return EncodedPrompt(None, engine.encode_prompt(prompt["prompt_token_ids"], chat=False))
    if isinstance(prompt, str):
        if engine.tokenizer is None:
            raise ValueError("this model has no tokenizer: give prompts as "
                             "{'prompt_token_ids': [...]}")
        if not prompt:
            raise ValueError("empty prompt: give some text or token ids")
        ids = engine.tokenizer.encode(prompt, add_special_tokens=True)
        return EncodedPrompt(prompt, engine.encode_prompt(ids, chat=False))
    raise TypeError(f"a prompt is a string, {{'prompt': text}} or {{'prompt_token_ids': ids}}, "
                    f"got {type(prompt).__name__}")


def encode_conversation(engine, messages) -> EncodedPrompt:
    """A list of chat messages -> the rendered template and its token ids."""
    if engine.tokenizer is None:
        raise ValueError("this model has no tokenizer, so it has no chat template")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        raise ValueError("a conversation is a non-empty list of messages "
                         "{'role': str, 'content': str}")
    text = engine.tokenizer.render_chat(messages)
    return EncodedPrompt(text, engine.encode_prompt(
        engine.tokenizer.apply_chat_template(messages), chat=False))
