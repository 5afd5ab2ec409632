"""Chapter 05 (online softmax): figures of the decode kernel's running max, correction,
denominator and accumulator, and of its error against float64.

The recurrence itself (``online_softmax_trace``) and the references (``exact_attention``,
``oracle_decode``) live in ``paged_tutorial.teaching.oracles``; ``plot_softmax_replay`` draws what a
puzzle's ``softmax_update`` does token by token next to the article's update.
matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["plot_online_softmax_trace", "plot_softmax_error", "plot_softmax_replay"]

FIG_DPI = 80


def _plt():
    import matplotlib.pyplot as plt
    return plt


def plot_online_softmax_trace(trace: dict, kernel_out=None, dims=(0, 1, 2),
                              block_size: int | None = None):
    """Three panels over the tokens: scores and the running max (with the correction factor
    where it is < 1), the denominator d, and acc/d for a few output dimensions converging to
    the kernel's final output (dashed)."""
    plt = _plt()
    n = len(trace["score"])
    pos = np.arange(n)
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 6.6), dpi=FIG_DPI, sharex=True)
    ax = axes[0]
    ax.plot(pos, trace["score"], "o", ms=3, label="score q.k/sqrt(d)")
    ax.step(pos, trace["max"], where="post", color="tab:red", lw=1, label="running max")
    jumps = np.flatnonzero(trace["correction"][1:] < 1) + 1
    for j in jumps:
        ax.annotate(f"x{trace['correction'][j]:.2f}", (j, trace["max"][j]), fontsize=6,
                    textcoords="offset points", xytext=(2, 4), color="tab:red")
    ax.set_ylabel("score")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("online softmax, token by token (red labels: correction exp(old max - new max))",
                 fontsize=9)
    ax = axes[1]
    ax.plot(pos, trace["d"], "-o", ms=2, color="tab:purple")
    ax.set_ylabel("denominator d")
    ax = axes[2]
    for i, dim in enumerate(dims):
        line, = ax.plot(pos, trace["acc"][:, dim] / trace["d"], lw=1, label=f"acc/d, dim {dim}")
        if kernel_out is not None:
            ax.axhline(float(kernel_out[dim]), color=line.get_color(), ls="--", lw=0.8)
    ax.set_ylabel("acc / d")
    ax.set_xlabel("token position (kernel loop order)")
    ax.legend(fontsize=7, loc="best")
    if block_size:
        for a in axes:
            for x in range(block_size, n, block_size):
                a.axvline(x - 0.5, color="0.75", lw=0.7, ls="--")
    fig.tight_layout()
    return fig


def plot_softmax_error(lengths, curves: dict, markers: dict | None = None):
    """Relative error against float64 two-pass attention, per sequence length (log-log), with
    the float32 and bfloat16 rounding levels for scale."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.2, 3.6), dpi=FIG_DPI)
    styles = ["-o", "--s", "-^", "--v", "-d", "--x"]
    for (name, errs), st in zip(curves.items(), styles):
        ax.plot(lengths, errs, st, ms=4, lw=1, label=name)
    for name, (ls, es) in (markers or {}).items():
        ax.plot(ls, es, "*", ms=12, label=name)
    for level, text in ((2.0 ** -24, "float32: half an ulp at 1 (2^-24)"),
                        (2.0 ** -8, "bfloat16: half an ulp at 1 (2^-8)")):
        ax.axhline(level, color="0.6", lw=0.7, ls=":")
        ax.text(lengths[-1], level * 1.25, text, fontsize=7, color="0.35", ha="right")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens read by the decode step)")
    ax.set_ylabel("max |error| / max |output|")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("online softmax vs two-pass softmax, against float64", fontsize=9)
    fig.tight_layout()
    return fig


def plot_softmax_replay(scores, mine, article, title: str = ""):
    """A puzzle's ``softmax_update`` replayed on the host next to the article's: per token,
    the score and both running maxes (top) and the output so far, acc / d, for dimension 0
    (bottom).  ``mine`` / ``article``: [tokens, 3] arrays of (max, d, acc) after each token;
    ``mine`` may stop early (the update raised)."""
    plt = _plt()
    scores = np.asarray(scores, dtype=np.float64)
    mine, article = np.asarray(mine, dtype=np.float64), np.asarray(article, dtype=np.float64)
    pos = np.arange(len(scores))
    fig, axes = plt.subplots(2, 1, figsize=(7.5, 4.6), dpi=FIG_DPI, sharex=True)
    ax = axes[0]
    ax.plot(pos, scores, "o", ms=3, color="0.4", label="score")
    ax.step(pos[:len(article)], article[:, 0], where="post", color="tab:green", lw=1.2,
            label="running max, article's update")
    if len(mine):
        ax.step(pos[:len(mine)], mine[:, 0], where="post", color="tab:red", lw=1, ls="--",
                label="running max, your update")
    ax.set_ylabel("score")
    ax.legend(fontsize=7, loc="best")
    ax = axes[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        ax.plot(pos[:len(article)], article[:, 2] / article[:, 1], "-o", ms=3, color="tab:green",
                label="acc / d, article's update")
        if len(mine):
            out = mine[:, 2] / mine[:, 1]
            ax.plot(pos[:len(mine)], np.where(np.isfinite(out), out, np.nan), "--s", ms=3,
                    color="tab:red", label="acc / d, your update")
            bad = np.flatnonzero(~np.isfinite(out))
            for t in bad[:1]:
                ax.axvline(t, color="tab:red", lw=0.8, ls=":")
                ax.text(t, ax.get_ylim()[1], " not finite from here", color="tab:red",
                        fontsize=7, va="top")
    ax.set_ylabel("output so far, dim 0")
    ax.set_xlabel("token (kernel loop order)")
    ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"online softmax replayed on the host: {title}", fontsize=9)
    fig.tight_layout()
    return fig
