"""Decode (and prefill) speed of the whole engine on the GPU, side by side with HF, and the
decode ladder that notebook 08 draws.

``benchmarks/decode.py`` (its docstring says what each run measures and writes) parses its
arguments and calls ``run``; ``quick_run`` is the ladder and HF eager alone, what notebook 08
times on a reader's GPU (``teaching/decode_on_your_gpu.py``).  Importing this module needs no
GPU; running it does.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import paged_tutorial as pt
from paged_tutorial.backends.numba_cuda import NumbaBackend
from paged_tutorial.config import llama_3_2_1b_config
from paged_tutorial.loading.models import Model
from paged_tutorial.loading.weights import expected_tensor_shapes
from paged_tutorial.measure.comparison import rel_err
from paged_tutorial.measure.gpu_machine import ceilings, gpu_info
from paged_tutorial.measure.gpu_timers import events_ms
from paged_tutorial.measure.result_files import write_json

BATCHES = (1, 64)
PROMPT_LEN = 128
NEW_TOKENS = 64
PREFILL_LENS = (1024, 1024)
LOGIT_RTOL = 3e-2


def random_gpu_model(seed: int = 0) -> Model:
    """``random_model``'s distribution (N(0, 0.02) matrices, 1 + N(0, 0.1) norms), drawn on
    the GPU: seconds instead of a minute of CPU sampling for 1.2 B parameters."""
    cfg = llama_3_2_1b_config()
    g = torch.Generator(device="cuda").manual_seed(seed)
    weights = {}
    for name, shape in expected_tensor_shapes(cfg).items():
        x = torch.randn(shape, generator=g, device="cuda")
        weights[name] = ((1.0 + 0.1 * x) if len(shape) == 1 else 0.02 * x).to(torch.bfloat16)
    return Model(cfg, weights, None, "bfloat16", source=f"random-gpu(seed={seed})")


def hf_model(model: Model, device="cuda"):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_dict(model.config.to_hf_dict())
    with torch.device(device):
        hf = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    missing, unexpected = hf.load_state_dict(model.weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.tie_weights()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


def prompts_for(batch: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, length).tolist() for _ in range(batch)]


def weight_bytes(model: Model) -> int:
    return sum(t.numel() * t.element_size() for t in model.weights.values())


# --- ours ------------------------------------------------------------------------------------

def make_engine(model, batch, **kw):
    return pt.Engine(model, max_slots=batch, max_seq_len=PROMPT_LEN + NEW_TOKENS + 64, **kw)


def exactly(n: int) -> pt.SamplingParams:
    """Greedy, exactly n tokens (random weights: EOS ignored)."""
    return pt.SamplingParams(max_tokens=n, ignore_eos=True)


def article_backend():
    """The numba backend with the article's decode attention kernel."""
    from paged_tutorial.backends.numba_cuda import KernelOptions

    return NumbaBackend(options=KernelOptions(attention="article"))


def ladder() -> dict:
    """The rungs of the decode-step fusions, each with graphs and without the rungs after it
    (the engine itself, with all of them, is the "engine" row): RoPE, the cache write and
    the SwiGLU in the GEMVs' epilogues (``KernelOptions.fuse_epilogues``), then launches that
    overlap the previous kernel (``overlap``).  "fused_norms_graphs" is the engine with the
    five-kernel layer (``fuse_norms``: the norms in the GEMVs' prologues, the residual adds in
    their epilogues), "looping_gemvs_graphs" the engine with the GEMVs' capped grid of
    looping blocks instead of one wave (``gemv_wave=False``), "sync_scheduling_graphs" the
    engine without asynchronous scheduling (each decode step read back and committed before
    the next is launched), and "fast_attention_graphs" the engine with the CUDA-core
    attention kernel at every batch (``attention="fast"``: no tensor cores from batch 16),
    all timed beside it."""
    from paged_tutorial.backends.numba_cuda import KernelOptions

    return {
        "graphs_separate_mlp_no_overlap": dict(backend=NumbaBackend(options=KernelOptions(
            fuse_epilogues=False, overlap=False))),
        "graphs_no_overlap": dict(backend=NumbaBackend(options=KernelOptions(overlap=False))),
        "fused_norms_graphs": dict(backend=NumbaBackend(options=KernelOptions(
            fuse_norms=True))),
        "looping_gemvs_graphs": dict(backend=NumbaBackend(options=KernelOptions(
            gemv_wave=False))),
        "sync_scheduling_graphs": dict(async_scheduling=False),
        "fast_attention_graphs": dict(backend=NumbaBackend(options=KernelOptions(
            attention="fast"))),
    }


def time_engine(model, batch, **kw) -> dict:
    """Median ms per decode step (and the graph replay's GPU time) of a fresh engine."""
    engine = make_engine(model, batch, **kw)
    prompts = prompts_for(batch, PROMPT_LEN, 1, model.config.vocab_size)
    engine.generate(prompts, exactly(8), chat=False)           # warm-up, graph capture
    steps = []
    engine.generate(prompts, exactly(NEW_TOKENS), chat=False, on_step=steps.append)
    decode = [r.seconds * 1e3 for r in steps if r.kind == "decode" and r.num_tokens == batch]
    res = {"ms_per_step": statistics.median(decode[2:]), "steps": len(decode)}
    graphs = engine.model_runner.graphs
    if graphs is not None:
        graph = graphs.graphs[graphs.bucket_for(batch)][0]
        res["gpu_ms_per_step"] = events_ms(graph.replay, reps=30)
    return res


def run_recorded(model, prompts, n_new, **kw):
    """Greedy tokens and every step's logits, per request, from a fresh engine."""
    engine = make_engine(model, len(prompts), **kw)
    engine.record_logits = True
    per_req: dict[int, list] = {}

    def record(report):
        for i, rid in enumerate(report.request_ids):
            per_req.setdefault(rid, []).append(report.logits[i])

    results = engine.generate(prompts, exactly(n_new), chat=False, on_step=record)
    return [r.token_ids for r in results], [per_req[r.request_id] for r in results]


def teacher_forced_err(hf, prompts, tokens, logits) -> float:
    """||ours - HF|| / ||HF|| over every generated position, HF fed our tokens."""
    diff2 = ref2 = 0.0
    with torch.no_grad():
        for p, toks, ours in zip(prompts, tokens, logits):
            ids = torch.tensor([p + toks], device=hf.device)
            ref = hf(ids).logits[0, len(p) - 1:len(p) - 1 + len(toks)].float().cpu()
            mine = torch.stack(ours[:len(toks)]).float()
            diff2 += float((mine - ref).pow(2).sum())
            ref2 += float(ref.pow(2).sum())
    return (diff2 / ref2) ** 0.5


def check_against_hf(model, hf) -> dict:
    """Ours (CUDA graphs), ours without graphs and the article's kernel, each against HF
    teacher-forced on its own greedy tokens.  bf16 activations rounded at different places
    drift apart over 16 layers of random weights (a few % of the logits, see
    gpu-correctness-*.json); the fast path must stay within that drift of the article's."""
    prompts = [prompts_for(1, n, 7 + n, model.config.vocab_size)[0] for n in (37, 100)]
    graphs = run_recorded(model, prompts, 16)
    eager = run_recorded(model, prompts, 16, cuda_graphs=False)
    article = run_recorded(model, prompts, 16, cuda_graphs=False, backend=article_backend())
    graph_errs = []
    for toks, etoks, ours, theirs in zip(graphs[0], eager[0], graphs[1], eager[1]):
        for j in range(len(toks)):
            graph_errs.append(rel_err(ours[j], theirs[j]))
            if toks[j] != etoks[j]:
                break                   # past a (near-tie) divergence the inputs differ
    out = {"rel_err_vs_hf_teacher_forced": teacher_forced_err(hf, prompts, *graphs),
           "article_kernel_rel_err_vs_hf": teacher_forced_err(hf, prompts, *article),
           "graphs_vs_eager_max_rel_err": max(graph_errs),
           "fast_vs_article_first_decode_rel_err": max(
               rel_err(a[1], b[1]) for a, b in zip(graphs[1], article[1])),
           "tokens_checked": sum(len(t) for t in graphs[0])}
    print("correctness:", out, flush=True)
    assert out["graphs_vs_eager_max_rel_err"] < 1e-3, out
    assert out["rel_err_vs_hf_teacher_forced"] < max(
        LOGIT_RTOL, 1.5 * out["article_kernel_rel_err_vs_hf"]), out
    return out


def time_row(model, batch, variants: dict, bandwidth: float, hf=None,
             hf_static: bool = True) -> dict:
    """One row of the JSON: the floors at ``batch`` (``bandwidth`` in bytes/s, the copy speed
    measured in this run), every variant's ms per step (an error is reported in the row and
    the other variants still run), and HF's when ``hf`` is given."""
    cfg = model.config
    wbytes = weight_bytes(model)
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.kv_dim * 2
    mean_ctx = PROMPT_LEN + NEW_TOKENS / 2
    row = {"batch": batch,
           "floor_ms_per_step": (wbytes + batch * mean_ctx * kv_per_token) / bandwidth * 1e3,
           "weight_floor_ms_per_step": wbytes / bandwidth * 1e3}
    for name, kw in variants.items():
        try:
            r = time_engine(model, batch, **kw)
        except Exception as exc:                      # report, keep the other numbers
            row[f"{name}_error"] = repr(exc)[:300]
            continue
        key = "engine" if name == "engine" else f"engine_{name}"
        row[f"{key}_ms_per_step"] = r["ms_per_step"]
        if "gpu_ms_per_step" in r:
            row[f"{key}_gpu_ms_per_step"] = r["gpu_ms_per_step"]
        print(f"B={batch} {name}: {r}", flush=True)
    if hf is not None:
        row["hf_eager_ms_per_step"] = time_hf(hf, batch, static=False)["ms_per_step"]
        if hf_static:
            st = time_hf(hf, batch, static=True)
            row["hf_static_ms_per_step"] = st["ms_per_step"]
            row["hf_static_warmup_s"] = st["warmup_s"]
        row["hf_ms_per_step"] = row.get("hf_static_ms_per_step", row["hf_eager_ms_per_step"])
    print(f"B={batch}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else
                                     f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def ladder_variants() -> dict:
    """The variants of the decode ladder, from launches by the host to the engine: what the
    quick run times."""
    return {"fast_no_graphs": dict(cuda_graphs=False), **ladder(), "engine": {}}


def quick_run(batches=BATCHES, hf: bool = True, hf_static: bool = False) -> dict:
    """The decode ladder timed on this GPU in this process, in the schema ``main`` writes:
    the ceilings, then per batch the floors, the ladder's rungs and (``hf``) HF eager (its
    compiled static cache, 20-30 s of compiling per batch size, with ``hf_static``).  Leaves
    out what makes the full run long: the logits check against HF, the article's and
    Triton's kernels, prefill and SmolLM2.  About a minute on an H200 once the kernels are
    compiled; ``"quick": True`` in the result says which run it was."""
    t_start = time.time()
    data = {**gpu_info(), "model": "Llama-3.2-1B shapes, random bf16 weights",
            "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS, "quick": True,
            "ceilings": ceilings()}
    model = random_gpu_model()
    hf_ref = None
    if hf:
        try:
            hf_ref = hf_model(model)
        except ImportError as exc:                        # transformers not installed
            data["hf_error"] = repr(exc)[:300]
    bw = data["ceilings"]["copy_bandwidth_gbs"] * 1e9
    data["rows"] = [time_row(model, batch, ladder_variants(), bw, hf_ref, hf_static=hf_static)
                    for batch in batches]
    from paged_tutorial.backends.numba_cuda.runtime import launch
    data["launch_errors"] = {f"{k[0]}/{k[1]}": v for k, v in launch.FAST_LAUNCH_ERRORS.items()}
    data["seconds"] = round(time.time() - t_start, 1)
    del model, hf_ref
    torch.cuda.empty_cache()
    return data


# --- HF --------------------------------------------------------------------------------------

class StepClock:
    """A stopping criterion that never stops and records when each step ends (generate syncs
    on the host every step, so the timestamps follow the GPU)."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def time_hf(hf, batch, static: bool) -> dict:
    from transformers import StoppingCriteriaList

    ids = torch.tensor(prompts_for(batch, PROMPT_LEN, 1, hf.config.vocab_size), device="cuda")
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
              min_new_tokens=NEW_TOKENS, do_sample=False)
    if static:
        kw["cache_implementation"] = "static"
    t0 = time.perf_counter()
    hf.generate(ids, **kw)                                    # warm-up (static: compiles)
    warm = time.perf_counter() - t0
    clock = StepClock()
    hf.generate(ids, stopping_criteria=StoppingCriteriaList([clock]), **kw)
    steps = np.diff(clock.times) * 1e3
    return {"ms_per_step": float(np.median(steps[2:])), "warmup_s": round(warm, 1),
            "steps": int(len(steps))}


# --- prefill -------------------------------------------------------------------------------

def prefill_flops(cfg, lens) -> float:
    h, i, t = cfg.hidden_size, cfg.intermediate_size, sum(lens)
    per_layer = h * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * h + 2 * h * i + i * h
    matmul = 2 * t * per_layer * cfg.num_hidden_layers + 2 * len(lens) * h * cfg.vocab_size
    attn = cfg.num_hidden_layers * sum(4 * cfg.n_heads * cfg.head_dim * n * (n + 1) // 2
                                       for n in lens)
    return float(matmul + attn)


def time_prefill(model, matmul_tflops, hf=None, **kw) -> dict:
    engine = pt.Engine(model, max_slots=2, max_seq_len=max(PREFILL_LENS) + 8, **kw)
    prompts = [prompts_for(1, n, 11 + i, model.config.vocab_size)[0]
               for i, n in enumerate(PREFILL_LENS)]
    times = []
    for _ in range(6):
        steps = []
        engine.generate(prompts, exactly(1), chat=False, on_step=steps.append)
        times.append(next(r.seconds for r in steps if r.kind == "prefill") * 1e3)
    flops = prefill_flops(model.config, PREFILL_LENS)
    res = {"tokens": sum(PREFILL_LENS), "flops": flops,
           "engine_ms": statistics.median(times[1:])}
    res["engine_tflops"] = flops / (res["engine_ms"] * 1e-3) / 1e12
    res["engine_pct_of_matmul_rate"] = 100 * res["engine_tflops"] / matmul_tflops
    # the forward pass alone (no host bookkeeping), CUDA events
    runner, cache = engine.model_runner.network, engine.cache
    for r, p in enumerate(prompts):
        cache.ensure_capacity(r, len(p))
    inputs = engine.model_runner.packer.prefill(prompts, [0] * len(prompts),
                                                list(range(len(prompts))),
                                                cache.device_block_table())
    res["forward_ms"] = events_ms(lambda: runner.forward(inputs, cache), reps=10)
    from paged_tutorial.backends.numba_cuda.kernels import prefill_sdpa
    res["attention_path"] = prefill_sdpa.LAST_PATH if getattr(
        engine.backend, "prefill", None) == "sdpa" else "numba-kernel"
    res["forward_tflops"] = flops / (res["forward_ms"] * 1e-3) / 1e12
    res["forward_pct_of_matmul_rate"] = 100 * res["forward_tflops"] / matmul_tflops
    if hf is not None:
        ids = torch.tensor(prompts, device="cuda")
        with torch.no_grad():
            res["hf_forward_ms"] = events_ms(lambda: hf(ids, logits_to_keep=1), reps=10)
    return res


# --- real weights: the embedded SmolLM2 -----------------------------------------------------

SMOLLM2_PROMPTS = ["What is the capital of France?", "Name three colors.",
                   "Explain what a GPU is in two sentences.",
                   "Write a short story about a cat who learns to fly.",
                   "List the planets of the solar system in order from the sun."]
SMOLLM2_CHECK_TOKENS = 32


def smollm2_hf(gguf: Path, dtype: torch.dtype):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                          dtype=dtype).to("cuda").eval()
    hf.generation_config.eos_token_id = None          # timed runs: exactly NEW_TOKENS tokens
    hf.generation_config.pad_token_id = 0
    return hf


def smollm2_check_tokens(model, hf, prompt_ids) -> dict:
    """Our float32 greedy tokens (graphs, all prompts in one batch) against HF float32's, one
    prompt at a time, up to our end of sequence."""
    engine = pt.Engine(model, backend="numba", max_slots=len(prompt_ids), max_seq_len=256)
    ours = engine.generate(prompt_ids, pt.SamplingParams(max_tokens=SMOLLM2_CHECK_TOKENS),
                           chat=False)
    equal, compared = [], 0
    for ids, res in zip(prompt_ids, ours):
        x = torch.tensor([ids], device="cuda")
        want = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=SMOLLM2_CHECK_TOKENS)[0, len(ids):].tolist()
        equal.append(res.token_ids == want[:len(res.token_ids)])
        compared += len(res.token_ids)
    out = {"prompts": len(prompt_ids), "tokens_compared": compared,
           "tokens_equal_hf_float32": all(equal), "per_prompt_equal": equal,
           "first_answer": ours[0].text}
    print("SmolLM2 float32 check:", out, flush=True)
    return out


def smollm2_section(args) -> dict:
    """The embedded SmolLM2 on real weights: checked, then timed beside HF on the same GGUF."""
    from paged_tutorial.loading.models import find_embedded_smollm2

    try:
        gguf = find_embedded_smollm2()
    except FileNotFoundError as exc:
        print(f"SmolLM2: skipped ({exc})", flush=True)
        return {"present": False, "reason": str(exc)}
    out = {"present": True, "model": "SmolLM2-135M-Instruct (embedded Q4_1 GGUF)",
           "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS, "dtypes": {}}
    for dtype in ("float32", "bfloat16"):
        model = pt.load_model("smollm2-135m", dtype=dtype, device="cuda")
        hf = None if args.skip_hf else smollm2_hf(gguf, getattr(torch, dtype))
        entry = {}
        if dtype == "float32" and hf is not None:
            tok = model.tokenizer
            prompt_ids = [tok.apply_chat_template([{"role": "user", "content": p}])
                          for p in SMOLLM2_PROMPTS]
            hf.generation_config.eos_token_id = list(model.config.eos_token_ids) or None
            entry["check"] = smollm2_check_tokens(model, hf, prompt_ids)
            hf.generation_config.eos_token_id = None
        rows = []
        for batch in BATCHES:
            r = time_engine(model, batch)
            row = {"batch": batch, "engine_ms_per_step": r["ms_per_step"],
                   "engine_ms_per_token": r["ms_per_step"] / batch,
                   "engine_gpu_ms_per_step": r.get("gpu_ms_per_step")}
            if hf is not None:
                row["hf_eager_ms_per_step"] = time_hf(hf, batch, static=False)["ms_per_step"]
                if not args.skip_hf_static and dtype == "float32":    # one compile per batch
                    st = time_hf(hf, batch, static=True)
                    row["hf_static_ms_per_step"] = st["ms_per_step"]
                    row["hf_static_warmup_s"] = st["warmup_s"]
                best = row.get("hf_static_ms_per_step", row["hf_eager_ms_per_step"])
                row["hf_ms_per_token"] = best / batch
            print(f"SmolLM2 {dtype} B={batch}: {row}", flush=True)
            rows.append(row)
        entry["rows"] = rows
        out["dtypes"][dtype] = entry
        del model, hf
        torch.cuda.empty_cache()
    return out


def print_smollm2(section: dict) -> None:
    if not section.get("present"):
        print(f"SmolLM2: not measured ({section.get('reason')})")
        return
    check = section["dtypes"].get("float32", {}).get("check")
    if check is not None:
        print(f"SmolLM2 float32 tokens equal HF float32: {check['tokens_equal_hf_float32']} "
              f"({check['tokens_compared']} tokens, {check['prompts']} prompts)")
    for dtype, entry in section["dtypes"].items():
        for row in entry["rows"]:
            print(f"SmolLM2 {dtype} B={row['batch']}: engine "
                  f"{row['engine_ms_per_token']:.4f} ms/token ({row['engine_ms_per_step']:.3f} "
                  f"ms/step), HF {row.get('hf_ms_per_token', float('nan')):.4f} ms/token")


def run(args) -> int:
    """The run ``benchmarks/decode.py`` asks for with its arguments ``args`` (its docstring says
    which flag measures what); the JSON goes to the folder ``args.out``."""
    if args.quick:
        data = quick_run(hf=not args.skip_hf)
        write_json(data, "decode-quick", args.out)
        return 0
    t_start = time.time()
    if args.variant_file and Path(args.variant_file).exists():
        from paged_tutorial.backends.numba_cuda.kernels import attention_fast
        best = json.loads(Path(args.variant_file).read_text())
        attention_fast.NUM_WARPS = best["num_warps"]
        attention_fast.CHOSEN_SHAPE = attention_fast.KernelShape(
            **{f.name: best[f.name] for f in dataclasses.fields(attention_fast.KernelShape)
               if f.name in best})
        print("fast-kernel variant:", best, flush=True)
    data = {**gpu_info(), "model": "Llama-3.2-1B shapes, random bf16 weights",
            "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS}
    data["ceilings"] = ceilings()
    if not args.skip_smollm2:
        data["smollm2"] = smollm2_section(args)
    if args.only_smollm2:
        data["seconds"] = round(time.time() - t_start, 1)
        write_json(data, "decode-smollm2", args.out)
        print_smollm2(data["smollm2"])
        return 0
    bw = data["ceilings"]["copy_bandwidth_gbs"] * 1e9
    model = random_gpu_model()
    hf = None if args.skip_hf else hf_model(model)
    if hf is not None:
        data["correctness"] = check_against_hf(model, hf)
        print("correctness:", data["correctness"], flush=True)
    from paged_tutorial.backends.numba_cuda import KernelOptions
    from paged_tutorial.backends.triton_backend import TritonAttentionBackend

    rungs = ladder()
    variants = {
        "engine": {},
        "article_no_graphs": dict(backend=article_backend(), cuda_graphs=False),
        "fast_no_graphs": dict(cuda_graphs=False),
        "article_graphs": dict(backend=article_backend()),
        "triton_graphs": dict(backend=TritonAttentionBackend()),
        **rungs,
    }
    if args.skip_variants:
        variants = {"engine": {}, "fast_no_graphs": dict(cuda_graphs=False), **rungs}
    data["rows"] = [time_row(model, batch, variants, bw, hf, hf_static=not args.skip_hf_static)
                    for batch in BATCHES]
    data["prefill"] = time_prefill(model, data["ceilings"]["bf16_matmul_tflops"], hf)
    if not args.skip_variants:
        data["prefill_numba_kernel"] = time_prefill(
            model, data["ceilings"]["bf16_matmul_tflops"],
            backend=NumbaBackend(options=KernelOptions(prefill="numba")))
    print("prefill:", data["prefill"], flush=True)
    from paged_tutorial.backends.numba_cuda.kernels import attention_fast
    from paged_tutorial.backends.numba_cuda.kernels import gemv
    from paged_tutorial.backends.numba_cuda.runtime import launch
    data["fast_kernel"] = {"num_warps": attention_fast.NUM_WARPS,
                           "four_warps_from_blocks": attention_fast.FEW_WARPS_FROM_BLOCKS,
                           **dataclasses.asdict(attention_fast.CHOSEN_SHAPE)}
    data["gemv_max_rows"] = gemv.MAX_ROWS
    data["launch_errors"] = {f"{k[0]}/{k[1]}": v for k, v in launch.FAST_LAUNCH_ERRORS.items()}
    data["seconds"] = round(time.time() - t_start, 1)
    write_json(data, "decode", args.out)
    print(f"ceilings: {data['ceilings']}")
    for row in data["rows"]:
        print(f"TARGET B={row['batch']}: engine {row.get('engine_ms_per_step', float('nan')):.3f} "
              f"ms/step (gpu {row.get('engine_gpu_ms_per_step', float('nan')):.3f}), "
              f"HF static {row.get('hf_static_ms_per_step', float('nan')):.2f}, "
              f"HF eager {row.get('hf_eager_ms_per_step', float('nan')):.1f}, "
              f"floor {row['floor_ms_per_step']:.3f}")
        print(f"TARGET B={row['batch']} eager (no graphs): "
              f"{row.get('engine_fast_no_graphs_ms_per_step', float('nan')):.2f} ms/step")
    if "smollm2" in data:
        print_smollm2(data["smollm2"])
    pf = data["prefill"]
    print(f"TARGET prefill 2x1024: {pf['engine_ms']:.2f} ms (forward alone "
          f"{pf['forward_ms']:.2f} ms; HF forward {pf.get('hf_forward_ms', float('nan')):.2f} ms) "
          f"= {pf['engine_tflops']:.0f} TFLOP/s = {pf['engine_pct_of_matmul_rate']:.0f}% of "
          f"matmul rate; attention: {pf['attention_path']}")
    return 0

