"""A pytest plugin for ``gpu_tests.py``: one JSON line per test phase, written as the run goes
(so a run stopped by its time limit still leaves its results).

    PYTEST_JSONL=out.jsonl python -m pytest -p pytest_jsonl ...

Under pytest-xdist (``-n N``) the controller receives every worker's reports and is the only
process that writes.
"""

from __future__ import annotations

import json
import os

_PATH = os.environ.get("PYTEST_JSONL")
_WRITES = True


def pytest_configure(config):
    global _WRITES
    _WRITES = not hasattr(config, "workerinput")      # an xdist worker: the controller writes


def _mark(nodeid: str, when: str) -> None:
    if _PATH and _WRITES:
        with open(_PATH, "a") as f:
            f.write(json.dumps({"nodeid": nodeid, "when": when}) + "\n")


def pytest_runtest_logstart(nodeid, location):
    """A line when a test starts and one when it ends, so a run cut by its time limit names
    the tests it was in."""
    _mark(nodeid, "start")


def pytest_runtest_logfinish(nodeid, location):
    _mark(nodeid, "finish")


def pytest_runtest_logreport(report):
    if not _PATH or not _WRITES:
        return
    if report.when != "call" and report.outcome == "passed":
        return                                   # setup/teardown passing: nothing to say
    message = ""
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])
    elif report.outcome == "failed":
        message = report.longreprtext[-1500:]
    with open(_PATH, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when,
                            "outcome": report.outcome, "seconds": round(report.duration, 2),
                            "message": message}) + "\n")
