"""``python -m tests.mutation [PUZZLE ...] [--list]``: every mutant of each puzzle's worked
solution (all puzzles by default) through its grader and the deep oracle; writes
``tests/mutation/report.json`` (then ``PYTHONPATH=. python tests/teaching/test_puzzles_doc.py``
regenerates ``docs/puzzles.md`` from it)."""

import sys

from tests.mutation.run import mutants_of, run
from tests.mutation.targets import TARGETS


def main(argv) -> int:
    names = [a for a in argv if not a.startswith("--")] or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        print(f"no puzzle named {', '.join(unknown)}; puzzles: {', '.join(TARGETS)}")
        return 2
    if "--list" in argv:
        for name in names:
            for m in mutants_of(name):
                print(name, m.key)
        return 0
    report = run(names)
    holes = sum(report["puzzles"][n]["hole"] + report["puzzles"][n]["unlisted"]
                for n in names)
    return 1 if holes else 0


if __name__ == "__main__":
    from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING  # noqa: F401
    sys.exit(main(sys.argv[1:]))
