"""``cpu_matvec``: the compiled few-row product the torch backend uses on the CPU, against
``torch.nn.functional.linear``, and which products it takes."""

from __future__ import annotations

import pytest
import torch

from paged_tutorial.backends import cpu_matvec
from paged_tutorial.backends.torch_ref import TorchBackend


@pytest.mark.parametrize("rows", [1, 3, cpu_matvec.MAX_ROWS])
def test_matvec_equals_linear_to_float32_rounding(rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(200, 96, generator=g)
    x = torch.randn(rows, 96, generator=g)
    out = cpu_matvec.matvec(x, weight)
    assert out.shape == (rows, 200) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_matvec_reads_strided_rows():
    """q, k, v and the attention output reach the projections as views."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 32, generator=g)
    wide = torch.randn(2, 96, generator=g)
    x = wide[:, 16:48]
    torch.testing.assert_close(cpu_matvec.matvec(x, weight), x @ weight.T, rtol=1e-5, atol=1e-5)


def test_takes_only_small_float32_cpu_products():
    w = torch.zeros(8, 4)
    assert cpu_matvec.takes(torch.zeros(1, 4), w)
    assert not cpu_matvec.takes(torch.zeros(cpu_matvec.MAX_ROWS + 1, 4), w)     # a prompt
    assert not cpu_matvec.takes(torch.zeros(1, 4, dtype=torch.bfloat16), w.bfloat16())
    assert not cpu_matvec.takes(torch.zeros(1, 4), torch.zeros(4, 8).T)          # not contiguous
    assert not cpu_matvec.takes(torch.zeros(1, 4, requires_grad=True), w)


def test_the_torch_backend_uses_it_for_decode_rows_and_the_blas_for_prompts(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_matvec, "matvec", lambda x, w: calls.append(x.shape[0]) or x @ w.T)
    backend = TorchBackend()
    w = torch.randn(8, 4)
    backend.linear(torch.randn(3, 4), w)
    backend.linear(torch.randn(cpu_matvec.MAX_ROWS + 4, 4), w)
    assert calls == [3]
