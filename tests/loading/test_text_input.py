"""Lone surrogates in text (what Python makes of bytes it could not decode): a ValueError naming
the character, its position and the fix, from the tokenizer, chat messages and the engine alike,
never the tokenizer library's TypeError."""

from __future__ import annotations

import pytest

from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial import Engine, load_model
from paged_tutorial.loading.models import random_model
from paged_tutorial.loading.text_input import check_text, find_lone_surrogate

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("text") / "tiny.gguf",
                           random_model(tiny_config(), seed=1),
                           metadata={"tokenizer.chat_template": TEMPLATE})
    return load_model(path, "float32")


def test_encode_names_the_character_position_and_byte(tiny):
    with pytest.raises(ValueError) as info:
        tiny.tokenizer.encode("caf\udce9 au lait")
    text = str(info.value)
    for fragment in ("'\\udce9'", "U+DCE9", "position 3", "byte 0xE9", "surrogateescape",
                     "decode the original bytes"):
        assert fragment in text, text


def test_half_of_a_pair(tiny):
    with pytest.raises(ValueError, match=r"U\+D83D\) at position 1,.*half of a UTF-16"):
        tiny.tokenizer.encode("a\ud83d")


def test_chat_messages_name_the_message(tiny):
    with pytest.raises(ValueError, match="chat message 1's content holds a lone surrogate .* "
                                         "at position 0"):
        tiny.tokenizer.apply_chat_template([{"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": "\udc80x"}])


@pytest.mark.parametrize("chat", [True, False])
def test_engine_prompt(tiny, chat):
    engine = Engine(tiny, backend="torch", max_slots=1, kv_cache_bytes=2 ** 20, max_seq_len=32)
    with pytest.raises(ValueError, match="lone surrogate '\\\\udce9' \\(U\\+DCE9\\) at position "
                                         "3"):
        engine.generate(["caf\udce9"], max_tokens=1, chat=chat)
    with pytest.raises(ValueError, match="U\\+DCE9"):
        engine.add_request("caf\udce9", max_tokens=1, chat=chat)
    assert not engine.has_unfinished()
    assert engine.generate(["café 😀"], max_tokens=1, chat=chat)[0].token_ids


def test_real_characters_pass():
    text = "café 😀 한국어 \U0010ffff"
    assert find_lone_surrogate(text) is None and check_text(text) is text
    assert find_lone_surrogate("ab\udfff") == (2, "\udfff")
