"""Prompts as vLLM takes them, turned into token ids for the engine.

A prompt is a string (encoded as the model's tokenizer does by default, with its BOS token when
it has one: no chat template, as in vLLM's ``LLM.generate``), ``{"prompt": text}``
(``TextPrompt``), or ``{"prompt_token_ids": [ids]}`` (``TokensPrompt``; both in
``paged_tutorial/inputs.py``).  A conversation (``LLM.chat``, ``/v1/chat/completions``) is a
list of ``{"role", "content"}`` messages, rendered by the model's chat template, with vLLM's
options (``ChatTemplateOptions``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class ChatTemplateOptions:
    """How a conversation is rendered (vLLM's ``LLM.chat`` keywords)."""
    chat_template: str | None = None     # a Jinja template's text; None: the model's own
    add_generation_prompt: bool = True   # end with the assistant's turn header
    continue_final_message: bool = False  # leave the last message open for the model
    chat_template_kwargs: dict = field(default_factory=dict)   # more template variables

    @classmethod
    def of(cls, chat_template, add_generation_prompt, continue_final_message,
           chat_template_kwargs) -> "ChatTemplateOptions":
        """Checked: each a clear error naming the argument."""
        if chat_template is not None and (not isinstance(chat_template, str)
                                          or not chat_template.strip()):
            raise ValueError(f"chat_template must be a Jinja template's text, got "
                             f"{chat_template!r}")
        for name, value in (("add_generation_prompt", add_generation_prompt),
                            ("continue_final_message", continue_final_message)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if add_generation_prompt and continue_final_message:
            raise ValueError("continue_final_message=True continues the last message, "
                             "add_generation_prompt=True starts a new assistant turn: pass "
                             "add_generation_prompt=False with continue_final_message=True")
        kwargs = {} if chat_template_kwargs is None else chat_template_kwargs
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"chat_template_kwargs must be a dict of template variables, got "
                             f"{chat_template_kwargs!r}")
        reserved = {"messages", "add_generation_prompt"} & set(kwargs)
        if reserved:
            raise ValueError(f"chat_template_kwargs cannot set {sorted(reserved)}: pass the "
                             "conversation and add_generation_prompt as chat's own arguments")
        return cls(chat_template, add_generation_prompt, continue_final_message, dict(kwargs))

    def render(self, tokenizer, messages) -> str:
        """The conversation's text; with ``continue_final_message`` cut right after the last
        message's content (as transformers does), so what the template closes it with is gone."""
        text = tokenizer.render_chat(messages, self.add_generation_prompt,
                                     template=self.chat_template, **self.chat_template_kwargs)
        if self.continue_final_message:
            final = messages[-1]["content"]
            at = text.rfind(final) if final else -1
            if at < 0:
                raise ValueError("continue_final_message=True: the last message's content is "
                                 "not in the rendered chat, so it cannot be left open (an "
                                 "empty last message, or a template that rewrites it)")
            text = text[:at + len(final)]
        return text


def encode_conversation(engine, messages, options: ChatTemplateOptions | None = None
                        ) -> EncodedPrompt:
    """A list of chat messages -> the rendered template and its token ids."""
    if engine.tokenizer is None:
        raise ValueError("this model has no tokenizer, so it has no chat template")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        raise ValueError("a conversation is a non-empty list of messages "
                         "{'role': str, 'content': str}")
    text = (options or ChatTemplateOptions()).render(engine.tokenizer, messages)
    ids = engine.tokenizer.encode(text, add_special_tokens=False)   # the template wrote them
    return EncodedPrompt(text, engine.encode_prompt(ids, chat=False))
