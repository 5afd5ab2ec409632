"""Prefix caching: N requests that share a long system prompt, with and without sharing.

    python benchmarks/prefix_sharing.py                 # CPU: embedded SmolLM2, float32, torch
    python benchmarks/prefix_sharing.py --gpu --out /tmp/prefix-sharing-gpu.json
                                                        # GPU: random Llama-3.2-1B bf16, numba
    python benchmarks/prefix_sharing.py --tiny          # CPU: the GPU run's block geometry
                                                        # with a tiny model (host bookkeeping)

Each request is the same system prompt followed by its own question; all N are submitted at
once to an engine with N slots and generate a fixed number of tokens (EOS ignored).  The same
N requests are then submitted a second time, after the first wave has finished ("warm"): with
prefix caching, the system prompt's blocks are still cached then, although nobody uses them.
For each engine (prefix caching off / on) and each wave the script records:

- ``prefill_tokens``: tokens the prefill steps computed (K/V written);
- ``peak_blocks_used``: the most physical blocks referenced by block-table entries at once
  (a shared block counts once), and ``peak_blocks_cached`` (unused blocks kept for a prefix);
- ``ttft_s``: each request's time to first token (submission -> first token), and the wave's
  wall time;
- ``num_cached_tokens``: per request, prompt tokens served from shared blocks;
- ``prefill_phase_s``: the wave's prefill steps (those that give the first tokens) split into
  the engine's phases (``StepReport.phase_seconds``, summed over those steps): ``schedule``
  (admission and block allocation: the host bookkeeping), ``inputs`` (packing, block-table
  sync), ``forward`` (on a GPU: enqueueing the layers' kernels), ``sample`` (on a GPU: waiting
  for them and reading the tokens back), ``postprocess`` and ``release``;
- whether the greedy tokens equal those of the engine without prefix caching; on the GPU also
  in float32 (``same_tokens_float32``: the same weights and requests, one run of each wave),
  where they must be equal, while the timed run is in bfloat16.

Before measuring, each engine serves unrelated prompts once (kernel compilation, CUDA graph
capture).  Both waves run once with a cache listener that counts blocks (untimed: a listener
sees every one of the ~17 000 block-table entries a wave edits), then ``--repeats`` times
without it, the prefix cache emptied (``evict_unused``) before each cold wave; token and block
counts are the same every time, times are those of the fastest repeat (on a shared machine,
the one least disturbed), every repeat's kept too.
``load_average_1min`` (before, after) says how busy the machine was.  The GPU mode needs no
model file: Llama-3.2-1B's shapes with random weights, prompts as token ids.  ``--tiny`` keeps
that mode's block geometry (16 layers, the same requests, prompts and cache layout) with a
model too small to cost anything (hidden 64, 2 heads, vocabulary 512, float32, torch on the
CPU): what it measures is the host's work per step, which the GPU run pays too.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

import paged_tutorial as pt

RESULTS = Path(__file__).resolve().parent / "results"

SYSTEM_PROMPT = (
    "You are the teaching assistant of a course on how large language models are served. "
    "The course follows a Korean article series that builds a CUDA C++ engine for "
    "Llama-3.2-1B step by step, and this part is about paged attention. Answer the student's "
    "question in plain words, in at most three sentences, and stay precise. When the question "
    "is about memory, say which quantity is stored, where it lives and how many bytes it takes. "
    "When the question is about speed, say which resource limits the step: reading the weights, "
    "reading the KV cache, or launching kernels. Never invent numbers: if a figure depends on "
    "the model or the GPU, say what it depends on. The vocabulary of the course: a block holds "
    "the keys and values of sixteen tokens of one layer; the block table maps a sequence's "
    "logical blocks to physical blocks; free_blocks is the stack of physical blocks that hold "
    "nothing; a slot is one row of the block table; prefill computes a whole prompt at once and "
    "decode adds one token per step. Keep answers short and friendly, and do not repeat the "
    "question.")
QUESTIONS = [
    "Why does the KV cache grow with every generated token?",
    "What is a block table?",
    "Why are blocks sixteen tokens long?",
    "What does free_blocks hold?",
    "Why is decode slower per token than prefill?",
    "What happens when the cache is full?",
    "Can two requests share a block?",
    "What limits the speed of one decode step?",
    "Why does every layer own its own blocks?",
    "What is a slot?",
    "How big is one block of Llama-3.2-1B in bf16?",
    "What does the attention kernel read for one token?",
    "Why copy only the changed entries of the table?",
    "What is continuous batching?",
    "Why recompute a preempted request?",
    "What is time to first token?",
]


def tiny_1b_geometry_config():
    """Llama-3.2-1B's layers (so its block table's shape) with every width shrunk."""
    return dataclasses.replace(pt.llama_3_2_1b_config(), vocab_size=512, hidden_size=64,
                               intermediate_size=128, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=32)


def chat_prompts(model, n: int) -> tuple[list[list[int]], int]:
    """(token ids of the N chat prompts, tokens they all share at the start)."""
    tok = model.tokenizer
    prompts = [tok.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT},
                                        {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]
                                         + ("" if i < len(QUESTIONS) else f" ({i})")}])
               for i in range(n)]
    return prompts, common_prefix(prompts)


def random_prompts(vocab: int, n: int, system_len: int, question_len: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, system_len).tolist()
    return [system + rng.integers(0, vocab, question_len).tolist() for _ in range(n)], system_len


def random_workload(config, dtype: str, n: int, system_len: int, question_len: int):
    """A random-weights model of ``config`` (seed 0), ``n`` prompts sharing a system prefix,
    and a warm-up set drawn the same way with another seed: (model, prompts, shared, warmup)."""
    model = pt.random_model(config, dtype=dtype, seed=0)
    prompts, shared = random_prompts(config.vocab_size, n, system_len, question_len)
    warmup, _ = random_prompts(config.vocab_size, n, system_len, question_len, seed=1)
    return model, prompts, shared, warmup


def common_prefix(prompts) -> int:
    n = min(len(p) for p in prompts)
    for i in range(n):
        if len({p[i] for p in prompts}) > 1:
            return i
    return n


class BlockUsage:
    """Peak blocks referenced / cached, from the cache's listener events (every change)."""

    def __init__(self, cache):
        self.cache = cache
        self.used = int((cache.reference_counts() > 0).sum())
        self.peak_used = self.used
        self.peak_cached = cache.num_evictable_blocks
        cache.add_listener(self.on_event)

    def reset(self) -> None:
        self.peak_used = self.used
        self.peak_cached = self.cache.num_evictable_blocks

    def on_event(self, event) -> None:
        if event.kind in ("pop", "reuse"):
            self.used += 1
        elif event.kind in ("push", "cache"):
            self.used -= 1
        self.peak_used = max(self.peak_used, self.used)
        if event.kind in ("cache", "reuse", "evict"):
            self.peak_cached = max(self.peak_cached, self.cache.num_evictable_blocks)


def prefill_phases(steps) -> dict:
    """Seconds per engine phase, summed over the prefill steps."""
    out = {}
    for step in steps:
        if step.kind == "prefill":
            for name, seconds in step.phase_seconds.items():
                out[name] = out.get(name, 0.0) + seconds
    return {name: round(seconds, 5) for name, seconds in out.items()}


def run_wave(engine, usage: BlockUsage | None, prompts, params) -> dict:
    """One wave; ``usage`` (a listener counting blocks) or None for a timed wave."""
    if usage is not None:
        usage.reset()
    steps = []
    t0 = time.perf_counter()
    results = engine.generate(prompts, params, on_step=steps.append)
    wall = time.perf_counter() - t0
    ttft = [r.time_to_first_token_s for r in results]
    return {
        "prefill_tokens": sum(s.num_tokens for s in steps if s.kind == "prefill"),
        "prefill_steps": sum(1 for s in steps if s.kind == "prefill"),
        "steps": len(steps),
        "peak_blocks_used": usage.peak_used if usage is not None else None,
        "peak_blocks_cached": usage.peak_cached if usage is not None else None,
        "prefill_phase_s": prefill_phases(steps),
        "num_cached_tokens": [r.num_cached_tokens for r in results],
        "ttft_s": [round(t, 5) for t in ttft],
        "ttft_mean_s": round(float(np.mean(ttft)), 5),
        "ttft_max_s": round(float(np.max(ttft)), 5),
        "wall_s": round(wall, 4),
        "tokens": [r.token_ids for r in results],
    }


def measure(model, backend: str, prompts, warmup_prompts, max_new: int, max_seq_len: int,
            prefix_caching: bool, sync, repeats: int) -> dict:
    """Both waves once with a block-counting listener (untimed), then ``repeats`` times
    without it (the prefix cache emptied before each cold wave); counts come from the counted
    run (they are the same every time); times are the fastest timed repeat's (the least
    disturbed by other work on the machine), all timed repeats kept in ``*_all``."""
    engine = pt.Engine(model, backend=backend, max_slots=len(prompts), max_seq_len=max_seq_len,
                       prefix_caching=prefix_caching)
    params = pt.SamplingParams(max_tokens=max_new, ignore_eos=True)
    engine.generate(warmup_prompts, params)                 # compile, capture, warm the caches

    def both_waves(usage):
        if prefix_caching:
            engine.cache.allocator.evict_unused()
        sync()
        out = {}
        for wave in ("cold", "warm"):
            out[wave] = run_wave(engine, usage, prompts, params)
            sync()
        return out

    usage = BlockUsage(engine.cache)
    counted = both_waves(usage)
    engine.cache.remove_listener(usage.on_event)
    timed = [both_waves(None) for _ in range(repeats)]
    waves = {}
    for wave in ("cold", "warm"):
        first, rs = dict(counted[wave]), [t[wave] for t in timed]
        best = min(rs, key=lambda r: r["wall_s"])
        for key in ("ttft_mean_s", "ttft_max_s", "wall_s"):
            first[key] = best[key]
            first[key + "_all"] = [r[key] for r in rs]
        first["ttft_s"] = best["ttft_s"]
        first["prefill_phase_s"] = best["prefill_phase_s"]
        assert all(r["tokens"] == first["tokens"] and r["prefill_tokens"] == first["prefill_tokens"]
                   for r in rs), "a repeat computed different tokens"
        waves[wave] = first
    return {"describe": engine.describe(), "num_blocks": engine.cache.NUM_BLOCKS,
            "block_size": engine.cache.BLOCK_SIZE, "repeats": repeats, "waves": waves}


def float32_tokens_check(model, prompts, max_new: int, max_seq_len: int) -> dict:
    """The same requests on the same weights in float32, prefix caching off and on, cold and
    warm waves: the greedy tokens must be equal (in bfloat16 the cached-prefix path rounds at
    other places than the full prefill, and near-ties can go either way)."""
    from paged_tutorial.loading.models import Model

    fp32 = Model(model.config, {k: v.to(device="cuda", dtype=torch.float32)
                                for k, v in model.weights.items()}, None, "float32",
                 source=f"{model.source}, in float32")
    params = pt.SamplingParams(max_tokens=max_new, ignore_eos=True)
    tokens = {}
    for caching in (False, True):
        engine = pt.Engine(fp32, backend="numba", max_slots=len(prompts), max_seq_len=max_seq_len,
                           prefix_caching=caching)
        tokens[caching] = [[r.token_ids for r in engine.generate(prompts, params)]
                           for _wave in ("cold", "warm")]
    out = {"dtype": "float32", "same_tokens_cold": tokens[False][0] == tokens[True][0],
           "same_tokens_warm": tokens[False][1] == tokens[True][1]}
    del fp32
    torch.cuda.empty_cache()
    print("float32 tokens, prefix caching off vs on:", out, flush=True)
    return out


def summarize(off: dict, on: dict) -> dict:
    out = {}
    for wave in ("cold", "warm"):
        a, b = off["waves"][wave], on["waves"][wave]
        out[wave] = {
            "prefill_tokens_off": a["prefill_tokens"], "prefill_tokens_on": b["prefill_tokens"],
            "prefill_tokens_ratio": round(a["prefill_tokens"] / b["prefill_tokens"], 2),
            "peak_blocks_used_off": a["peak_blocks_used"],
            "peak_blocks_used_on": b["peak_blocks_used"],
            "ttft_mean_s_off": a["ttft_mean_s"], "ttft_mean_s_on": b["ttft_mean_s"],
            "ttft_mean_speedup": round(a["ttft_mean_s"] / b["ttft_mean_s"], 2),
            "prefill_phase_s_off": a["prefill_phase_s"], "prefill_phase_s_on": b["prefill_phase_s"],
            "wall_s_off": a["wall_s"], "wall_s_on": b["wall_s"],
            "same_tokens": a["tokens"] == b["tokens"],
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true",
                    help="random Llama-3.2-1B weights in bf16 on the GPU (numba backend)")
    ap.add_argument("--tiny", action="store_true",
                    help="the --gpu run's block geometry (16 layers, 16 requests of 1056 "
                         "tokens sharing 1024) with a tiny float32 model on the CPU: the "
                         "host's bookkeeping per step")
    ap.add_argument("--requests", type=int, default=None,
                    help="N (default 8 on the CPU, 16 on the GPU)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="tokens each request generates (default 8 CPU, 32 GPU)")
    ap.add_argument("--system-tokens", type=int, default=1024,
                    help="--gpu / --tiny: length of the shared random system prompt")
    ap.add_argument("--question-tokens", type=int, default=32,
                    help="--gpu / --tiny: length of each request's own random question")
    ap.add_argument("--repeats", type=int, default=None,
                    help="run both waves this many times; times of the fastest (default 5 on "
                         "the CPU, 3 on the GPU: there the one-time kernel compilation dominates)")
    ap.add_argument("--out", default=None,
                    help="a .json file, or a folder for prefix-sharing-<cpu|gpu>-<date>.json "
                         "(default benchmarks/results/)")
    args = ap.parse_args(argv)

    if args.gpu and args.tiny:
        print("error: --gpu and --tiny are two different runs: pick one", file=sys.stderr)
        return 2
    if args.gpu:
        if not torch.cuda.is_available():
            print("error: --gpu needs a CUDA GPU", file=sys.stderr)
            return 2
        n = args.requests or 16
        max_new = args.max_tokens or 32
        model, prompts, shared, warmup = random_workload(
            pt.llama_3_2_1b_config(), "bfloat16", n, args.system_tokens, args.question_tokens)
        backend, max_seq_len = "numba", 2048
        model_name, device = "Llama-3.2-1B shapes, random weights (seed 0)", \
            torch.cuda.get_device_name(0)

        def sync():
            torch.cuda.synchronize()
    elif args.tiny:
        n = args.requests or 16
        max_new = args.max_tokens or 32
        model, prompts, shared, warmup = random_workload(
            tiny_1b_geometry_config(), "float32", n, args.system_tokens, args.question_tokens)
        backend, max_seq_len = "torch", 2048
        model_name = ("Llama-3.2-1B's 16 layers with hidden 64, 2 / 1 heads of 32, "
                      "vocabulary 512, random weights (seed 0)")
        device = platform.processor() or platform.machine()

        def sync():
            pass
    else:
        n = args.requests or 8
        max_new = args.max_tokens or 8
        model = pt.load_model("smollm2-135m", dtype="float32")
        prompts, shared = chat_prompts(model, n)
        warmup = [model.tokenizer.apply_chat_template(q) for q in QUESTIONS[:n]]
        backend, max_seq_len = "torch", 512
        model_name = "SmolLM2-135M-Instruct (embedded GGUF)"
        device = platform.processor() or platform.machine()

        def sync():
            pass

    repeats = args.repeats or (3 if args.gpu or args.tiny else 5)
    load_before = os.getloadavg()
    off = measure(model, backend, prompts, warmup, max_new, max_seq_len, False, sync, repeats)
    on = measure(model, backend, prompts, warmup, max_new, max_seq_len, True, sync, repeats)
    summary = summarize(off, on)
    if args.gpu:
        check = float32_tokens_check(model, prompts, max_new, max_seq_len)
        for wave in ("cold", "warm"):
            summary[wave]["same_tokens_float32"] = check[f"same_tokens_{wave}"]
    data = {
        "benchmark": "prefix_sharing",
        "date": dt.date.today().isoformat(),
        "command": "python benchmarks/prefix_sharing.py" + (" --gpu" if args.gpu else "")
        + (" --tiny" if args.tiny else ""),
        "device": device, "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
        "load_average_1min": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "model": model_name, "dtype": model.dtype, "backend": backend,
        "requests": n, "max_tokens": max_new,
        "prompt_tokens": [len(p) for p in prompts], "shared_prefix_tokens": shared,
        "off": on_off_without_tokens(off), "on": on_off_without_tokens(on),
        "summary": summary,
    }
    out = Path(args.out) if args.out else RESULTS
    path = out if out.suffix == ".json" else \
        out / f"prefix-sharing-{'gpu' if args.gpu else 'tiny' if args.tiny else 'cpu'}-" \
        f"{data['date']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    for wave, s in data["summary"].items():
        print(f"{wave}: prefill tokens {s['prefill_tokens_off']} -> {s['prefill_tokens_on']} "
              f"({s['prefill_tokens_ratio']}x fewer), peak blocks used "
              f"{s['peak_blocks_used_off']} -> {s['peak_blocks_used_on']}, mean TTFT "
              f"{s['ttft_mean_s_off'] * 1e3:.1f} -> {s['ttft_mean_s_on'] * 1e3:.1f} ms "
              f"(on/off {s['ttft_mean_s_on'] / s['ttft_mean_s_off']:.2f}x), "
              f"same tokens: {s['same_tokens']}"
              + (f" ({model.dtype}), in float32: {s['same_tokens_float32']}"
                 if "same_tokens_float32" in s else ""))
        for side in ("off", "on"):
            phases = s[f"prefill_phase_s_{side}"]
            print(f"  caching {side}, prefill steps (ms): "
                  + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in phases.items()))
    return 0


def on_off_without_tokens(run: dict) -> dict:
    """The JSON keeps token counts, not the tokens themselves."""
    return {**run, "waves": {w: {k: v for k, v in r.items() if k != "tokens"}
                             for w, r in run["waves"].items()}}


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
