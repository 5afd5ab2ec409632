"""``viz.warps``: the chapter-04 demo kernels (simulated on a CPU) checked against their NumPy
models, and the figures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction import warps  # noqa: E402


def test_shuffle_demos():
    rng = np.random.default_rng(3)
    values = rng.standard_normal(64).astype(np.float32)
    steps = warps.shuffle_chain(values)
    model = values.copy()
    for s, off in enumerate(warps.OFFSETS, start=1):
        model = model + warps.shfl_down_model(model, off)
        np.testing.assert_array_equal(steps[s], model)
    np.testing.assert_allclose(warps.package_warp_sum(values[:32]), values[:32].sum(), rtol=1e-5)
    ones = np.ones(128, np.float32)
    assert warps.article_two_warp_dot(ones, ones)["score"] == 64.0
    assert warps.article_two_warp_dot(ones[:64], ones[:64])["score"] == 64.0
    fig = warps.plot_lane_diagram(steps)
    assert fig.axes
    plt.close(fig)


def test_warp_coverage_figure():
    fig = warps.plot_warp_coverage(80, [1, 1, 0])
    img = fig.axes[0].images[0].get_array()
    assert img.shape == (1, 96, 3)
    assert tuple(img[0, 0]) != tuple(img[0, 70])         # counted vs dropped
    assert tuple(img[0, 90]) == tuple(img[0, 95])        # padding lanes alike
    plt.close(fig)
