"""``loading/gguf_file.py`` and ``loading/gguf_torch.py`` against the ``gguf`` package they replace
on the load path: the same header values and bit-identical dequantized tensors, from NumPy on the
host and from torch on the device the weights go to (the CPU here; ``tests/gpu`` on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gguf
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize

from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial.loading.gguf_file import GGUFFile, GGUFFormatError
from paged_tutorial.loading.gguf_torch import dequantize_bytes, dequantize_on
from paged_tutorial.loading.models import random_model

KINDS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]


def _reference(path):
    reader = gguf.GGUFReader(str(path))
    fields = {name: f.contents() for name, f in reader.fields.items()
              if not name.startswith("GGUF.")}
    tensors = {t.name: np.asarray(gguf_dequantize(t.data, t.tensor_type), np.float32)
               .reshape(tuple(int(d) for d in reversed(t.shape.tolist())))
               for t in reader.tensors}
    return fields, tensors


def _assert_same_as_gguf(path):
    fields, tensors = _reference(path)
    ours = GGUFFile.open(path)
    assert ours.fields == fields
    assert {k: type(v) for k, v in ours.fields.items()} == {k: type(v) for k, v in fields.items()}
    assert [t.name for t in ours.tensors] == list(tensors)
    for t in ours.tensors:
        values = ours.dequantize(t)
        assert values.dtype == np.float32 and values.shape == tensors[t.name].shape, t.name
        assert np.array_equal(values, tensors[t.name]), t.name
        on_cpu = dequantize_on(t, torch.device("cpu"))
        assert on_cpu.dtype == torch.float32 and on_cpu.shape == values.shape, t.name
        assert_same_bits(on_cpu.numpy(), tensors[t.name], t.name)
        # the torch arithmetic a GPU runs, run here on the CPU
        on_torch = dequantize_bytes(torch.from_numpy(t.data), t.tensor_type.name)
        assert on_torch.dtype == torch.float32, t.name
        assert_same_bits(on_torch.numpy().reshape(values.shape), tensors[t.name], t.name)


def assert_same_bits(values: np.ndarray, expected: np.ndarray, name: str) -> None:
    """Equal bit for bit (so -0.0 and 0.0 differ, as a fused multiply-add's rounding would)."""
    assert np.array_equal(np.ascontiguousarray(values).view(np.uint32),
                          np.ascontiguousarray(expected).view(np.uint32)), name


def test_tiny_gguf_reads_as_the_gguf_package_reads_it(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", random_model(tiny_config()),
                           quantize=("mlp.up_proj.weight",))
    _assert_same_as_gguf(path)


@pytest.mark.parametrize("kind", KINDS)
def test_whole_tensor_dequantization_is_bit_identical(tmp_path, kind):
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((64, 96)) * 0.05).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    if kind in ("F32", "F16"):
        writer.add_tensor("t", values.astype(np.float16 if kind == "F16" else np.float32))
    else:                            # the writer derives the shape from the quantized bytes
        writer.add_tensor("t", gguf_quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _assert_same_as_gguf(tmp_path / "t.gguf")
    assert GGUFFile.open(tmp_path / "t.gguf").tensors[0].tensor_type == qtype


@pytest.mark.slow          # gguf.GGUFReader takes seconds on this file
def test_embedded_smollm2_reads_as_the_gguf_package_reads_it(smollm2_path):
    _assert_same_as_gguf(smollm2_path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(GGUFFormatError, match="does not start with"):
        GGUFFile.open(path)
    path.write_bytes(b"GGUF" + (7).to_bytes(4, "little") + bytes(16))
    with pytest.raises(GGUFFormatError, match="version 7"):
        GGUFFile.open(path)
