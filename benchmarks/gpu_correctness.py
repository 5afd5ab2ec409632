"""GPU correctness in one command: the numba backend against HF transformers and the torch
backend, every kernel at full size, compute-sanitizer, and the block-table debug mode.

    python benchmarks/gpu_correctness.py [--out DIR]     # on a machine with an NVIDIA GPU

Writes ``DIR/gpu-correctness-<date>.json`` (GPU name and date inside).  Weights are random
(seeded) at the exact shapes of Llama-3.2-1B and of SmolLM2-135M, in bfloat16: the GPU machine
cannot download the real ones.  What is compared, and why these tolerances:

- *Logits*, teacher-forced: HF's logits over prompt + our generated tokens against ours at
  every generated position, as ||ours - hf|| / ||hf||.  Both store activations in bf16 (8 bits
  of mantissa, relative rounding 2^-9 = 0.2 % per op) but round at different places (our
  kernels keep float32 inside fused ops; HF rounds after every torch op) and reduce in
  different orders, so across 16-30 layers a relative error of about 1 % is expected; the
  check allows 3 %.
- *Greedy tokens*: compared token by token until the first difference.  With random weights
  the top-2 logits are often within bf16 noise, so a difference can be legitimate; it is
  only an error where HF's own top-2 margin exceeds ``MARGIN`` (a real disagreement).
- The torch backend on the same GPU gets the same comparison with HF, so the two backends'
  errors can be read side by side (each teacher-forced on its own tokens).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import paged_tutorial as pt
from common import write_json
from paged_tutorial.config import llama_3_2_1b_config, smollm2_135m_config
from paged_tutorial.loading.models import save_hf_folder

LOGIT_RTOL = 3e-2
MARGIN = 0.25          # logits; above ~10x the bf16 noise measured on these models
PROMPT_LENGTHS = (7, 16, 33, 100)
NEW_TOKENS = 32


def hf_from_model(model, folder: Path):
    from transformers import LlamaForCausalLM

    save_hf_folder(model.to("cpu"), folder)
    hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    hf.generation_config.eos_token_id = None      # like our run: exactly NEW_TOKENS tokens
    return hf


def run_engine(model, backend, prompts):
    engine = pt.Engine(model, backend=backend, max_slots=2, max_seq_len=512)
    engine.record_logits = True
    per_request = {i: [] for i in range(len(prompts))}

    def keep(report):
        for row, rid in enumerate(report.request_ids):
            per_request[rid].append(report.logits[row])

    # random weights: generate exactly NEW_TOKENS (ignore_eos)
    results = engine.generate(prompts, pt.SamplingParams(max_tokens=NEW_TOKENS,
                                                         ignore_eos=True), on_step=keep)
    engine.cache.check_invariants()
    return [r.token_ids for r in results], [torch.stack(per_request[i]) for i in per_request], engine


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(tokens, logits, ref_tokens, ref_logits):
    """Per prompt: first token difference, logit rel error, argmax disagreements where the
    reference's top-2 margin exceeds MARGIN."""
    rows = []
    for t, lg, rt, rl in zip(tokens, logits, ref_tokens, ref_logits):
        rel = float((lg - rl).norm() / rl.norm())
        top2 = rl.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        disagree = lg.argmax(-1) != rl.argmax(-1)
        rows.append({"first_token_difference": first_difference(t, rt),
                     "logits_rel_error": round(rel, 5),
                     "argmax_agreement": round(float((~disagree).float().mean()), 4),
                     "confident_disagreements": int((disagree & (margin > MARGIN)).sum())})
    return rows


def hf_reference(hf, prompts, tokens):
    """HF greedy tokens, and HF's logits teacher-forced on *our* tokens."""
    ref_tokens, ref_logits = [], []
    with torch.no_grad():
        for p, t in zip(prompts, tokens):
            ids = torch.tensor([p], device="cuda")
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
            ref_tokens.append(out[0, len(p):].tolist())
            full = torch.tensor([p + t[:-1]], device="cuda")
            ref_logits.append(hf(full).logits[0, len(p) - 1:].float().cpu())
    return ref_tokens, ref_logits


def model_check(name, config, seed):
    t0 = time.perf_counter()
    model = pt.random_model(config, dtype="bfloat16", seed=seed, device="cuda")
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in PROMPT_LENGTHS]
    tokens, logits, engine = run_engine(model, "numba", prompts)
    t_tokens, t_logits, _ = run_engine(model, "torch", prompts)
    with tempfile.TemporaryDirectory() as d:
        hf = hf_from_model(model, Path(d))
        ref_tokens, ref_logits = hf_reference(hf, prompts, tokens)
        _, ref_logits_t = hf_reference(hf, prompts, t_tokens)
        del hf
    torch.cuda.empty_cache()
    vs_hf = compare(tokens, logits, ref_tokens, ref_logits)
    torch_vs_hf = compare(t_tokens, t_logits, ref_tokens, ref_logits_t)
    ok = all(r["logits_rel_error"] < LOGIT_RTOL and r["confident_disagreements"] == 0
             for r in vs_hf + torch_vs_hf)
    return {"model": name, "shapes": config.to_hf_dict(), "backend": engine.backend.describe(),
            "prompt_lengths": list(PROMPT_LENGTHS), "new_tokens": NEW_TOKENS,
            "numba_vs_hf": vs_hf, "torch_backend_vs_hf": torch_vs_hf,
            "identical_tokens_vs_hf": sum(a == b for a, b in zip(tokens, ref_tokens)),
            "identical_tokens_vs_torch_backend": sum(a == b for a, b in zip(tokens, t_tokens)),
            "pass": ok, "seconds": round(time.perf_counter() - t0, 1)}


def debug_mode_check():
    """check_inputs=True must refuse a block-table entry outside [0, NUM_BLOCKS)."""
    config = smollm2_135m_config().replace(num_hidden_layers=2)
    model = pt.random_model(config, dtype="bfloat16", seed=3, device="cuda")
    engine = pt.Engine(model, backend="numba", debug=True, max_slots=2, max_seq_len=256)
    request = engine.add_request([1, 2, 3, 4, 5], max_tokens=8)
    engine.step()                                     # prefill
    engine.cache.block_table[request.slot, 1, 0] = engine.cache.NUM_BLOCKS + 7
    engine.cache.mark_table_changed(request.slot, 1, 0)
    try:
        engine.step()
        return {"pass": False, "message": "a wild block-table entry was not rejected"}
    except ValueError as e:          # our check, not a CUDA fault after the fact
        torch.cuda.synchronize()         # the context is still healthy: nothing wild was read
        return {"pass": "outside [0, NUM_BLOCKS" in str(e), "message": str(e)[:300]}


def sanitize_target():
    """What compute-sanitizer watches: one prefill + 8 decode steps, 2 slots."""
    config = llama_3_2_1b_config().replace(num_hidden_layers=2)
    model = pt.random_model(config, dtype="bfloat16", seed=4, device="cuda")
    from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend

    # the engine's default GPU path (fast attention, CUDA-graph decode), then the article's
    # kernel launched eagerly
    for backend, graphs in (("numba", None), (NumbaBackend(options=KernelOptions(attention="article")), False)):
        engine = pt.Engine(model, backend=backend, max_slots=2, max_seq_len=256,
                           cuda_graphs=graphs)
        engine.generate([[5] * 20, [7] * 37], pt.SamplingParams(max_tokens=9,
                                                                ignore_eos=True))
        torch.cuda.synchronize()
    print("sanitize target done")


LIBRARY_KERNELS = ("nvjet", "cudnn", "cutlass", "sm90_xmma", "ampere_", "cublas")


def read_sanitizer_log(tool: str, text: str) -> dict:
    """Sort a compute-sanitizer log into what concerns this package's kernels.

    memcheck also reports CUDA API calls that returned an error (at start-up the CUDA bindings
    probe driver entry points with cuGetProcAddress, which answers CUDA_ERROR_INVALID_VALUE for
    the ones this driver lacks): those are counted apart from memory-access errors.  racecheck
    hazards inside cuBLAS / cuDNN kernels (which race by design on their shared-memory
    pipelines, or are not modelled by the tool) are counted apart from ours."""
    done = "sanitize target done" in text
    if tool == "memcheck":
        api = re.findall(r"Program hit (\S+) \(error \d+\) due to .* on CUDA API call to (\S+)\.",
                         text)
        access = len(re.findall(r"Invalid (?:__global__|__shared__|__local__) (?:read|write)", text))
        return {"memory_access_errors": access,
                "api_errors": sorted({f"{e} on {c}" for e, c in api}), "api_error_count": len(api),
                "pass": done and access == 0}
    kernels = re.findall(r"Race reported between (?:Read|Write) access at ([A-Za-z0-9_]+)", text)
    ours = [k for k in kernels if not k.startswith(LIBRARY_KERNELS)]
    return {"hazards_total": len(kernels), "hazards_in_library_kernels": len(kernels) - len(ours),
            "hazards_in_our_kernels": len(ours), "our_kernels_with_hazards": sorted(set(ours)),
            "pass": done and not ours and bool(re.search(r"RACECHECK SUMMARY", text))}


def run_sanitizers(tools, timeout: int, log_dir: Path | None = None):
    """Run compute-sanitizer with each tool over ``--sanitize-target``, side by side."""
    procs, results = {}, []
    t0 = time.perf_counter()
    for tool in tools:
        cmd = ["compute-sanitizer", "--tool", tool, "--target-processes", "all",
               "--print-limit", "0", sys.executable, __file__, "--sanitize-target"]
        try:
            procs[tool] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True)
        except FileNotFoundError:
            results.append({"tool": tool, "pass": None, "message": "compute-sanitizer not found"})
    for tool, p in procs.items():
        try:
            text, _ = p.communicate(timeout=max(1, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            text = (p.communicate()[0] or "") + f"\n[timed out after {timeout} s]"
        if log_dir is not None:
            (log_dir / f"sanitizer-{tool}.log").write_text(text)
        results.append({"tool": tool, **read_sanitizer_log(tool, text), "returncode": p.returncode,
                        "seconds": round(time.perf_counter() - t0, 1), "tail": text[-1500:]})
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--sanitize-target", action="store_true")
    ap.add_argument("--skip", default="", help="comma list: kernels,models,sanitizer,debug")
    ap.add_argument("--sanitizer-timeout", type=int, default=300)
    args = ap.parse_args()
    if args.sanitize_target:
        sanitize_target()
        return
    assert torch.cuda.is_available(), "run this on a machine with an NVIDIA GPU"
    skip = set(filter(None, args.skip.split(",")))
    result = {"gpu": torch.cuda.get_device_name(), "date": dt.date.today().isoformat(),
              "torch": torch.__version__, "command": "python benchmarks/gpu_correctness.py"}
    import numba

    result["numba"] = numba.__version__
    if "kernels" not in skip:
        # every kernel at full size: the GPU-marked tests (tests/gpu/test_gpu.py)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/gpu/test_gpu.py"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
        result["kernels"] = {"command": "python -m pytest -q tests/gpu/test_gpu.py",
                             "pass": proc.returncode == 0,
                             "summary": proc.stdout.strip().splitlines()[-1:]}
    if "models" not in skip:
        result["models"] = [model_check("Llama-3.2-1B shapes", llama_3_2_1b_config(), 0),
                            model_check("SmolLM2-135M shapes", smollm2_135m_config(), 1)]
    if "debug" not in skip:
        result["debug_mode"] = debug_mode_check()
    if "sanitizer" not in skip:
        result["sanitizer"] = run_sanitizers(("memcheck", "racecheck"), args.sanitizer_timeout,
                                             Path(args.out))
    out = write_json(result, "gpu-correctness", args.out, indent=2)
    summary = {k: v for k, v in result.items() if k not in ("kernels", "models", "sanitizer")}
    print(json.dumps(summary, indent=1))
    for m in result.get("models", []):
        print(m["model"], "pass" if m["pass"] else "FAIL",
              [r["logits_rel_error"] for r in m["numba_vs_hf"]],
              "tokens identical vs HF:", m["identical_tokens_vs_hf"], "/", len(PROMPT_LENGTHS))
    for s in result.get("sanitizer", []):
        print("sanitizer", s["tool"], s.get("errors"), s["pass"], s.get("message", ""))
    print("wrote", out)


if __name__ == "__main__":
    main()
