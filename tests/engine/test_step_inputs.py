"""One ``StepInputs`` per engine step: every input packed into one buffer, sent with one copy,
and the torch backend's decode reading nothing back from the device."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import paged_tutorial as pt
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.step_inputs import StepInputPacker

HOST_READS = {"tolist", "cpu", "numpy", "item", "__int__", "__float__", "__bool__",
              "__index__"}


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def tensors_of(inputs) -> dict:
    return {name: getattr(inputs, name) for name in
            ("token_ids", "positions", "slots", "seq_slots", "seq_lens", "cu_seqlens",
             "context_lens", "logit_rows", "temperature", "top_p", "uniforms")
            if getattr(inputs, name) is not None}


def test_prefill_inputs_are_views_of_one_buffer():
    packer = StepInputPacker("cpu")
    inputs = packer.prefill([[5, 6, 7], [8, 9]], [0, 16], [1, 0], None,
                            sampling=([0.0, 0.5], [1.0, 0.9], [0.0, 0.25]))
    tensors = tensors_of(inputs)
    assert len(tensors) == 11 and len({storage_of(t) for t in tensors.values()}) == 1
    assert inputs.token_ids.tolist() == [5, 6, 7, 8, 9]
    assert inputs.positions.tolist() == [0, 1, 2, 16, 17]
    assert inputs.slots.tolist() == [1, 1, 1, 0, 0]
    assert inputs.cu_seqlens.tolist() == [0, 3, 5] and inputs.cu_seqlens_host == (0, 3, 5)
    assert inputs.seq_lens.tolist() == [3, 18] and inputs.max_seq_len == 18
    assert inputs.logit_rows.tolist() == [2, 4] and inputs.max_query_len == 3
    assert inputs.reads_cached_context
    assert inputs.top_p.dtype == torch.float32 and inputs.top_p.tolist() == pytest.approx(
        [1.0, 0.9])
    assert (packer.packs, packer.copies) == (1, 0)         # on the CPU nothing is copied


def test_one_copy_per_step_to_another_device():
    # the meta device stands in for a GPU: a copy is made, once, and every tensor is its view
    packer = StepInputPacker("meta")
    inputs = packer.decode([3, 4], [10, 20], [0, 1], None, sampling=([0.0] * 2,) * 3)
    tensors = tensors_of(inputs)
    assert all(t.device.type == "meta" for t in tensors.values())
    assert len({storage_of(t) for t in tensors.values()}) == 1
    assert (packer.packs, packer.copies) == (1, 1) and inputs.max_seq_len == 21


def test_prefill_rejects_mismatched_lists():
    with pytest.raises(ValueError, match="one of each per sequence"):
        StepInputPacker("cpu").prefill([[1, 2]], [0, 0], [0], None)


def tiny_engine(tiny_llama, backend, **engine_options):
    folder, _ = tiny_llama("gqa3-untied-llama3-hub")
    model = pt.load_model(str(folder), dtype="float32")
    return pt.Engine(model, backend=backend, max_slots=2, max_seq_len=64, **engine_options)


def test_the_engine_packs_once_per_step(tiny_llama):
    # eager steps: a replayed CUDA graph (the torch backend on a GPU) fills its own buffers
    engine = tiny_engine(tiny_llama, "torch", cuda_graphs=False)
    steps = []
    engine.generate([[1, 2, 3], [4, 5, 6, 7, 8]], pt.SamplingParams(max_tokens=4),
                    chat=False, on_step=steps.append)
    assert engine.model_runner.packer.packs == len(steps) > 2


class HostReads(TorchFunctionMode):
    """Records every torch call that brings a tensor's values to the host."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_torch_decode_reads_nothing_back_from_the_device(tiny_llama, monkeypatch):
    # check_inputs=False: the default on a GPU, where the checks would copy the table; and the
    # decode rows through torch ops as on a GPU (on the CPU, the compiled products and ops of
    # cpu_matvec, cpu_quantized and cpu_decode_ops view CPU tensors as numpy)
    from paged_tutorial.backends import cpu_matvec

    monkeypatch.setattr(cpu_matvec, "MAX_ROWS", 0)
    backend = TorchBackend("cpu", check_inputs=False)
    assert not TorchBackend("cuda").check_inputs
    engine = tiny_engine(tiny_llama, backend)
    engine.add_request([1, 2, 3, 4, 5] * 4, pt.SamplingParams(max_tokens=8))
    engine.add_request([9, 8, 7], pt.SamplingParams(max_tokens=8))
    engine.step()                                          # the prefill
    runner = engine.model_runner
    requests = engine.scheduler.running
    for r in requests:
        engine.cache.ensure_capacity(r.slot, r.num_computed_tokens + 1)
    inputs = runner.decode_inputs(requests)
    reads = HostReads()
    with reads:
        logits = runner.network.forward(inputs, engine.cache)
    assert reads.seen == [] and logits.shape[0] == 2


def test_batched_torch_decode_matches_one_sequence_at_a_time(tiny_llama):
    # the same greedy tokens whether the decode reads every sequence at once or one by one
    prompts = [[1, 2, 3, 4, 5] * 4, [9, 8, 7]]
    params = pt.SamplingParams(max_tokens=6)
    together = tiny_engine(tiny_llama, "torch").generate(prompts, params, chat=False)
    alone = [tiny_engine(tiny_llama, "torch").generate([p], params, chat=False)[0]
             for p in prompts]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
