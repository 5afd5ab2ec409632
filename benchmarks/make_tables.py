"""Markdown tables and plots from the committed GPU results (runs anywhere, no GPU):

    python benchmarks/make_tables.py [--results benchmarks/results] [--no-plots] [--doc docs/measured.md]

Reads the newest ``cpu-generate-*.json`` (``cpu_generate.py``), ``decode-*.json``,
``attention-*.json``, ``kernels-*.json``, ``profile-*.json`` and ``gpu-tests-*.json`` (written
on the GPU by ``decode.py``, ``attention.py``, ``kernel_speeds.py``, ``profile_step.py`` and
``gpu_tests.py``, all run by ``gpu_all.sh``), prints the
tables, draws ``decode-<date>.png`` and ``attention-<date>.png`` beside them, and with
``--doc`` rewrites that page's block between ``<!-- benchmarks:start -->`` and
``<!-- benchmarks:end -->`` (``docs/measured.md`` holds the measured tables).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paged_tutorial.teaching import results
from paged_tutorial.teaching.results import dated_files

RESULTS = Path(__file__).resolve().parent / "results"


def newest(folder: Path, stem: str) -> dict | None:
    """The newest ``<stem>-<date>.json`` (not ``<stem>-rerun-<date>.json``: results.py's rule)."""
    files = dated_files(stem, folder)
    return json.loads(files[-1][1].read_text()) if files else None


def newest_name(folder: Path, stem: str) -> str | None:
    """The file name ``newest`` reads for ``stem``, or None."""
    files = dated_files(stem, folder)
    return files[-1][1].name if files else None


def prefill_run(folder: Path) -> tuple[dict, str] | None:
    """Where the prefill attention line comes from when the newest attention run skipped it:
    the newest run that has it (None when the newest has it, or none does)."""
    a = newest(folder, "attention")
    if a is None or a.get("prefill"):
        return None
    older = results.newest("attention", folder=folder, holding="prefill")
    return (older.data, older.path.name) if older.found else None


def sources_line(folder: Path) -> str:
    """Which committed files the tables below were made from (so the page cannot name others),
    an older attention run that gave the prefill line included."""
    older = prefill_run(folder)
    names = [newest_name(folder, stem) for stem in SOURCES] + ([older[1]] if older else [])
    return "Made from: " + ", ".join(f"`{n}`" for n in names if n) + \
        " (`python benchmarks/make_tables.py --doc docs/measured.md`)."


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def decode_table(d: dict) -> str:
    out = [f"Decode, Llama-3.2-1B shapes (random bf16 weights), {d['prompt_len']}-token prompts, "
           f"{d['new_tokens']} new tokens, greedy; {d['gpu']}, {d['date']}.  ms per decode step "
           "(median), lower is better.", "",
           "| batch | ours (engine, CUDA graphs) | ours, GPU only | ours without graphs | "
           "HF static cache | HF eager | floor | HF / ours | ours / floor |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        ours = r.get("engine_ms_per_step")
        static, eager = r.get("hf_static_ms_per_step"), r.get("hf_eager_ms_per_step")
        hf, which = (static, "static") if static else (eager, "eager")
        ratio = f"{fmt(hf / ours, 2)}x ({which})" if ours and hf else "-"
        out.append(f"| {r['batch']} | {fmt(ours)} | {fmt(r.get('engine_gpu_ms_per_step'))} | "
                   f"{fmt(r.get('engine_fast_no_graphs_ms_per_step'))} | "
                   f"{fmt(static)} | {fmt(eager, 1)} | "
                   f"{fmt(r['floor_ms_per_step'])} | {ratio} | "
                   f"{fmt(ours / r['floor_ms_per_step'] if ours else None, 2)}x |")
    out += ["", "What each step bought (ms per decode step, whole engine):", "",
            "| batch | article kernel, no graphs | fast kernel, no graphs | article kernel + "
            "CUDA graphs | fast kernel + CUDA graphs (default) | Triton kernel + CUDA graphs |",
            "|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        out.append(f"| {r['batch']} | {fmt(r.get('engine_article_no_graphs_ms_per_step'), 1)} | "
                   f"{fmt(r.get('engine_fast_no_graphs_ms_per_step'), 1)} | "
                   f"{fmt(r.get('engine_article_graphs_ms_per_step'))} | "
                   f"{fmt(r.get('engine_ms_per_step'))} | "
                   f"{fmt(r.get('engine_triton_graphs_ms_per_step'))} |")
    p = d.get("prefill")
    if p:
        path = {"varlen": "one variable-length FlashAttention call per layer",
                "per-sequence": "one SDPA call per sequence and layer"}.get(
                    p.get("attention_path"), p.get("attention_path") or "SDPA")
        out += ["", f"Prefill of 2 x 1024-token prompts (one engine step): {p['engine_ms']:.1f} ms "
                f"= {p['engine_tflops']:.0f} TFLOP/s = {p['engine_pct_of_matmul_rate']:.0f}% of "
                f"the bf16 matmul rate measured in the same run "
                f"({d['ceilings']['bf16_matmul_tflops']:.0f} TFLOP/s); forward pass alone "
                f"{p['forward_ms']:.1f} ms; HF forward {fmt(p.get('hf_forward_ms'), 1)} ms; "
                f"attention: {path}."]
    c = d.get("correctness")
    if c:
        out += ["", f"Checked first: logits vs HF teacher-forced on our greedy tokens "
                f"{c['rel_err_vs_hf_teacher_forced']:.3f} (the article's kernel: "
                f"{c['article_kernel_rel_err_vs_hf']:.3f}); CUDA graphs vs eager "
                f"{c['graphs_vs_eager_max_rel_err']:.1e}."]
    return "\n".join(out)


def _splits(batch, ctx, target, num_warps, n_kv=8, block_size=16, max_splits=32):
    """split_kv.choose_splits, for a given target (GPU branch)."""
    want = -(-target // max(1, batch * n_kv))
    return max(1, min(want, max(1, (ctx // block_size) // num_warps), max_splits))


def committed_entry(a: dict, r: dict) -> str | None:
    """The sweep entry that the committed defaults (the sweep's variant, TARGET_BLOCKS = 256)
    would launch for this case: benchmarks ran before the split target was lowered from 528."""
    best = a.get("best_variant")
    if not best:
        return None
    nw, b, ctx = best["num_warps"], r["batch"], r["context"]
    now, then = _splits(b, ctx, 256, nw), _splits(b, ctx, 528, nw)
    key = f"fast {best['name']} s{'auto' if now == then else now}"
    return key if key in r["us"] else None


#: FlashInfer's batch decode, where the run had it (``measure/flashinfer_peer.py``)
FLASHINFER_COLUMNS = {"flashinfer": "FlashInfer", "flashinfer-tc": "FlashInfer, tensor cores"}


def attention_table(a: dict, prefill_run: tuple[dict, str] | None = None) -> str:
    """The decode attention table of run ``a``, and the prefill attention of ``a`` or, when
    ``a`` skipped it, of ``prefill_run`` (an older run, named with its card and date)."""
    bw = a["ceilings"]["copy_bandwidth_gbs"]
    flashinfer = any(k in r["us"] for r in a["rows"] for k in FLASHINFER_COLUMNS)
    tensor_core = any("tensor_core" in r["us"] for r in a["rows"])
    columns = ["batch", "context", "ours (Numba, defaults of the run)",
               *(["ours, tensor cores (the engine's from batch 16)"] if tensor_core else []),
               "ours, committed defaults (sweep)", "Triton",
               *(FLASHINFER_COLUMNS.values() if flashinfer else ()),
               "torch SDPA, contiguous K/V", "article kernel", "floor"]
    best = a.get("best_variant", {}).get("name")
    out = [f"Paged decode attention, 32 query / 8 KV heads, head_dim 64, BLOCK_SIZE 16, bf16; "
           f"{a['gpu']}, {a['date']}; copy bandwidth {bw:.0f} GB/s.  Microseconds per call "
           "(median of CUDA-graph replays), and % of the copy bandwidth for the K/V bytes.", "",
           "| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
    for r in a["rows"]:
        us, pct = r["us"], r["pct_of_copy_bw"]
        bk = committed_entry(a, r)

        def cell(k):
            return f"{us[k]:.1f} ({pct[k]:.0f}%)" if k in us else "-"

        peers = "".join(f"{cell(k)} | " for k in FLASHINFER_COLUMNS) if flashinfer else ""
        tc = f"{cell('tensor_core')} | " if tensor_core else ""
        out.append(f"| {r['batch']} | {r['context']} | {cell('fast')} | {tc}"
                   f"{cell(bk) if bk else '-'} | {cell('triton')} | {peers}{cell('sdpa')} | "
                   f"{cell('article')} | {r['floor_us']:.1f} |")
    not_run = {k: v for r in a["rows"] for k, v in r.get("not_run", {}).items()}
    if not_run:
        out += ["", "Not run: " + "; ".join(f"{k}: {v}" for k, v in not_run.items()) + "."]
    p, where = a.get("prefill"), ""
    if not p and prefill_run:
        older, name = prefill_run
        p, where = older["prefill"], f" (`{name}`: {older['gpu']}, {older['date']})"
    if p:
        names = {"numba": "Numba kernel", "varlen": "one varlen flash call (the GPU default)",
                 "sdpa_per_sequence": "SDPA per sequence", "sdpa": "torch SDPA (flash)"}
        out += ["", f"Prefill attention, 2 x 1024 tokens, one layer{where}: " + ", ".join(
            f"{names.get(k, k)} {us:.0f} us ({p['tflops'][k]:.1f} TFLOP/s)"
            for k, us in p["us"].items()) + "."]
    if best:
        knobs = {k: v for k, v in a["best_variant"].items() if k not in ("name", "geomean_us")}
        out += ["", f"Fast-kernel variant chosen by the sweep and committed as the default: "
                f"`{best}` ({json.dumps(knobs)}); splits per sequence = "
                "ceil(256 / (batch x 8 KV heads)), capped.  The "
                "'defaults of the run' column is the previous default (`wide-g8u1l2`, 4 warps, "
                "target 528 blocks)."]
    return "\n".join(out)


def kernels_table(k: dict) -> str:
    bw = k["ceilings"]["copy_bandwidth_gbs"]
    out = [f"Small kernels, Llama-3.2-1B shapes, bf16; {k['gpu']}, {k['date']}; copy bandwidth "
           f"{bw:.0f} GB/s.  Microseconds per call (median of CUDA-graph replays), % of the copy "
           "bandwidth for the bytes the op must move.", "",
           "| op | tokens | floor | ours (16-byte kernels) | scalar kernel (before) | torch |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in k.get("small_ops", []):
        us, pct = r["us"], r["pct_of_copy_bw"]

        def cell(name):
            return f"{us[name]:.1f} ({pct[name]:.0f}%)" if name in us else "-"

        out.append(f"| {r['op']} | {r['tokens']} | {r['floor_us']:.1f} | {cell('ours')} | "
                   f"{cell('scalar_kernel')} | {cell('torch') if 'torch' in us else cell('torch_argmax')} |")
    if k.get("gemv"):
        out += ["", f"Decode GEMV (one token row) against cuBLAS, microseconds per call; the "
                f"engine uses the GEMV up to {k.get('gemv_max_rows', '?')} row(s):", "",
                "| matrix | N x K | tokens | ours | cuBLAS | floor |", "|---|---|---:|---:|---:|---:|"]
        for r in k["gemv"]:
            out.append(f"| {r['matrix']} | {r['shape'][0]} x {r['shape'][1]} | {r['tokens']} | "
                       f"{r['us']['ours']:.1f} | {r['us']['cublas']:.1f} | {r['floor_us']:.1f} |")
    if k.get("attention_short"):
        out += ["", "Decode attention at short contexts over warps per block (w) and splits (s), "
                "microseconds:", "", "| batch | context | best | 8 warps, auto splits | "
                "4 warps, auto splits | floor |", "|---:|---:|---|---:|---:|---:|"]
        for r in k["attention_short"]:
            us = r["us"]
            out.append(f"| {r['batch']} | {r['context']} | {r['best']} {us[r['best']]:.1f} | "
                       f"{fmt(us.get('w8 sauto'), 1)} | {fmt(us.get('w4 sauto'), 1)} | "
                       f"{r['floor_us']:.1f} |")
    return "\n".join(out)


def short_kernel_name(name: str) -> str:
    """``numba:gemv`` for our kernels (profile_step.py's names, or the profiler's demangled
    ones), cuBLAS / torch kernel names cut short."""
    if "paged_tutorial::" in name:
        name = "numba:" + name.split("[abi")[0].split("(")[0].split("::")[-1]
    if name.startswith("void "):
        name = name[5:]
    return name.split("<")[0][:40]


def profile_table(p: dict, top: int = 8) -> str:
    out = [f"Where a step's time goes (torch.profiler, one step; {p['gpu']}, {p['date']}):", "",
           "| step | wall ms | kernel ms | kernels | largest kernels (us in the step) |",
           "|---|---:|---:|---:|---|"]
    for name in ("decode_graph_b1", "decode_graph_b64", "decode_eager_b1", "prefill_2x1024"):
        r = p.get(name)
        if not r or "error" in r:
            continue
        largest = "; ".join(f"{short_kernel_name(k['name'])} {k['total_us']:.0f}"
                            for k in r["by_kernel"][:top])
        out.append(f"| {name} | {r['wall_ms']:.2f} | {r['kernel_ms']:.2f} | {r['kernels']} | "
                   f"{largest} |")
    h = p.get("host")
    if h and "error" not in h:
        modes = [m for m in ("ctypes", "raw", "core", "numba") if f"rms_norm_{m}_us" in h]
        out += ["", "Host time per small op (rms_norm, one row), by launch path: " + ", ".join(
            f"{m} {h[f'rms_norm_{m}_us']:.0f} us" for m in modes) +
            f"; torch.empty {h['torch_empty_us']:.1f} us, torch linear {h['torch_linear_us']:.0f} us."]
    return "\n".join(out)


def tests_line(t: dict, rerun: dict | None = None) -> str:
    c = t["counts"]
    nb = [n["notebook"].split("/")[-1] for n in t["could_not_run_here"]["notebooks"]]
    fails = ", ".join(f["test"] for f in t["failures"]) or "none"
    cut = "" if t.get("finished_within_limit", True) else \
        (f" The process reached its {t['seconds']:.0f} s limit and was stopped there; the counts"
         " are the results it had recorded by then.")
    missing = ""
    if c["needs_missing_model"] or nb:
        missing = (f"; {c['needs_missing_model']} tests and the notebooks {', '.join(nb) or '-'} "
                   f"could not run there "
                   f"({t['could_not_run_here']['tests_needing_the_model_file']['reason']})")
    line = (f"GPU test run ({t['gpu']}, {t['date']}, `{t['command']}`): {c['passed']} passed, "
            f"{c['failed']} failed, {c['errors']} errors, {c['skipped']} skipped{missing}. "
            f"Failures: {fails}.{cut}")
    if rerun is not None:
        r = rerun["counts"]
        line += (f" A second run after fixes ({rerun['date']}, `{rerun['command']}`): "
                 f"{r['passed']} passed, {r['failed']} failed, {r['errors']} errors, "
                 f"{r['skipped']} skipped"
                 + ("" if rerun.get("finished_within_limit", True) else ", cut by its limit")
                 + ".")
    return line


def plot_decode(d: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("engine_article_no_graphs_ms_per_step", "article kernel, no graphs"),
            ("hf_eager_ms_per_step", "HF eager"),
            ("hf_static_ms_per_step", "HF static cache"),
            ("engine_article_graphs_ms_per_step", "article kernel + graphs"),
            ("engine_ms_per_step", "ours (fast + graphs)"),
            ("floor_ms_per_step", "weight + KV read floor")]
    fig, axes = plt.subplots(1, len(d["rows"]), figsize=(5 * len(d["rows"]), 3.6))
    for ax, r in zip(axes if len(d["rows"]) > 1 else [axes], d["rows"]):
        names = [n for k, n in keys if r.get(k) is not None]
        vals = [r[k] for k, n in keys if r.get(k) is not None]
        ax.barh(names, vals, color=["#bbb"] * (len(vals) - 2) + ["#2a7", "#555"])
        ax.set_xscale("log")
        ax.set_xlabel("ms per decode step (log)")
        ax.set_title(f"batch {r['batch']}")
        for y, v in enumerate(vals):
            ax.text(v, y, f" {v:.2f}", va="center", fontsize=8)
    fig.suptitle(f"Llama-3.2-1B decode, {d['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention(a: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    labels = [f"B{r['batch']}\nctx{r['context']}" for r in a["rows"]]
    x = range(len(labels))
    for k, name in (("fast", "ours (Numba)"), ("triton", "Triton"),
                    ("sdpa", "SDPA, contiguous K/V")):
        ax.plot(x, [r["pct_of_copy_bw"].get(k) for r in a["rows"]], marker="o", label=name)
    ax.axhline(70, color="#c33", lw=0.8, ls="--", label="70% target")
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("% of copy bandwidth")
    ax.set_title(f"Paged decode attention, {a['gpu']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cpu_table(c: dict) -> str:
    if "phase" in c["rows"][0]:
        return cpu_threads_table(c)
    out = [f"CPU, {c['model']}, greedy, {len(c['prompts'])} chat prompts x "
           f"{c['new_tokens_per_prompt']} new tokens; {c['machine']}, torch {c['torch']}, "
           f"{c['date']}.  Seconds for the whole run, the median of {c.get('repeats', 1)} "
           "(lower is better).", "",
           "| ours: slots | ours (torch backend) | HF generate, one prompt at a time | "
           "ours / HF | same tokens as HF |", "|---:|---:|---:|---:|---|"]
    for r in c["rows"]:
        ours = r.get("ours_median_s", r["ours_s"])       # repeated runs keep their medians
        hf = r.get("hf_median_s", r["hf_s"])
        out.append(f"| {r['max_slots']} | {ours:.1f} s | {hf:.1f} s | "
                   f"{r['ratio_ours_over_hf']:.2f}x | {all(r['same_tokens_as_hf'])} |")
    return "\n".join(out)


def cpu_threads_table(c: dict) -> str:
    """The run that times every thread count, idle and beside a busy process."""
    out = [f"CPU, {c['model']}, greedy, {len(c['prompts'])} chat prompts x "
           f"{c['new_tokens_per_prompt']} new tokens; {c['machine']}, torch {c['torch']}, "
           f"{c['date']}; loaded: {c['loaded']}; load average at each phase's start "
           f"{c['load_average_1_5_15_min_at_each_phase_start']}.  Seconds for the whole run, "
           f"the median of {c['repeats']} (lower is better); HF at its best thread count.", "",
           "| machine | ours: slots | ours, threads chosen by the package | ours at its best "
           "count | default / best (target <= 1.25) | HF generate | ours / HF (target) | "
           "same tokens as HF |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in c["rows"]:
        out.append(f"| {r['phase']} | {r['max_slots']} | {r['ours_median_s']:.1f} s | "
                   f"{r['ours_best_median_s']:.1f} s ({r['ours_best_threads']}) | "
                   f"{r['ratio_default_over_best_threads']:.2f}x | {r['hf_median_s']:.1f} s "
                   f"({r['hf_best_threads']}) | {r['ratio_ours_over_hf']:.2f}x "
                   f"(<= {r['target_ours_over_hf']}) | {all(r['same_tokens_as_hf'])} |")
    return "\n".join(out)


START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"
#: the result files the tables are made from, newest of each
SOURCES = ("cpu-generate", "decode", "attention", "kernels", "profile", "gpu-tests")


def write_doc(doc: Path, text: str) -> None:
    body = doc.read_text()
    if START not in body or END not in body:
        raise SystemExit(f"{doc} has no {START} ... {END} block to rewrite")
    head, rest = body.split(START, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--doc", default=None,
                   help="rewrite this page's benchmarks block (docs/measured.md)")
    args = p.parse_args(argv)
    folder = Path(args.results)
    c = newest(folder, "cpu-generate")
    d, a = newest(folder, "decode"), newest(folder, "attention")
    k, prof, t = newest(folder, "kernels"), newest(folder, "profile"), newest(folder, "gpu-tests")
    if c is None and d is None and a is None:
        print(f"no cpu-generate-, decode- or attention-*.json in {folder}", file=sys.stderr)
        return 1
    parts = [sources_line(folder)]
    if c:
        parts.append(cpu_table(c))
    if d:
        parts.append(decode_table(d))
        if not args.no_plots:
            plot_decode(d, folder / f"decode-{d['date']}.png")
    if a:
        parts.append(attention_table(a, prefill_run(folder)))
        if not args.no_plots:
            plot_attention(a, folder / f"attention-{a['date']}.png")
    if k:
        parts.append(kernels_table(k))
    if prof:
        parts.append(profile_table(prof))
    if t:
        rerun = newest(folder, "gpu-tests-rerun")
        parts.append(tests_line(t, rerun if rerun and rerun["date"] >= t["date"] else None))
    text = "\n\n".join(parts)
    print(text)
    if args.doc:
        write_doc(Path(args.doc), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
