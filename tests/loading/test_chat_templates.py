"""Chat templates and chat messages: every way a template can fail while rendering, and every
malformed message list, ends in one of the package's own errors (ChatTemplateError naming the
template's source and the fault, ChatMessageError naming the message), never a raw exception
from Jinja; tokenizer files of the wrong JSON shape are refused naming the file.

The tokenizer here is a tiny byte-level BPE built in memory (no model files)."""

from __future__ import annotations

import json

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import models

from paged_tutorial.loading.tokenizer import ChatMessageError, ChatTemplateError, Tokenizer

SOURCE = "/models/tiny-chat"
PLAIN = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def tokenizer(template) -> Tokenizer:
    return Tokenizer(tokenizers.Tokenizer(models.BPE()), chat_template=template, source=SOURCE)


# --- each kind of template fault ---------------------------------------------------------------

@pytest.mark.parametrize("template, fault", [
    ("{{ no_such_name.attribute }}", "UndefinedError: 'no_such_name' is undefined"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError"),
    ("{{ messages.append(1) }}", "SecurityError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recurses without end"),
    ("{{ messages[7]['content'] }}", "UndefinedError"),
    ("{{ messages[0]['content'] + 3 }}", "TypeError"),
])
def test_a_template_that_fails_while_rendering_is_one_clear_error(template, fault):
    with pytest.raises(ChatTemplateError) as info:
        tokenizer("line one\n" + template).render_chat("hi")
    text = str(info.value)
    assert SOURCE in text and fault in text and "template line 2" in text, text
    assert "\n" not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_raise_exception_names_the_source_and_the_templates_words():
    with pytest.raises(ChatTemplateError) as info:
        tokenizer("{{ raise_exception('roles must alternate') }}").render_chat("hi")
    assert str(info.value) == (f"the chat template of {SOURCE} rejected the messages "
                               "(template line 1): roles must alternate")


def test_a_syntax_error_names_the_source_and_the_line():
    with pytest.raises(ChatTemplateError, match=f"the chat template of {SOURCE} is not valid "
                                                r"Jinja2 \(line 2: "):
        tokenizer("ok\n{% if %}").render_chat("hi")


def test_a_template_that_is_not_a_string():
    with pytest.raises(ChatTemplateError, match="is not a string: it is a int"):
        tokenizer(42).render_chat("hi")


# --- messages are checked before the template sees them ----------------------------------------

@pytest.mark.parametrize("messages, words", [
    ([{"role": "user"}], "chat message 0 has no 'content'"),
    ([{"role": "user", "content": "a"}, {"content": "b"}], "chat message 1 has no 'role'"),
    ([{"role": "user", "content": None}], "chat message 0's 'content' must be a string, got "
                                          "NoneType"),
    ([{"role": "user", "content": ["part"]}], "chat message 0's 'content' must be a string"),
    ([{"role": 3, "content": "x"}], "chat message 0's 'role' must be a string, got int"),
    ([{"role": "user", "content": "a"}, "text"], "chat message 1 must be a dict"),
    ([], "non-empty list"),
    ({"role": "user", "content": "a"}, "non-empty list"),
    ([{"role": "user", "content": "caf\udce9"}], "chat message 0's content holds a lone "
                                                 "surrogate"),
])
def test_malformed_messages_name_the_message(messages, words):
    template = "{{ messages[0]['content'] + 1 }}"       # would fail differently if reached
    with pytest.raises(ChatMessageError, match=words.replace("(", r"\(")):
        tokenizer(template).render_chat(messages)
    assert issubclass(ChatMessageError, TypeError) and issubclass(ChatMessageError, ValueError)


# --- tokenizer files of the wrong shape --------------------------------------------------------

def write_folder(tmp_path, config_text: str):
    tokenizers.Tokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(config_text)
    return tmp_path


def test_chat_template_42_says_the_template_is_not_a_string(tmp_path):
    folder = write_folder(tmp_path, json.dumps({"chat_template": 42}))
    with pytest.raises(ValueError) as info:
        Tokenizer.from_folder(folder)
    text = str(info.value)
    assert "'chat_template' in" in text and "tokenizer_config.json is not a string" in text
    assert "number (42)" in text and "no chat template" not in text


def test_tokenizer_config_that_is_a_json_list_is_refused_naming_the_file(tmp_path):
    folder = write_folder(tmp_path, json.dumps([{"chat_template": PLAIN}]))
    with pytest.raises(ValueError) as info:
        Tokenizer.from_folder(folder)
    assert f"{folder / 'tokenizer_config.json'} holds a JSON list" in str(info.value)


def test_a_named_template_list_still_picks_default(tmp_path):
    folder = write_folder(tmp_path, json.dumps({"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": PLAIN}]}))
    assert Tokenizer.from_folder(folder).render_chat("hi") == "<user>hi"


def test_gguf_chat_template_that_is_not_a_string():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"],
            "tokenizer.ggml.merges": [], "tokenizer.chat_template": 7}
    with pytest.raises(ValueError, match="tokenizer.chat_template in tiny.gguf is not a string"):
        Tokenizer.from_gguf_metadata(meta, source="tiny.gguf")


# --- property: random templates and random message lists ---------------------------------------

TEMPLATE_PIECES = [
    "text ", "{{ messages[0]['content'] }}", "{{ messages[-1]['role'] | upper }}",
    "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}",
    "{% if add_generation_prompt %}<assistant>{% endif %}", "{{ bos_token }}",
    "{{ messages | length }}", "{{ (messages | length) // 0 }}", "{{ 1 / 0 }}",
    "{{ undefined_name }}", "{{ undefined_name.attribute }}", "{{ undefined_name() }}",
    "{{ messages[9]['content'] }}", "{{ messages[0].content + 1 }}",
    "{{ ''.__class__ }}", "{{ messages.__len__() }}", "{{ messages.pop() }}",
    "{{ raise_exception('no thanks') }}", "{{ messages[0]['content'] | tojson }}",
    "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "{% if %}", "{{ ",
    "{% for %}", "{{ strftime_now('%Y') }}", "{{ range(3) | list }}", "{% set x = 1 %}{{ x.y.z }}",
    "{{ messages[0]['content'][10000] }}", "{{ 'a' * 3 }}", "{{ (1, 2)[5] }}", "{{ {}['k'] }}",
    "{{ messages[0]['content'] | int }}", "{% generation %}g{% endgeneration %}",
]
values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                   st.text(max_size=8), st.lists(st.text(max_size=3), max_size=2))
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                               "content": st.text(max_size=12)}),
        st.dictionaries(st.sampled_from(["role", "content", "name", "tool_calls"]), values,
                        max_size=4),
        values),
    max_size=4)
prompts = st.one_of(messages, st.text(max_size=12), values)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(st.sampled_from(TEMPLATE_PIECES), min_size=1, max_size=4),
       chat=prompts)
def test_no_raw_exception_escapes_render_chat(pieces, chat):
    try:
        text = tokenizer("".join(pieces)).render_chat(chat)
    except (ChatTemplateError, ChatMessageError) as exc:
        assert SOURCE in str(exc) or isinstance(exc, ChatMessageError), exc
        assert str(exc) and "\n" not in str(exc), exc
    else:
        assert isinstance(text, str)
