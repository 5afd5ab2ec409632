"""``python -m tests.mutation [PUZZLE ...] [--list | --relist | --recheck | --help]``: every
mutant of each puzzle's worked solution (all puzzles by default) through its grader and the
deep oracle; writes ``tests/mutation/report.json`` (then ``PYTHONPATH=. python
tests/teaching/test_puzzles_doc.py`` regenerates ``docs/puzzles.md`` from it)."""

import sys

import json

from tests.mutation.run import REPORT_FILE, apply_equivalent_list, mutants_of, recheck, run
from tests.mutation.targets import TARGETS


def main(argv) -> int:
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        return 0
    names = [a for a in argv if not a.startswith("--")] or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        print(f"no puzzle named {', '.join(unknown)}; puzzles: {', '.join(TARGETS)}")
        return 2
    if "--relist" in argv:              # the report again against today's equivalent.json
        report = apply_equivalent_list(json.loads(REPORT_FILE.read_text()))
        REPORT_FILE.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        return 0
    if "--recheck" in argv:             # the report's passing mutants against today's checks
        recheck(names)
        return 0
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
