"""CPU speed: our torch backend vs HF ``generate`` on SmolLM2-135M, float32, greedy.

    python benchmarks/cpu_generate.py [--out benchmarks/results/cpu-generate-<date>.json]

Three chat prompts x 64 new tokens, run side by side in one process on the same machine. HF
serves the prompts one after another; ours serves them through max_slots slots (1: one at a
time, like HF; 3: all together).  Each request generates exactly 64 tokens (EOS stops neither
side) so that the work is the same, and the tokens are compared.  Target: ours within 1.5x
of HF's time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
from pathlib import Path

import torch

import paged_tutorial as pt

PROMPTS = ["What is the capital of France?",
           "Write a short poem about autumn leaves.",
           "Explain in two sentences why the sky is blue."]
NEW_TOKENS = 64


def time_ours(model, prompts, max_slots):
    engine = pt.Engine(model, backend="torch", max_slots=max_slots, max_seq_len=512)
    engine.generate([prompts[0]], max_tokens=4)            # warm-up
    t0 = time.perf_counter()
    # ignore_eos: exactly NEW_TOKENS per request, like HF below
    results = engine.generate(prompts, pt.SamplingParams(max_tokens=NEW_TOKENS,
                                                         ignore_eos=True))
    return time.perf_counter() - t0, results


def time_hf(hf, ids_list):
    hf.generate(torch.tensor([ids_list[0]]), max_new_tokens=4, do_sample=False)   # warm-up
    t0 = time.perf_counter()
    outs = []
    for ids in ids_list:
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        outs.append(out[0, len(ids):].tolist())
    return time.perf_counter() - t0, outs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from transformers import LlamaForCausalLM

    from paged_tutorial.loading.models import find_embedded_smollm2

    torch.manual_seed(0)
    model = pt.load_model("smollm2-135m", dtype="float32")
    path = Path(find_embedded_smollm2())
    hf = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                          dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None     # no stop on EOS: exactly NEW_TOKENS each
    ids_list = [model.tokenizer.apply_chat_template(p) for p in PROMPTS]
    rows = []
    with torch.inference_mode():
        hf_s, hf_tokens = time_hf(hf, ids_list)
        for slots in (1, 3):
            ours_s, results = time_ours(model, PROMPTS, slots)
            same = [r.token_ids == t for r, t in zip(results, hf_tokens)]
            rows.append({"max_slots": slots, "ours_s": round(ours_s, 3), "hf_s": round(hf_s, 3),
                         "ratio_ours_over_hf": round(ours_s / hf_s, 3),
                         "tokens": NEW_TOKENS * len(PROMPTS),
                         "ours_tokens_per_s": round(NEW_TOKENS * len(PROMPTS) / ours_s, 1),
                         "hf_tokens_per_s": round(NEW_TOKENS * len(PROMPTS) / hf_s, 1),
                         "same_tokens_as_hf": same})
    result = {"benchmark": "cpu_generate", "date": dt.date.today().isoformat(),
              "machine": f"{platform.machine()} {os.cpu_count()} cores",
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "model": "SmolLM2-135M-Instruct Q4_1 GGUF, dequantized to float32",
              "prompts": PROMPTS, "new_tokens_per_prompt": NEW_TOKENS,
              "hf": "transformers LlamaForCausalLM.generate, one prompt at a time", "rows": rows}
    text = json.dumps(result, indent=2)
    print(text)
    out = Path(args.out or f"benchmarks/results/cpu-generate-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
