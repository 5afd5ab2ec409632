"""Chapter 08 (performance): the committed GPU measurements in plain words and figures.

The JSON files are written by ``benchmarks/decode.py``, ``benchmarks/attention.py`` and
``benchmarks/profile_step.py`` on a GPU; ``results.newest`` finds the newest of each.  A newer run
may time fewer variants (or name new ones): every function here draws or lists what the file has
and says what it does not, never a table cell of ``nan``.

- ``decode_ladder``: the decode step, one change at a time (the *ladder*), as ``Rung`` records
  with a plain-words label and what the change is;
- ``plot_decode_ladder``: the ladder as bars, per batch size, against the floor and HF;
- ``attention_rows`` / ``plot_attention``: the attention kernels alone, as a share of the copy
  bandwidth;
- ``load_width_comparison``: the same fast kernel with 8-byte and with 16-byte loads;
- ``profile_rows`` / ``plot_profile``: where one decode step's GPU time goes, kernel by kernel.

matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Rung", "LADDER", "REFERENCES", "decode_ladder", "plot_decode_ladder",
           "attention_rows", "plot_attention", "KERNELS", "load_width_comparison",
           "profile_rows", "plot_profile"]

FIG_DPI = 80


@dataclass(frozen=True)
class Rung:
    key: str                 # the per-step milliseconds key in decode-<date>.json rows
    label: str               # what runs, in plain words
    change: str              # what this rung changes from the one before


#: the engine's decode step, from the article's kernel launched from Python to the default
LADDER = (
    Rung("engine_article_no_graphs_ms_per_step",
         "article's kernel, each kernel launched from Python",
         "the starting point: the article's attention kernel, and every one of the step's "
         "kernels launched one at a time by the Python host"),
    Rung("engine_fast_no_graphs_ms_per_step",
         "fast kernel, each kernel launched from Python",
         "a faster attention kernel, still launched one kernel at a time"),
    Rung("engine_article_graphs_ms_per_step",
         "article's kernel, the step replayed as a CUDA graph",
         "the whole step recorded once and replayed with one call: no Python between kernels"),
    Rung("engine_ms_per_step",
         "fast kernel, replayed as a CUDA graph (the default)",
         "both: the engine as a user gets it"),
    Rung("engine_triton_graphs_ms_per_step",
         "Triton kernel, replayed as a CUDA graph",
         "for comparison: a Triton attention kernel in the same engine"),
)
#: other engines and the floor, drawn as reference lines
REFERENCES = (
    ("hf_eager_ms_per_step", "HF transformers, eager generate"),
    ("hf_static_ms_per_step", "HF transformers, static cache (compiled)"),
    ("floor_ms_per_step", "floor: every weight read once at copy speed"),
)


def decode_ladder(decode: dict) -> list[dict]:
    """One entry per rung the file has: {'rung': Rung, 'ms': {batch: ms}}; rungs with no
    measurement at any batch size are left out (``missing_rungs`` lists them)."""
    out = []
    for rung in LADDER:
        ms = {r["batch"]: r[rung.key] for r in decode.get("rows", []) if r.get(rung.key) is not None}
        if ms:
            out.append({"rung": rung, "ms": ms})
    return out


def missing_rungs(decode: dict) -> list[str]:
    have = {entry["rung"].key for entry in decode_ladder(decode)}
    return [rung.label for rung in LADDER if rung.key not in have]


def plot_decode_ladder(decode: dict):
    """The decode ladder as horizontal bars (milliseconds per step, log scale), one panel per
    batch size, with HF and the floor as reference lines."""
    import matplotlib.pyplot as plt

    ladder = decode_ladder(decode)
    batches = [r["batch"] for r in decode.get("rows", [])]
    fig, axes = plt.subplots(1, len(batches), figsize=(4.3 * len(batches) + 2.6, 3.7),
                             dpi=FIG_DPI, sharey=True, squeeze=False)
    colors = plt.get_cmap("tab10")
    styles = ("--", "-.", ":")
    for ax, row in zip(axes[0], decode.get("rows", [])):
        batch = row["batch"]
        entries = [e for e in ladder if batch in e["ms"]]
        for i, entry in enumerate(ladder):
            if batch in entry["ms"]:
                ms = entry["ms"][batch]
                ax.barh(i, ms, color=colors(i), height=0.6)
                ax.text(ms * 1.08, i, f"{ms:.2f} ms", va="center", fontsize=7)
        refs = []
        for (key, label), ls in zip(REFERENCES, styles):
            if row.get(key) is not None:
                ax.axvline(row[key], color="0.3", ls=ls, lw=1)
                refs.append(f"{row[key]:.2f}")
        ax.set_xscale("log")
        ax.set_xlabel("milliseconds per decode step (log scale)", fontsize=8)
        ax.set_title(f"batch {batch}", fontsize=9)
        if not entries:
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center")
        lo = min([row.get("floor_ms_per_step") or math.inf] + [e["ms"][batch] for e in entries])
        hi = max([e["ms"][batch] for e in entries] + [row.get(k) or 0 for k, _ in REFERENCES])
        if math.isfinite(lo) and hi > 0:
            ax.set_xlim(lo / 1.6, hi * 2.5)
    axes[0][0].set_yticks(range(len(ladder)))
    axes[0][0].set_yticklabels([e["rung"].label for e in ladder], fontsize=7)
    axes[0][0].invert_yaxis()
    handles = [plt.Line2D([], [], color="0.3", ls=ls, lw=1, label=label)
               for (key, label), ls in zip(REFERENCES, styles)
               if any(r.get(key) is not None for r in decode.get("rows", []))]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    model = decode.get("model", "")
    fig.suptitle(f"one decode step of {model}, one change at a time ({decode.get('gpu', '')})",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


#: attention kernels compared, in plain words (keys of attention-<date>.json rows' "us")
KERNELS = {"article": "article's kernel", "fast": "fast kernel", "triton": "Triton kernel",
           "sdpa": "torch SDPA, contiguous K/V (no block table)"}


def attention_rows(attn: dict) -> list[dict]:
    """{'batch', 'context', 'floor_us', 'us': {kernel: us}, 'pct': {kernel: % of copy speed}}
    for every (batch, context) of the file, with only the kernels it timed there."""
    out = []
    for r in attn.get("rows", []):
        us = {k: r["us"][k] for k in KERNELS if r.get("us", {}).get(k) is not None}
        pct = {k: 100 * r["floor_us"] / v for k, v in us.items() if v}
        out.append({"batch": r["batch"], "context": r["context"], "floor_us": r["floor_us"],
                    "us": us, "pct": pct})
    return out


def plot_attention(attn: dict):
    """Share of the copy bandwidth each attention kernel reaches, per (batch, context): 100 %
    would read the K/V bytes at the speed of a plain device copy.  Kernels not timed at a point
    have no bar there."""
    import matplotlib.pyplot as plt

    rows = attention_rows(attn)
    kernels = [k for k in KERNELS if any(k in r["pct"] for r in rows)]
    fig, ax = plt.subplots(figsize=(8.4, 3.4), dpi=FIG_DPI)
    width = 0.8 / max(len(kernels), 1)
    colors = plt.get_cmap("tab10")
    for j, k in enumerate(kernels):
        xs = [i + (j - (len(kernels) - 1) / 2) * width for i, r in enumerate(rows) if k in r["pct"]]
        ys = [r["pct"][k] for r in rows if k in r["pct"]]
        ax.bar(xs, ys, width=width, color=colors(j), label=KERNELS[k])
        if k == "article":                     # too small to see: say it
            for x, y in zip(xs, ys):
                ax.text(x, y + 1.5, f"{y:.1f}%", ha="center", fontsize=6, color=colors(j))
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"batch {r['batch']}\n{r['context']} tokens" for r in rows], fontsize=7)
    ax.set_ylabel("% of copy bandwidth", fontsize=8)
    ax.axhline(100, color="0.4", lw=0.8, ls="--")
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    ax.set_title(f"decode attention alone, one layer ({attn.get('gpu', '')}): higher is faster",
                 fontsize=9)
    fig.tight_layout()
    return fig


def load_width_comparison(attn: dict, batch: int = 64, context: int = 2048) -> dict | None:
    """{'8-byte loads': us, '16-byte loads': us} for the fast kernel at (batch, context): the
    fastest timed variant of each load width, without splitting the sequence.  The attention
    benchmark names its variants ``fast narrow-...`` (8-byte loads) and ``fast wide-...``
    (16-byte loads); None when the file has no such pair."""
    row = next((r for r in attn.get("rows", []) if (r["batch"], r["context"]) == (batch, context)),
               None)
    if row is None:
        return None
    best = {}
    for name, us in row.get("us", {}).items():
        parts = name.split()
        if len(parts) < 2 or parts[0] != "fast" or us is None:
            continue
        width = "8-byte loads" if parts[1].startswith("narrow") else \
            "16-byte loads" if parts[1].startswith("wide") else None
        unsplit = parts[-1] == "s1" if len(parts) > 3 else True
        if width and unsplit:
            best[width] = min(best.get(width, math.inf), us)
    if len(best) < 2:
        return None
    return {"8-byte loads": best["8-byte loads"], "16-byte loads": best["16-byte loads"],
            "floor_us": row["floor_us"]}


def profile_rows(profile: dict, step: str, top: int = 8) -> list[dict]:
    """The ``top`` kernels of one profiled step (e.g. "decode_graph_b1") by total GPU time, plus
    one row for the rest: {'name', 'calls', 'total_us'}."""
    entry = profile.get(step) or {}
    kernels = sorted(entry.get("by_kernel", []), key=lambda k: -k.get("total_us", 0))
    rows = [{"name": _short_kernel(k["name"]), "calls": k.get("calls"),
             "total_us": k.get("total_us", 0.0)} for k in kernels[:top]]
    rest = sum(k.get("total_us", 0.0) for k in kernels[top:]) + entry.get("other_kernels_us", 0)
    if rest:
        rows.append({"name": "everything else", "calls": None, "total_us": rest})
    return rows


def _short_kernel(name: str) -> str:
    name = name.replace("numba:", "")
    if name.startswith("nvjet") or "gemm" in name.lower() or "cutlass" in name.lower():
        return "cuBLAS matmul"
    if "Memcpy" in name:
        return name.split("(")[0].strip()
    if "::" in name or "<" in name:
        return "torch: " + name.split("<")[0].split("(")[0].split("::")[-1][:40]
    return name[:48]


def plot_profile(profile: dict, steps=("decode_graph_b1", "decode_graph_b64")):
    """Where one decode step's GPU time goes, kernel by kernel (top kernels, merged by name)."""
    import matplotlib.pyplot as plt

    present = [s for s in steps if profile.get(s)]
    fig, axes = plt.subplots(1, max(len(present), 1), figsize=(4.6 * max(len(present), 1), 3.4),
                             dpi=FIG_DPI, squeeze=False)
    for ax, step in zip(axes[0], present):
        merged: dict = {}
        for r in profile_rows(profile, step, top=50):
            merged[r["name"]] = merged.get(r["name"], 0.0) + r["total_us"]
        names = sorted(merged, key=lambda n: -merged[n])[:8]
        ax.barh(range(len(names)), [merged[n] for n in names], color="tab:blue")
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=7)
        ax.invert_yaxis()
        entry = profile[step]
        ax.set_xlabel("microseconds of GPU time in one step", fontsize=8)
        ax.set_title(f"{step.replace('decode_graph_b', 'decode step, batch ')}: "
                     f"{entry.get('kernels', '?')} kernels, {entry.get('kernel_ms', 0):.2f} ms",
                     fontsize=8)
    fig.tight_layout()
    return fig
