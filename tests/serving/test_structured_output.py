"""``response_format`` (json_object, json_schema) through llguidance masking the sampler's
logits: the processor's mask on its own, and the embedded SmolLM2 answering the ``openai``
client with JSON that parses and follows the schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

import paged_tutorial as pt

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("llguidance")

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
            if form.get("json_schema", {}).get("schema"):
                assert "nonsense" in response.json()["error"]["message"]


def test_a_schema_it_cannot_use_is_a_value_error_naming_the_problem(chat_tokenizer):
    vocab, eos = chat_tokenizer.vocab_size, [chat_tokenizer.backend.token_to_id("<|im_end|>")]
    for schema, problem in (({"type": "nonsense"}, "nonsense"),
                            ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}},
                             "nowhere"),
                            ('{"type": "object"', "not JSON"),
                            ("[1, 2]", "must be a JSON object")):
        with pytest.raises(ValueError, match=problem):
            json_processor(chat_tokenizer, vocab, eos, schema)
    as_text = json_processor(chat_tokenizer, vocab, eos, json.dumps(SCHEMA))
    assert torch.equal(torch.isinf(as_text([], torch.zeros(vocab))),
                       torch.isinf(json_processor(chat_tokenizer, vocab, eos, SCHEMA)(
                           [], torch.zeros(vocab))))


def test_a_recomputed_answer_starts_over_and_one_past_its_end_is_left_alone(chat_tokenizer):
    vocab, eos = chat_tokenizer.vocab_size, [chat_tokenizer.backend.token_to_id("<|im_end|>")]
    processor = json_processor(chat_tokenizer, vocab, eos)          # any JSON object
    brace = chat_tokenizer.encode("{")[0]
    output = chat_tokenizer.encode('{"a": 1')
    assert torch.isinf(processor(output, torch.zeros(vocab))[brace])   # inside the object
    output.clear()                                          # preempted: its tokens recomputed
    assert torch.isfinite(processor(output, torch.zeros(vocab))[brace])
    output.extend(chat_tokenizer.encode('{"a": 1}') + eos)
    assert torch.isfinite(processor(output, torch.zeros(vocab))).all()   # ignore_eos: free
    output.append(brace)
    assert torch.isfinite(processor(output, torch.zeros(vocab))).all()
    two_ends = eos + [chat_tokenizer.backend.token_to_id("<|endoftext|>")]
    complete = json_processor(chat_tokenizer, vocab, two_ends)(
        chat_tokenizer.encode('{"a": 1}'), torch.zeros(vocab))
    assert torch.isfinite(complete).nonzero().flatten().tolist() == sorted(two_ends)
    wide = json_processor(chat_tokenizer, vocab + 64, eos)   # a model padding its vocabulary
    padded = wide([], torch.zeros(vocab + 64))
    assert torch.isinf(padded[vocab:]).all() and torch.isfinite(padded[brace])


def test_building_a_processor_imports_neither_transformers_nor_triton():
    script = ("import sys\n"
              f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "from tiny_chat_model import smollm2_tokenizer\n"
              "from paged_tutorial.serving import structured_output\n"
              "tokenizer = smollm2_tokenizer()\n"
              "structured_output.json_processor(tokenizer, tokenizer.vocab_size, [2])\n"
              "print(sorted({'transformers', 'triton', 'xgrammar'} & set(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


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
