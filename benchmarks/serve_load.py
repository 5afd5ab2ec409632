"""The server against the engine under it: the same requests through offline ``LLM.generate``
and through the OpenAI-compatible server with N concurrent streaming clients, in one run.

    python benchmarks/serve_load.py --backend torch --model smollm2-135m --clients 16 \
        --max-tokens 32 --out /tmp/serve.json

Each of the N requests is a distinct prompt of about ``--prompt-words`` words, greedy,
``ignore_eos`` and ``max_tokens`` fixed, so every run generates N x max_tokens tokens.  The
engine has N slots (``--max-slots`` to change it): everything decodes together both ways.

- offline: ``LLM.generate(prompts)`` on a worker thread (where the server's engine loop runs) (throughput: generated tokens / wall time), then the same
  requests through ``Engine.generate`` with ``on_token`` timing each request's first token;
- served: the same engine behind ``BackgroundServer``; the clients run in a child process (so
  their parsing does not share this process's interpreter) as N asyncio streams over httpx,
  all started together; throughput is generated tokens / (last stream's end - first start),
  first token is each stream's first text chunk.

``--io auto,python`` serves the same requests twice, on uvloop + httptools (uvicorn's choice
where they are installed) and on asyncio + h11, side by side in one run (``served_by_io``).

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


# --- the clients (a child process) --------------------------------------------------------
def _clients(url: str, model: str, prompts: list[str], max_tokens: int, queue) -> None:
    import httpx

    async def one(http, prompt, start):
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
                        first = time.perf_counter() - start
                    text.append(chunk["choices"][0]["text"])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return first, time.perf_counter(), tokens, "".join(text)

    async def run():
        limits = httpx.Limits(max_connections=len(prompts) + 1)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            start = time.perf_counter()
            results = await asyncio.gather(*(one(http, p, start) for p in prompts))
        return start, results

    start, results = asyncio.run(run())
    queue.put({"first_token_s": [r[0] for r in results],
               "wall_s": max(r[1] for r in results) - start,
               "tokens": sum(r[2] for r in results), "texts": [r[3] for r in results]})


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


def served(engine, prompts, max_tokens, name, io="auto"):
    from paged_tutorial.serving.app import build_app
    from paged_tutorial.serving.server import BackgroundServer

    # every client connected at once (an older checkout's server has no such keyword)
    accepted = inspect.signature(BackgroundServer).parameters
    room = {"limit_concurrency": None} if "limit_concurrency" in accepted else {}
    if "io" in accepted:
        room["io"] = io
    with BackgroundServer(build_app(engine, name), **room) as server:
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        warm = context.Process(target=_clients,
                               args=(server.url, name, prompts[:1], 2, queue))
        warm.start()
        queue.get(timeout=600)
        warm.join()
        before = thread_cpu_s()
        child = context.Process(target=_clients,
                                args=(server.url, name, prompts, max_tokens, queue))
        child.start()
        result = queue.get(timeout=3600)
        child.join()
        after = thread_cpu_s()
    result["thread_cpu_s"] = {thread: round(after[thread] - before[thread], 3)
                              for thread in ("uvicorn", "engine-loop")
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
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ios = [io.strip() for io in args.io.split(",") if io.strip()]

    import torch

    import paged_tutorial as pt
    from common import write_json

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    llm = pt.LLM(args.model, backend=args.backend, dtype=args.dtype,
                 max_num_seqs=args.max_slots or args.clients,
                 max_model_len=args.max_model_len)
    llm.engine.warm_up()
    prompts = prompts_for(args.clients, args.prompt_words)
    llm.generate(prompts[:2], pt.SamplingParams(max_tokens=2))         # warm both batch sizes
    off = on_a_worker_thread(offline, llm, prompts, args.max_tokens)
    runs = {io: served(llm.engine, prompts, args.max_tokens, "load", io) for io in ios}
    srv = runs[ios[0]]
    off_tps, srv_tps = off["tokens"] / off["wall_s"], srv["tokens"] / srv["wall_s"]

    def summary(run, io):
        from paged_tutorial.serving.server import io_in_use

        return {"io": io_in_use(io), "tokens_per_s": round(run["tokens"] / run["wall_s"], 1),
                "over_offline": round(run["tokens"] / run["wall_s"] / off_tps, 3),
                "first_token_p50_s": round(statistics.median(run["first_token_s"]), 4),
                "thread_cpu_us_per_token": {
                    thread: round(1e6 * seconds / run["tokens"], 1)
                    for thread, seconds in run["thread_cpu_s"].items()},
                "same_answers": off["texts"] == run["texts"]}
    data = {
        "benchmark": "serve_load", "date": dt.date.today().isoformat(),
        "what": "offline LLM.generate vs the server with N concurrent streaming clients, "
                "same requests, same engine, one run",
        "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:] if argv is None
                                                                 else argv),
        "engine": llm.engine.describe(), "torch_threads": torch.get_num_threads(),
        "clients": args.clients, "max_tokens": args.max_tokens,
        "offline_tokens_per_s": round(off_tps, 1), "served_tokens_per_s": round(srv_tps, 1),
        "served_over_offline": round(srv_tps / off_tps, 3),
        "offline_first_token_p50_s": round(statistics.median(off["first_token_s"]), 4),
        "served_first_token_p50_s": round(statistics.median(srv["first_token_s"]), 4),
        "offline_first_token_p90_s": round(percentile(off["first_token_s"], 0.9), 4),
        "served_first_token_p90_s": round(percentile(srv["first_token_s"], 0.9), 4),
        "offline_wall_s": round(off["wall_s"], 3), "served_wall_s": round(srv["wall_s"], 3),
        "engine_generate_wall_s": round(off["engine_generate_wall_s"], 3),
        "tokens": off["tokens"], "served_tokens": srv["tokens"],
        # CPU time of the server's two threads while serving, per generated token
        "served_thread_cpu_us_per_token": {
            thread: round(1e6 * seconds / srv["tokens"], 1)
            for thread, seconds in srv["thread_cpu_s"].items()},
        "same_answers": all(off["texts"] == run["texts"] for run in runs.values()),
        "served_by_io": {io: summary(run, io) for io, run in runs.items()},
    }
    print(json.dumps(data, indent=1))
    write_json(data, "serve", args.out)
    return 0 if data["same_answers"] and all(run["tokens"] == off["tokens"]
                                             for run in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
