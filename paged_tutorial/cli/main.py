"""What the command runs, and how every run ends.

Every failure the user can cause (a model that is missing, gated or cannot be downloaded, a
backend this machine cannot run, a prompt too long for ``--max-seq-len``, a prompt file that
cannot be read, an answer standard output cannot take) ends with one ``error:`` line on
stderr and exit status 2; an option value out of range, a combination of options that cannot
work, or a prompt the terminal's encoding could not decode, is argparse's ``error:`` line
(status 2) before anything loads.  The backend is checked before any weights are loaded.
Ctrl-C at any moment prints one line and exits 130 (``ctrl_c``); when nobody reads standard
output any more (``| head -c 1``, or started with it closed) the command stops quietly with
status 141, as a shell reports for a writer that SIGPIPE ended; when standard error cannot be
written, diagnostics are dropped and the answer still goes out.  No traceback in any of these.

``serve`` as the first argument is the subcommand that starts the OpenAI-compatible server
(``serve.py``; its options are parsed by the same parser, ``options.py``).
"""

from __future__ import annotations

import os
import signal
import sys
import warnings

from paged_tutorial.cli import ctrl_c
from paged_tutorial.cli.options import EXIT_USAGE, SERVE
from paged_tutorial.cli.streams import (AnswerOutput, Diagnostics, OutputClosed, OutputFailed,
                                        point_at_devnull)

EXIT_INTERRUPTED = ctrl_c.EXIT_INTERRUPTED
EXIT_OUTPUT_CLOSED = 141        # 128 + SIGPIPE: what `head` expects of a writer it stopped reading


def _warning_line(message, category, filename, lineno, line=None) -> str:
    text = " ".join(str(message).split())
    return text + "\n" if text.startswith("warning:") else f"warning: {text}\n"


def serve(argv: list[str]) -> int:
    """``serve ...``: the OpenAI-compatible server (its options: ``options.py``)."""
    from paged_tutorial.cli.options import parse
    from paged_tutorial.cli.serve import run_serve

    return run_serve(parse([SERVE, *argv]))


def _descriptor_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    """The command; ``argv`` None means this process is the program (``sys.argv``): then it
    takes Ctrl-C over from the first instant and guards its own standard error."""
    program = argv is None
    if program:
        ctrl_c.take_over()
        argv = sys.argv[1:]
        if not _descriptor_is_open(2):           # started with 2>&-: keep fd 2 from being
            point_at_devnull(2)                  # reused by a file opened later
        sys.stderr = Diagnostics(sys.stderr, owns_fd=True)
    err = sys.stderr if isinstance(sys.stderr, Diagnostics) else Diagnostics(sys.stderr)
    if sys.stdout is None:           # started with stdout closed (>&-): nobody reads the answer
        return EXIT_OUTPUT_CLOSED
    if argv[:1] == [SERVE]:
        return serve(argv[1:])
    out = AnswerOutput(sys.stdout)
    try:
        return _run(argv, out, err)
    except KeyboardInterrupt:            # an in-process caller's Ctrl-C (a test, a notebook)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second one: no traceback
        try:
            print(f"\n{ctrl_c.INTERRUPTED_LINE}", file=err, flush=True)
        finally:
            signal.signal(signal.SIGINT, previous)
        return EXIT_INTERRUPTED


def _run(argv: list[str], out: AnswerOutput, err) -> int:
    from paged_tutorial.cli.options import parse
    from paged_tutorial.cli.prompts import PromptError, bad_prompt_encoding, collect_prompts
    from paged_tutorial.cli.startup import UsageError

    try:
        args = parse(argv)
        problem = bad_prompt_encoding(args.prompt)
        if problem:
            from paged_tutorial.cli.options import build_parser

            build_parser().error(problem)
        warnings.formatwarning = _warning_line
        if args.chat:
            from paged_tutorial.cli.chat import run_chat

            status = run_chat(args, out, err)
        else:
            prompts = collect_prompts(args)
            from paged_tutorial.cli.answers import run

            status = run(args, prompts, out, err)
        if out.failure is not None:
            raise out.failure
        return status
    except (UsageError, PromptError) as exc:
        print(f"error: {exc}", file=err, flush=True)
    except OutputClosed:
        point_at_devnull(1)
        return EXIT_OUTPUT_CLOSED
    except OutputFailed as exc:
        point_at_devnull(1)
        print(f"error: cannot write the answer to standard output: {exc}", file=err, flush=True)
    return EXIT_USAGE
