"""The model-family registry (a checkpoint's family found by its architecture, everything else
refused naming what is served) and the loader's refusals of what it cannot load faithfully: a
device this machine lacks, a stale second safetensors file, integer or bool weights."""

from __future__ import annotations

import json

import pytest
import torch

import paged_tutorial as pt
from helpers.fixtures_loading import edit_config_json, tiny_config, write_tiny_folder
from paged_tutorial.families import FAMILIES, LLAMA, QWEN2, QWEN3, family_for_gguf, family_for_hf
from paged_tutorial.loading.models import random_model, save_hf_folder
from paged_tutorial.loading.weights import load_safetensors_folder


# --- the registry ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_family_is_found_by_its_architecture(family):
    assert family_for_hf(family.hf_architecture, family.model_type) is family
    assert family_for_gguf(family.gguf_architecture) is family


def test_an_unserved_architecture_is_refused_naming_the_served_ones(tmp_path):
    write_tiny_folder(tmp_path)
    edit_config_json(tmp_path, architectures=["Gemma2ForCausalLM"], model_type="gemma2")
    with pytest.raises(ValueError) as info:
        pt.load_model(str(tmp_path), dtype="float32")
    message = str(info.value)
    assert "config.json" in message and "'Gemma2ForCausalLM'" in message
    for family in FAMILIES:
        assert family.hf_architecture in message


def test_architecture_and_model_type_must_agree(tmp_path):
    write_tiny_folder(tmp_path)
    edit_config_json(tmp_path, model_type="qwen2")          # a Llama's architectures kept
    with pytest.raises(ValueError, match="'LlamaForCausalLM' \\(model_type 'qwen2'\\)"):
        load_safetensors_folder(tmp_path, "float32")


@pytest.mark.parametrize("family", [QWEN2, QWEN3], ids=lambda f: f.name)
def test_a_random_family_model_saves_and_loads_back(tmp_path, family):
    config = tiny_config(architecture=family.hf_architecture)
    model = random_model(config, seed=3)
    save_hf_folder(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["architectures"], saved["model_type"]) == ([family.hf_architecture],
                                                              family.model_type)
    loaded = pt.load_model(str(tmp_path), dtype="float32")
    assert loaded.config == model.config
    assert set(loaded.weights) == set(model.weights)
    for name, tensor in model.weights.items():
        assert torch.equal(loaded.weights[name], tensor), name
    assert model.config.num_parameters() == sum(t.numel() for t in model.weights.values())


def test_qwen3_head_dim_defaults_as_transformers_does(tmp_path):
    save_hf_folder(random_model(tiny_config(architecture="Qwen3ForCausalLM", head_dim=128)),
                   tmp_path)
    edit_config_json(tmp_path, head_dim=None)
    config, _ = load_safetensors_folder(tmp_path, "float32")
    assert config.head_dim == 128            # not hidden_size / heads (8)


def test_sliding_window_attention_is_refused(tmp_path):
    save_hf_folder(random_model(tiny_config(architecture="Qwen2ForCausalLM")), tmp_path)
    edit_config_json(tmp_path, use_sliding_window=True)
    with pytest.raises(ValueError, match="config.json.*use_sliding_window"):
        load_safetensors_folder(tmp_path, "float32")


def test_a_qwen2_checkpoint_without_its_biases_is_refused(tmp_path):
    write_tiny_folder(tmp_path)                       # a Llama's tensors: no biases
    edit_config_json(tmp_path, architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    with pytest.raises(ValueError, match="missing required tensor.*q_proj.bias.*"
                                         "Qwen2ForCausalLM"):
        load_safetensors_folder(tmp_path, "float32")


def test_a_llama_with_qwen3_norms_is_refused(tmp_path):
    save_hf_folder(random_model(tiny_config(architecture="Qwen3ForCausalLM")), tmp_path)
    edit_config_json(tmp_path, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(ValueError, match="self_attn.[qk]_norm.weight.*LlamaForCausalLM"):
        load_safetensors_folder(tmp_path, "float32")


# --- devices --------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cuda:9", "tpu"])
def test_a_device_this_machine_lacks_is_named_with_the_fix(tmp_path, device):
    if device.startswith("cuda") and torch.cuda.device_count() > 9:
        pytest.skip("this machine has a cuda:9")
    write_tiny_folder(tmp_path)
    with pytest.raises(ValueError) as info:
        pt.load_model(str(tmp_path), dtype="float32", device=device)
    message = str(info.value)
    assert f"device {device!r}" in message and "cpu" in message and "\n" not in message


# --- what the safetensors files hold ----------------------------------------------------------

def test_a_stale_second_safetensors_is_refused_naming_both_files(tmp_path):
    from safetensors.torch import save_file

    write_tiny_folder(tmp_path, seed=0)
    stale = random_model(tiny_config(), seed=1)
    save_file({name: t.clone() for name, t in stale.weights.items()},
              str(tmp_path / "old-download.safetensors"))
    with pytest.raises(ValueError) as info:
        pt.load_model(str(tmp_path), dtype="float32")
    message = str(info.value)
    assert "model.safetensors" in message and "old-download.safetensors" in message
    assert "is stored both in" in message


@pytest.mark.parametrize("dtype, shown", [(torch.int8, "I8"), (torch.bool, "BOOL")])
def test_integer_or_bool_weights_are_refused_naming_tensor_and_dtype(tmp_path, dtype, shown):
    from safetensors.torch import load_file, save_file

    write_tiny_folder(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    name = "model.layers.1.self_attn.q_proj.weight"
    tensors[name] = (tensors[name] * 100).to(dtype)
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match=f"{name}.*stored as {shown}"):
        pt.load_model(str(tmp_path), dtype="float32")
