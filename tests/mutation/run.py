"""Run mutants of the worked solutions through the graders and, where a grader calls one
correct, through the deep oracle; classify each and write the report."""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.operators import Mutant, mutants
from tests.mutation.targets import TARGETS

HERE = Path(__file__).parent
EQUIVALENT_FILE = HERE / "equivalent.json"
REPORT_FILE = HERE / "report.json"


@dataclass
class Outcome:
    puzzle: str
    mutant: Mutant
    status: str            # refused | equivalent | hole | unlisted (passes both, not listed)
    grader: str            # the grader's verdict, first line
    deep: str | None = None
    seconds: float = 0.0


def equivalent_list() -> dict:
    """{puzzle: {mutant key: reason}} from ``equivalent.json``."""
    if not EQUIVALENT_FILE.exists():
        return {}
    return json.loads(EQUIVALENT_FILE.read_text())


def mutants_of(puzzle: str) -> list[Mutant]:
    target = TARGETS[puzzle]
    return mutants(target.source())


def grade(puzzle: str, mutant: Mutant):
    """The grader's verdict on ``mutant`` (what ``pt.exercises.check`` runs)."""
    from paged_tutorial.teaching.chapters import puzzle as puzzle_named

    try:
        answer = TARGETS[puzzle].build(mutant.source)
    except Exception as exc:             # a mutant that does not even define the function
        return None, f"does not build: {type(exc).__name__}: {exc}"
    verdict = puzzle_named(puzzle).grade(answer)
    return answer, verdict


def classify(puzzle: str, mutant: Mutant, listed: dict) -> Outcome:
    start = time.perf_counter()
    answer, verdict = grade(puzzle, mutant)
    if answer is None or verdict.status != "correct":
        message = verdict if isinstance(verdict, str) else str(verdict.message)
        return Outcome(puzzle, mutant, "refused", _first_line(message),
                       seconds=time.perf_counter() - start)
    deep = TARGETS[puzzle].deep_oracle(answer)
    if deep is not None:
        status = "hole"
    else:
        status = "equivalent" if mutant.key in listed.get(puzzle, {}) else "unlisted"
    return Outcome(puzzle, mutant, status, "correct", deep, time.perf_counter() - start)


def _first_line(text: str) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line[:300]


def sample(puzzle: str, k: int, seed: int) -> list[Mutant]:
    """``k`` mutants of ``puzzle`` drawn with ``seed`` (one per operator first, so the sample
    spreads over the operators)."""
    all_ = mutants_of(puzzle)
    rng = random.Random(f"{seed}:{puzzle}")
    by_op: dict = {}
    for m in all_:
        by_op.setdefault(m.operator, []).append(m)
    picked = [rng.choice(ms) for _, ms in sorted(by_op.items())]
    rng.shuffle(picked)
    rest = [m for m in all_ if m not in picked]
    rng.shuffle(rest)
    return (picked + rest)[:k]


def run(puzzles, report_path: Path | None = REPORT_FILE, log=sys.stdout) -> dict:
    """Every mutant of ``puzzles``; the report (also written to ``report_path``, merged with
    the puzzles already in it)."""
    listed = equivalent_list()
    report = {}
    if report_path is not None and report_path.exists():
        report = json.loads(report_path.read_text())
    report.setdefault("puzzles", {})
    for puzzle in puzzles:
        outcomes = []
        all_ = mutants_of(puzzle)
        for i, mutant in enumerate(all_):
            outcome = classify(puzzle, mutant, listed)
            outcomes.append(outcome)
            print(f"{puzzle} {i + 1}/{len(all_)} {outcome.status:10s} {outcome.seconds:5.1f}s "
                  f"{mutant.key}" + (f"  DEEP: {outcome.deep}" if outcome.deep else ""),
                  file=log, flush=True)
        if report_path is not None and report_path.exists():   # another run may have written
            report = json.loads(report_path.read_text())
            report.setdefault("puzzles", {})
        report["puzzles"][puzzle] = summarize(outcomes)
        report["date"] = time.strftime("%Y-%m-%d")
        apply_equivalent_list(report)
        if report_path is not None:
            report_path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


def apply_equivalent_list(report: dict) -> dict:
    """The report's equivalent and unlisted counts recomputed from its mutants that pass both
    the check and the deep oracle, against today's ``equivalent.json``."""
    listed = equivalent_list()
    for puzzle, row in report.get("puzzles", {}).items():
        passing = row.get("passing_both", [])
        row["equivalent"] = sum(k in listed.get(puzzle, {}) for k in passing)
        row["unlisted"] = len(passing) - row["equivalent"]
    return report


def recheck(puzzles, report_path: Path = REPORT_FILE, log=sys.stdout) -> dict:
    """Grade again the mutants the report has passing both the check and the deep oracle (after
    a check was made stricter: every mutant it refused before it refuses still) and move the
    ones it now refuses to the refused count."""
    report = json.loads(report_path.read_text())
    for puzzle in puzzles:
        row = report["puzzles"].get(puzzle)
        if row is None:
            continue
        made = {m.key: m for m in mutants_of(puzzle)}
        still = []
        holes = [h["key"] for h in row["holes_found"]]
        for key in holes:
            answer, verdict = grade(puzzle, made[key])
            if answer is None or verdict.status != "correct":
                print(f"{puzzle} recheck refused (was a hole) {key}", file=log, flush=True)
                row["refused"] += 1
                row["hole"] -= 1
                row["by_operator"][made[key].operator]["refused"] += 1
                row["holes_found"] = [h for h in row["holes_found"] if h["key"] != key]
        for key in row["passing_both"]:
            answer, verdict = grade(puzzle, made[key])
            refused = answer is None or verdict.status != "correct"
            print(f"{puzzle} recheck {'refused' if refused else 'passes'} {key}", file=log,
                  flush=True)
            if refused:
                row["refused"] += 1
                row["by_operator"][made[key].operator]["refused"] += 1
            else:
                still.append(key)
        row["passing_both"] = still
    apply_equivalent_list(report)
    report_path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


def summarize(outcomes: list[Outcome]) -> dict:
    count = {s: sum(o.status == s for o in outcomes)
             for s in ("refused", "equivalent", "hole", "unlisted")}
    return {
        "made": len(outcomes), **count,
        "seconds": round(sum(o.seconds for o in outcomes), 1),
        "holes_found": [{"key": o.mutant.key, "deep": o.deep} for o in outcomes
                        if o.status == "hole"],
        "passing_both": [o.mutant.key for o in outcomes
                         if o.status in ("equivalent", "unlisted")],
        "by_operator": _by_operator(outcomes),
    }


def _by_operator(outcomes):
    out: dict = {}
    for o in outcomes:
        row = out.setdefault(o.mutant.operator, {"made": 0, "refused": 0})
        row["made"] += 1
        row["refused"] += o.status == "refused"
    return out
