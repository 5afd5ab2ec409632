"""Fixtures for the serving tests: a tiny random Llama with SmolLM2's tokenizer (fast on two
CPU cores, float32 on the torch backend), an ``LLM`` over it, and a server on 127.0.0.1."""

from __future__ import annotations

import pytest

from tiny_chat_model import smollm2_tokenizer, tiny_chat_model

MAX_SEQ_LEN = 128


@pytest.fixture(scope="session")
def chat_tokenizer():
    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(chat_tokenizer):
    return tiny_chat_model(chat_tokenizer)


@pytest.fixture(scope="session")
def llm(tiny_model):
    import paged_tutorial as pt

    return pt.LLM(tiny_model, backend="torch", max_num_seqs=4, max_model_len=MAX_SEQ_LEN)
