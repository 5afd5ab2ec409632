"""``--chat``: an interactive conversation with history.  Each line typed is a user message;
the answer streams to standard output and joins the history, so the next message is answered
with everything said before (through the model's chat template, ``--system`` first).

Ctrl-C while an answer streams stops that answer (what was shown stays in the history) and
the conversation goes on; Ctrl-C while typing drops the line; Ctrl-D (end of input) ends the
conversation with status 0.  Standard input need not be a terminal: piped lines are read one
message each, without a prompt."""

from __future__ import annotations

import sys

from paged_tutorial.cli import ctrl_c
from paged_tutorial.cli.prompts import engine_prompt
from paged_tutorial.cli.startup import UsageError, start_engine, warn_about_korean
from paged_tutorial.cli.streams import one_line

PROMPT = "> "
GREETING = ("[chat: type a message and press Enter; Ctrl-C stops an answer, Ctrl-D ends the "
            "conversation]")


class Conversation:
    """The messages so far, system message first."""

    def __init__(self, system: str | None):
        self.messages: list[dict] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})

    def ask(self, text: str) -> list[dict]:
        self.messages.append({"role": "user", "content": text})
        return list(self.messages)

    def answered(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def withdraw(self) -> None:
        """Drop the last user message (it could not be answered)."""
        self.messages.pop()


def read_message(stdin, interactive: bool) -> str | None:
    """The next line typed (without its line end); None at end of input.  Ctrl-C while
    typing drops the line and asks again."""
    while True:
        try:
            with ctrl_c.raising():
                if interactive:
                    return input(PROMPT)
                line = stdin.readline()
        except EOFError:
            return None
        except KeyboardInterrupt:
            print(file=sys.stdout, flush=True)
            continue
        if not line:
            return None
        return line.rstrip("\r\n")


def answer(engine, messages: list[dict], args, out, err) -> tuple[str, object | None]:
    """Stream one answer; (the text shown, the result or None when Ctrl-C stopped it)."""
    shown: list[str] = []

    def on_token(_request_id, _token, piece):
        if piece:
            shown.append(piece)
            out.write(piece)
            out.flush()

    request = engine.add_request(engine_prompt(engine, messages),
                                 max_tokens=args.max_tokens,
                                 temperature=args.temperature, top_p=args.top_p,
                                 seed=args.seed, chat=True, on_token=on_token)
    stopped = False
    try:
        with ctrl_c.raising():
            while engine.has_unfinished():
                engine.step()
    except KeyboardInterrupt:
        stopped = True
    if stopped:
        engine.cancel(request.request_id)
        while engine.has_unfinished():
            engine.step()
    result = engine.pop_result(request.request_id)
    if stopped or result.finish_reason == "cancelled":   # Ctrl-C inside on_token cancels it
        return "".join(shown), None
    done = "".join(shown)
    out.write(result.text[len(done):] if result.text.startswith(done) else "")
    return result.text, result


def run_chat(args, out, err, stdin=None) -> int:
    """The conversation loop; 0 when it ends with end of input."""
    stdin = sys.stdin if stdin is None else stdin
    if stdin is None:
        raise UsageError("--chat reads messages from standard input, which is closed")
    engine, timing = start_engine(args, err)
    interactive = stdin is sys.stdin and stdin.isatty() and sys.stdout.isatty()
    if interactive:
        import readline  # noqa: F401 - line editing and history for input()
    print(GREETING, file=err, flush=True)
    conversation = Conversation(args.system)
    while True:
        text = read_message(stdin, interactive)
        if text is None:
            if interactive:
                out.write("\n")
                out.flush()
            return 0
        if not text.strip():
            continue
        warn_about_korean(args, [text], err)
        try:
            messages = conversation.ask(text)
            said, result = answer(engine, messages, args, out, err)
        except (ValueError, TypeError) as exc:
            conversation.withdraw()
            hint = "; or end this conversation (Ctrl-D) and start a new one" if getattr(
                exc, "field", None) == "prompt" else ""
            print(f"error: {one_line(exc)}{hint}", file=err, flush=True)
            continue
        out.write("\n")
        out.flush()
        conversation.answered(said)
        if result is None:
            print("[stopped: Ctrl-C; the conversation goes on]", file=err, flush=True)
        else:
            print(f"[{len(result.token_ids)} tokens, finish_reason={result.finish_reason}"
                  f"{timing.report(result)}]", file=err, flush=True)
            timing.load_s = None         # said once, after the first answer
