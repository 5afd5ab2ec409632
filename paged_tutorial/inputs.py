"""vLLM's prompt types (``vllm.inputs``): a prompt given as text or as token ids.

    from paged_tutorial import LLM, TokensPrompt
    llm.generate([TokensPrompt(prompt_token_ids=[1, 504, 3575])], params)

Both are plain dicts to Python (``TypedDict``): ``{"prompt_token_ids": [...]}`` and
``{"prompt": "..."}`` work the same.  ``LLM.generate`` takes them (``serving/prompts.py``);
vLLM 0.10.2 removed ``generate``'s ``prompt_token_ids=`` keyword in their favour, and so does
this package.
"""

from __future__ import annotations

from typing import TypedDict


class TextPrompt(TypedDict):
    prompt: str                          # encoded as the tokenizer does by default (BOS too)


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]          # given to the model as they are


__all__ = ["TextPrompt", "TokensPrompt"]
