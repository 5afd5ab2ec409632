"""Text <-> token ids, chat templates and streaming detokenization.

A thin layer over the ``tokenizers`` library (the Rust engine behind transformers' fast
tokenizers), built either from a Hugging Face folder (``tokenizer.json``) or from the tokenizer a
GGUF file carries in its metadata (``tokenizer.ggml.*``).  Chat templates are rendered the way
transformers renders them: Jinja2 in a sandbox, ``trim_blocks``/``lstrip_blocks``, with
``raise_exception``, ``strftime_now`` and a non-escaping ``tojson``.
"""

from __future__ import annotations

import copy

import json
import warnings
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from paged_tutorial.loading.text_input import check_text

# --- chat templates ----------------------------------------------------------------------------


class ChatTemplateError(ValueError):
    """The chat template cannot render these messages: it refused them (its
    ``raise_exception`` was called), it is not valid Jinja2, or it failed while rendering (an
    undefined name, a division by zero, the sandbox refusing an attribute, endless recursion).
    The message names the template's source and the fault."""


class ChatMessageError(TypeError, ValueError):
    """A chat message list that is not one (a message without 'role', or whose 'content' is
    not a string): refused before the template sees it, naming the message's index."""


class _TemplateRefusal(Exception):
    """What the template's ``raise_exception(message)`` raises inside Jinja."""


def _raise_exception(message):
    raise _TemplateRefusal(message)


def _template_line(exc: BaseException) -> int | None:
    """The template line the render was on when ``exc`` rose (Jinja rewrites its tracebacks
    so that template frames carry the template's own line numbers), or None."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def template_failure(exc: BaseException, where: str) -> ChatTemplateError:
    """One clear error for a template that failed while rendering."""
    line = _template_line(exc)
    at = f" (template line {line})" if line is not None else ""
    if isinstance(exc, _TemplateRefusal):
        return ChatTemplateError(f"the chat template of {where} rejected the messages{at}: "
                                 f"{' '.join(str(exc).split())}")
    if isinstance(exc, RecursionError):
        fault = "it recurses without end"
    else:
        text = " ".join(str(exc).split())
        fault = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return ChatTemplateError(
        f"the chat template of {where} failed while rendering{at}: {fault}; fix the template "
        "(or pass a different one), or send the prompt as token ids or with chat=False")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_chat_template(source: str):
    """A compiled Jinja2 template, in a sandbox (templates from the hub are untrusted code).
    A syntax error is a ChatTemplateError saying what "is not valid Jinja2" and where."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks;
        for inference it just renders its body."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body) \
                .set_lineno(lineno)

        def _render(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"is not valid Jinja2 (line {exc.lineno}: {' '.join(str(exc.message).split())}); "
            "fix the template, or "
            "send the prompt as token ids or with chat=False") from exc


def as_messages(prompt_or_messages) -> list[dict]:
    """A prompt string becomes one user message; a message list is checked and copied.  Each
    message is a dict with a string 'role' and a string 'content' (other keys are kept for the
    template); anything else is a ChatMessageError naming the message's index."""
    if isinstance(prompt_or_messages, str):
        return [{"role": "user", "content": _checked_text(prompt_or_messages, "the prompt")}]
    if isinstance(prompt_or_messages, (bytes, Mapping)) or \
            not isinstance(prompt_or_messages, Sequence) or not prompt_or_messages:
        raise ChatMessageError("a chat is a prompt string or a non-empty list of "
                               f"{{'role': ..., 'content': ...}} dicts, got "
                               f"{_shown(prompt_or_messages)}")
    messages = []
    for i, message in enumerate(prompt_or_messages):
        if not isinstance(message, Mapping):
            raise ChatMessageError(f"chat message {i} must be a dict with 'role' and 'content', "
                                   f"got {_shown(message)}")
        for key in ("role", "content"):
            if key not in message:
                raise ChatMessageError(f"chat message {i} has no {key!r}: each message needs "
                                       f"'role' and 'content', got {_shown(message)}")
            if not isinstance(message[key], str):
                raise ChatMessageError(
                    f"chat message {i}'s {key!r} must be a string, got "
                    f"{type(message[key]).__name__} {_shown(message[key])}")
        _checked_text(message["role"], f"chat message {i}'s role")
        _checked_text(message["content"], f"chat message {i}'s content")
        messages.append(dict(message))
    return messages


def _checked_text(text: str, what: str) -> str:
    try:
        return check_text(text, what)
    except ValueError as exc:
        raise ChatMessageError(str(exc)) from None


def _shown(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# --- GGUF's byte-level BPE tokenizer -------------------------------------------------------------

TOKEN_TYPE_CONTROL = 3          # llama.cpp's token_type for special tokens like <|im_end|>
TOKEN_TYPE_USER_DEFINED = 4     # added (non-special) tokens like <think>

# Pre-tokenizer split regexes by ``tokenizer.ggml.pre``, as transformers' GGUF converter
# (integrations/gguf/gguf_tokenizer_mapping.py) picks them.  A pre type not listed keeps GPT-2's
# own ByteLevel regex -- right for "gpt2" and "smollm" (SmolLM2's merges never join digits, so its
# digit-by-digit split yields the same tokens).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GGUF_PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), _GPT4O_SPLIT),
}
GPT2_REGEX_PRE_TYPES = (None, "default", "gpt2", "gpt-2", "smollm")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: how byte-level BPE spells raw bytes."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def byte_level_vocab(tokens: Sequence[str]) -> dict[str, int]:
    """token -> id, respelling any token llama.cpp stored as raw text into the byte alphabet."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    return {token if set(token) <= alphabet
            else "".join(spelling[b] for b in token.encode("utf-8")): index
            for index, token in enumerate(tokens)}


def gguf_pre_tokenizer(pre_type: str | None):
    split = GGUF_PRE_TOKENIZER_SPLITS.get(pre_type)
    if split is None:
        if pre_type not in GPT2_REGEX_PRE_TYPES:
            warnings.warn(f"GGUF pre-tokenizer {pre_type!r} is not known here; using GPT-2's "
                          "split regex, so tokenization may differ slightly from llama.cpp's",
                          stacklevel=3)
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _gguf_added_tokens(tokens: Sequence[str], token_types: Sequence[int] | None,
                       vocab: Mapping[str, int]) -> tuple[list[AddedToken], list[AddedToken]]:
    """(special, plain) added tokens.  A control token spelled outside the byte alphabet is a
    llama.cpp mislabel and is skipped, as transformers does."""
    alphabet = set(bytes_to_unicode().values())
    special, plain = [], []
    for token, kind in zip(tokens, token_types or ()):
        if kind == TOKEN_TYPE_CONTROL and set(token) <= alphabet:
            special.append(AddedToken(token, normalized=False, special=True))
        elif kind == TOKEN_TYPE_USER_DEFINED and token in vocab:
            plain.append(AddedToken(token, normalized=False, special=False))
    return special, plain


def byte_level_bpe_from_gguf(meta: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """The ``tokenizers.Tokenizer`` a ``tokenizer.ggml.model == "gpt2"`` GGUF describes."""
    tokens = meta["tokenizer.ggml.tokens"]
    vocab = byte_level_vocab(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or ()]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                              continuing_subword_prefix="", end_of_word_suffix=""))
    backend.pre_tokenizer = gguf_pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    backend.decoder = decoders.ByteLevel()
    special, plain = _gguf_added_tokens(tokens, meta.get("tokenizer.ggml.token_type"), vocab)
    backend.add_special_tokens(special)
    backend.add_tokens(plain)
    return backend


def _with_bos_post_processor(backend: tokenizers.Tokenizer, bos_token: str, bos_id: int):
    """``encode(add_special_tokens=True)`` prepends BOS, as llama.cpp does for add_bos_token."""
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos_token} $A", pair=f"{bos_token} $A $B", special_tokens=[(bos_token, bos_id)])


# --- tokenizer folders ---------------------------------------------------------------------------

def _token_content(value) -> str | None:
    """tokenizer_config.json spells a special token as a string or {"content": ...}."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    """A JSON object file's contents ({} when the file is absent); anything else is refused
    with a ValueError naming the file."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): the file is truncated or corrupt; "
                         "re-download it") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {_json_kind(data)}, not an object of settings "
                         "({...}): the file is damaged or is not this model's; re-download it")
    return data


def _json_kind(value) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _pick_template(template, where: str) -> str | None:
    """A template string, or the "default" of a list of {"name", "template"} entries; any other
    value is refused with a ValueError naming ``where`` (the file and field)."""
    if isinstance(template, str) or template is None:
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        chosen = named.get("default") or next(iter(named.values()), None)
        if chosen is None or isinstance(chosen, str):
            return chosen
        template = chosen
    raise ValueError(f"{where} is not a string: it is a {_json_kind(template)} "
                     f"({_shown(template)}), where a Jinja2 template's text belongs; fix the "
                     "file (or re-download it), or pass prompts with chat=False")


def chat_template_from_folder(folder: Path, tokenizer_config: Mapping) -> str | None:
    """``chat_template.jinja``, else ``chat_template.json``, else tokenizer_config.json's."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = folder / "chat_template.json"
    from_json = _pick_template(_read_json(json_file).get("chat_template"),
                               f"'chat_template' in {json_file}")
    return from_json or _pick_template(tokenizer_config.get("chat_template"),
                                       f"'chat_template' in {folder / 'tokenizer_config.json'}")


# --- the tokenizer -------------------------------------------------------------------------------

class StreamDetokenizer:
    """Turns generated token ids into text one id at a time.

    ``step(id)`` returns only the new text; while a multi-byte UTF-8 character is still split
    across tokens it returns "" and emits the whole character once its last byte arrives."""

    def __init__(self, backend: tokenizers.Tokenizer, skip_special_tokens: bool = True):
        self._backend = backend
        self._stream = decoders.DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._backend, int(token_id)) or ""


class Tokenizer:
    """Encode/decode, chat templates and streaming for one model."""

    def __init__(self, backend: tokenizers.Tokenizer, *, chat_template: str | None = None,
                 special_tokens: Mapping[str, str | None] | None = None,
                 eos_token_ids: Iterable[int] = (), source: str = ""):
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.source = source
        eos = list(eos_token_ids)
        eos_token = self.special_tokens.get("eos_token")
        if eos_token is not None and backend.token_to_id(eos_token) is not None:
            eos.insert(0, backend.token_to_id(eos_token))
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(e) for e in eos))

    # --- constructors ---------------------------------------------------------------------
    @classmethod
    def from_folder(cls, path, *, required: bool = True) -> "Tokenizer | None":
        """The tokenizer of a Hugging Face folder (``tokenizer.json`` plus
        ``tokenizer_config.json`` / ``chat_template.jinja`` / ``special_tokens_map.json``).

        Without ``tokenizer.json``: FileNotFoundError, or None when ``required=False``."""
        folder = Path(path).expanduser()
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            if not required:
                return None
            raise FileNotFoundError(_missing_tokenizer_message(folder))
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the Rust parser raises a bare Exception on bad JSON
            raise ValueError(f"{tokenizer_file} could not be read ({exc}): it is truncated or "
                             "corrupt; re-download it") from exc
        config = _read_json(folder / "tokenizer_config.json")
        token_map = _read_json(folder / "special_tokens_map.json")
        names = ("bos_token", "eos_token", "unk_token", "pad_token")
        special = {n: _token_content(config.get(n)) or _token_content(token_map.get(n))
                   for n in names}
        return cls(backend, chat_template=chat_template_from_folder(folder, config),
                   special_tokens=special, source=str(folder))

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], source: str = "") -> "Tokenizer":
        """The tokenizer a GGUF file carries (``tokenizer.ggml.*``); byte-level BPE only."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"GGUF tokenizer type {kind!r} is not supported: this engine builds byte-level "
                "BPE tokenizers ('gpt2': SmolLM2, Llama 3, Qwen2) from GGUF metadata; load the "
                "model from a Hugging Face folder with tokenizer.json instead, or pass token ids")
        if not meta.get("tokenizer.ggml.tokens"):
            raise ValueError("GGUF metadata has no tokenizer.ggml.tokens: the file carries no "
                             "vocabulary; pass token ids instead of text")
        backend = byte_level_bpe_from_gguf(meta)
        tokens = meta["tokenizer.ggml.tokens"]
        ids = {name: meta.get(f"tokenizer.ggml.{key}") for name, key in (
            ("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id"))}
        special = {name: tokens[i] if isinstance(i, int) and not isinstance(i, bool)
                   and 0 <= i < len(tokens) else None
                   for name, i in ids.items()}
        if meta.get("tokenizer.ggml.add_bos_token") and special["bos_token"] is not None:
            _with_bos_post_processor(backend, special["bos_token"], int(ids["bos_token"]))
        extra_eos = [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                     if meta.get(k) is not None]
        template = _pick_template(meta.get("tokenizer.chat_template"),
                                  f"tokenizer.chat_template in {source or 'the GGUF metadata'}")
        return cls(backend, chat_template=template, special_tokens=special,
                   eos_token_ids=extra_eos, source=source)

    # --- properties -----------------------------------------------------------------------
    @property
    def bos_token_id(self) -> int | None:
        bos = self.special_tokens.get("bos_token")
        return None if bos is None else self.backend.token_to_id(bos)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    # --- text <-> ids ---------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a string, got {type(text).__name__}")
        check_text(text)
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def stream(self, skip_special_tokens: bool = True) -> StreamDetokenizer:
        """A fresh incremental detokenizer for one generated sequence."""
        return StreamDetokenizer(self.backend, skip_special_tokens)

    # --- chat -----------------------------------------------------------------------------
    def render_chat(self, prompt_or_messages, add_generation_prompt: bool = True,
                    template: str | None = None, **template_vars) -> str:
        """The chat template's text for these messages (what apply_chat_template tokenizes);
        ``template``: a template's text to use instead of the tokenizer's own."""
        if template is not None:
            other = copy.copy(self)
            other.chat_template = template
            return other.render_chat(prompt_or_messages, add_generation_prompt,
                                     **template_vars)
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise ChatTemplateError(
                f"the chat template of {self.source or 'this tokenizer'} is not a string: it is "
                f"a {type(self.chat_template).__name__}; pass the template's text")
        if not self.chat_template:
            where = f" of {self.source}" if self.source else ""
            raise ValueError(
                f"the tokenizer{where} has no chat template: pass the prompt as token ids, or "
                "as text with chat=False to skip the template")
        messages = as_messages(prompt_or_messages)       # checked before Jinja sees them
        where = self.source or "this tokenizer"
        try:
            template = compile_chat_template(self.chat_template)
        except ChatTemplateError as exc:
            raise ChatTemplateError(f"the chat template of {where} {exc}") from None
        # As transformers: the special tokens by name, and tools/documents defined (as None).
        variables = {"tools": None, "documents": None, **self.special_tokens, **template_vars}
        try:
            text = template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   **variables)
        except Exception as exc:     # a template is untrusted code: any fault is the template's
            raise template_failure(exc, where) from None
        if not isinstance(text, str):
            raise ChatTemplateError(f"the chat template of {where} rendered no text")
        return text

    def apply_chat_template(self, prompt_or_messages, add_generation_prompt: bool = True,
                            **template_vars) -> list[int]:
        """Token ids of the rendered chat.  The template writes its own BOS and special tokens,
        so the text is encoded without adding any (as transformers does)."""
        text = self.render_chat(prompt_or_messages, add_generation_prompt, **template_vars)
        return self.encode(text, add_special_tokens=False)

    # --- saving ---------------------------------------------------------------------------
    def save_to_folder(self, path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (readable by from_folder and by
        transformers' AutoTokenizer)."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(folder / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.special_tokens}
        if self.chat_template:
            config["chat_template"] = self.chat_template
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2,
                                                                 ensure_ascii=False))

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, eos_token_ids={self.eos_token_ids}, "
                f"chat_template={'yes' if self.chat_template else 'no'}, source={self.source!r})")


def _missing_tokenizer_message(folder: Path) -> str:
    hint = ""
    if (folder / "tokenizer.model").is_file():
        hint = (" (it has tokenizer.model, a SentencePiece file this engine does not read; "
                "save a tokenizer.json with transformers' AutoTokenizer.save_pretrained)")
    return (f"{folder} has no tokenizer.json{hint}: download the model's tokenizer files, "
            "or pass prompts as token ids")
