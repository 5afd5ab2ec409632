"""``cpu_matvec``: the compiled few-row product the torch backend uses on the CPU, against
``torch.nn.functional.linear``, and which products it takes."""

from __future__ import annotations

import pytest
import torch

from paged_tutorial.backends import cpu_matvec
from paged_tutorial.backends.torch_ref import TorchBackend


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 3, cpu_matvec.MAX_ROWS])
@pytest.mark.parametrize("n_out", [1, 5, 203])
def test_matvec_equals_linear_to_float32_rounding(rows, n_out, threads):
    """Output counts that are not a multiple of the rows done at once, split over threads or
    not (more threads than Numba started are simply used as shares)."""
    g = torch.Generator().manual_seed(rows * 1000 + n_out)
    weight = torch.randn(n_out, 96, generator=g)
    x = torch.randn(rows, 96, generator=g)
    out = cpu_matvec.matvec(x, weight, threads=threads)
    assert out.shape == (rows, n_out) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_out,shares", [(1, 2), (10, 2), (576, 2), (203, 3), (3, 8)])
def test_the_shares_cover_every_output_row_once(n_out, shares):
    covered = []
    for share in range(shares):
        first, stop = cpu_matvec.share_bounds(n_out, shares, share)
        assert first <= stop
        covered += range(first, stop)
    assert covered == list(range(n_out))


def test_matvec_follows_torchs_thread_count(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert cpu_matvec.threads_to_use() == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 10_000)
    import numba
    assert cpu_matvec.threads_to_use() == numba.config.NUMBA_NUM_THREADS


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


def test_a_split_product_leaves_torchs_thread_count_as_it_was():
    """Numba's parallel loop and torch share one OpenMP runtime: the loop must not change the
    count torch's own ops (and the package's thread choice) see."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ones(1, 8)
        cpu_matvec.matvec(one, torch.ones(8, 8), threads=2)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
