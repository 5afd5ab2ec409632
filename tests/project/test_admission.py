"""One admission: the same bad request is refused by every frontend in the same words.

Each case goes through ``Engine.generate``, ``LLM.generate`` (with vLLM's ``SamplingParams``),
the OpenAI server (FastAPI's TestClient) and the command line's ``main``; each refusal must
carry the text of the one ``AdmissionError`` that the rule raises, and name the same field
(the server's ``param``, the command line's option)."""

from __future__ import annotations

import pytest

import paged_tutorial as pt
from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial.cli import main as cli
from paged_tutorial.cli.streams import one_line
from paged_tutorial.engine.limits import MAX_TOKENS_LIMIT
from paged_tutorial.loading.models import random_model

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from paged_tutorial.serving.app import build_app  # noqa: E402

MAX_SEQ_LEN = 16
#: a cache of a few MiB: on a GPU shared by several test processes, no engine here takes more
CACHE = 4 << 20
FAST = ["--backend", "torch", "--dtype", "float32", "--no-progress", "--no-chat",
        "--max-seq-len", str(MAX_SEQ_LEN), "--kv-cache-mib", str(CACHE >> 20)]
TOO_LONG = "abcdefghijklmnopqrstuvwxyz" * 2

#: (case id, the sampling arguments, the field the refusal names)
BAD_SAMPLING = [
    ("max_tokens=0", {"max_tokens": 0}, "max_tokens"),
    ("max_tokens<0", {"max_tokens": -3}, "max_tokens"),
    ("max_tokens too big", {"max_tokens": MAX_TOKENS_LIMIT + 1}, "max_tokens"),
    ("temperature<0", {"temperature": -0.5}, "temperature"),
    ("top_p=0", {"top_p": 0.0}, "top_p"),
    ("top_p>1", {"top_p": 1.5}, "top_p"),
    ("seed<0", {"seed": -1}, "seed"),
    ("empty stop", {"stop": [""]}, "stop"),
    ("stop not text", {"stop": [3]}, "stop"),
]
CLI_OPTIONS = {"max_tokens", "temperature", "top_p", "seed"}     # the command has no --stop


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("admission") / "tiny.gguf"
    return write_tiny_gguf(path, random_model(tiny_config(vocab_size=320), seed=3))


@pytest.fixture(scope="module")
def model(tiny_gguf):
    return pt.load_model(tiny_gguf, "float32")


@pytest.fixture(scope="module")
def engine(model):
    return pt.Engine(model, backend="torch", max_seq_len=MAX_SEQ_LEN, kv_cache_bytes=CACHE)


@pytest.fixture(scope="module")
def llm(model):
    return pt.LLM(model, backend="torch", max_model_len=MAX_SEQ_LEN, kv_cache_bytes=CACHE)


@pytest.fixture(scope="module")
def server(model):
    with TestClient(build_app(pt.Engine(model, backend="torch", max_seq_len=MAX_SEQ_LEN,
                                        kv_cache_bytes=CACHE),
                              "tiny")) as client:
        yield client


def refusal(call) -> pt.AdmissionError:
    with pytest.raises(pt.AdmissionError) as info:
        call()
    return info.value


def server_refusal(server, body: dict) -> dict:
    response = server.post("/v1/completions", json={"model": "tiny", **body})
    assert response.status_code == 400, response.text
    return response.json()["error"]


def cli_refusal(capsys, argv) -> str:
    """The command's one 'error:' line, whether argparse or the run refused."""
    try:
        status = cli.main(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == cli.EXIT_USAGE
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize("case, sampling, field", BAD_SAMPLING,
                         ids=[c for c, _, _ in BAD_SAMPLING])
def test_bad_sampling_is_refused_alike_everywhere(engine, llm, server, capsys, case, sampling,
                                                  field):
    rule = refusal(lambda: pt.SamplingParams(**sampling))      # LLM's way in: vLLM's params
    assert rule.field == field and field in str(rule)
    if set(sampling) <= {"max_tokens", "temperature", "top_p", "seed"}:
        by_engine = refusal(lambda: engine.generate([[5, 6]], **sampling))
    else:
        by_engine = refusal(lambda: engine.generate([[5, 6]], pt.SamplingParams(**sampling)))
    assert (by_engine.field, str(by_engine)) == (field, str(rule))
    error = server_refusal(server, {"prompt": [5, 6], "temperature": 0, **sampling})
    assert (error["param"], error["message"]) == (field, str(rule))
    if field in CLI_OPTIONS:
        (name, value), = sampling.items()
        option = "--" + name.replace("_", "-")
        line = cli_refusal(capsys, ["hi", *FAST, option, str(value)])
        assert line.endswith(f"error: argument {option}: {rule}"), line
    assert not engine.has_unfinished() and engine.num_requests == 0


def test_a_prompt_too_long_is_refused_alike_everywhere(engine, llm, server, tiny_gguf, capsys):
    ids = engine.encode_prompt(TOO_LONG, chat=False)           # what the command line sends
    assert len(ids) >= MAX_SEQ_LEN
    rule = refusal(lambda: engine.generate([[5, 6], ids]))
    assert rule.field == "prompt" and rule.code == "context_length_exceeded"
    assert f"the prompt has {len(ids)} tokens but max_seq_len is {MAX_SEQ_LEN}" in str(rule)
    assert "raise max_seq_len" in str(rule)
    assert not engine.has_unfinished() and engine.num_requests == 0     # [5, 6] not queued
    assert str(refusal(lambda: engine.add_request(ids))) == str(rule)
    assert str(refusal(lambda: engine.stream(ids))) == str(rule)
    assert str(refusal(lambda: llm.generate([{"prompt_token_ids": ids}]))) == str(rule)
    assert llm.engine.num_requests == 0
    error = server_refusal(server, {"prompt": ids})
    assert (error["param"], error["message"], error["code"]) == \
        ("prompt", str(rule), "context_length_exceeded")
    line = cli_refusal(capsys, [TOO_LONG, "--model", str(tiny_gguf), *FAST])
    assert line == f"error: {one_line(rule)}"            # the command prints it on one line


def test_the_limits_are_the_apis_own():
    """The command line's ranges come from the same constants the API checks."""
    from paged_tutorial.cli import options

    text = " ".join(options.build_parser().format_help().split())
    assert f"(default: 64), 1 to {MAX_TOKENS_LIMIT}" in text
    with pytest.raises(pt.AdmissionError, match=str(MAX_TOKENS_LIMIT)):
        pt.SamplingParams(max_tokens=MAX_TOKENS_LIMIT + 1)
    assert pt.SamplingParams(max_tokens=MAX_TOKENS_LIMIT).max_tokens == MAX_TOKENS_LIMIT
