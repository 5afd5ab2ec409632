"""GPU self-check: every kernel against ``TorchBackend`` at Llama-3.2-1B shapes, with timings.

    python -m paged_tutorial.backends.numba_cuda.selfcheck [--json out.json] [--dtype bfloat16]

Run it on a machine with an NVIDIA GPU (NUMBA_ENABLE_CUDASIM unset).  It checks what the
simulator cannot: that every kernel compiles for the real target (libdevice bit casts, fp16
casts, shuffles), agrees with torch at full size (scattered blocks, 32 q / 8 kv heads,
contexts of ~1000 tokens, a 128256-token vocabulary), runs on torch's stream, and can be
captured in a CUDA graph.  Each op is timed with CUDA events around one Python call (median
of several), so small ops measure the host's launch overhead (argument conversion + Numba
dispatch, ~0.1-0.3 ms) more than the kernel; the CUDA-graph line shows replay without it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from . import SIMULATING, NumbaBackend
from ..torch_ref import TorchBackend
from ...config import CacheConfig, llama_3_2_1b_config
from ...kv_cache import PagedKVCache
from ...sampling import sample_reference


def _time(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


RTOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def _err(a, b):
    """max |a - b| / (rtol |b| + atol) for a's dtype: <= 1 passes (about 1-2 ulps)."""
    rtol = RTOL[a.dtype]
    a, b = a.float(), b.float()
    return float(((a - b).abs() / (rtol * b.abs() + rtol / 10)).max())


def _decode_oracle(ref, q, cache, bt, layer, lens, act, scale):
    """float32 attention over the same (rounded) cached K/V: what the kernel computes."""
    out = q.float().clone()
    for b, (slot, n) in enumerate(zip(act.tolist(), lens.tolist())):
        k, v = ref.gather_kv(cache, bt, slot, layer, n)
        out[b] = ref._attend(out[b:b + 1], k.float(), v.float(), scale, causal=False)[0]
    return out


def run(dtype_name="bfloat16", seed=0) -> dict:
    if SIMULATING:
        raise SystemExit("selfcheck runs the real kernels: start it without NUMBA_ENABLE_CUDASIM")
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16,
          "float32": torch.float32}[dtype_name]
    dev = torch.device("cuda")
    nb, ref = NumbaBackend(), TorchBackend(dev)
    g = torch.Generator(device=dev).manual_seed(seed)
    m = llama_3_2_1b_config()
    H, nH, nKV, D, inter, V = (m.hidden_size, m.n_heads, m.n_kv_heads, m.head_dim,
                               m.intermediate_size, m.vocab_size)
    results = {"gpu": torch.cuda.get_device_name(), "dtype": dtype_name,
               "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "ops": {}}

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(dt)

    def record(name, err, tol, t_numba, t_torch, **extra):
        ok = err <= tol
        results["ops"][name] = {"max_rel_err": err, "tol": tol, "ok": ok,
                                "numba_ms": t_numba, "torch_ms": t_torch, **extra}
        print(f"{name:28s} err {err:9.2e} (tol {tol:.0e}) {'ok ' if ok else 'BAD'} "
              f"numba {t_numba:8.4f} ms  torch {t_torch:8.4f} ms", flush=True)

    tol = 1.0                       # see _err: ~1-2 ulps of the storage dtype
    T = 1024
    # embed
    w = rn(V, H)
    ids = torch.randint(0, V, (T,), generator=g, device=dev, dtype=torch.int32)
    record("embed T=1024", _err(nb.embed(w, ids), ref.embed(w, ids)), 0.0,
           _time(lambda: nb.embed(w, ids)), _time(lambda: ref.embed(w, ids)))
    # norms
    x, wn = rn(T, H, scale=3), rn(H)
    record("rms_norm T=1024", _err(nb.rms_norm(x, wn, 1e-5), ref.rms_norm(x, wn, 1e-5)), tol,
           _time(lambda: nb.rms_norm(x, wn, 1e-5)), _time(lambda: ref.rms_norm(x, wn, 1e-5)))
    r1, r2 = rn(T, H), None
    r2 = r1.clone()
    o1, o2 = nb.add_rms_norm(x, r1, wn, 1e-5), ref.add_rms_norm(x, r2, wn, 1e-5)
    record("add_rms_norm T=1024", max(_err(o1, o2), _err(r1, r2)), tol,
           _time(lambda: nb.add_rms_norm(x, r1.clone(), wn, 1e-5)),
           _time(lambda: ref.add_rms_norm(x, r2.clone(), wn, 1e-5)))
    # rope on q/k sliced out of a fused qkv
    qkv = rn(T, (nH + 2 * nKV) * D)
    q = qkv[:, :nH * D].view(T, nH, D)
    k = qkv[:, nH * D:(nH + nKV) * D].view(T, nKV, D)
    inv = 1.0 / 500000.0 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D)
    ang = torch.arange(4096, device=dev, dtype=torch.float32)[:, None] * inv
    cos, sin = ang.cos(), ang.sin()
    pos = torch.randint(0, 4096, (T,), generator=g, device=dev, dtype=torch.int32)
    q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
    nb.rope(q1, k1, pos, cos, sin)
    ref.rope(q2, k2, pos, cos, sin)
    qq, kk = q.clone(), k.clone()
    record("rope T=1024", max(_err(q1, q2), _err(k1, k2)), tol,
           _time(lambda: nb.rope(qq, kk, pos, cos, sin)),
           _time(lambda: ref.rope(qq, kk, pos, cos, sin)))
    # silu_mul
    gu = rn(T, 2 * inter, scale=3)
    record("silu_mul T=1024", _err(nb.silu_mul(gu), ref.silu_mul(gu)), tol,
           _time(lambda: nb.silu_mul(gu)), _time(lambda: ref.silu_mul(gu)))

    # the paged cache: 8 slots, scattered blocks
    ctx = [1024, 977, 513, 2000, 31, 1500, 700, 1100]
    cfg = CacheConfig.for_model(m, dtype=dtype_name, kv_cache_bytes=1 << 30, max_slots=8)
    cache = PagedKVCache(cfg, device=dev)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g, device=dev).to(dt))
    perm = torch.randperm(len(cache.free_blocks)).tolist()
    cache.free_blocks = [cache.free_blocks[i] for i in perm]
    for slot, n in enumerate(ctx):
        cache.ensure_capacity(slot, n)
    bt = cache.device_block_table()
    layer = 5
    # write_kv: a prefill of slot 0 (1024 tokens) + one decode token for each other slot
    slots = torch.tensor([0] * 1024 + list(range(1, 8)), dtype=torch.int32, device=dev)
    positions = torch.tensor(list(range(1024)) + [n - 1 for n in ctx[1:]], dtype=torch.int32,
                             device=dev)
    kw, vw = rn(len(slots), nKV, D), rn(len(slots), nKV, D)
    twin_buf = cache.buffer.clone()
    nb.write_kv(cache, kw, vw, bt, layer, slots, positions)
    nb_buf = cache.buffer.clone()
    cache.buffer.copy_(twin_buf)
    ref.write_kv(cache, kw, vw, bt, layer, slots, positions)
    bits = torch.int32 if dt == torch.float32 else torch.int16
    same = torch.equal(nb_buf.view(bits), cache.buffer.view(bits))
    record("write_kv T=1031", 0.0 if same else 1.0, 0.0,
           _time(lambda: nb.write_kv(cache, kw, vw, bt, layer, slots, positions)),
           _time(lambda: ref.write_kv(cache, kw, vw, bt, layer, slots, positions)))

    # decode attention, the article's kernel
    scale = 1.0 / math.sqrt(D)
    for batch in (1, 8):
        qd = rn(batch, nH, D)
        lens = torch.tensor(ctx[:batch], dtype=torch.int32, device=dev)
        act = torch.arange(batch, dtype=torch.int32, device=dev).flip(0) if batch > 1 else \
            torch.tensor([0], dtype=torch.int32, device=dev)
        lens = lens.flip(0) if batch > 1 else lens
        a, b = qd.clone(), qd.clone()
        nb.decode_attention(a, cache, bt, layer, lens, act, scale)
        ref.decode_attention(b, cache, bt, layer, lens, act, scale)
        results.setdefault("vs_torch_same_dtype", {})[f"decode B={batch}"] = _err(a, b)
        record(f"decode_attention B={batch}",
               _err(a, _decode_oracle(ref, qd, cache, bt, layer, lens, act, scale)), tol,
               _time(lambda: nb.decode_attention(qd.clone(), cache, bt, layer, lens, act, scale)),
               _time(lambda: ref.decode_attention(qd.clone(), cache, bt, layer, lens, act, scale),
                     reps=3), ctx=ctx[:batch])

    # prefill attention: two prompts packed
    cu = [0, 600, 1024]
    qkv = rn(T, (nH + 2 * nKV) * D)
    q = qkv[:, :nH * D].view(T, nH, D)
    k = qkv[:, nH * D:(nH + nKV) * D].view(T, nKV, D)
    v = qkv[:, (nH + nKV) * D:].view(T, nKV, D)
    a = nb.prefill_attention(q, k, v, cu, scale)
    results.setdefault("vs_torch_same_dtype", {})["prefill"] = _err(
        a, ref.prefill_attention(q, k, v, cu, scale))
    record("prefill_attention T=1024",
           _err(a, ref.prefill_attention(q.float(), k.float(), v.float(), cu, scale)), tol,
           _time(lambda: nb.prefill_attention(q, k, v, cu, scale)),
           _time(lambda: ref.prefill_attention(q, k, v, cu, scale)))

    # sampling over the full vocabulary
    B = 8
    logits = torch.randn(B, V, generator=g, device=dev) * 4
    temp = torch.tensor([0, 0.7, 1.0, 0.6, 1.2, 0.0, 0.9, 0.8], device=dev)
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 0.95, 1.0, 0.3, 0.99], device=dev)
    u = torch.rand(B, generator=g, device=dev)
    got, want = nb.sample(logits, temp, top_p, u).cpu(), sample_reference(logits, temp, top_p,
                                                                            u).cpu()
    record("sample B=8 V=128256", float((got != want).sum()), 0.0,
           _time(lambda: nb.sample(logits, temp, top_p, u)),
           _time(lambda: sample_reference(logits, temp, top_p, u), reps=3),
           got=got.tolist(), want=want.tolist())

    # CUDA graph capture of Numba launches (on torch's stream)
    qd = rn(8, nH, D)
    lens = torch.tensor(ctx, dtype=torch.int32, device=dev)
    act = torch.arange(8, dtype=torch.int32, device=dev)
    xg = rn(8, H)
    static_q = qd.clone()
    nb.decode_attention(static_q, cache, bt, layer, lens, act, scale)   # compiled already
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        static_q.copy_(qd)
        out_norm = nb.rms_norm(xg, wn, 1e-5)
    torch.cuda.current_stream().wait_stream(s)
    captured = True
    try:
        with torch.cuda.graph(graph):
            static_q.copy_(qd)
            nb.decode_attention(static_q, cache, bt, layer, lens, act, scale)
            out_norm = nb.rms_norm(xg, wn, 1e-5)
        graph.replay()
        torch.cuda.synchronize()
        expect_q = _decode_oracle(ref, qd, cache, bt, layer, lens, act, scale)
        graph_err = max(_err(static_q, expect_q), _err(out_norm, ref.rms_norm(xg, wn, 1e-5)))
        t_graph = _time(graph.replay)
    except Exception as exc:                    # report, do not hide
        captured, graph_err, t_graph = False, float("inf"), float("nan")
        results["graph_error"] = repr(exc)
    record("cuda_graph decode+norm", graph_err, tol, t_graph, float("nan"),
           captured=captured)
    results["all_ok"] = all(op["ok"] for op in results["ops"].values())
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    res = run(args.dtype)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print("ALL OK" if res["all_ok"] else "SOME CHECKS FAILED")
    return 0 if res["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
