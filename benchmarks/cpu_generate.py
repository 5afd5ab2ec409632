"""CPU speed: our torch backend against HF ``generate`` on SmolLM2-135M, float32, greedy.

    python benchmarks/cpu_generate.py [--repeats 3] [--new-tokens 64] [--out FILE.json|DIR]

Three chat prompts x ``--new-tokens`` new tokens (EOS stops neither side, so the work is the
same).  HF serves the prompts one after another; ours serves them through max_slots slots (1:
one at a time, like HF; 3: all together).  The tokens are checked equal first; then each
repeat times HF, ours on 1 slot and ours on 3 slots back to back, in an order that rotates
from repeat to repeat, so a busy spell on the machine falls on both sides.  The result holds
every timing and the medians; the ratios are median(ours) / median(HF).  Targets: at most
0.8 on 1 slot, at most 0.5 on 3 slots.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
from pathlib import Path

import torch

import paged_tutorial as pt
from common import write_json
from paged_tutorial.measure.wall_clock import timed_call

PROMPTS = ["What is the capital of France?",
           "Write a short poem about autumn leaves.",
           "Explain in two sentences why the sky is blue."]
SLOTS = (1, 3)


def run_ours(engines, slots, new_tokens):
    params = pt.SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    seconds, results = timed_call(lambda: engines[slots].generate(PROMPTS, params))
    return seconds, [r.token_ids for r in results]


def run_hf(hf, ids_list, new_tokens):
    def generate_each():
        outs = []
        for ids in ids_list:
            out = hf.generate(torch.tensor([ids]),
                              attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            outs.append(out[0, len(ids):].tolist())
        return outs
    return timed_call(generate_each)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="a .json file, or a folder for "
                    "cpu-generate-<date>.json (default benchmarks/results)")
    args = ap.parse_args()
    from transformers import LlamaForCausalLM

    from paged_tutorial.loading.models import find_embedded_smollm2

    torch.manual_seed(0)
    model = pt.load_model("smollm2-135m", dtype="float32")
    path = Path(find_embedded_smollm2())
    hf = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                          dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None     # no stop on EOS: exactly new_tokens each
    ids_list = [model.tokenizer.apply_chat_template(p) for p in PROMPTS]
    engines = {s: pt.Engine(model, backend="torch", max_slots=s, max_seq_len=512) for s in SLOTS}
    sides = {"hf": lambda: run_hf(hf, ids_list, args.new_tokens)}
    sides.update({f"ours_{s}_slots": (lambda s=s: run_ours(engines, s, args.new_tokens))
                  for s in SLOTS})
    times: dict[str, list[float]] = {name: [] for name in sides}
    with torch.inference_mode():
        # warm-up, and the tokens compared before anything is timed
        tokens = {name: run()[1] for name, run in sides.items()}
        same = {name: [a == b for a, b in zip(toks, tokens["hf"])]
                for name, toks in tokens.items() if name != "hf"}
        if not all(all(v) for v in same.values()):
            raise SystemExit(f"tokens differ from HF's: {same}")
        names = list(sides)
        for rep in range(args.repeats):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                seconds, _ = sides[name]()
                times[name].append(round(seconds, 3))
                print(f"repeat {rep}: {name} {seconds:.2f} s", flush=True)
            write_result(args, times, same, rep + 1)


def write_result(args, times, same, repeats_done):
    """The result so far (every repeat's timings, their medians), written after each repeat:
    a run cut short keeps what it measured."""
    hf_median = statistics.median(times["hf"])
    n_tokens = args.new_tokens * len(PROMPTS)
    rows = []
    for s in SLOTS:
        ours = times[f"ours_{s}_slots"]
        rows.append({"max_slots": s, "ours_s": ours, "hf_s": times["hf"],
                     "ours_median_s": statistics.median(ours), "hf_median_s": hf_median,
                     "ratio_ours_over_hf": round(statistics.median(ours) / hf_median, 3),
                     "tokens": n_tokens,
                     "ours_tokens_per_s": round(n_tokens / statistics.median(ours), 1),
                     "hf_tokens_per_s": round(n_tokens / hf_median, 1),
                     "same_tokens_as_hf": same[f"ours_{s}_slots"]})
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    result = {"benchmark": "cpu_generate", "date": dt.date.today().isoformat(),
              "machine": f"{platform.machine()} {os.cpu_count()} cores",
              "load_average_1_5_15_min_when_written": [round(x, 1) for x in load] if load else None,
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "model": "SmolLM2-135M-Instruct Q4_1 GGUF, dequantized to float32",
              "prompts": PROMPTS, "new_tokens_per_prompt": args.new_tokens,
              "repeats": repeats_done,
              "hf": "transformers LlamaForCausalLM.generate, one prompt at a time", "rows": rows}
    print(json.dumps(result, indent=2), flush=True)
    write_json(result, "cpu-generate", args.out, indent=2)


if __name__ == "__main__":
    main()
