"""One-shot prompts: one prompt streams its answer to standard output token by token; several
are served together (one slot each) and each answer is printed, labelled, as soon as it
finishes.  With ``--json`` each answer is one JSON object on a line of its own instead."""

from __future__ import annotations

import json

from paged_tutorial.cli.prompts import chat_messages, engine_prompt
from paged_tutorial.cli.startup import UsageError, start_engine, warn_about_korean
from paged_tutorial.cli.streams import one_line
from paged_tutorial.cli.timing import compile_stats


def answer_object(index: int, prompt: str, result, timings: dict) -> dict:
    """What ``--json`` prints for one answer."""
    return {"index": index, "prompt": prompt, "text": result.text,
            "token_ids": [int(t) for t in result.token_ids],
            "finish_reason": result.finish_reason, "prompt_tokens": len(result.prompt_token_ids),
            "seed": result.seed, "timings": timings}


def run(args, prompts: list[str], out, err) -> int:
    """Answer ``prompts`` with the engine ``args`` describe; 0 when every answer was written."""
    engine, timing = start_engine(args, err)
    warn_about_korean(args, [*prompts, args.system], err)
    single = len(prompts) == 1
    streaming = single and not args.json
    streamed: list[str] = []
    compile_at_first_token: dict[int, float] = {}

    def on_token_for(index):
        def on_token(_request_id, _token, piece):
            if index not in compile_at_first_token:
                stats = compile_stats()
                compile_at_first_token[index] = stats.seconds if stats is not None else 0.0
            if streaming and piece:
                streamed.append(piece)
                out.write(piece)
                out.flush()
        return on_token

    requests = []
    for i, prompt in enumerate(prompts):       # each admitted (or refused) as it is queued
        try:
            requests.append(engine.add_request(
                engine_prompt(engine, chat_messages(prompt, args.system)),
                max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                seed=args.seed, chat=not args.no_chat, on_token=on_token_for(i)))
        except (ValueError, TypeError) as exc:
            raise UsageError(("" if single else f"prompt {i + 1}: ") + one_line(exc)) from exc
    index_of = {r.request_id: i for i, r in enumerate(requests)}
    shown: set[int] = set()

    def show(request_id):
        i = index_of[request_id]
        result = engine.result(request_id)
        stats = timing.compiles_since_start()
        current = compile_stats()
        compiling = (current.seconds if stats is not None and current is not None else 0.0) - \
            compile_at_first_token.get(i, 0.0)
        if args.json:
            line = answer_object(i, prompts[i], result, timing.timings(result, compiling, stats))
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
        elif streaming:   # what the streaming detokenizer still held back (an incomplete
            done = "".join(streamed)          # UTF-8 sequence at the very end), then a newline
            out.write((result.text[len(done):] if result.text.startswith(done) else "") + "\n")
        else:
            out.write(f"--- [{i}] {prompts[i]!r}\n{result.text}\n")
        out.flush()
        label = "" if single else f"{i}: "
        print(f"[{label}{len(result.token_ids)} tokens, finish_reason={result.finish_reason}"
              f"{timing.report(result, compiling, stats)}]", file=err, flush=True)
        shown.add(request_id)

    while engine.has_unfinished():
        report = engine.step()
        for request_id in report.finished:
            if request_id in index_of and request_id not in shown:
                show(request_id)
    for r in requests:                  # any answer no step report named (none expected)
        if r.request_id not in shown:
            show(r.request_id)
    return 0
