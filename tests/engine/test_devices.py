"""Device names are checked when the Engine is made: one ValueError naming the device and the
devices there are, instead of whatever torch raises when a tensor first moves there."""

from __future__ import annotations

import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig
from paged_tutorial.devices import available_devices

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
N_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


BAD = ["meta", "gpu", "cuda:x", "", "cpu:zero", f"cuda:{N_GPUS}", "cuda:7" if N_GPUS < 8 else
       "cuda:99", "mps" if not torch.backends.mps.is_available() else "xla"]
if N_GPUS == 0:
    BAD += ["cuda", "cuda:0", torch.device("cuda")]


@pytest.mark.parametrize("device", BAD, ids=repr)
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_a_device_this_machine_cannot_run_is_one_clear_error(tiny_model, device, backend):
    with pytest.raises(ValueError) as info:
        pt.Engine(tiny_model, backend=backend, device=device)
    message = str(info.value)
    assert repr(device) in message and "cpu" in message


@pytest.mark.parametrize("device", [5, 1.0, ["cpu"]], ids=repr)
def test_a_device_that_is_not_a_name_is_a_type_error(tiny_model, device):
    with pytest.raises(TypeError, match="device must be a string"):
        pt.Engine(tiny_model, backend="torch", device=device)


def test_the_cpu_is_always_available(tiny_model):
    assert available_devices()[0] == "cpu"
    engine = pt.Engine(tiny_model, backend="torch", device=torch.device("cpu"), max_seq_len=32)
    assert engine.generate([[1, 2]], max_tokens=2)[0].finish_reason == "length"


@pytest.mark.gpu
def test_every_visible_gpu_is_accepted_and_the_next_index_refused(tiny_model):
    assert N_GPUS > 0
    for i in range(N_GPUS):
        engine = pt.Engine(tiny_model, backend="torch", device=f"cuda:{i}", max_seq_len=32)
        assert engine.generate([[1, 2]], max_tokens=2)[0].finish_reason == "length"
    with pytest.raises(ValueError, match=f"has {N_GPUS} CUDA device"):
        pt.Engine(tiny_model, backend="torch", device=f"cuda:{N_GPUS}")
