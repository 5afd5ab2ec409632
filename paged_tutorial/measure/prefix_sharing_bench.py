"""Prefix caching measured: N requests that share a long system prompt, served with and without
sharing, in two waves (the second after the first has finished, its prefix still cached).

``run`` measures a ``prefix_sharing_workload.Workload`` with prefix caching off and on and
writes ``prefix-sharing-<mode>-<date>.json``; ``benchmarks/prefix_sharing.py`` (its docstring
says what every field means) parses its arguments and calls it.
"""

from __future__ import annotations

import datetime as dt
import os

import numpy as np
import torch

import paged_tutorial as pt
from paged_tutorial.measure.prefix_sharing_workload import Workload
from paged_tutorial.measure.result_files import write_json
from paged_tutorial.measure.wall_clock import timed_call


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
    wall, results = timed_call(lambda: engine.generate(prompts, params, on_step=steps.append))
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


def on_off_without_tokens(run: dict) -> dict:
    """The JSON keeps token counts, not the tokens themselves."""
    return {**run, "waves": {w: {k: v for k, v in r.items() if k != "tokens"}
                             for w, r in run["waves"].items()}}


def run(work: Workload, repeats: int | None, out) -> dict:
    """Measure ``work`` with prefix caching off, then on (``repeats`` timed repeats of both
    waves; default 5 on the CPU, 3 for gpu and tiny), on the GPU also the float32 token check;
    the JSON goes to ``out`` (a ``.json`` file, or a folder for
    ``prefix-sharing-<mode>-<date>.json``)."""
    repeats = repeats or (3 if work.mode in ("gpu", "tiny") else 5)
    load_before = os.getloadavg()
    off = measure(work.model, work.backend, work.prompts, work.warmup, work.max_new,
                  work.max_seq_len, False, work.sync, repeats)
    on = measure(work.model, work.backend, work.prompts, work.warmup, work.max_new,
                 work.max_seq_len, True, work.sync, repeats)
    summary = summarize(off, on)
    if work.mode == "gpu":
        check = float32_tokens_check(work.model, work.prompts, work.max_new, work.max_seq_len)
        for wave in ("cold", "warm"):
            summary[wave]["same_tokens_float32"] = check[f"same_tokens_{wave}"]
    data = {
        "benchmark": "prefix_sharing",
        "date": dt.date.today().isoformat(),
        "command": "python benchmarks/prefix_sharing.py" + ("" if work.mode == "cpu"
                                                             else f" --{work.mode}"),
        "device": work.device, "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average_1min": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "model": work.model_name, "dtype": work.model.dtype, "backend": work.backend,
        "requests": work.requests, "max_tokens": work.max_new,
        "prompt_tokens": [len(p) for p in work.prompts], "shared_prefix_tokens": work.shared,
        "off": on_off_without_tokens(off), "on": on_off_without_tokens(on),
        "summary": summary,
    }
    write_json(data, f"prefix-sharing-{work.mode}", out)
    print_summary(data)
    return data


def print_summary(data: dict) -> None:
    for wave, s in data["summary"].items():
        print(f"{wave}: prefill tokens {s['prefill_tokens_off']} -> {s['prefill_tokens_on']} "
              f"({s['prefill_tokens_ratio']}x fewer), peak blocks used "
              f"{s['peak_blocks_used_off']} -> {s['peak_blocks_used_on']}, mean TTFT "
              f"{s['ttft_mean_s_off'] * 1e3:.1f} -> {s['ttft_mean_s_on'] * 1e3:.1f} ms "
              f"(on/off {s['ttft_mean_s_on'] / s['ttft_mean_s_off']:.2f}x), "
              f"same tokens: {s['same_tokens']}"
              + (f" ({data['dtype']}), in float32: {s['same_tokens_float32']}"
                 if "same_tokens_float32" in s else ""))
        for side in ("off", "on"):
            phases = s[f"prefill_phase_s_{side}"]
            print(f"  caching {side}, prefill steps (ms): "
                  + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in phases.items()))
