"""Where the command's prompts come from: its arguments, ``-`` (standard input) and ``-f
FILE``; each is checked before anything heavy loads."""

from __future__ import annotations

import sys

from paged_tutorial.cli.options import STDIN
from paged_tutorial.loading.text_input import escaped_byte, find_lone_surrogate


class PromptError(Exception):
    """A prompt that cannot be read: printed as one 'error:' line (status 2)."""


def bad_prompt_encoding(prompts: list[str]) -> str | None:
    """What to say about the first prompt holding a byte the terminal's encoding could not
    decode (Python gives such argv bytes as lone surrogates), or None."""
    for i, prompt in enumerate(prompts):
        found = find_lone_surrogate(prompt)
        if found is None:
            continue
        position, char = found
        byte = escaped_byte(char)
        what = f"the byte 0x{byte:02X}" if byte is not None else f"U+{ord(char):04X}"
        label = "the prompt" if len(prompts) == 1 else f"prompt {i + 1}"
        return (f"{label} holds {what} at position {position}, which is not valid in this "
                f"terminal's encoding ({sys.getfilesystemencoding()}, from LANG / LC_ALL): the "
                "terminal sent text in another encoding; make the terminal and LANG / LC_ALL "
                "agree (both UTF-8, say) and type the prompt again")
    return None


def _without_final_newline(text: str) -> str:
    """A file's text without the line end an editor (or ``echo``) puts after the last line."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def _decoded(data: bytes, where: str) -> str:
    try:
        return _without_final_newline(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PromptError(f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02X} at offset "
                          f"{exc.start}): save it as UTF-8 (iconv -t UTF-8), then try again") \
            from None


def read_prompt(name: str, stdin=None) -> str:
    """The prompt a ``-f`` argument (or ``-``) names."""
    if name == STDIN:
        stdin = sys.stdin if stdin is None else stdin
        if stdin is None:
            raise PromptError("'-' reads the prompt from standard input, but standard input is "
                              "closed: pipe the prompt in (echo 'Hi' | ... -), or pass it as "
                              "an argument")
        stream = getattr(stdin, "buffer", None)
        try:
            data = stream.read() if stream is not None else stdin.read().encode("utf-8")
        except OSError as exc:
            raise PromptError(f"cannot read the prompt from standard input: "
                              f"{exc.strerror or exc}") from None
        return _decoded(data, "standard input")
    try:
        with open(name, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        raise PromptError(f"-f {name}: no such file: check the path") from None
    except IsADirectoryError:
        raise PromptError(f"-f {name}: is a folder, not a prompt file") from None
    except OSError as exc:
        raise PromptError(f"-f {name}: cannot read it ({exc.strerror or exc})") from None
    return _decoded(data, f"-f {name}")


def collect_prompts(args, stdin=None) -> list[str]:
    """The prompts in order: the arguments (``-`` read from standard input), then each ``-f``."""
    prompts = [read_prompt(STDIN, stdin) if p == STDIN else p for p in args.prompt]
    prompts += [read_prompt(name, stdin) for name in args.file]
    for i, prompt in enumerate(prompts):
        if not prompt:
            label = "the prompt" if len(prompts) == 1 else f"prompt {i + 1}"
            raise PromptError(f"{label} is empty: nothing to answer")
    return prompts


def chat_messages(prompt: str, system: str | None) -> list[dict] | str:
    """One prompt as the engine's chat takes it: the prompt itself, or a system message and
    it."""
    if system is None:
        return prompt
    return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]


def engine_prompt(engine, prompt: str | list[dict]):
    """What ``engine.add_request`` takes for a prompt string or a list of chat messages: the
    string itself, or the token ids of the messages through the model's chat template."""
    if isinstance(prompt, str):
        return prompt
    tokenizer = engine.model.tokenizer
    if tokenizer is None:
        raise ValueError(f"model {engine.model.source!r} has no tokenizer files, so it has no "
                         "chat template for a conversation or --system")
    return tokenizer.apply_chat_template(prompt)
