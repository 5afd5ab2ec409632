"""Model configs checked field by field: config.json and GGUF metadata go through one validator
(``paged_tutorial.config.check_model_fields``), and a bad field is a ValueError naming the field
as the file spells it, the value and the accepted range.

The named cases are the hostile files an adversarial user tried; the hypothesis tests mutate
one field of a valid tiny model (a config.json folder and a GGUF file, written here) and
require either such an error or a model whose logits are finite and not constant."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.fixtures_loading import tiny_config, write_tiny_folder, write_tiny_gguf
from paged_tutorial import Engine
from paged_tutorial.config import ConfigFieldError, ModelConfig, check_model_fields
from paged_tutorial.loading.models import load_model, random_model
from paged_tutorial.loading.weights import GGUF_FIELD_NAMES, load_gguf, load_safetensors_folder

NAN, INF = float("nan"), float("inf")
LINEAR = {"rope_type": "linear", "factor": 2.0}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
DROP = "<drop the key>"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    write_tiny_folder(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_model():
    return random_model(tiny_config(), seed=0)


def write_config(folder, base: dict, key: str, value) -> None:
    data = dict(base)
    if value is DROP:
        data.pop(key, None)
    else:
        data[key] = value
    (folder / "config.json").write_text(json.dumps(data))


def base_config_json() -> dict:
    return tiny_config().to_hf_dict()


# --- the hostile files, one by one -------------------------------------------------------------

HF_CASES = [
    ("rope_theta", 0, "rope_theta must be a finite number above 1"),
    ("rope_theta", -10000, "rope_theta must be a finite number above 1"),
    ("rope_theta", "abc", "rope_theta must be"),
    ("rms_norm_eps", -1, "rms_norm_eps must be a finite number above 0 and below 1"),
    ("rms_norm_eps", NAN, "rms_norm_eps must be"),
    ("rope_scaling", {"rope_type": "linear", "factor": 0}, "rope_scaling.factor must be"),
    ("rope_scaling", {"rope_type": "linear"}, "rope_scaling.factor must be given"),
    ("rope_scaling", {"type": "llama3", "factor": 8.0}, "rope_scaling.low_freq_factor must be "
                                                        "given"),
    ("rope_scaling", {**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
     "rope_scaling.low_freq_factor must be below high_freq_factor"),
    ("rope_scaling", "linear", "rope_scaling must be null or an object"),
    ("rope_scaling", ["linear", 2.0], "rope_scaling must be null or an object"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_type must be a RoPE type"),
    ("num_attention_heads", 4.5, "num_attention_heads must be a positive integer"),
    ("num_attention_heads", "8", "num_attention_heads must be a positive integer"),
    ("num_attention_heads", 3, "num_key_value_heads must be a divisor of num_attention_heads"),
    ("hidden_size", 64.9, "hidden_size must be a positive integer"),
    ("num_hidden_layers", True, "num_hidden_layers must be a positive integer"),
    ("head_dim", 7, "head_dim must be even"),
    ("max_position_embeddings", -5, "max_position_embeddings must be a positive integer"),
    ("max_position_embeddings", "x", "max_position_embeddings must be a positive integer"),
    ("eos_token_id", "2", "eos_token_id (eos_token_ids) must be a token id"),
    ("eos_token_id", [2, -1], "eos_token_id (eos_token_ids) must be a token id"),
    ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false"),
    ("architectures", "LlamaForCausalLM", "architectures must be a list of strings"),
    ("architectures", [3], "architectures must be a list of strings"),
]


@pytest.mark.parametrize("key, value, message", HF_CASES,
                         ids=[f"{k}={v!r}" for k, v, _ in HF_CASES])
def test_config_json_field_errors(hf_folder, key, value, message):
    write_config(hf_folder, base_config_json(), key, value)
    with pytest.raises(ValueError) as info:
        load_safetensors_folder(hf_folder, "float32")
    text = str(info.value)
    assert message in text and "config.json" in text
    assert ", got " in text or "is absent" in text, text    # the value found is shown


def test_head_dim_derived_only_from_an_even_split(hf_folder):
    data = base_config_json()
    del data["head_dim"]
    write_config(hf_folder, data, "hidden_size", 30)
    with pytest.raises(ValueError, match="num_attention_heads must be a divisor of hidden_size "
                                         r"\(30\) when head_dim is not given"):
        load_safetensors_folder(hf_folder, "float32")


def test_wrong_layer_count_is_named(hf_folder):
    write_config(hf_folder, base_config_json(), "num_hidden_layers", 10 ** 12)
    with pytest.raises(ValueError, match=r"num_hidden_layers=1000000000000 but the checkpoint "
                                         r"holds 2 layers"):
        load_safetensors_folder(hf_folder, "float32")


GGUF_CASES = [
    ("llama.attention.head_count", 0, "llama.attention.head_count (num_attention_heads) must "
                                      "be a positive integer"),
    ("llama.attention.head_count_kv", 0, "llama.attention.head_count_kv (num_key_value_heads) "
                                         "must be a positive integer"),
    ("llama.rope.freq_base", -1.0, "llama.rope.freq_base (rope_theta) must be a finite number"),
    ("llama.rope.freq_base", 0.0, "llama.rope.freq_base (rope_theta) must be"),
    ("llama.attention.layer_norm_rms_epsilon", -1.0,
     "llama.attention.layer_norm_rms_epsilon (rms_norm_eps) must be"),
    ("llama.attention.layer_norm_rms_epsilon", 0.0,
     "llama.attention.layer_norm_rms_epsilon (rms_norm_eps) must be"),
    ("llama.context_length", 0, "llama.context_length (max_position_embeddings) must be"),
    ("llama.embedding_length", 32.5, "llama.embedding_length (hidden_size) must be a positive"),
    ("llama.block_count", "2", "llama.block_count (num_hidden_layers) must be"),
    ("llama.attention.head_count", [4, 2], "llama.attention.head_count differs between layers"),
    ("llama.rope.scaling.factor", 0.0, "llama.rope.scaling.factor (rope_scaling.factor) must "
                                       "be"),
    ("tokenizer.ggml.eos_token_id", -2, "tokenizer.ggml.eos_token_id (eos_token_ids) must be"),
    ("tokenizer.ggml.bos_token_id", "x", "tokenizer.ggml.bos_token_id (bos_token_id) must be"),
]


@pytest.mark.parametrize("key, value, message", GGUF_CASES,
                         ids=[f"{k}={v!r}" for k, v, _ in GGUF_CASES])
def test_gguf_field_errors(tmp_path, tiny_model, key, value, message):
    metadata = {key: value}
    if key == "llama.rope.scaling.factor":
        metadata["llama.rope.scaling.type"] = "linear"
    path = write_tiny_gguf(tmp_path / "bad.gguf", tiny_model, metadata=metadata)
    with pytest.raises(ValueError) as info:
        load_gguf(path, "float32")
    assert message in str(info.value) and "bad.gguf" in str(info.value)


def test_gguf_linear_scaling_is_read(tmp_path, tiny_model):
    path = write_tiny_gguf(tmp_path / "linear.gguf", tiny_model, metadata={
        "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    config, _, _ = load_gguf(path, "float32")
    assert config.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_direct_construction_is_checked_the_same_way():
    with pytest.raises(ConfigFieldError, match="rope_theta must be a finite number above 1"):
        tiny_config(rope_theta=0.5)
    with pytest.raises(ConfigFieldError, match="num_attention_heads must be a positive integer"):
        tiny_config(num_attention_heads=4.0)
    config = tiny_config(rope_scaling={"type": "linear", "factor": 2})
    assert config.rope_scaling == LINEAR and config.rope_type == "linear"
    assert tiny_config(rope_scaling={"rope_type": "default"}).rope_scaling is None
    assert check_model_fields({**config.__dict__, "head_dim": None})["head_dim"] == 8


# --- every field mutated: a clear error or a working model -------------------------------------

SPECIAL_VALUES = [
    0, -1, 1, 2, 3, 7, 8, 16, 4.5, 64.9, 8.0, True, False, None, "", "8", "LlamaForCausalLM",
    [], [4], [2, 3], ["x"], {}, NAN, INF, -INF, 1e30, 1e-300, -1e-5, 0.5, 1.5, 2 ** 31, 2 ** 62,
    LINEAR, LLAMA3, {"rope_type": "linear"}, {"rope_type": "linear", "factor": 0},
    {"type": "linear", "factor": 1e-300}, {"rope_type": "yarn", "factor": 2.0}, {"rope_type": 3},
    {**LLAMA3, "low_freq_factor": 4.0}, {**LLAMA3, "original_max_position_embeddings": 0.5},
    {"rope_type": "default", "rope_theta": 0.0}, {"rope_type": "linear", "factor": 3.0,
                                                  "rope_theta": 500.0},
]
JSON_VALUES = st.one_of(
    st.sampled_from(SPECIAL_VALUES + [DROP]), st.integers(-5, 600), st.integers(),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
    st.lists(st.integers(-2, 400), max_size=3),
    st.builds(lambda f: {"rope_type": "linear", "factor": f}, st.floats()))
HF_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
           "rope_scaling", "rope_parameters", "max_position_embeddings", "tie_word_embeddings",
           "bos_token_id", "eos_token_id", "architectures", "model_type"]
INTERNAL = (ZeroDivisionError, KeyError, AttributeError, TypeError, IndexError, OverflowError,
            RuntimeError)


def assert_works(model) -> None:
    """The model serves: finite logits that differ across the vocabulary at every step."""
    if model.config.max_position_embeddings < 4:
        return                                 # no room for a prompt and a token to check
    engine = Engine(model, backend="torch", max_slots=1, kv_cache_bytes=2 ** 20,
                    max_seq_len=min(16, model.config.max_position_embeddings))
    engine.record_logits = True
    engine.add_request([1, 5, 9], max_tokens=2, temperature=0.0)
    logits = []
    while engine.has_unfinished():
        report = engine.step()
        if report.logits is not None:
            logits.append(report.logits)
    assert logits
    for step_logits in logits:
        assert torch.isfinite(step_logits).all()
        assert (step_logits.std(dim=-1) > 0).all()


def assert_clear_error(exc: BaseException, names: set[str]) -> None:
    assert isinstance(exc, ValueError) and not isinstance(exc, INTERNAL), repr(exc)
    text = str(exc)
    assert any(name in text for name in names), (names, text)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(HF_KEYS), value=JSON_VALUES)
def test_config_json_mutations(hf_folder, key, value):
    write_config(hf_folder, base_config_json(), key, value)
    names = {key, "rope_theta" if key == "rope_parameters" else key,
             "rope_scaling" if key == "rope_parameters" else key,
             "eos_token_ids" if key == "eos_token_id" else key}
    try:
        model = load_model(hf_folder, "float32")
    except Exception as exc:                    # noqa: BLE001 - the assertion says which
        assert_clear_error(exc, names)
        return
    assert_works(model)


GGUF_KEYS = ["llama.block_count", "llama.context_length", "llama.embedding_length",
             "llama.feed_forward_length", "llama.attention.head_count",
             "llama.attention.head_count_kv", "llama.rope.dimension_count",
             "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon",
             "llama.attention.key_length", "llama.vocab_size", "llama.rope.scaling.type",
             "llama.rope.scaling.factor", "tokenizer.ggml.bos_token_id",
             "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
FIELD_OF_GGUF_KEY = {key: field for field, key in GGUF_FIELD_NAMES.items()}
GGUF_VALUES = st.one_of(
    st.sampled_from([v for v in SPECIAL_VALUES if not isinstance(v, dict)]
                    + ["linear", "llama3", "yarn", "none"]),
    st.integers(-5, 600), st.integers(-2 ** 63, 2 ** 63 - 1),
    st.floats(allow_nan=True, allow_infinity=True, width=32), st.text(max_size=4),
    st.lists(st.integers(0, 400), max_size=3))


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(GGUF_KEYS), value=GGUF_VALUES, with_linear=st.booleans())
def test_gguf_mutations(tmp_path_factory, tiny_model, key, value, with_linear):
    metadata = {key: value}
    if with_linear and key != "llama.rope.scaling.type":
        metadata["llama.rope.scaling.type"] = "linear"     # makes the factor key count
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", tiny_model,
                           metadata=metadata)
    names = {key, FIELD_OF_GGUF_KEY.get(key, key),
             "llama.rope.scaling.factor" if with_linear else key}
    try:
        model = load_model(path, "float32")
    except Exception as exc:                    # noqa: BLE001 - the assertion says which
        assert_clear_error(exc, names)
        return
    assert_works(model)


def test_values_that_look_wrong_but_are_fine(hf_folder):
    """Large theta, a tiny eps, a linear factor of 1, eos as a list: all load and serve."""
    base = base_config_json()
    for key, value in [("rope_theta", 1e30), ("rms_norm_eps", 1e-30),
                       ("rope_scaling", {"type": "linear", "factor": 1.0}),
                       ("eos_token_id", [2, 3]), ("bos_token_id", None)]:
        write_config(hf_folder, base, key, value)
        assert_works(load_model(hf_folder, "float32"))
    assert not math.isnan(ModelConfig.from_hf_dict(base).rope_theta)
