"""Where one engine step's time goes, kernel by kernel (torch.profiler), on the GPU: decode steps
by graph replay and eagerly, a prefill step, and the host's cost per launch.

``kernel_table`` turns a profile into calls, total and mean microseconds per kernel name
(``short_name``: a Numba kernel's mangled name cut to its Python function's); ``run`` is what
``benchmarks/profile_step.py`` (its docstring says what it measures and writes) calls.
Importing this module needs no GPU; running it does.
"""

from __future__ import annotations

import re
import time

import torch

import paged_tutorial as pt
from paged_tutorial.measure.decode_ladder import (PROMPT_LEN, make_engine, prompts_for,
                                                  random_gpu_model)
from paged_tutorial.measure.gpu_machine import gpu_info
from paged_tutorial.measure.result_files import write_json
from paged_tutorial.measure.wall_clock import median_wall_ms, per_call_us

TOP = 40


def short_name(name: str) -> str:
    """A Numba kernel's name (mangled, or demangled by the profiler) -> ``numba:`` + the
    Python function's name; other kernels' names cut to 120 characters."""
    if "paged_tutorial::" in name:
        return "numba:" + name.split("[abi")[0].split("(")[0].split("::")[-1]
    if not name.startswith("_ZN"):
        return name[:120]
    tokens, i = [], 3
    while i < len(name) and name[i].isdigit():
        m = re.match(r"\d+", name[i:])
        n = int(m.group())
        i += len(m.group())
        tokens.append(name[i:i + n])
        i += n
    return f"numba:{tokens[-1]}" if tokens else name[:120]


def kernel_table(prof) -> dict:
    per: dict[str, list[float]] = {}
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        per.setdefault(short_name(evt.name), []).append(evt.time_range.elapsed_us())
    rows = sorted(({"name": k, "calls": len(v), "total_us": round(sum(v), 2),
                    "mean_us": round(sum(v) / len(v), 2)} for k, v in per.items()),
                  key=lambda r: -r["total_us"])
    total = sum(r["total_us"] for r in rows)
    return {"kernel_ms": round(total / 1e3, 4), "kernels": sum(r["calls"] for r in rows),
            "by_kernel": rows[:TOP], "other_kernels_us": round(
                sum(r["total_us"] for r in rows[TOP:]), 2)}


def profiled(fn, wall_reps: int = 15) -> dict:
    """Wall time of fn() (median, synchronized), then one profiled call."""
    wall = median_wall_ms(fn, wall_reps, sync=torch.cuda.synchronize)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {"wall_ms": round(wall, 4), **kernel_table(prof)}


def decode_step_fn(model, batch: int, graphs: bool):
    """An engine mid-generation, and a function running one decode step of it (the running
    requests' positions are restored after each call, so every call is the same step)."""
    engine = make_engine(model, batch, cuda_graphs=graphs)
    prompts = prompts_for(batch, PROMPT_LEN, 1, model.config.vocab_size)
    for p in prompts:
        engine.add_request(p, pt.SamplingParams(max_tokens=1 << 20, ignore_eos=True),
                           chat=False)
    engine.step()                                            # prefill
    engine.step()                                            # first decode (graph capture)
    requests = list(engine.scheduler.running)

    def step():
        lens = [(r, r.num_computed_tokens, len(r.output_ids)) for r in requests]
        report = engine.step()
        assert report.kind == "decode" and report.num_tokens == batch
        for r, cached, n_out in lens:                        # rewind: same step next time
            r.num_computed_tokens = cached
            del r.output_ids[n_out:]
    return step


def prefill_step_fn(model):
    engine = pt.Engine(model, max_slots=2, max_seq_len=1100)
    prompts = [prompts_for(1, 1024, 11 + i, model.config.vocab_size)[0] for i in range(2)]

    def step():
        results = engine.generate(prompts, pt.SamplingParams(max_tokens=1, ignore_eos=True),
                                  chat=False)
        assert all(len(r.token_ids) == 1 for r in results)
    return step


def numba_own_launch(nb, x, w):
    """nb.rms_norm's kernel launched through Numba's own path (``kernel[grid, block,
    stream](*args)``, every argument converted per call), for comparison with the launcher."""
    from numba import cuda

    from paged_tutorial.backends.numba_cuda.kernels import norms

    hidden = x.shape[1]
    threads, per_thread = norms.vec_row_threads(hidden, 512)
    kernel = norms.rms_norm_vec_kernels(per_thread)[0]
    out = torch.empty_like(x)
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    xa = cuda.as_cuda_array(x.view(torch.int16)).view("int32")
    wa = cuda.as_cuda_array(w.view(torch.int16)).view("int32")
    oa = cuda.as_cuda_array(out.view(torch.int16)).view("int32")
    return lambda: kernel[1, threads, stream](xa, hidden // 2, wa, oa, hidden, 1e-5)


def host_costs(model) -> dict:
    """Host microseconds per call of small ops (2000 calls, then one sync: the GPU keeps up,
    so this is the host's time), through the launcher of ``launch.py`` and Numba's own; and a cProfile of
    eager decode steps at batch 1: which Python functions the host time goes to."""
    import cProfile
    import pstats

    from paged_tutorial.backends.numba_cuda import NumbaBackend
    from paged_tutorial.backends.numba_cuda.runtime import launch

    nb = NumbaBackend()
    x = torch.randn(1, model.config.hidden_size, device="cuda").to(torch.bfloat16)
    w = torch.ones(model.config.hidden_size, device="cuda", dtype=torch.bfloat16)
    gu = torch.randn(1, 2 * model.config.intermediate_size, device="cuda").to(torch.bfloat16)
    res = {}

    def host_us(fn):
        return round(per_call_us(fn, 2000, sync=torch.cuda.synchronize), 2)

    # the launcher (``launch.launch``) against Numba's own launch of the same kernel
    res["rms_norm_raw_us"] = host_us(lambda: nb.rms_norm(x, w, 1e-5))
    res["silu_mul_raw_us"] = host_us(lambda: nb.silu_mul(gu))
    norm_numba = numba_own_launch(nb, x, w)
    res["rms_norm_numba_us"] = host_us(norm_numba)
    res["torch_empty_us"] = host_us(lambda: torch.empty(1, 2048, device="cuda",
                                                            dtype=torch.bfloat16))
    wl = model.weights["model.layers.0.self_attn.o_proj.weight"]
    res["torch_linear_us"] = host_us(lambda: torch.nn.functional.linear(x, wl))
    res["launch_errors"] = {f"{k[0]}/{k[1]}": v for k, v in launch.FAST_LAUNCH_ERRORS.items()}
    step = decode_step_fn(model, 1, False)
    step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():
        rows.append({"function": f"{file.rsplit('/', 1)[-1]}:{line}:{fn}", "calls_per_step":
                     nc / 20, "self_us_per_step": round(tt / 20 * 1e6, 1),
                     "total_us_per_step": round(ct / 20 * 1e6, 1)})
    rows.sort(key=lambda r: -r["self_us_per_step"])
    res["eager_decode_b1_cprofile_top"] = rows[:30]
    return res


def run(out) -> dict:
    """Profile every case (an error is recorded in its place and the others still run), then
    the host's costs; ``profile-<date>.json`` goes to the folder ``out``."""
    t0 = time.time()
    data = {**gpu_info(), "model": "Llama-3.2-1B shapes, random bf16 weights",
            "prompt_len": PROMPT_LEN}
    model = random_gpu_model()
    cases = {"decode_graph_b1": lambda: decode_step_fn(model, 1, True),
             "decode_graph_b64": lambda: decode_step_fn(model, 64, True),
             "decode_eager_b1": lambda: decode_step_fn(model, 1, False),
             "prefill_2x1024": lambda: prefill_step_fn(model)}
    for name, make in cases.items():
        try:
            data[name] = profiled(make())
        except Exception as exc:                             # report, keep the others
            data[name] = {"error": repr(exc)[:400]}
        d = data[name]
        print(f"{name}: wall {d.get('wall_ms')} ms, kernels {d.get('kernel_ms')} ms "
              f"({d.get('kernels')} launches)", flush=True)
        for r in d.get("by_kernel", [])[:12]:
            print(f"    {r['total_us']:9.1f} us {r['calls']:4d} x {r['mean_us']:7.2f}  "
                  f"{r['name'][:90]}", flush=True)
        torch.cuda.empty_cache()
    try:
        data["host"] = host_costs(model)
        print("host:", {k: v for k, v in data["host"].items() if k.endswith("_us")},
              data["host"]["launch_errors"], flush=True)
        for r in data["host"]["eager_decode_b1_cprofile_top"][:25]:
            print(f"    self {r['self_us_per_step']:8.1f} us/step  {r['calls_per_step']:6.0f} "
                  f"calls  {r['function'][:90]}", flush=True)
    except Exception as exc:
        data["host"] = {"error": repr(exc)[:400]}
        print("host costs failed:", data["host"], flush=True)
    data["seconds"] = round(time.time() - t0, 1)
    write_json(data, "profile", out)
    return data
