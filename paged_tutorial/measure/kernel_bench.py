"""The small kernels of a step against the bandwidth they should reach, and the GEMV against
cuBLAS, on the GPU: add_rms_norm, silu_mul and greedy sampling beside the scalar kernels they
replaced and torch's ops; the GEMV over its row counts (how ``gemv.MAX_ROWS`` was chosen); the
fast decode attention at short contexts over warps and splits.

``benchmarks/kernel_speeds.py`` (its docstring says what it measures and writes) calls ``run``.
Importing this module needs no GPU; running it does.
"""

from __future__ import annotations

import time

import torch

from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend
from paged_tutorial.backends.numba_cuda.kernels import attention_fast, gemv
from paged_tutorial.backends.sampling_rule import sample_reference
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.config import llama_3_2_1b_config
from paged_tutorial.measure.attention_bench import SCALE, build_cache, reference
from paged_tutorial.measure.comparison import rel_err
from paged_tutorial.measure.gpu_machine import ceilings, gpu_info
from paged_tutorial.measure.gpu_timers import N_INNER, copies_for, graph_ms
from paged_tutorial.measure.result_files import write_json

M = llama_3_2_1b_config()
H, I, V = M.hidden_size, M.intermediate_size, M.vocab_size
BF = torch.bfloat16


def timed(fn, inputs) -> float:
    """Microseconds per call, inputs rotated (set i % len(inputs)) across the graph's calls."""
    return graph_ms(lambda i: fn(*inputs[i % len(inputs)]), N_INNER) * 1e3


def small_ops(bw_gbs: float, g) -> list[dict]:
    nb, scalar, ref = NumbaBackend(), NumbaBackend(options=KernelOptions(vector=False)), TorchBackend("cuda")
    rows = []

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(BF)

    for T in (1, 64, 2048):
        wn = rn(H)
        # add_rms_norm: x, residual read; residual, out written
        nbytes = 4 * T * H * 2 + H * 2
        sets = [(rn(T, H), rn(T, H)) for _ in range(copies_for(nbytes))]
        a, r_a = sets[0][0], sets[0][1].clone()
        b, r_b = sets[0][0], sets[0][1].clone()
        oa, ob = nb.add_rms_norm(a, r_a, wn, 1e-5), scalar.add_rms_norm(b, r_b, wn, 1e-5)
        assert torch.equal(r_a, r_b) and float(
            ((oa.float() - ob.float()).abs() / (1e-2 * ob.float().abs() + 1e-3)).max()) <= 1
        row = {"op": "add_rms_norm", "tokens": T, "bytes": nbytes, "us": {
            "ours": timed(lambda x, r: nb.add_rms_norm(x, r, wn, 1e-5), sets),
            "scalar_kernel": timed(lambda x, r: scalar.add_rms_norm(x, r, wn, 1e-5), sets),
            "torch": timed(lambda x, r: ref.add_rms_norm(x, r, wn, 1e-5), sets)}}
        rows.append(row)
        # silu_mul: gate_up read, out written
        nbytes = 3 * T * I * 2
        sets = [(rn(T, 2 * I, scale=3),) for _ in range(copies_for(nbytes))]
        assert torch.equal(nb.silu_mul(sets[0][0]).view(torch.int16),
                           scalar.silu_mul(sets[0][0]).view(torch.int16))
        rows.append({"op": "silu_mul", "tokens": T, "bytes": nbytes, "us": {
            "ours": timed(nb.silu_mul, sets), "scalar_kernel": timed(scalar.silu_mul, sets),
            "torch": timed(ref.silu_mul, sets)}})
    # greedy sampling over the vocabulary (float32 logits)
    for B in (1, 64):
        nbytes = B * V * 4
        sets = [(torch.randn(B, V, generator=g, device="cuda"),) for _ in range(copies_for(nbytes))]
        zeros, ones = torch.zeros(B, device="cuda"), torch.ones(B, device="cuda")
        got = nb.sample(sets[0][0], zeros, ones, zeros)
        assert torch.equal(got.cpu(), sample_reference(sets[0][0], zeros, ones, zeros).cpu())
        rows.append({"op": "sample_greedy", "tokens": B, "bytes": nbytes, "us": {
            "ours": timed(lambda x: nb.sample(x, zeros, ones, zeros), sets),
            "torch_argmax": timed(lambda x: torch.argmax(x, -1), sets)}})
    for row in rows:
        floor = row["bytes"] / (bw_gbs * 1e9) * 1e6
        row["floor_us"] = floor
        row["pct_of_copy_bw"] = {k: 100 * floor / v for k, v in row["us"].items()}
    return rows


def gemv_rows(bw_gbs: float, g) -> list[dict]:
    nb = NumbaBackend(options=KernelOptions(gemv=True))
    max_rows, gemv.MAX_ROWS = gemv.MAX_ROWS, 8         # time T = 8 too
    shapes = {"qkv": (3072, H), "o": (H, H), "gate_up": (2 * I, H), "down": (H, I),
              "lm_head": (V, H)}
    rows = []
    for name, (n_out, k) in shapes.items():
        nbytes = n_out * k * 2
        ws = [(torch.randn(n_out, k, generator=g, device="cuda") * 0.02).to(BF)
              for _ in range(copies_for(nbytes))]
        for T in (1, 2, 4, 8):
            x = torch.randn(T, k, generator=g, device="cuda").to(BF)

            def ours(w, x=x):
                return nb.linear(x, w)

            err = rel_err(ours(ws[0]), x.float() @ ws[0].float().T)
            assert err < 4e-3, (name, T, err)
            floor = nbytes / (bw_gbs * 1e9) * 1e6
            us = {"ours": timed(ours, [(w,) for w in ws]),
                  "cublas": timed(lambda w, x=x: torch.nn.functional.linear(x, w),
                                  [(w,) for w in ws])}
            rows.append({"matrix": name, "shape": [n_out, k], "tokens": T, "floor_us": floor,
                         "us": us, "rel_err": err,
                         "pct_of_copy_bw": {kk: 100 * floor / v for kk, v in us.items()}})
            print(f"gemv {name:8s} T={T}: ours {us['ours']:7.1f} us, cuBLAS {us['cublas']:7.1f}"
                  f" us, floor {floor:6.1f} us", flush=True)
        del ws
        torch.cuda.empty_cache()
    gemv.MAX_ROWS = max_rows
    return rows


def attention_short_contexts(bw_gbs: float, g) -> list[dict]:
    """The fast decode-attention kernel at decode-benchmark contexts (128-token prompts: about
    160 tokens) and at 1024, over warps per block and splits per sequence: how the launch
    policy for short contexts was chosen."""
    rows = []
    for batch, ctx in ((1, 160), (64, 160), (1, 1024), (64, 1024)):
        cache, n_layers, kv_bytes = build_cache(batch, ctx, g)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        slots = torch.randperm(batch, generator=g, device="cuda").to(torch.int32)
        q0 = torch.randn(batch, 32, 64, generator=g, device="cuda").to(BF)
        ref = reference(q0, cache, 0, seq_lens, slots)
        floor = kv_bytes / (bw_gbs * 1e9) * 1e6
        us = {}
        for nw in (2, 4, 8):
            for splits in (None, 1, 2, 4, 8, 16):
                def fn(q, layer, nw=nw, splits=splits):
                    return attention_fast.decode_attention_fast(
                        q, cache, cache.device_block_table(), layer, seq_lens, slots, SCALE,
                        num_warps=nw, n_splits=splits)
                q = q0.clone()
                fn(q, 0)
                if not rel_err(q, ref) < 1e-2:
                    raise AssertionError(f"attention B={batch} ctx={ctx} w{nw} s{splits}")
                qs = [q0.clone() for _ in range(N_INNER)]
                us[f"w{nw} s{splits or 'auto'}"] = graph_ms(
                    lambda i: fn(qs[i], i % n_layers), N_INNER) * 1e3
        best = min(us, key=us.get)
        rows.append({"batch": batch, "context": ctx, "floor_us": floor, "us": us, "best": best})
        print(f"attention B={batch} ctx={ctx}: default(w{attention_fast.NUM_WARPS} sauto) "
              f"{us[f'w{attention_fast.NUM_WARPS} sauto']:.1f} us, best {best} {us[best]:.1f} "
              f"us, floor {floor:.1f} us", flush=True)
        del cache
        torch.cuda.empty_cache()
    return rows


def run(out) -> dict:
    """Every table, each kernel checked before it is timed; ``kernels-<date>.json`` goes to
    the folder ``out``."""
    t0 = time.time()
    g = torch.Generator(device="cuda").manual_seed(0)
    data = {**gpu_info(), "ceilings": ceilings()}
    bw = data["ceilings"]["copy_bandwidth_gbs"]
    data["small_ops"] = small_ops(bw, g)
    for r in data["small_ops"]:
        print(f"{r['op']:14s} T={r['tokens']:5d} floor {r['floor_us']:7.1f} us  " + "  ".join(
            f"{k} {v:7.1f} us ({r['pct_of_copy_bw'][k]:.0f}%)" for k, v in r["us"].items()),
            flush=True)
    data["gemv"] = gemv_rows(bw, g)
    data["attention_short"] = attention_short_contexts(bw, g)
    data["gemv_max_rows"] = gemv.MAX_ROWS
    data["seconds"] = round(time.time() - t0, 1)
    write_json(data, "kernels", out)
    return data
