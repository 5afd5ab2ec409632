"""CPU speed: our torch backend against HF ``generate`` on SmolLM2-135M, float32, greedy, with the
machine idle and with a busy process beside it, at every thread count.

    python benchmarks/cpu_generate.py [--repeats 3] [--new-tokens 32] [--threads 1 2]
                                      [--out FILE.json|DIR]

Three chat prompts x ``--new-tokens`` new tokens (EOS stops neither side, so the work is the
same).  HF serves the prompts one after another; ours serves them through max_slots slots (1:
one at a time, like HF; 3: all together).  The sides timed: HF at each thread count of
``--threads`` (default: 1 to the cores this process may use), ours with the package's own
choice of threads (``threads.configure_threads``, "default") and ours at each thread count, each
on 1 and on 3 slots.  The tokens are checked equal to HF's first.  Then every repeat times every
side twice, once with the machine as it is ("idle") and once while a process this script starts
keeps one core busy ("loaded": a Python loop that never sleeps), in an order that rotates from
repeat to repeat, so a busy spell on the machine falls on all sides.

The result holds every timing, the medians and, per phase and slot count: ours by default over
ours at its best thread count (target at most 1.25) and over HF at HF's best thread count
(targets at most 0.8 on 1 slot, 0.5 on 3 slots), with the load average seen before and after.
It is written after every repeat, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import paged_tutorial as pt
from common import write_json
from paged_tutorial.measure.wall_clock import timed_call
from paged_tutorial.threads import choose_automatically, configure_threads, usable_cores

PROMPTS = ["What is the capital of France?",
           "Write a short poem about autumn leaves.",
           "Explain in two sentences why the sky is blue."]
SLOTS = (1, 3)
PHASES = ("idle", "loaded")
#: seconds the busy process runs before the loaded phase's first timing
LOAD_SETTLE_S = 2.0
#: targets: ours by default over ours at its best thread count; ours over HF at its best
TARGET_DEFAULT_OVER_BEST = 1.25
TARGET_OVER_HF = {1: 0.8, 3: 0.5}


def run_ours(engines, slots, new_tokens, threads):
    if threads is None:
        choose_automatically()
    else:
        configure_threads(threads)
    params = pt.SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    seconds, results = timed_call(lambda: engines[slots].generate(PROMPTS, params))
    return seconds, [r.token_ids for r in results]


def run_hf(hf, ids_list, new_tokens, threads):
    torch.set_num_threads(threads)

    def generate_each():
        outs = []
        for ids in ids_list:
            out = hf.generate(torch.tensor([ids]),
                              attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            outs.append(out[0, len(ids):].tolist())
        return outs
    return timed_call(generate_each)


def start_busy_process() -> subprocess.Popen:
    """A process that keeps one core busy until stopped."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def cpu_model() -> str:
    """The processor's name ("model name" in /proc/cpuinfo; platform.processor() elsewhere)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown processor"


def load_average():
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="the fixed thread counts timed (default: 1 to the usable cores)")
    ap.add_argument("--out", default=None, help="a .json file, or a folder for "
                    "cpu-generate-<date>.json (default benchmarks/results)")
    args = ap.parse_args()
    from transformers import LlamaForCausalLM

    from paged_tutorial.loading.models import find_embedded_smollm2
    from pathlib import Path

    thread_counts = args.threads or list(range(1, len(usable_cores()) + 1))
    torch.manual_seed(0)
    model = pt.load_model("smollm2-135m", dtype="float32")
    path = Path(find_embedded_smollm2())
    hf = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                          dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None     # no stop on EOS: exactly new_tokens each
    ids_list = [model.tokenizer.apply_chat_template(p) for p in PROMPTS]
    engines = {s: pt.Engine(model, backend="torch", max_slots=s, max_seq_len=512) for s in SLOTS}
    sides = {f"hf_{t}_threads": (lambda t=t: run_hf(hf, ids_list, args.new_tokens, t))
             for t in thread_counts}
    for s in SLOTS:
        sides[f"ours_default_{s}_slots"] = (
            lambda s=s: run_ours(engines, s, args.new_tokens, None))
        for t in thread_counts:
            sides[f"ours_{t}_threads_{s}_slots"] = (
                lambda s=s, t=t: run_ours(engines, s, args.new_tokens, t))
    reference = f"hf_{thread_counts[0]}_threads"
    times = {phase: {name: [] for name in sides} for phase in PHASES}
    loads = {phase: [] for phase in PHASES}
    with torch.inference_mode():
        # warm-up, and the tokens compared before anything is timed
        tokens = {name: run()[1] for name, run in sides.items()}
        same = {name: [a == b for a, b in zip(toks, tokens[reference])]
                for name, toks in tokens.items()}
        if not all(all(v) for v in same.values()):
            raise SystemExit(f"tokens differ from HF's: {same}")
        names = list(sides)
        for rep in range(args.repeats):
            for phase in PHASES:
                busy = start_busy_process() if phase == "loaded" else None
                try:
                    if busy is not None:
                        time.sleep(LOAD_SETTLE_S)
                    loads[phase].append(load_average())
                    shift = rep % len(names)
                    for name in names[shift:] + names[:shift]:
                        seconds, _ = sides[name]()
                        times[phase][name].append(round(seconds, 3))
                        print(f"repeat {rep} {phase}: {name} {seconds:.2f} s", flush=True)
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
            write_result(args, thread_counts, times, loads, same, rep + 1)
    choose_automatically()


def summary(phase_times: dict, thread_counts, new_tokens) -> list[dict]:
    """Per slot count: ours by default, ours at its best count, HF at its best count."""
    med = {name: statistics.median(v) for name, v in phase_times.items() if v}
    hf_best = min(thread_counts, key=lambda t: med[f"hf_{t}_threads"])
    hf_s = med[f"hf_{hf_best}_threads"]
    rows = []
    for s in SLOTS:
        ours_best = min(thread_counts, key=lambda t: med[f"ours_{t}_threads_{s}_slots"])
        best_s = med[f"ours_{ours_best}_threads_{s}_slots"]
        default_s = med[f"ours_default_{s}_slots"]
        n_tokens = new_tokens * len(PROMPTS)
        rows.append({
            "max_slots": s, "ours_median_s": default_s, "hf_median_s": hf_s,
            "ours_s": phase_times[f"ours_default_{s}_slots"],
            "hf_s": phase_times[f"hf_{hf_best}_threads"],
            "hf_best_threads": hf_best, "ours_best_threads": ours_best,
            "ours_best_median_s": best_s,
            "ratio_ours_over_hf": round(default_s / hf_s, 3),
            "target_ours_over_hf": TARGET_OVER_HF[s],
            "ratio_default_over_best_threads": round(default_s / best_s, 3),
            "target_default_over_best_threads": TARGET_DEFAULT_OVER_BEST,
            "tokens": n_tokens, "ours_tokens_per_s": round(n_tokens / default_s, 1),
            "hf_tokens_per_s": round(n_tokens / hf_s, 1)})
    return rows


def write_result(args, thread_counts, times, loads, same, repeats_done):
    rows = []
    for phase in PHASES:
        for row in summary(times[phase], thread_counts, args.new_tokens):
            key = f"ours_default_{row['max_slots']}_slots"
            rows.append({"phase": phase, **row, "same_tokens_as_hf": same[key]})
    result = {"benchmark": "cpu_generate", "date": dt.date.today().isoformat(),
              "command": "python benchmarks/cpu_generate.py " + " ".join(sys.argv[1:]),
              "machine": f"{platform.machine()} {os.cpu_count()} cores, {cpu_model()}",
              "usable_cores": len(usable_cores()),
              "load_average_1_5_15_min_at_each_phase_start": loads,
              "load_average_1_5_15_min_when_written": load_average(),
              "torch": torch.__version__, "thread_counts": thread_counts,
              "model": "SmolLM2-135M-Instruct Q4_1 GGUF (embedding Q8_0): HF dequantizes it "
                       "to float32; ours too, and its decode products read the GGUF's blocks "
                       "(the same values: backends/cpu_quantized.py)",
              "prompts": PROMPTS, "new_tokens_per_prompt": args.new_tokens,
              "repeats": repeats_done,
              "hf": "transformers LlamaForCausalLM.generate, one prompt at a time",
              "loaded": "a second process running `while True: pass` (one core busy)",
              "rows": rows, "seconds": times}
    print(json_rows(rows), flush=True)
    write_json(result, "cpu-generate", args.out, indent=1)


def json_rows(rows) -> str:
    return "\n".join(f"{r['phase']:6} {r['max_slots']} slot(s): default {r['ours_median_s']:.2f} s"
                     f" (best {r['ours_best_threads']} threads {r['ours_best_median_s']:.2f} s, "
                     f"x{r['ratio_default_over_best_threads']}), HF at {r['hf_best_threads']} "
                     f"threads {r['hf_median_s']:.2f} s: ours/HF {r['ratio_ours_over_hf']}"
                     for r in rows)


if __name__ == "__main__":
    main()
