"""``response_format`` (json_object, json_schema) through xgrammar masking the sampler's
logits: the processor's mask on its own, and the embedded SmolLM2 answering the ``openai``
client with JSON that parses and follows the schema."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

import paged_tutorial as pt

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")

from paged_tutorial.serving.app import build_app  # noqa: E402
from paged_tutorial.serving.server import BackgroundServer  # noqa: E402
from paged_tutorial.serving.structured_output import (StructuredOutputsParams,  # noqa: E402
                                                      json_processor,
                                                      structured_outputs_processor)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "is_capital": {"type": "boolean"}},
          "required": ["city", "is_capital"], "additionalProperties": False}


def test_the_mask_lets_through_only_tokens_that_keep_the_json_valid(chat_tokenizer):
    vocab = chat_tokenizer.vocab_size
    eos = [chat_tokenizer.backend.token_to_id("<|im_end|>")]
    processor = json_processor(chat_tokenizer, vocab, eos, SCHEMA)
    tokens = chat_tokenizer.encode('{"city": "Paris", "is_capital": true}')
    output: list[int] = []
    for token in tokens:
        logits = processor(output, torch.zeros(vocab))
        assert torch.isfinite(logits[token]), chat_tokenizer.decode([token])
        if not output:                                           # only a '{' may begin it
            assert torch.isinf(logits).sum() > vocab * 0.9
        output.append(token)
    logits = processor(output, torch.zeros(vocab))              # the object is complete
    assert torch.isfinite(logits[eos[0]]) and torch.isinf(logits).sum() == vocab - 1
    fresh = processor([], torch.zeros(vocab))                   # another answer: its own state
    assert torch.isinf(fresh[chat_tokenizer.encode("hello")[0]])
    assert torch.isfinite(fresh[chat_tokenizer.encode("{")[0]])
    vllm_form = structured_outputs_processor(StructuredOutputsParams(json=SCHEMA),
                                             chat_tokenizer, vocab, eos)
    assert torch.equal(torch.isinf(vllm_form([], torch.zeros(vocab))), torch.isinf(fresh))
    with pytest.raises(ValueError, match="one of"):
        StructuredOutputsParams()


def test_a_schema_that_is_not_one_is_a_400_naming_response_format(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=128)
    with BackgroundServer(build_app(engine, "tiny")) as server:
        for form in ({"type": "json_schema", "json_schema": {"name": "x"}},
                     {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}},
                     {"type": "xml"}):
            response = httpx.post(server.url + "/v1/completions", json={
                "model": "tiny", "prompt": "hi", "response_format": form})
            assert response.status_code == 400, form
            assert response.json()["error"]["param"].startswith("response_format")


@pytest.mark.slow
def test_smollm2_answers_json_that_parses_and_follows_the_schema(smollm2_f32):
    jsonschema = pytest.importorskip("jsonschema")
    llm = pt.LLM(smollm2_f32, backend="torch", max_num_seqs=2, max_model_len=512)
    with BackgroundServer(build_app(llm.engine, "smol")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                               timeout=300)
        ask = [{"role": "user", "content": "Name the capital of France as JSON."}]
        schema_answer = client.chat.completions.create(
            model="smol", messages=ask, max_tokens=40, temperature=0,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "city", "schema": SCHEMA}})
        object_answer = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "Say hi as a JSON object."}],
            max_tokens=40, temperature=0, response_format={"type": "json_object"})
    value = json.loads(schema_answer.choices[0].message.content)
    jsonschema.validate(value, SCHEMA)
    assert schema_answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(object_answer.choices[0].message.content), dict)
