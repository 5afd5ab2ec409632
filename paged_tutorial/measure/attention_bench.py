"""Paged decode attention (and prefill attention) on the GPU, side by side: the fast Numba
kernel, the tensor-core Numba kernel (``attention_tc.py``, the engine's from batch 16), the
Triton peer, FlashInfer's batch decode where it is installed (``flashinfer_peer.py``), the
article's kernel, torch SDPA on contiguous K/V, against the copy floor; and the sweep over
the fast kernel's shapes that chose ``attention_fast.CHOSEN_SHAPE``.

``benchmarks/attention.py`` (its docstring says what each run measures and writes) parses its
arguments and calls ``run``.  ``build_cache`` and ``reference`` also serve
``kernel_bench.attention_short_contexts``.  Importing this module needs no GPU; running it
does.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from paged_tutorial.backends import triton_attention
from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend
from paged_tutorial.backends.numba_cuda.kernels import attention_fast, attention_tc
from paged_tutorial.backends.numba_cuda.kernels.attention_fast import KernelShape
from paged_tutorial.backends.numba_cuda.kernels.prefill_sdpa import prefill_attention_sdpa
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig
from paged_tutorial.measure import flashinfer_peer
from paged_tutorial.measure.comparison import rel_err
from paged_tutorial.measure.gpu_machine import ceilings, gpu_info
from paged_tutorial.measure.gpu_timers import N_INNER, copies_for, graph_ms
from paged_tutorial.measure.result_files import write_json

N_Q, N_KV, D, BS = 32, 8, 64, 16
SCALE = 1.0 / math.sqrt(D)
CASES = [(1, 1024), (1, 2048), (8, 1024), (16, 2048), (32, 2048), (64, 512), (64, 1024),
         (64, 2048)]
TARGETS = [(1, 1024), (64, 2048)]
#: kernel shapes timed by --sweep (``attention_fast.KernelShape``: 16-byte loads, lanes per
#: token, passes per load, passes per softmax update); the package launches the winner,
#: ``attention_fast.CHOSEN_SHAPE``
SWEEP = [("wide-g8u1l1", KernelShape(wide=True, max_lanes=8, load_passes=1, update_passes=1)),
         ("wide-g8u1l2", KernelShape(wide=True, max_lanes=8, load_passes=2, update_passes=1)),
         ("wide-g8u2l2", KernelShape(wide=True, max_lanes=8, load_passes=2, update_passes=2)),
         ("wide-g8u2l4", KernelShape(wide=True, max_lanes=8, load_passes=4, update_passes=2)),
         ("narrow-g16u2l4", KernelShape(wide=False, max_lanes=16, load_passes=4,
                                        update_passes=2))]
SWEEP_SPLITS = (None, 1, 2, 4, 8, 16, 32)     # None: the package's own choice


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What ``--sweep`` times beside the defaults: (name, KernelShape) variants, each with 4 and
    8 warps per block and each split count."""
    variants: tuple = tuple(SWEEP)
    splits: tuple = SWEEP_SPLITS


def build_cache(batch: int, ctx: int, g: torch.Generator, device: str = "cuda"):
    """A cache with ``n_layers`` layers of ``batch`` sequences of ``ctx`` tokens each (enough
    layers that the launches of one timing graph read >= ROTATE_BYTES), random contents,
    its blocks scattered at random; ``g``: a generator on ``device``."""
    kv_bytes = batch * ctx * N_KV * D * 2 * 2
    n_layers = copies_for(kv_bytes)
    blocks = batch * n_layers * (ctx // BS)
    cfg = CacheConfig(num_layers=n_layers, num_kv_heads=N_KV, head_dim=D, dtype="bfloat16",
                      max_slots=batch, max_seq_len=ctx, block_size=BS,
                      kv_cache_bytes=blocks * 2 * BS * N_KV * D * 2)
    cache = PagedKVCache(cfg, device=device)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g, device=device)
                       .to(torch.bfloat16))
    perm = torch.randperm(cfg.NUM_BLOCKS, generator=g, device=device).to(torch.int32)
    cache.block_table[...] = perm.cpu().numpy().reshape(batch, n_layers, ctx // BS)
    cache.free_blocks = []
    cache.mark_table_changed()
    return cache, n_layers, kv_bytes


def reference(q, cache, layer, seq_lens, slots):
    """float32 attention on K/V gathered through the block table (masked to each length)."""
    c = cache.config
    table = cache.device_block_table()[slots.long(), layer].long()          # [B, MAXB]
    view = cache.buffer.view(c.NUM_BLOCKS, 2, BS, N_KV, D)
    kv = view[table]                                                         # [B, MAXB, 2, ...]
    k = kv[:, :, 0].reshape(q.shape[0], -1, N_KV, D).float()
    v = kv[:, :, 1].reshape(q.shape[0], -1, N_KV, D).float()
    qf = q.float().view(q.shape[0], N_KV, N_Q // N_KV, D)
    s = torch.einsum("bhgd,bthd->bhgt", qf, k) * SCALE
    t = torch.arange(k.shape[1], device=q.device)
    s = s.masked_fill(t[None, None, None, :] >= seq_lens.long()[:, None, None, None],
                      float("-inf"))
    p = torch.softmax(s, -1)
    return torch.einsum("bhgt,bthd->bhgd", p, v).reshape(q.shape)


def contiguous_kv(cache, layer, batch, ctx):
    c = cache.config
    table = cache.device_block_table()[:batch, layer].long()
    kv = cache.buffer.view(c.NUM_BLOCKS, 2, BS, N_KV, D)[table]
    k = kv[:, :, 0].reshape(batch, ctx, N_KV, D).transpose(1, 2).contiguous()
    v = kv[:, :, 1].reshape(batch, ctx, N_KV, D).transpose(1, 2).contiguous()
    return k, v


def decode_impls(cache, sweep: Sweep | None):
    article = NumbaBackend(options=KernelOptions(attention="article"))
    impls = {
        "fast": lambda q, l, sl, sa: attention_fast.decode_attention_fast(
            q, cache, cache.device_block_table(), l, sl, sa, SCALE),
        "article": lambda q, l, sl, sa: article.decode_attention(
            q, cache, cache.device_block_table(), l, sl, sa, SCALE),
        # the tensor-core kernel as the engine runs it, and with each warp loading its next
        # block before computing the current one
        "tensor_core": lambda q, l, sl, sa: attention_tc.decode_attention_tc(
            q, cache, cache.device_block_table(), l, sl, sa, SCALE),
        "tensor_core-prefetch": lambda q, l, sl, sa: attention_tc.decode_attention_tc(
            q, cache, cache.device_block_table(), l, sl, sa, SCALE, prefetch=True),
    }
    if triton_attention.available():
        impls["triton"] = lambda q, l, sl, sa: triton_attention.decode_attention_triton(
            q, cache, cache.device_block_table(), l, sl, sa, SCALE)
    if sweep is not None:
        for vname, shape in sweep.variants:
            for nw in (4, 8):
                for splits in sweep.splits:
                    name = f"fast {vname} w{nw} s{splits or 'auto'}"
                    impls[name] = (lambda nw, splits, shape: lambda q, l, sl, sa:
                                   attention_fast.decode_attention_fast(
                                       q, cache, cache.device_block_table(), l, sl, sa, SCALE,
                                       num_warps=nw, n_splits=splits, shape=shape)
                                   )(nw, splits, shape)
    return impls


def bench_case(batch, ctx, bw_gbs, sweep, g):
    cache, n_layers, kv_bytes = build_cache(batch, ctx, g)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    slots = torch.randperm(batch, generator=g, device="cuda").to(torch.int32)
    q0 = torch.randn(batch, N_Q, D, generator=g, device="cuda").to(torch.bfloat16)
    row = {"batch": batch, "context": ctx, "kv_bytes": kv_bytes,
           "floor_us": kv_bytes / (bw_gbs * 1e9) * 1e6, "us": {}, "max_rel_err": {},
           "pct_of_copy_bw": {}}
    ref = reference(q0, cache, 0, seq_lens, slots)
    # mixed lengths too (ends mid-block, empty splits): checked, not timed
    mixed = torch.randint(1, ctx + 1, (batch,), generator=g, device="cuda").to(torch.int32)
    ref_mixed = reference(q0, cache, 0, mixed, slots)
    target = (batch, ctx) in TARGETS
    for name, fn in decode_impls(cache, sweep).items():
        if name == "article" and not target:
            continue
        q = q0.clone()
        fn(q, 0, seq_lens, slots)
        qm = q0.clone()
        fn(qm, 0, mixed, slots)
        torch.cuda.synchronize()
        err = max(rel_err(q, ref), rel_err(qm, ref_mixed))
        row["max_rel_err"][name] = err
        if not err < 1e-2:
            raise AssertionError(f"{name} at batch {batch} ctx {ctx}: rel err {err}")
        qs = [q0.clone() for _ in range(N_INNER)]
        us = graph_ms(lambda i: fn(qs[i], i % n_layers, seq_lens, slots), N_INNER) * 1e3
        row["us"][name] = us
        row["pct_of_copy_bw"][name] = 100 * row["floor_us"] / us
    # torch SDPA on contiguous K/V (no block table), the library baseline
    kvs = [contiguous_kv(cache, layer, batch, ctx) for layer in range(n_layers)]
    qd = q0.view(batch, N_Q, 1, D)
    out = torch.nn.functional.scaled_dot_product_attention(qd, *kvs[0], scale=SCALE,
                                                           enable_gqa=True)
    row["max_rel_err"]["sdpa"] = rel_err(out.view(batch, N_Q, D),
                                         reference(q0, cache, 0, seq_lens, torch.arange(
                                             batch, device="cuda", dtype=torch.int32)))
    us = graph_ms(lambda i: torch.nn.functional.scaled_dot_product_attention(
        qd, *kvs[i % n_layers], scale=SCALE, enable_gqa=True), N_INNER) * 1e3
    row["us"]["sdpa"] = us
    row["pct_of_copy_bw"]["sdpa"] = 100 * row["floor_us"] / us
    bench_flashinfer(row, cache, n_layers, q0, seq_lens, mixed, slots, ref, ref_mixed)
    if "article" in row["us"]:
        row["speedup_vs_article"] = row["us"]["article"] / row["us"]["fast"]
    row["tensor_core_speedup_vs_fast"] = row["us"]["fast"] / row["us"]["tensor_core"]
    return row


def bench_flashinfer(row, cache, n_layers, q0, seq_lens, mixed, slots, ref, ref_mixed) -> None:
    """FlashInfer's batch decode (``flashinfer_peer.py``), CUDA cores and tensor cores, checked
    like the others, timed the same way; where it cannot run, ``row["not_run"]`` says why."""
    ok, why = flashinfer_peer.available()
    if not ok:
        row.setdefault("not_run", {})["flashinfer"] = why
        return
    for name, tensor_cores in (("flashinfer", False), ("flashinfer-tc", True)):
        try:
            peer = flashinfer_peer.FlashInferDecode(cache, N_Q, SCALE, tensor_cores)
            err = max(rel_err(peer(q0.clone(), 0, seq_lens, slots).clone(), ref),
                      rel_err(peer(q0.clone(), 0, mixed, slots).clone(), ref_mixed))
            row["max_rel_err"][name] = err
            if not err < 1e-2:
                raise AssertionError(f"rel err {err}")
            for layer in range(n_layers):
                peer.prepare(layer, seq_lens, slots)
            torch.cuda.synchronize()
            qs = [q0.clone() for _ in range(N_INNER)]
            us = graph_ms(lambda i: peer(qs[i], i % n_layers, seq_lens, slots), N_INNER) * 1e3
        except Exception as exc:          # a peer that fails is reported, not fatal
            row.setdefault("not_run", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        row["us"][name] = us
        row["pct_of_copy_bw"][name] = 100 * row["floor_us"] / us


def bench_prefill(g, matmul_tflops):
    """Causal attention of 2 x 1024 packed tokens, one layer: the Numba kernel, one varlen
    flash call (the GPU default) and SDPA per sequence."""
    cu = [0, 1024, 2048]
    t = cu[-1]
    qkv = torch.randn(t, (N_Q + 2 * N_KV) * D, generator=g, device="cuda").to(torch.bfloat16)
    q = qkv[:, :N_Q * D].view(t, N_Q, D)
    k = qkv[:, N_Q * D:(N_Q + N_KV) * D].view(t, N_KV, D)
    v = qkv[:, (N_Q + N_KV) * D:].view(t, N_KV, D)
    from paged_tutorial.backends.torch_ref import TorchBackend
    from paged_tutorial.step_inputs import prefill_layout
    layout = prefill_layout(cu, "cuda")
    ref = TorchBackend("cuda").prefill_attention(q.float(), k.float(), v.float(), layout, SCALE)
    flops = sum(4 * N_Q * D * (n * (n + 1) // 2) for n in (1024, 1024))   # QK^T + PV, causal
    numba_prefill = NumbaBackend(options=KernelOptions(prefill="numba"))
    default = NumbaBackend()                  # the GPU default: one varlen flash call
    impls = {"numba": lambda: numba_prefill.prefill_attention(q, k, v, layout, SCALE),
             "varlen": lambda: default.prefill_attention(q, k, v, layout, SCALE),
             "sdpa_per_sequence": lambda: prefill_attention_sdpa(q, k, v, cu, SCALE)}
    res = {"tokens": t, "sequences": 2, "flops": flops, "us": {}, "tflops": {},
           "max_rel_err": {}}
    for name, fn in impls.items():
        out = fn()
        res["max_rel_err"][name] = rel_err(out, ref)
        if not res["max_rel_err"][name] < 1e-2:
            raise AssertionError(f"prefill {name}: rel err {res['max_rel_err'][name]}")
        us = graph_ms(lambda i: fn(), 3, reps=10) * 1e3
        res["us"][name] = us
        res["tflops"][name] = flops / (us * 1e-6) / 1e12
    res["pct_of_matmul_rate"] = {n: 100 * x / matmul_tflops for n, x in res["tflops"].items()}
    return res


def best_variant(rows, sweep: Sweep) -> dict | None:
    """The (variant, warps) whose automatic split choice has the smallest geometric-mean time
    over the cases (None when the sweep left the automatic choice out)."""
    scores = {}
    for row in rows:
        for name, us in row["us"].items():
            if name.startswith("fast ") and name.endswith(" sauto"):
                key = name[len("fast "):-len(" sauto")]
                scores.setdefault(key, []).append(math.log(us))
    if not scores:
        return None
    key = min(scores, key=lambda k: sum(scores[k]) / len(scores[k]))
    vname, nw = key.rsplit(" w", 1)
    return {"name": key, "num_warps": int(nw), **dataclasses.asdict(dict(sweep.variants)[vname]),
            "geomean_us": math.exp(sum(scores[key]) / len(scores[key]))}


def best_per_case(rows) -> list[dict]:
    """For each swept case, the fastest (variant, warps, splits) and its time."""
    out = []
    for row in rows:
        swept = {k: v for k, v in row["us"].items() if k.startswith("fast ")}
        if swept:
            name = min(swept, key=swept.get)
            out.append({"batch": row["batch"], "context": row["context"], "name": name,
                        "us": swept[name], "fast_us": row["us"]["fast"]})
    return out


def parse_cases(text: str | None) -> list[tuple[int, int]]:
    """``"1:1024,64:2048"`` -> [(1, 1024), (64, 2048)] (batch, context); None -> ``CASES``."""
    if not text:
        return list(CASES)
    cases = []
    for item in text.split(","):
        batch, sep, ctx = item.partition(":")
        if not sep or not batch.strip().isdigit() or not ctx.strip().isdigit():
            raise ValueError(f"case {item!r}: give BATCH:CONTEXT, e.g. 1:1024,64:2048")
        cases.append((int(batch), int(ctx)))
    return cases


def sweep_for(variants: str | None = None, splits: str | None = None) -> Sweep:
    """The ``Sweep`` narrowed to the comma-separated ``variants`` (names of ``SWEEP``) and
    ``splits`` (split counts, 0 for the package's own choice)."""
    sweep = Sweep()
    if variants:
        known = dict(SWEEP)
        unknown = [v for v in variants.split(",") if v not in known]
        if unknown:
            raise ValueError(f"unknown --variants {unknown}; SWEEP has {list(known)}")
        sweep = dataclasses.replace(sweep, variants=tuple(
            (v, known[v]) for v in variants.split(",")))
    if splits:
        sweep = dataclasses.replace(sweep, splits=tuple(
            int(x) or None for x in splits.split(",")))
    return sweep


def run(cases, sweep: Sweep | None, out, best_out: str | None = None,
        skip_prefill: bool = False) -> dict:
    """Check and time every (batch, context) of ``cases`` (with the fast kernel's variants of
    ``sweep`` when given; the best written to ``best_out`` as JSON), then prefill attention
    unless ``skip_prefill``; ``attention-<date>.json`` goes to ``out`` after every case."""
    t0 = time.time()
    g = torch.Generator(device="cuda").manual_seed(0)
    data = {**gpu_info(), "shapes": {"n_q_heads": N_Q, "n_kv_heads": N_KV, "head_dim": D,
                                     "block_size": BS, "dtype": "bfloat16"}}
    data["ceilings"] = ceilings()
    bw = data["ceilings"]["copy_bandwidth_gbs"]
    data["rows"] = []
    for batch, ctx in cases:
        row = bench_case(batch, ctx, bw, sweep, g)
        torch.cuda.empty_cache()
        data["rows"].append(row)
        write_json(data, "attention", out)              # each case kept as it is timed
        print(f"B={batch:3d} ctx={ctx:5d} " + " ".join(
            f"{k}={v:.1f}us({row['pct_of_copy_bw'][k]:.0f}%)" for k, v in row["us"].items()
            if not k.startswith("fast ")), flush=True)
    if sweep is not None:
        data["best_variant"] = best_variant(data["rows"], sweep)
        print("best variant:", data["best_variant"], flush=True)
        data["best_per_case"] = best_per_case(data["rows"])
        for b in data["best_per_case"]:
            print(f"best at B={b['batch']} ctx={b['context']}: {b['name']} {b['us']:.1f} us "
                  f"(default {b['fast_us']:.1f})", flush=True)
        best = data["best_variant"]
        for row in data["rows"] if best else []:  # the winner under its own name, where timed
            key = f"fast {best['name']} sauto"
            if key in row["us"]:
                row["us"]["fast_tuned"] = row["us"][key]
                row["pct_of_copy_bw"]["fast_tuned"] = row["pct_of_copy_bw"][key]
        if best_out and best:
            Path(best_out).write_text(json.dumps(best))
    if not skip_prefill:
        data["prefill"] = bench_prefill(g, data["ceilings"]["bf16_matmul_tflops"])
    data["seconds"] = round(time.time() - t0, 1)
    write_json(data, "attention", out)
    print_summary(data)
    return data


def print_summary(data: dict) -> None:
    print(f"ceilings: {data['ceilings']}")
    if "prefill" in data:
        print("prefill attention (2 x 1024): " + " ".join(
            f"{k}={v:.0f}us ({data['prefill']['tflops'][k]:.1f} TFLOP/s)"
            for k, v in data["prefill"]["us"].items()))
    for row in data["rows"]:
        if (row["batch"], row["context"]) in TARGETS:
            best = sorted(((v, k) for k, v in row["us"].items()))[:4]
            print(f"TARGET B={row['batch']} ctx={row['context']}: fast {row['us']['fast']:.1f} us "
                  f"= {row['pct_of_copy_bw']['fast']:.0f}% of copy bw, "
                  f"{row.get('speedup_vs_article', 0):.1f}x article; best: {best}")
