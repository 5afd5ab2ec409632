"""``cpu_quantized``: the CPU's decode product over a GGUF's blocks.  The blocks' arithmetic is
checked against the ``gguf`` package's own dequantization, the product against float64 sums of
those values, and the plumbing (every kept matrix equals the float tensor the decoder passes,
Q/K rows un-permuted, q/k/v and gate/up stacked) on the embedded SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paged_tutorial.backends import cpu_matvec
from paged_tutorial.backends.cpu_quantized import TILE_ROWS, QuantizedMatrix, quantized_matrix
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.loading.gguf_rows import BLOCK_BYTES, QuantizedRows

KINDS = sorted(BLOCK_BYTES)


def random_rows(kind: str, n_out: int, n_in: int, seed: int) -> QuantizedRows:
    """Blocks as llama.cpp writes them: float16 scales (and Q4_1 minimums) of a realistic size,
    every quant value drawn."""
    rng = np.random.default_rng(seed)
    n_blocks = n_in // 32
    blocks = rng.integers(0, 256, (n_out, n_blocks, BLOCK_BYTES[kind]), dtype=np.uint8)
    scales = (rng.random((n_out, n_blocks)) * 0.02 + 1e-3).astype(np.float16)
    blocks[:, :, 0:2] = scales[..., None].view(np.uint8)
    if kind == "Q4_1":
        minimums = (-rng.random((n_out, n_blocks)) * 0.1).astype(np.float16)
        blocks[:, :, 2:4] = minimums[..., None].view(np.uint8)
    return QuantizedRows(kind, blocks.reshape(n_out, -1))


@pytest.mark.parametrize("kind", KINDS)
def test_rows_stand_for_the_values_the_gguf_package_computes(kind):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rows = random_rows(kind, 8, 64, seed=1)
    expected = dequantize(rows.data, GGMLQuantizationType[kind])
    assert torch.equal(rows.dequantize(), torch.from_numpy(np.asarray(expected, np.float32)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_out", [1, TILE_ROWS - 1, TILE_ROWS + 3, 3 * TILE_ROWS])
@pytest.mark.parametrize("batch", [1, 3, cpu_matvec.MAX_ROWS])
def test_product_equals_the_float64_sums_of_the_blocks_values(kind, n_out, batch):
    rows = random_rows(kind, n_out, 96, seed=n_out + batch)
    x = torch.randn(batch, 96, generator=torch.Generator().manual_seed(batch))
    out = QuantizedMatrix(rows).matvec(x)
    reference = (x.double() @ rows.dequantize().double().T).float()
    assert out.shape == (batch, n_out) and out.dtype == torch.float32
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_product_reads_strided_activation_rows():
    rows = random_rows("Q4_1", 40, 64, seed=3)
    wide = torch.randn(2, 128, generator=torch.Generator().manual_seed(0))
    x = wide[:, 32:96]
    torch.testing.assert_close(QuantizedMatrix(rows).matvec(x),
                               x @ rows.dequantize().T, rtol=1e-5, atol=1e-5)


def test_stacked_rows_are_the_parts_one_after_another():
    parts = [random_rows("Q4_1", n, 64, seed=n) for n in (5, 7, 3)]
    stacked = QuantizedRows.stack(parts)
    assert stacked.shape == (15, 64)
    assert torch.equal(stacked.dequantize(), torch.cat([p.dequantize() for p in parts]))
    with pytest.raises(ValueError, match="kinds"):
        QuantizedRows.stack([parts[0], random_rows("Q8_0", 5, 64, seed=0)])


def test_bad_rows_and_bad_activations_are_refused_by_name():
    with pytest.raises(ValueError, match="Q5_K"):
        QuantizedRows("Q5_K", np.zeros((2, 20), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        QuantizedRows("Q4_1", np.zeros((2, 21), np.uint8))
    matrix = QuantizedMatrix(random_rows("Q8_0", 4, 64, seed=0))
    with pytest.raises(ValueError, match=r"\[B, 64\]"):
        matrix.matvec(torch.zeros(1, 32))


def test_each_model_regroups_its_rows_once():
    rows = random_rows("Q4_0", 4, 32, seed=0)
    assert quantized_matrix(rows) is quantized_matrix(rows)


def test_every_kept_matrix_holds_the_float_tensor_the_decoder_multiplies(smollm2_f32):
    """Names, row order (Llama's Q/K rows un-permuted) and stacking: each kept matrix stands
    for exactly the float32 values the loader made, so the CPU path multiplies the same
    weights as HF, only summed in another order."""
    model = smollm2_f32
    tensors = {**model.weights, **model.packed}
    config = model.config
    assert {r.kind for r in model.quantized.values()} == {"Q4_1", "Q8_0"}
    layer_matrices = len(config.family.layer_roles) - 2          # the two norms are vectors
    assert len(model.quantized) == config.num_hidden_layers * layer_matrices + 1   # + embedding
    for name, rows in model.quantized.items():
        assert torch.equal(rows.dequantize(), tensors[name]), name


def test_the_torch_backend_multiplies_decode_rows_by_the_kept_blocks(smollm2_f32):
    from paged_tutorial.model.decoder import build_network

    backend = TorchBackend("cpu")
    network = build_network(smollm2_f32, backend, max_positions=64)
    layer = network.layers[0]
    x = torch.randn(2, smollm2_f32.config.hidden_size, generator=torch.Generator().manual_seed(0))
    kept = backend.quantized[layer.gate_up.data_ptr()]
    assert kept[0] is layer.gate_up
    torch.testing.assert_close(backend.linear(x, layer.gate_up), kept[1].matvec(x))
    torch.testing.assert_close(backend.linear(x, layer.gate_up), x @ layer.gate_up.T,
                               rtol=1e-4, atol=1e-4)
    # the tied LM head is the embedding's Q8_0 blocks
    assert backend.quantized[network.lm_head.data_ptr()][1].kind == "Q8_0"
    # a prompt (more rows than a decode step) goes to the BLAS over the float values
    prompt = torch.randn(cpu_matvec.MAX_ROWS + 1, smollm2_f32.config.hidden_size)
    assert torch.equal(backend.linear(prompt, layer.gate_up),
                       torch.nn.functional.linear(prompt, layer.gate_up))


def test_models_off_the_cpu_or_in_other_dtypes_keep_no_rows(smollm2_f32):
    import paged_tutorial as pt

    assert smollm2_f32.to("meta").quantized == {}
    assert pt.load_model("smollm2-135m", dtype="bfloat16").quantized == {}


def test_a_model_counts_the_blocks_it_keeps_in_its_size(smollm2_f32, smollm2_path):
    """The kept blocks are the file's matrices again: a float32 model that keeps them holds
    about the GGUF's size more than the same tensors without them."""
    from paged_tutorial.loading.models import Model

    m = smollm2_f32
    without_rows = Model(m.config, dict(m.weights), m.tokenizer, m.dtype, m.source,
                         packed=dict(m.packed))
    kept = m.num_bytes() - without_rows.num_bytes()
    assert kept == sum(r.data.nbytes for r in m.quantized.values())
    assert 0.9 * smollm2_path.stat().st_size < kept <= smollm2_path.stat().st_size


def test_a_recording_backend_hands_the_blocks_to_the_backend_it_wraps(smollm2_f32):
    """A watched engine multiplies by the same blocks as an unwatched one (same sums, same
    tokens)."""
    from paged_tutorial.backends.recording import RecordingBackend
    from paged_tutorial.model.decoder import build_network

    recorder = RecordingBackend(TorchBackend("cpu"))
    network = build_network(smollm2_f32, recorder, max_positions=64)
    assert network.layers[0].down.data_ptr() in recorder.inner.quantized
