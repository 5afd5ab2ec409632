"""Which dtype a model loads in by default (``loading/dtype_choice.py``), on the CPU."""

from __future__ import annotations

import logging

import pytest
import torch

from paged_tutorial.loading import catalog
from paged_tutorial.loading.dtype_choice import choose_dtype
from paged_tutorial.loading.models import load_model
from helpers.fixtures_loading import write_tiny_folder


def test_small_models_run_in_float32_on_a_gpu():
    choice = choose_dtype("smollm2-135m", "cuda", half="bfloat16")
    assert choice.dtype == "float32"
    assert "bfloat16 changes its greedy answer" in choice.line()
    assert choice.line().startswith("float32: SmolLM2-135M is small enough")


@pytest.mark.parametrize("alias", ["llama-3.2-1b", "llama-3.2-1b-ungated", "kanana-nano-2.1b",
                                   "unsloth/Llama-3.2-1B-Instruct"])
def test_larger_models_run_in_the_gpus_half_type(alias):
    assert choose_dtype(alias, "cuda:0", half="bfloat16").dtype == "bfloat16"
    t4 = choose_dtype(alias, torch.device("cuda"), half="float16")
    assert t4.dtype == "float16" and "float16 is this GPU's half type" in t4.reason


def test_every_catalog_entry_names_its_gpu_dtype_and_why():
    for entry in catalog.KNOWN_MODELS:
        assert entry.gpu_dtype in ("float32", catalog.HALF) and entry.dtype_reason


def test_the_cpu_default_is_float32_and_an_explicit_dtype_wins():
    for source in ("smollm2-135m", "llama-3.2-1b", "some/other-model"):
        assert choose_dtype(source, "cpu").dtype == "float32"
        assert choose_dtype(source).dtype == "float32"
    explicit = choose_dtype("smollm2-135m", "cuda", "bf16", half="bfloat16")
    assert (explicit.dtype, explicit.reason) == ("bfloat16", "asked for")


def test_models_outside_the_catalog_get_the_half_type_and_a_hint():
    choice = choose_dtype("org/unknown", "cuda", half="bfloat16")
    assert choice.dtype == "bfloat16" and "--dtype float32" in choice.reason


def test_load_model_says_which_dtype_and_why(tmp_path, caplog):
    write_tiny_folder(tmp_path)
    with caplog.at_level(logging.INFO, logger="paged_tutorial"):
        model = load_model(tmp_path)
    assert model.dtype == "float32" and "the CPU's default" in model.dtype_reason
    assert "float32 (the CPU's default" in model.describe()
    assert any("float32: the CPU's default" in r.getMessage() for r in caplog.records)
    assert load_model(tmp_path, "float16").dtype_reason == "asked for"
