"""The server against the engine under it: the same requests through offline ``LLM.generate``
and through the OpenAI-compatible server with N concurrent streaming clients, in one run.

    python benchmarks/serve_load.py --backend torch --model smollm2-135m --clients 16 \
        --max-tokens 32 --out /tmp/serve.json

Each of the N requests is a distinct prompt of about ``--prompt-words`` words, greedy,
``ignore_eos`` and ``max_tokens`` fixed, so every run generates N x max_tokens tokens.  The
engine has N slots (``--max-slots`` to change it): everything decodes together both ways.

- offline: ``LLM.generate(prompts)`` on a worker thread (where the server's engine loop runs)
  (throughput: generated tokens / wall time), then the same requests through
  ``Engine.generate`` with ``on_token`` timing each request's first token;
- served: the same requests behind ``BackgroundServer``; the clients run in
  ``--client-processes`` child processes (so their parsing shares neither this process's
  interpreter nor one client process's) as N asyncio streams over httpx, all started together;
  throughput is generated tokens / (last stream's end - first start), first token is each
  stream's first text chunk.

``--engine process,thread`` (the default) serves them with the engine in a process of its own
(``EngineProcess``, what ``paged-tutorial serve`` does) and on a thread of the server's process;
``--io auto,python`` on uvloop + httptools (uvicorn's choice where they are installed) and on
asyncio + h11: every pair side by side in one run (``served_by``), the first pair giving the
headline figures.

Writes JSON (``serve-<date>.json`` in benchmarks/results, or ``--out``): the two
throughputs, their ratio, first-token p50 / p90 both ways, the CPU time per generated token of
the server's event-loop thread and engine thread (Linux), and the setting.  The answers are
checked to be the same tokens both ways (greedy).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import inspect
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WORDS = ("block table cache page slot token kernel prefix layer query value key head batch "
         "step warp thread memory request answer").split()


def prompts_for(count: int, words: int) -> list[str]:
    return [f"Request {i}: " + " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)]
                                        for j in range(words)) for i in range(count)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# --- the clients (child processes) -------------------------------------------------------
def _clients(url: str, model: str, prompts: dict[int, str], max_tokens: int, go, queue) -> None:
    """Stream ``prompts`` (index -> prompt) concurrently once ``go`` is set; put the absolute
    times (``time.monotonic``, one clock for every process on Linux and macOS) of each first
    token and end, and this process's CPU seconds."""
    import resource

    import httpx

    async def one(http, prompt):
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
        first, text, tokens = None, [], 0
        async with http.stream("POST", url + "/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    if first is None:
                        first = time.monotonic()
                    text.append(chunk["choices"][0]["text"])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return first, time.monotonic(), tokens, "".join(text)

    async def run():
        limits = httpx.Limits(max_connections=len(prompts) + 1)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            go.wait()
            start = time.monotonic()
            results = await asyncio.gather(*(one(http, p) for p in prompts.values()))
        return start, results

    cpu = resource.getrusage(resource.RUSAGE_SELF)
    start, results = asyncio.run(run())
    used = resource.getrusage(resource.RUSAGE_SELF)
    queue.put({"start": start, "results": dict(zip(prompts, results)),
               "cpu_s": used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime})


def run_clients(context, url: str, model: str, prompts: list[str], max_tokens: int,
                processes: int) -> dict:
    """The prompts streamed by ``processes`` client processes started together (one Python
    process parsing every chunk of 64 streams would be the slowest part of the measurement)."""
    queue, go = context.Queue(), context.Event()
    shares = [{i: prompts[i] for i in range(k, len(prompts), processes)}
              for k in range(min(processes, len(prompts)))]
    children = [context.Process(target=_clients, args=(url, model, share, max_tokens, go,
                                                       queue)) for share in shares]
    for child in children:
        child.start()
    time.sleep(0.5 + 0.1 * len(children))      # each has imported httpx and waits for go
    go.set()
    parts = [queue.get(timeout=3600) for _ in children]
    for child in children:
        child.join()
    start = min(part["start"] for part in parts)
    results = {i: r for part in parts for i, r in part["results"].items()}
    ordered = [results[i] for i in range(len(prompts))]
    wall = max(r[1] for r in ordered) - start
    return {"first_token_s": [r[0] - start for r in ordered], "wall_s": wall,
            "tokens": sum(r[2] for r in ordered), "texts": [r[3] for r in ordered],
            "client_cpu_share": round(max(part["cpu_s"] for part in parts) / wall, 3)}


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds each named thread of this process has used (Linux's /proc; {} elsewhere):
    the event loop's ("uvicorn") and the engine loop's, whatever else the machine runs."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[thread.name] = (int(fields[11]) + int(fields[12])) / ticks
    return used


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process has used (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served(engine, prompts, max_tokens, name, io="auto", engine_process=None,
           client_processes=1):
    """The prompts through the server; ``engine_process`` (an ``EngineProcess``) serves them
    from its child instead of ``engine`` on a thread."""
    from paged_tutorial.serving.app import build_app
    from paged_tutorial.serving.server import BackgroundServer

    # every client connected at once (an older checkout's server has no such keyword)
    accepted = inspect.signature(BackgroundServer).parameters
    room = {"limit_concurrency": None} if "limit_concurrency" in accepted else {}
    if "io" in accepted:
        room["io"] = io
    app = build_app(engine, name) if engine_process is None else \
        build_app(engine_process.frontend, name, engine_process)
    with BackgroundServer(app, **room) as server:
        context = multiprocessing.get_context("spawn")
        run_clients(context, server.url, name, prompts[:1], 2, 1)          # warm-up
        before = thread_cpu_s()
        if engine_process is not None:
            before["engine process"] = process_cpu_s(engine_process.pid)
        result = run_clients(context, server.url, name, prompts, max_tokens, client_processes)
        after = thread_cpu_s()
        if engine_process is not None:
            after["engine process"] = process_cpu_s(engine_process.pid)
    result["thread_cpu_s"] = {thread: round(after[thread] - before[thread], 3)
                              for thread in ("uvicorn", "engine-loop", "engine-events",
                                             "engine process")
                              if thread in before and thread in after}
    return result


def on_a_worker_thread(fn, *args):
    """``fn(*args)`` on a thread of its own, as the server's engine loop runs (on a CPU, torch
    decodes at another speed on the main thread than on a worker)."""
    box = []
    thread = threading.Thread(target=lambda: box.append(fn(*args)))
    thread.start()
    thread.join()
    return box[0]


def offline(llm, prompts, max_tokens):
    import paged_tutorial as pt

    params = pt.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    ids = [o.prompt_token_ids for o in outputs]
    first: dict[int, float] = {}

    def on_token(index, token_id, piece):
        first.setdefault(index, time.perf_counter() - t0)

    t0 = time.perf_counter()
    results = llm.engine.generate(ids, params, chat=False, on_token=on_token)
    engine_wall = time.perf_counter() - t0
    return {"wall_s": wall, "tokens": tokens, "texts": [o.outputs[0].text for o in outputs],
            "engine_generate_wall_s": engine_wall,
            "first_token_s": [first[i] for i in range(len(results))]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default=None)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--max-slots", type=int, default=None, help="default: --clients")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-words", type=int, default=24)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=None,
                   help="torch's intra-op threads (default: torch's own choice)")
    p.add_argument("--io", default="auto",
                   help="the server's event loop and HTTP parser, one or more of 'auto' (uvloop "
                        "+ httptools where installed) and 'python' (asyncio + h11), comma-"
                        "separated: each is served in turn, the first gives the headline figures")
    p.add_argument("--engine", default="process,thread",
                   help="where the server's engine steps, one or more of 'process' (a process "
                        "of its own, the server's default) and 'thread' (a thread of the "
                        "server's process), comma-separated: each is served with each --io")
    p.add_argument("--client-processes", type=int, default=4,
                   help="processes the streaming clients are spread over, so that parsing "
                        "their chunks never holds the server back (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of offline, then each served setting, alternated; the figures "
                        "are the medians over the rounds")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ios = [io.strip() for io in args.io.split(",") if io.strip()]
    modes = [mode.strip() for mode in args.engine.split(",") if mode.strip()]

    import torch

    import paged_tutorial as pt
    from common import write_json

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    llm = pt.LLM(args.model, backend=args.backend, dtype=args.dtype,
                 max_num_seqs=args.max_slots or args.clients,
                 max_model_len=args.max_model_len)
    llm.engine.warm_up(every_batch_size=True)      # as the served engines are
    prompts = prompts_for(args.clients, args.prompt_words)
    llm.generate(prompts[:2], pt.SamplingParams(max_tokens=2))         # warm both batch sizes
    from paged_tutorial.serving.engine_process import EngineProcess, EngineRecipe

    recipe = EngineRecipe(args.model, backend=args.backend, dtype=args.dtype,
                          max_slots=args.max_slots or args.clients,
                          max_seq_len=args.max_model_len, threads=args.threads)
    keys = [f"{mode} {io}" for mode in modes for io in ios]
    offs, runs = [], {key: [] for key in keys}
    for _ in range(max(1, args.repeats)):
        offs.append(on_a_worker_thread(offline, llm, prompts, args.max_tokens))
        for key in keys:
            mode, io = key.split()
            # a server's lifespan ends its engine loop: each served run starts its own child
            child = EngineProcess(recipe) if mode == "process" else None
            runs[key].append(served(llm.engine, prompts, args.max_tokens, "load", io, child,
                                    args.client_processes))

    def tps(run) -> float:
        return run["tokens"] / run["wall_s"]

    def median_first(rounds) -> float:
        return statistics.median(statistics.median(r["first_token_s"]) for r in rounds)

    off_tps = statistics.median(tps(r) for r in offs)
    off, srv = offs[0], runs[keys[0]][0]
    srv_tps = statistics.median(tps(r) for r in runs[keys[0]])

    def summary(rounds, key):
        from paged_tutorial.serving.server import io_in_use

        mode, io = key.split()
        tokens = sum(r["tokens"] for r in rounds)
        cpu = {thread: sum(r["thread_cpu_s"][thread] for r in rounds)
               for thread in rounds[0]["thread_cpu_s"]}
        return {"engine": mode, "io": io_in_use(io),
                "tokens_per_s": round(statistics.median(tps(r) for r in rounds), 1),
                "tokens_per_s_by_round": [round(tps(r), 1) for r in rounds],
                "over_offline": round(statistics.median(tps(r) for r in rounds) / off_tps, 3),
                "first_token_p50_s": round(median_first(rounds), 4),
                # the busiest client process's CPU time over the wall time, per round
                "client_cpu_share": [r["client_cpu_share"] for r in rounds],
                "thread_cpu_us_per_token": {thread: round(1e6 * seconds / tokens, 1)
                                            for thread, seconds in cpu.items()},
                "same_answers": all(off["texts"] == r["texts"] for r in rounds)}
    data = {
        "benchmark": "serve_load", "date": dt.date.today().isoformat(),
        "what": "offline LLM.generate vs the server with N concurrent streaming clients, "
                "same requests, one run; offline and each served setting alternated for "
                "--repeats rounds, medians",
        "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:] if argv is None
                                                                 else argv),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "engine": llm.engine.describe(), "torch_threads": torch.get_num_threads(),
        "clients": args.clients, "client_processes": args.client_processes,
        "max_tokens": args.max_tokens, "rounds": len(offs),
        "headline": keys[0],
        "offline_tokens_per_s": round(off_tps, 1), "served_tokens_per_s": round(srv_tps, 1),
        "offline_tokens_per_s_by_round": [round(tps(r), 1) for r in offs],
        "served_over_offline": round(srv_tps / off_tps, 3),
        "offline_first_token_p50_s": round(median_first(offs), 4),
        "served_first_token_p50_s": round(median_first(runs[keys[0]]), 4),
        "offline_first_token_p90_s": round(percentile(off["first_token_s"], 0.9), 4),
        "served_first_token_p90_s": round(percentile(srv["first_token_s"], 0.9), 4),
        "engine_generate_wall_s": round(off["engine_generate_wall_s"], 3),
        "tokens": off["tokens"], "served_tokens": srv["tokens"],
        "same_answers": all(off["texts"] == r["texts"] for rounds in runs.values()
                            for r in rounds),
        "served_by": {key: summary(rounds, key) for key, rounds in runs.items()},
    }
    print(json.dumps(data, indent=1))
    write_json(data, "serve", args.out)
    return 0 if data["same_answers"] and all(r["tokens"] == off["tokens"]
                                             for rounds in runs.values()
                                             for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
