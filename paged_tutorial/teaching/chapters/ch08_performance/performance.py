"""Chapter 08 (performance): the committed GPU measurements in plain words and figures.

The JSON files are written by ``benchmarks/decode.py``, ``benchmarks/attention.py`` and
``benchmarks/profile_step.py`` on a GPU; ``results.newest`` finds the newest of each.  A newer run
may time fewer variants (or name new ones): every function here draws or lists what the file has
and says what it does not, never a table cell of ``nan``.

- ``newest_ladder_run``: the newest decode file that times the ladder (``decode-<date>.json``
  or ``decode-fusions-<date>.json``);
- ``decode_ladder``: the decode step, one change at a time (the *ladder*), each rung with what
  it bought against the rung before; ``describe_rung`` says it in words;
- ``reference_lines``: the floor, and the step times at the megakernel's 78 % and the vLLM
  class's 50 % of the bandwidth (the shares Hazy Research reports for Llama-3.2-1B at batch 1
  on an H100), measured against this run's floor;
- ``plot_rung``: one figure per rung (the rung before and this one, per batch size), and
  ``plot_decode_ladder`` the whole ladder with what was timed beside it; both draw a run of the
  reader's GPU (``decode_on_your_gpu``) as a second row;
- ``attention_rows`` / ``plot_attention``: the attention kernels alone, as a share of the copy
  bandwidth;
- ``load_width_comparison``: the same fast kernel with 8-byte and with 16-byte loads;
- ``profile_rows`` / ``plot_profile``: where one decode step's GPU time goes, kernel by kernel;
  ``profile_groups`` the same by what the kernels do, against their part of the floor.

matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

from paged_tutorial.teaching.results import (RESULTS_SUBDIR, Measured, dated_files, newest,
                                             results_dir)

__all__ = ["Rung", "LADDER", "COMPARISONS", "REFERENCES", "newest_ladder_run", "has_ladder",
           "decode_ladder", "missing_rungs", "comparisons", "reference_lines",
           "bandwidth_share", "step_label", "describe_rung", "plot_rung", "plot_decode_ladder",
           "profile_groups",
           "attention_rows", "plot_attention", "KERNELS", "load_width_comparison",
           "profile_rows", "plot_profile"]

FIG_DPI = 80


@dataclass(frozen=True)
class Rung:
    key: str                 # the per-step milliseconds key in decode-<date>.json rows
    label: str               # what runs, in plain words
    change: str              # what this rung changes from the one before


#: the decode step, one change at a time, each rung with everything above it: the ladder
LADDER = (
    Rung("engine_fast_no_graphs_ms_per_step",
         "launched from Python",
         "every kernel of the step launched one at a time by the Python host"),
    Rung("engine_graphs_separate_mlp_no_overlap_ms_per_step",
         "CUDA graph",
         "the step recorded once and replayed as one CUDA graph: no Python between kernels "
         "(RoPE with the cache write and SwiGLU kernels of their own, each kernel starting "
         "after the last one ended)"),
    Rung("engine_graphs_no_overlap_ms_per_step",
         "+ RoPE and SwiGLU in the GEMVs",
         "the QKV GEMV rotates and writes the cache, the gate/up GEMV applies SwiGLU, before "
         "they store: two launches fewer per layer, and the intermediates never go to memory "
         "and back"),
    Rung("engine_ms_per_step",
         "+ overlapped launches (the engine)",
         "each kernel's blocks start under the previous kernel's tail (programmatic dependent "
         "launch): the engine as a user gets it"),
)
#: measured beside the ladder: other kernels in the same engine, and other engines
COMPARISONS = (
    Rung("engine_article_no_graphs_ms_per_step", "article's kernel, launched from Python",
         "the article's attention kernel in place of the fast one, launched from Python"),
    Rung("engine_article_graphs_ms_per_step", "article's kernel, in the engine",
         "the article's attention kernel in place of the fast one, everything else as shipped"),
    Rung("engine_triton_graphs_ms_per_step", "Triton kernel, in the engine",
         "a Triton attention kernel in place of the fast one"),
    Rung("engine_sync_scheduling_graphs_ms_per_step", "the engine, steps not launched ahead",
         "each decode step read back and committed before the next is launched (without "
         "asynchronous scheduling): the GPU waits for the host between steps"),
    Rung("engine_fast_attention_graphs_ms_per_step", "the engine, no tensor-core attention",
         "the CUDA-core attention kernel at every batch, where the engine takes the "
         "tensor-core one from 16 sequences on"),
    Rung("hf_eager_ms_per_step", "HF transformers, eager",
         "Hugging Face transformers' generate on the same weights"),
    Rung("hf_static_ms_per_step", "HF transformers, static cache (compiled)",
         "the same with cache_implementation='static' (its decode step compiled)"),
)
#: bandwidth shares drawn as reference lines: (share of the floor's speed, label)
MEGAKERNEL_SHARE = 0.78
VLLM_CLASS_SHARE = 0.50
REFERENCES = (
    (1.0, "floor: the step's bytes at copy speed"),
    (MEGAKERNEL_SHARE, "78 %: Hazy Research's megakernel (H100)"),
    (VLLM_CLASS_SHARE, "50 %: vLLM / SGLang class (H100)"),
)
#: the run names whose files hold decode rows (``decode.py`` and its fusion-ladder run)
DECODE_RUNS = ("decode", "decode-fusions")
DECODE_COMMAND = "python benchmarks/decode.py"


def has_ladder(decode: dict) -> bool:
    """Whether a decode file times the rungs between the launches from Python and the engine."""
    rows = decode.get("rows", []) if isinstance(decode, dict) else []
    return any(r.get(rung.key) is not None for r in rows for rung in LADDER[1:-1])


def newest_ladder_run(folder=None) -> Measured:
    """The decode run the notebook reads: the newest committed file that times the ladder
    (``decode-<date>.json`` or ``decode-fusions-<date>.json``; on one date the full run wins),
    else the newest decode run of either name, else ``results.newest``'s message saying
    none is committed."""
    import json
    from pathlib import Path

    try:
        folder = Path(folder) if folder is not None else results_dir()
    except FileNotFoundError:
        return newest("decode", how_to_make=DECODE_COMMAND)
    best = None
    for name in DECODE_RUNS:
        for date, path in dated_files(name, folder):
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("dry_run"):
                continue
            rank = (has_ladder(data), date, name == "decode")
            if best is None or rank > best[0]:
                where = f" on {data['gpu']}" if data.get("gpu") else ""
                best = (rank, Measured(name, path, data,
                                       f"{RESULTS_SUBDIR / path.name}: measured{where}, {date}"))
    return best[1] if best else newest("decode", how_to_make=DECODE_COMMAND, folder=folder)


def _rows(decode: dict | None) -> dict:
    return {r["batch"]: r for r in (decode or {}).get("rows", [])}


def _gpu_key(key: str) -> str:
    return key.replace("_ms_per_step", "_gpu_ms_per_step")


def decode_ladder(decode: dict) -> list[dict]:
    """One entry per rung the file has, in ladder order: {'rung', 'ms': {batch: ms per step},
    'gpu_ms': {batch: the graph replay's GPU time, where timed}, 'before': {batch: (the rung
    before's label, its ms)}, 'saved_ms': {batch: ms}, 'change_pct': {batch: %}}.  A rung is
    compared with the nearest rung above it timed at that batch size; the first has none."""
    rows = _rows(decode)
    out, last = [], {}
    for rung in LADDER:
        ms = {b: r[rung.key] for b, r in rows.items() if r.get(rung.key) is not None}
        if not ms:
            continue
        entry = {"rung": rung, "ms": ms,
                 "gpu_ms": {b: rows[b][_gpu_key(rung.key)] for b in ms
                            if rows[b].get(_gpu_key(rung.key)) is not None},
                 "before": {b: last[b] for b in ms if b in last}}
        entry["saved_ms"] = {b: before[1] - ms[b] for b, before in entry["before"].items()}
        entry["change_pct"] = {b: 100 * (ms[b] - before[1]) / before[1]
                               for b, before in entry["before"].items()}
        for b in ms:
            last[b] = (rung.label, ms[b])
        out.append(entry)
    return out


def missing_rungs(decode: dict) -> list[str]:
    have = {entry["rung"].key for entry in decode_ladder(decode)}
    return [rung.label for rung in LADDER if rung.key not in have]


def comparisons(decode: dict) -> list[dict]:
    """{'rung', 'ms': {batch: ms}} for every comparison the file timed."""
    rows = _rows(decode)
    out = []
    for rung in COMPARISONS:
        ms = {b: r[rung.key] for b, r in rows.items() if r.get(rung.key) is not None}
        if ms:
            out.append({"rung": rung, "ms": ms})
    return out


def reference_lines(row: dict) -> list[tuple[float, str]]:
    """(ms per step, label) of the floor and of the steps that read the same bytes at the
    megakernel's and at the vLLM class's share of the bandwidth, for one row of the file."""
    floor = row.get("floor_ms_per_step")
    if floor is None:
        return []
    return [(floor / share, label) for share, label in REFERENCES]


def bandwidth_share(row: dict, key: str = "engine_ms_per_step") -> float | None:
    """The share of the copy bandwidth a step of ``key`` reaches: floor / its time."""
    if row.get(key) is None or row.get("floor_ms_per_step") is None:
        return None
    return row["floor_ms_per_step"] / row[key]


def step_label(entry: dict, batch: int) -> str:
    """The text on a rung's bar: its ms per step, and what it bought against the rung before
    (ms saved, % change of the step time)."""
    text = f"{entry['ms'][batch]:.2f} ms"
    if batch in entry["before"]:
        saved = entry["saved_ms"][batch]
        text += f"\n{-saved:+.2f} ms ({entry['change_pct'][batch]:+.1f} %)"
    return text


def describe_rung(decode: dict, key: str) -> str:
    """The rung ``key`` (a ``LADDER`` key) in words: what it changes and, per batch size, what
    it bought; or that the file did not time it."""
    entry = next((e for e in decode_ladder(decode) if e["rung"].key == key), None)
    rung = next(r for r in LADDER if r.key == key)
    if entry is None:
        return f"{rung.label}: not timed in this run"
    ladder = decode_ladder(decode)
    before_gpu = {}
    for e in ladder[:ladder.index(entry)]:
        before_gpu.update(e["gpu_ms"])
        before_gpu.update({b: None for b in e["ms"] if b not in e["gpu_ms"]})
    lines = [f"{rung.label}: {rung.change}"]
    for b in sorted(entry["ms"]):
        line = f"  batch {b:>2}: {entry['ms'][b]:.2f} ms per step"
        if b in entry["before"]:
            saved = entry["saved_ms"][b]
            line += (f", {abs(saved):.2f} ms {'saved' if saved >= 0 else 'lost'} against "
                     f"'{entry['before'][b][0]}' ({entry['change_pct'][b]:+.1f} %)")
        if b in entry["gpu_ms"]:
            line += f"; on the GPU {entry['gpu_ms'][b]:.2f} ms"
            if before_gpu.get(b) is not None:
                line += f" (was {before_gpu[b]:.2f})"
        lines.append(line)
    return "\n".join(lines)


def _machine(decode: dict) -> str:
    return decode.get("gpu", "") + (" (quick run)" if decode.get("quick") else "")


def _draw_rung(ax, decode: dict, key: str, batch: int, colors) -> None:
    """Two bars on ``ax``: the rung before ``key`` (grey) and ``key`` (coloured, labelled),
    with the reference lines of that batch's row."""
    ladder = decode_ladder(decode)
    entry = next((e for e in ladder if e["rung"].key == key and batch in e["ms"]), None)
    row = _rows(decode).get(batch, {})
    if entry is None:
        ax.text(0.5, 0.5, "not timed", transform=ax.transAxes, ha="center", fontsize=8)
        ax.set_xticks([])
        return
    index = [r.key for r in LADDER].index(key)
    before = next((e for e in reversed(ladder[:ladder.index(entry)]) if batch in e["ms"]), None)
    bars = []                                   # (label, ms, GPU ms or None, colour, text)
    if before is not None:
        bars.append((before["rung"].label, before["ms"][batch], before["gpu_ms"].get(batch),
                     "0.75", None))
    bars.append((entry["rung"].label, entry["ms"][batch], entry["gpu_ms"].get(batch),
                 colors(index), step_label(entry, batch)))
    for x, (label, ms, gpu_ms, color, text) in enumerate(bars):
        ax.bar(x, ms, width=0.6, color=color)
        if text:
            ax.text(x, ms, text, ha="center", va="bottom", fontsize=7)
        if gpu_ms is not None:
            ax.plot([x - 0.3, x + 0.3], [gpu_ms] * 2, color="black", lw=1.2)
    styles = ("-", "--", ":")
    lines = reference_lines(row)
    top = max([bar[1] for bar in bars] + [ms for ms, _ in lines])
    text_y = -math.inf
    for (ms, label), ls in zip(lines, styles):            # lowest first: floor, 78 %, 50 %
        ax.axhline(ms, color="0.25", ls=ls, lw=0.9)
        text_y = max(ms, text_y + 0.07 * top)              # labels of close lines kept apart
        ax.text(1.01, text_y, f"{ms:.2f}", va="center", ha="left", fontsize=6, color="0.25",
                transform=ax.get_yaxis_transform())
    ax.set_ylim(0, top * 1.3)
    ax.set_xlim(-0.5, len(bars) - 0.5)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([textwrap.fill(bar[0], 16) for bar in bars], fontsize=7)
    ax.set_title(f"batch {batch}", fontsize=8)


def plot_rung(decode: dict, key: str, yours: dict | None = None):
    """One rung of the ladder as a figure: per batch size, the step time of the rung before
    (grey) and of this one (labelled with what it bought), against the floor and the steps the
    megakernel's 78 % and the vLLM class's 50 % of the bandwidth would take.  ``yours``: a run
    of the reader's GPU (same schema), drawn as a second row with its own floor and lines.
    The black tick on a bar is the graph replay's GPU time, where timed."""
    import matplotlib.pyplot as plt

    runs = [decode] + ([yours] if yours else [])
    batches = sorted(_rows(decode))
    fig, axes = plt.subplots(len(runs), len(batches), figsize=(3.3 * len(batches) + 0.8,
                                                              1.2 + 2.6 * len(runs)),
                             dpi=FIG_DPI, squeeze=False)
    colors = plt.get_cmap("tab10")
    for r, run in enumerate(runs):
        for c, batch in enumerate(batches):
            _draw_rung(axes[r][c], run, key, batch, colors)
        axes[r][0].set_ylabel(f"{_machine(run)}\nms per decode step", fontsize=7)
    rung = next(x for x in LADDER if x.key == key)
    handles = [plt.Line2D([], [], color="0.25", ls=ls, lw=0.9, label=label)
               for (_, label), ls in zip(REFERENCES, ("-", "--", ":"))]
    handles.append(plt.Line2D([], [], color="black", lw=1.2, label="the GPU's part"))
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=6, frameon=False)
    fig.suptitle(textwrap.fill(f"{rung.label}: {rung.change}", 110), fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 0.93))
    return fig


def plot_decode_ladder(decode: dict, yours: dict | None = None):
    """The whole ladder and what was measured beside it, as horizontal bars (ms per step, log
    scale), one panel per batch size (and a second row for ``yours``), with the floor and the
    78 % and 50 % bandwidth shares as reference lines."""
    import matplotlib.pyplot as plt

    runs = [decode] + ([yours] if yours else [])
    batches = sorted(_rows(decode))
    timed = {e["rung"].label for run in runs for e in decode_ladder(run) + comparisons(run)}
    names = [r.label for r in LADDER + COMPARISONS if r.label in timed]
    n_ladder = sum(r.label in timed for r in LADDER)
    fig, axes = plt.subplots(len(runs), len(batches),
                             figsize=(3.6 * len(batches) + 2.6,
                                      0.9 + 0.28 * len(names) * len(runs)),
                             dpi=FIG_DPI, sharey=True, squeeze=False)
    colors = plt.get_cmap("tab10")
    styles = ("-", "--", ":")
    for r, run in enumerate(runs):
        bars = {e["rung"].label: e["ms"] for e in decode_ladder(run) + comparisons(run)}
        for ax, batch in zip(axes[r], batches):
            row = _rows(run).get(batch, {})
            values = []
            for i, name in enumerate(names):
                ms = bars.get(name, {}).get(batch)
                if ms is None:
                    continue
                values.append(ms)
                ax.barh(i, ms, height=0.6, color=colors(i) if i < n_ladder else "0.7")
                ax.text(ms * 1.06, i, f"{ms:.2f}", va="center", fontsize=6)
            for (ms, _), ls in zip(reference_lines(row), styles):
                ax.axvline(ms, color="0.25", ls=ls, lw=0.9)
                values.append(ms)
            ax.set_xscale("log")
            if values:
                ax.set_xlim(min(values) / 1.5, max(values) * 2.2)
            else:
                ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center")
            ax.set_title(f"{_machine(run)}, batch {batch}", fontsize=8)
            ax.set_xlabel("ms per decode step (log scale)", fontsize=7)
    axes[0][0].set_yticks(range(len(names)))
    axes[0][0].set_yticklabels(names)
    axes[0][0].invert_yaxis()
    for ax in axes.flat:
        ax.tick_params(axis="y", labelsize=7)
    handles = [plt.Line2D([], [], color="0.25", ls=ls, lw=0.9, label=label)
               for (_, label), ls in zip(REFERENCES, styles)]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=6, frameon=False)
    fig.suptitle(f"one decode step of {decode.get('model', '')}: the ladder, then what was "
                 "timed beside it", fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    return fig


#: attention kernels compared, in plain words (keys of attention-<date>.json rows' "us")
KERNELS = {"article": "article's kernel", "fast": "fast kernel",
           "tensor_core": "tensor cores, our kernel on them (the engine's from batch 16)",
           "triton": "Triton kernel",
           "flashinfer": "FlashInfer, its batch decode on our cache",
           "flashinfer-tc": "FlashInfer-TC, the same on tensor cores",
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


#: the profile's kernels grouped by what they do: (group, test on the short kernel name)
PROFILE_GROUPS = (
    ("matrix products (weights)", lambda n: n in ("gemv", "cuBLAS matmul")
     or n.startswith("qkv_rope_write_kv") or "gemv" in n or "splitKreduce" in n),
    ("attention", lambda n: "attention" in n),
    ("RMSNorms", lambda n: "rms_norm" in n),
    ("SwiGLU", lambda n: "silu_mul" in n),
    ("RoPE + cache write", lambda n: "rope_write_kv" in n),
    ("sampling", lambda n: "sample" in n),
)


def profile_groups(profile: dict, step: str, row: dict | None = None) -> list[dict]:
    """One profiled step's GPU time by what the kernels do: {'group', 'calls', 'us',
    'floor_us', 'pct_of_floor'}, largest first, with "everything else" last.  With ``row``
    (the decode file's row at the step's batch size), the matrix products get the weight floor
    (every weight read once at copy speed) and attention the K/V part of the floor, so
    ``pct_of_floor`` says how close each runs to the bandwidth; the other groups move few
    bytes and have none."""
    entry = profile.get(step) or {}
    sums = {name: {"group": name, "calls": 0, "us": 0.0} for name, _ in PROFILE_GROUPS}
    rest = {"group": "everything else", "calls": 0, "us": entry.get("other_kernels_us", 0.0)}
    for k in entry.get("by_kernel", []):
        short = _short_kernel(k["name"])
        raw = k["name"].replace("numba:", "")
        target = next((sums[name] for name, test in PROFILE_GROUPS
                       if test(short) or test(raw)), rest)
        target["calls"] += k.get("calls") or 0
        target["us"] += k.get("total_us", 0.0)
    floors = {}
    if row and row.get("weight_floor_ms_per_step") is not None:
        floors["matrix products (weights)"] = 1e3 * row["weight_floor_ms_per_step"]
        if row.get("floor_ms_per_step") is not None:
            floors["attention"] = 1e3 * (row["floor_ms_per_step"] - row["weight_floor_ms_per_step"])
    out = []
    for g in sorted((g for g in sums.values() if g["us"]), key=lambda g: -g["us"]) + [rest]:
        if not g["us"] and g is rest:
            continue
        floor = floors.get(g["group"])
        out.append({**g, "floor_us": floor,
                    "pct_of_floor": 100 * floor / g["us"] if floor else None})
    return out
