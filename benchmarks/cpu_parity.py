"""Token parity with HF transformers on the embedded SmolLM2-135M, in float32 and bfloat16.

    python benchmarks/cpu_parity.py [--out benchmarks/results/cpu-parity-<date>.json]

float32: greedy tokens must be identical (the test suite asserts this too).  bfloat16: both
sides round every activation to 8 mantissa bits but at different places, so greedy decoding
eventually takes a different branch at a near-tie; this reports, per prompt, the index of the
first generated token where ours and HF's differ (None = identical), and the relative error
of the first step's logits against HF float32.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
from pathlib import Path

import torch

import paged_tutorial as pt
from common import write_json
from paged_tutorial.loading.models import find_embedded_smollm2

PROMPTS = ["What is the capital of France?",
           "Write a haiku about the sea.",
           "List three prime numbers and explain why they are prime.",
           "Translate 'good morning' into Spanish and German.",
           "Explain what a KV cache is in one paragraph."]
NEW_TOKENS = 48


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def hf_run(hf, ids):
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="a .json file, or a folder for "
                    "cpu-parity-<date>.json (default benchmarks/results)")
    args = ap.parse_args()
    from transformers import LlamaForCausalLM

    path = Path(find_embedded_smollm2())
    rows = {}
    hf_models = {dtype: LlamaForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=getattr(torch, dtype)).eval()
        for dtype in ("float32", "bfloat16")}
    for dtype, hf in hf_models.items():
        model = pt.load_model("smollm2-135m", dtype=dtype)
        engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=1024)
        engine.record_logits = True
        first_logits = {}

        def keep(report):
            for row, rid in enumerate(report.request_ids):
                first_logits.setdefault(rid, report.logits[row])

        results = engine.generate(PROMPTS, max_tokens=NEW_TOKENS, on_step=keep)
        per_prompt = []
        with torch.inference_mode():
            for i, r in enumerate(results):
                ref = hf_run(hf, r.prompt_token_ids)
                ids = torch.tensor([r.prompt_token_ids])
                ref_logits = hf_models["float32"](ids).logits[0, -1].float()
                rel = float((first_logits[i] - ref_logits).norm() / ref_logits.norm())
                per_prompt.append({"prompt": PROMPTS[i], "ours_tokens": len(r.token_ids),
                                   "hf_tokens": len(ref),
                                   "first_difference": first_difference(r.token_ids, ref),
                                   "first_step_logits_rel_error_vs_hf_float32": round(rel, 6),
                                   "ours_text": r.text})
        rows[dtype] = per_prompt
    result = {"benchmark": "cpu_parity", "date": dt.date.today().isoformat(),
              "machine": f"{platform.machine()} {os.cpu_count()} cores", "torch": torch.__version__,
              "model": "SmolLM2-135M-Instruct Q4_1 GGUF (embedded)", "new_tokens": NEW_TOKENS,
              "reference": "transformers LlamaForCausalLM.from_pretrained(gguf_file=...), greedy",
              "results": rows}
    write_json(result, "cpu-parity", args.out, indent=2)
    for dtype, per in rows.items():
        print(dtype, [p["first_difference"] for p in per],
              [p["first_step_logits_rel_error_vs_hf_float32"] for p in per])


if __name__ == "__main__":
    main()
