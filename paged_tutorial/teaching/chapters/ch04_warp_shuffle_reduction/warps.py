"""Chapter 04 (the warp-shuffle reduction): small demo kernels that show what one warp does,
and the figures drawn from what they recorded.

These are *demo* kernels, not engine kernels (the engine's decode kernel is
``backends/numba_cuda/kernels/attention.py``):

- ``shuffle_chain``: the decode kernel's five ``shfl_down_sync`` steps (kernels.cu:489-493),
  recording every lane's value after each step; ``shfl_down_model`` is the same step in NumPy.
- ``package_warp_sum``: the package's butterfly ``reduce.warp_sum``.
- ``article_two_warp_dot``: the article's fixed two-warp score reduction (threads 0 and 32
  publish into two shared floats), kept to show why it needs head_dim 64.

Figures: ``plot_lane_diagram`` (lanes x shuffle steps), ``plot_warp_coverage`` (which head
dimensions a cross-warp combine counted, e.g. the article's two cells at head_dim 80).
matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import numpy as np
import torch

# Importing the backend first decides simulator vs GPU before numba.cuda is imported.
from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.backends.numba_cuda.runtime import launch
from paged_tutorial.backends.numba_cuda.device import reduce
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING
from paged_tutorial.teaching.oracles import kernel_device

# A module global named ``cuda``: the simulator swaps it while a kernel of this module runs.
from numba import cuda, float32  # noqa: E402

__all__ = ["OFFSETS", "WARP_SIZE", "shuffle_chain", "shfl_down_model", "package_warp_sum",
           "article_two_warp_dot", "plot_lane_diagram",
           "plot_warp_coverage"]

WARP_SIZE = attention.WARP_SIZE
#: the decode kernel's shuffle offsets (kernels.cu:489-493)
OFFSETS = (16, 8, 4, 2, 1)
FIG_DPI = 80


@cuda.jit
def _shuffle_chain_kernel(values, offsets, accumulate, steps):
    """Each thread loads one value, then for each offset does v = shfl_down(v, offset)
    (or v += ... with ``accumulate``), recording v after every step in ``steps``
    ([len(offsets) + 1, n] flattened).  The decode kernel's reduction is offsets
    16, 8, 4, 2, 1 with accumulate."""
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    v = values[tid]
    steps[tid] = v
    for s in range(offsets.shape[0]):
        got = cuda.shfl_down_sync(attention.WARP_FULL_MASK, v, offsets[s])
        if accumulate:
            v = v + got
        else:
            v = got
        steps[(s + 1) * n + tid] = v


@cuda.jit
def _warp_sum_kernel(values, out):
    tid = cuda.threadIdx.x
    out[tid] = reduce.warp_sum(values[tid])


@cuda.jit
def _article_two_warp_dot_kernel(q, k, out):
    """The article's score reduction (kernels.cu:486-505) with its fixed layout: warp sums by
    shfl_down, then *threads 0 and 32* publish into two shared floats and thread 0 adds those
    two.  Launched with head_dim threads, as the article launches HEAD_DIM threads.  Writes
    out[0] = the sum thread 0 forms (unscaled), out[1], out[2] = the two shared floats."""
    dot_products = cuda.shared.array(2, float32)
    tid = cuda.threadIdx.x
    if tid < 2:
        dot_products[tid] = float32(0.0)      # (the article leaves them uninitialised)
    cuda.syncthreads()
    qk = float32(q[tid]) * float32(k[tid])
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 16)
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 8)
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 4)
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 2)
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 1)
    if tid == 0:
        dot_products[0] = qk
    if tid == 32:
        dot_products[1] = qk
    cuda.syncthreads()
    if tid == 0:
        out[0] = dot_products[0] + dot_products[1]
        out[1] = dot_products[0]
        out[2] = dot_products[1]


def _run(kernel, threads: int, *tensors_and_scalars):
    args = [launch.as_kernel_array(a) if torch.is_tensor(a) else a for a in tensors_and_scalars]
    launch.launch(kernel, 1, threads, *args)
    if not SIMULATING:
        torch.cuda.synchronize()


def shuffle_chain(values, offsets=OFFSETS, accumulate: bool = True) -> np.ndarray:
    """Run the shuffle demo kernel on ``values`` (one per thread, a single block) and return
    every lane's value before and after each step: float32 [len(offsets) + 1, n]."""
    dev = kernel_device()
    v = torch.as_tensor(np.asarray(values, dtype=np.float32)).to(dev)
    n = v.numel()
    offs = torch.tensor(list(offsets), dtype=torch.int32, device=dev)
    steps = torch.full(((len(offsets) + 1) * n,), float("nan"), dtype=torch.float32, device=dev)
    _run(_shuffle_chain_kernel, n, v, offs, bool(accumulate), steps)
    return steps.cpu().numpy().reshape(len(offsets) + 1, n)


def shfl_down_model(values, offset: int) -> np.ndarray:
    """NumPy model of one ``shfl_down_sync`` (width 32): lane i receives lane i + offset of its
    own warp, or keeps its own value when i + offset >= 32.  When the source lane lies past the
    end of a *partial* last warp (a block that is not a multiple of 32 threads) the hardware
    result is undefined (an H200 returned 0); this model, like the simulator shim, keeps the
    reader's value.  The package's decode kernel always launches whole warps."""
    values = np.asarray(values)
    n = len(values)
    out = values.copy()
    for tid in range(n):
        lane = tid % WARP_SIZE
        src = tid + offset
        if lane + offset < WARP_SIZE and src < n:
            out[tid] = values[src]
    return out


def package_warp_sum(values) -> np.ndarray:
    """Every lane's result of the package's ``reduce.warp_sum`` (butterfly ``shfl_xor``)."""
    dev = kernel_device()
    v = torch.as_tensor(np.asarray(values, dtype=np.float32)).to(dev)
    out = torch.full_like(v, float("nan"))
    _run(_warp_sum_kernel, v.numel(), v, out)
    return out.cpu().numpy()


def article_two_warp_dot(q, k) -> dict:
    """Run the article's fixed two-warp score reduction with len(q) threads (its HEAD_DIM).
    Returns {'score': what thread 0 computes (before the 1/sqrt(d) scale), 'dot_products':
    the two shared floats, 'exact': the full float64 dot product}."""
    dev = kernel_device()
    qa = torch.as_tensor(np.asarray(q, dtype=np.float32)).to(dev)
    ka = torch.as_tensor(np.asarray(k, dtype=np.float32)).to(dev)
    if qa.numel() != ka.numel() or not 33 <= qa.numel() <= 1024:
        raise ValueError("article_two_warp_dot: q and k need the same length, 33..1024 (the "
                         "layout needs a thread 32)")
    out = torch.full((3,), float("nan"), dtype=torch.float32, device=dev)
    _run(_article_two_warp_dot_kernel, qa.numel(), qa, ka, out)
    o = out.cpu().numpy()
    return {"score": float(o[0]), "dot_products": (float(o[1]), float(o[2])),
            "exact": float(np.dot(np.asarray(q, np.float64), np.asarray(k, np.float64)))}


# =========================================================================================
# figures
# =========================================================================================

def _plt():
    import matplotlib.pyplot as plt
    return plt


def plot_lane_diagram(steps: np.ndarray, offsets=OFFSETS, lanes: int = WARP_SIZE,
                      warp: int = 0):
    """A lanes x steps picture of the shfl_down reduction of one warp, from the values the
    demo kernel recorded (``shuffle_chain``).  Cell colour: how many of the warp's inputs the
    lane's value sums (from the coefficient model, checked against the recorded values);
    hatched: values that count some input twice (lanes whose source was past lane 31 added
    their own value).  Arrows: the additions that reach lane 0.  Lane 0's value is printed."""
    plt = _plt()
    base = warp * WARP_SIZE
    vals = steps[:, base:base + lanes]
    n_steps = len(offsets) + 1
    # coefficient model: coef[s][lane] = multiplicity of each input in the lane's value
    coef = [np.eye(lanes)]
    for off in offsets:
        prev = coef[-1]
        got = np.array([prev[i + off] if i + off < WARP_SIZE and i + off < lanes else prev[i]
                        for i in range(lanes)])
        coef.append(prev + got)
    coef = np.array(coef)                               # [steps, lanes, inputs]
    model = coef @ vals[0].astype(np.float64)
    if not np.allclose(model, vals, rtol=1e-5, atol=1e-5):
        raise AssertionError("recorded lane values do not follow the shfl_down model")
    n_terms = (coef > 0).sum(-1)
    doubled = (coef > 1).any(-1)
    fig, ax = plt.subplots(figsize=(7.5, 6.2), dpi=FIG_DPI)
    im = ax.imshow(n_terms.T, aspect="auto", cmap="Blues", vmin=0, vmax=lanes,
                   origin="upper", extent=(-0.5, n_steps - 0.5, lanes - 0.5, -0.5))
    for s in range(n_steps):
        for lane in range(lanes):
            if doubled[s, lane]:
                ax.add_patch(plt.Rectangle((s - 0.5, lane - 0.5), 1, 1, fill=False,
                                           hatch="////", lw=0, color="0.55"))
    # arrows of the tree that ends in lane 0: at step s (offset off), lane i < off gets i+off
    for s, off in enumerate(offsets, start=1):
        for i in range(off):
            if i + off < lanes:
                ax.annotate("", xy=(s - 0.05, i), xytext=(s - 0.95, i + off),
                            arrowprops=dict(arrowstyle="->", lw=0.6, color="tab:red"))
    for s in range(n_steps):
        ax.text(s, 0, f"{vals[s, 0]:.3f}", ha="center", va="center", fontsize=7,
                color="black", bbox=dict(fc="white", ec="none", alpha=0.7, pad=0.5))
    ax.set_xticks(range(n_steps))
    ax.set_xticklabels(["load"] + [f"+shfl_down\n{o}" for o in offsets], fontsize=8)
    ax.set_yticks(range(0, lanes, 4))
    ax.set_ylabel(f"lane (warp {warp}: threads {base}..{base + lanes - 1})")
    cb = fig.colorbar(im, ax=ax, fraction=0.04)
    cb.set_label("inputs summed in the lane's value", fontsize=8)
    ax.set_title("warp shuffle reduction: red = additions that reach lane 0; "
                 "hatched = counts an input twice", fontsize=9)
    fig.tight_layout()
    return fig


def plot_warp_coverage(head_dim: int, coefficients, warp_size: int = WARP_SIZE):
    """One cell per thread of a block of ``head_dim`` threads rounded up to whole warps,
    coloured by how many times a cross-warp sum counted that thread's warp: once (green),
    never (orange) or more than once (red); padding lanes of a partial last warp are grey.
    ``coefficients[w]`` is what the sum returns when only warp w's cell holds 1."""
    plt = _plt()
    from paged_tutorial.teaching.harness.addresses import READ_COLORS, UNTOUCHED

    good, missed, extra = (READ_COLORS[k] for k in READ_COLORS)
    coef = np.asarray(coefficients, dtype=np.float64)
    n_warps = len(coef)
    threads = n_warps * warp_size
    img = np.ones((1, threads, 3))
    for t in range(threads):
        w = t // warp_size
        if t >= head_dim:
            img[0, t] = UNTOUCHED
        elif coef[w] == 1:
            img[0, t] = good
        elif coef[w] == 0:
            img[0, t] = missed
        else:
            img[0, t] = extra
    fig, ax = plt.subplots(figsize=(min(0.06 * threads + 1.5, 10), 1.9), dpi=FIG_DPI)
    ax.imshow(img, aspect="auto", interpolation="nearest")
    for w in range(n_warps):
        ax.axvline(w * warp_size - 0.5, color="black", lw=0.8)
        ax.text(w * warp_size + warp_size / 2 - 0.5, 0, f"warp {w}: x{coef[w]:g}", ha="center",
                va="center", fontsize=7)
    ax.set_yticks([])
    ax.set_xlabel("thread = head dimension (grey: padding lanes, no dimension)", fontsize=8)
    ax.set_title(f"head_dim {head_dim}: how many times the sum counts each warp's partial sum",
                 fontsize=9)
    labels = {"counted once": good, "dropped": missed, "counted more than once": extra,
              "padding lane": UNTOUCHED}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, label=n) for n, c in labels.items()]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.18, 1, 1))
    return fig
