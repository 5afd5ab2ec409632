"""Exercises at the end of each notebook, checked by ``check(name, answer)``.

Each chapter module ``chNN.py`` defines ``CHECKS = {"NN.short_name": checker}``.  A checker
takes the reader's answer, computes the right one from the package itself (never a stored
literal where the package can compute it), and returns ``(ok, message)``; ``check`` prints a
one-line verdict, so a notebook's stored output stays the same for a correct answer.
"""

from __future__ import annotations

import importlib
import pkgutil

_CHECKS: dict = {}


def _load_all() -> dict:
    if not _CHECKS:
        for info in pkgutil.iter_modules(__path__):
            if info.name.startswith("ch"):
                module = importlib.import_module(f"{__name__}.{info.name}")
                _CHECKS.update(getattr(module, "CHECKS", {}))
    return _CHECKS


def check(name: str, answer) -> bool:
    """Check the answer to exercise ``name`` (e.g. ``"01.v_offset"``); print and return the
    verdict."""
    checks = _load_all()
    if name not in checks:
        raise KeyError(f"no exercise named {name!r}; known: {', '.join(sorted(checks))}")
    ok, message = checks[name](answer)
    print(f"{'✔ correct' if ok else '✘ not yet'} [{name}]: {message}")
    return ok


def exercises(prefix: str = "") -> list[str]:
    """Names of the exercises (of one chapter, with prefix "03.")."""
    return sorted(n for n in _load_all() if n.startswith(prefix))
