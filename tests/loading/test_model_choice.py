"""Where models come from: loading onto a device one tensor at a time, the catalog of named
models (and which ones answer Korean), the rule notebook 07 uses to pick a model, and the
benchmark results found from anywhere."""

from __future__ import annotations

import json
import weakref

import pytest
import torch

import paged_tutorial as pt
from helpers.fixtures_loading import tiny_config, write_tiny_folder, write_tiny_gguf
from paged_tutorial.loading import catalog as model_catalog, model_choice, weights
from paged_tutorial.teaching import results
from paged_tutorial.loading.models import MODEL_ALIASES, random_model

# --- load_model(device=...) ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_weights_go_to_the_device_one_tensor_at_a_time(tmp_path, monkeypatch, kind):
    """Each tensor read from the file is released before the next is read, and lands on the
    target device in the target dtype (the meta device stands in for a GPU here)."""
    model = random_model(tiny_config(), seed=1)
    if kind == "folder":
        write_tiny_folder(tmp_path, tiny_config(), seed=1)
        source = tmp_path
    else:
        source = write_tiny_gguf(tmp_path / "tiny.gguf", model)
    read_so_far: list[weakref.ref] = []
    alive_at_each_read = []
    real_place = weights.place_tensor

    def place(tensor, dtype, device):     # CPython frees a dropped tensor at once (refcount)
        alive_at_each_read.append(sum(ref() is not None for ref in read_so_far))
        read_so_far.append(weakref.ref(tensor))
        return real_place(tensor, dtype, device)

    monkeypatch.setattr(weights, "place_tensor", place)
    loaded = pt.load_model(source, "bfloat16", device="meta")
    assert len(alive_at_each_read) == len(model.weights)
    assert max(alive_at_each_read) == 0        # no tensor read earlier is still held on the host
    assert all(t.device.type == "meta" and t.dtype == torch.bfloat16
               for t in loaded.weights.values())


def test_place_tensor_converts_after_the_copy():
    t = torch.randn(4, 4)
    on_meta = weights.place_tensor(t, torch.bfloat16, torch.device("meta"))
    assert on_meta.device.type == "meta" and on_meta.dtype == torch.bfloat16
    on_cpu = weights.place_tensor(t, torch.float16, torch.device("cpu"))
    assert torch.equal(on_cpu, t.half())


def test_shapes_are_checked_before_any_tensor_is_read(tmp_path, monkeypatch):
    write_tiny_folder(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["hidden_size"] = 64                                  # wrong for these weights
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(weights, "place_tensor",
                        lambda *a: pytest.fail("a tensor was read before the shape check"))
    with pytest.raises(ValueError, match="config expects"):
        pt.load_model(tmp_path, "float32")


# --- the catalog --------------------------------------------------------------------------------

def test_aliases_come_from_the_catalog():
    assert MODEL_ALIASES is model_catalog.MODEL_ALIASES
    assert MODEL_ALIASES["llama-3.2-1b-ungated"] == "unsloth/Llama-3.2-1B-Instruct"
    assert MODEL_ALIASES["kanana-nano-2.1b"] == "kakaocorp/kanana-nano-2.1b-instruct"
    assert model_catalog.known_model("KAKAOCORP/kanana-nano-2.1b-instruct").korean


def test_korean_guidance():
    table = model_catalog.language_table()
    assert "English only" in table and "kanana-nano-2.1b" in table
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["--model", "/"]
    note = model_catalog.korean_note("smollm2-135m")
    assert "English only" in note and "kanana-nano-2.1b" in note
    assert model_catalog.korean_note("kanana-nano-2.1b").startswith("kanana-nano-2.1b answers")
    assert "not in this tutorial's catalog" in model_catalog.korean_note("org/other")


def test_a_kanana_shaped_llama_runs_in_the_engine():
    """Kanana nano's layout (GQA 3, head_dim 128, tied, rope_theta 5e5) at toy width: the
    engine's torch backend runs it (its numba kernels are checked at head_dim 128 elsewhere)."""
    config = tiny_config(hidden_size=96, num_attention_heads=3, num_key_value_heads=1,
                         head_dim=128, tie_word_embeddings=True, rope_theta=500000.0)
    engine = pt.Engine(random_model(config, seed=0), backend="torch")
    result = engine.generate([[5, 6, 7]], max_tokens=3, chat=False)[0]
    assert len(result.token_ids) == 3


# --- choose_model: what notebook 07 loads ----------------------------------------------------------

def test_choice_rule(monkeypatch):
    monkeypatch.setattr(model_choice, "gpu_dtype", lambda: "bfloat16")     # an Ampere or newer
    env = {}
    cpu = model_choice.choose_model(env, gpu=False)
    assert (cpu.source, cpu.dtype, cpu.device) == ("smollm2-135m", "float32", "cpu")
    gpu = model_choice.choose_model(env, gpu=True)
    assert (gpu.source, gpu.dtype, gpu.device) == ("unsloth/Llama-3.2-1B-Instruct",
                                                   "bfloat16", "cuda")
    assert gpu.may_fall_back and gpu.name == "llama-3.2-1b-ungated"
    local = model_choice.choose_model({"LLAMA_3_2_1B_DIR": "/models/llama"}, gpu=True)
    assert (local.source, local.dtype, local.may_fall_back) == ("/models/llama", "bfloat16",
                                                                False)
    explicit = model_choice.choose_model({"PAGED_TUTORIAL_MODEL": "smollm2-135m",
                                          "LLAMA_3_2_1B_DIR": "/models/llama"}, gpu=True)
    assert (explicit.source, explicit.dtype, explicit.device) == ("smollm2-135m", "float32",
                                                                  "cuda")
    assert explicit.reason == "PAGED_TUTORIAL_MODEL=smollm2-135m"
    monkeypatch.setattr(model_choice, "gpu_dtype", lambda: "float16")      # a T4
    assert model_choice.choose_model(env, gpu=True).dtype == "float16"


def test_hub_ids_are_accepted_through_the_variable(monkeypatch, tmp_path):
    """PAGED_TUTORIAL_MODEL=org/name downloads through huggingface_hub (replaced here by a
    local folder) and loads what it returns."""
    import huggingface_hub

    write_tiny_folder(tmp_path)
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, **kw: calls.append(repo_id) or str(tmp_path))
    choice = model_choice.choose_model({"PAGED_TUTORIAL_MODEL": "unsloth/Llama-3.2-1B-Instruct"},
                                       gpu=False)
    model, loaded = model_choice.load_chosen_model(choice)
    assert calls == ["unsloth/Llama-3.2-1B-Instruct"] and loaded == choice
    assert model.config.num_hidden_layers == tiny_config().num_hidden_layers


@pytest.mark.slow          # loads the embedded SmolLM2
def test_gpu_default_falls_back_when_offline_but_an_explicit_choice_does_not(monkeypatch):
    import huggingface_hub
    from huggingface_hub import errors

    def offline(*args, **kwargs):
        raise errors.LocalEntryNotFoundError("no connection")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    choice = model_choice.ModelChoice("unsloth/Llama-3.2-1B-Instruct", "bfloat16", "cpu",
                                      "test", may_fall_back=True)
    model, loaded = model_choice.load_chosen_model(choice)
    assert loaded.source == "smollm2-135m" and loaded.dtype == "float32"
    assert "could not be loaded" in loaded.reason and "cannot download" in loaded.reason
    explicit = model_choice.choose_model({"PAGED_TUTORIAL_MODEL": "org/absent"}, gpu=False)
    with pytest.raises(ConnectionError):
        model_choice.load_chosen_model(explicit)


# --- benchmark results -------------------------------------------------------------------------

def test_results_are_found_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                       # a notebook run from anywhere
    monkeypatch.delenv(results.RESULTS_ENV, raising=False)
    decode = results.load("decode-2026-11-30")
    assert decode["gpu"].startswith("NVIDIA")
    newest = results.dated_files("decode", results.results_dir())[-1]
    assert newest[0] >= "2026-11-30"
    assert results.find("decode") == newest[1] == results.find(newest[1].name)
    assert results.find("decode-2026-11-30.png").suffix == ".png"
    with pytest.raises(FileNotFoundError, match="no result 'nothing'.*available: .*decode"):
        results.find("nothing")


def test_results_missing_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results, "__file__", str(tmp_path / "site-packages" / "pt" / "r.py"))
    monkeypatch.delenv(results.RESULTS_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match="pip install -e .*PAGED_TUTORIAL_RESULTS"):
        results.load("decode")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "decode-2099-01-01.json").write_text('{"gpu": "X"}')
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path / "mine"))
    assert results.load("decode") == {"gpu": "X"}
