"""The checker from a shell: grade a notebook as its reader left it, or show the progress.

    python -m paged_tutorial.teaching.exercises grade notebooks/06_block_lifetime.ipynb
    python -m paged_tutorial.teaching.exercises grade --language ko notebooks/0*.ipynb
    python -m paged_tutorial.teaching.exercises progress

``grade`` exits with status 0 only when every exercise and puzzle of every notebook given is
solved (1 otherwise, and for a notebook whose run stopped at a cell that ends the program; 2 for
a path that is not a chapter notebook, each named in one line).  ``--language`` sets the
language of every line, the verdicts the notebook's checks print included.
"""

from __future__ import annotations

import argparse
import sys

from paged_tutorial.teaching.language import LANGUAGES, set_language


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged_tutorial.teaching.exercises",
                                     description="grade the tutorial's notebooks")
    parser.add_argument("--language", choices=sorted(LANGUAGES), default=None,
                        help="language of the table and verdicts (default: each notebook's)")
    commands = parser.add_subparsers(dest="command", required=True)
    grade = commands.add_parser("grade", help="run notebooks as left and grade every answer")
    grade.add_argument("notebooks", nargs="+", help="paths of NN_title.ipynb files")
    grade.add_argument("--language", choices=sorted(LANGUAGES), default=None,
                       dest="grade_language", help=argparse.SUPPRESS)
    commands.add_parser("progress", help="every chapter's newest verdicts")
    args = parser.parse_args(argv)
    chosen = args.language or getattr(args, "grade_language", None)

    from paged_tutorial.teaching.exercises.notebook_grading import progress, run_notebook

    if chosen:
        set_language(chosen)
    if args.command == "progress":
        progress()
        return 0
    status = 0
    for path in args.notebooks:
        try:
            result = run_notebook(path, chosen)
        except (FileNotFoundError, ValueError) as exc:
            print(exc, file=sys.stderr)
            status = max(status, 2)
            continue
        print(result.summary())
        print()
        if not result.all_solved:
            status = max(status, 1)
    return status


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:               # the reader of the output went away (| head)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
