"""Exercises at the end of each notebook, checked by ``check(name, answer)``.

Each chapter module ``chNN.py`` defines ``CHECKS = {"NN.short_name": checker}``.  A checker
takes the reader's answer, computes the right one from the package itself (never a stored
literal where the package can compute it), and returns ``(ok, message)``; ``check`` prints a
one-line verdict, so a notebook's stored output stays the same for a correct answer.
"""

from __future__ import annotations

import importlib
import numbers
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


# --- helpers the chapter checkers share ---------------------------------------------------
def as_int(value):
    """``value`` as a Python int if it is an integral number (int, numpy int, 3.0), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and float(value).is_integer():
        return int(value)
    return None


def tiny_engine(num_layers: int = 2, max_slots: int = 1, max_seq_len: int = 128):
    """A real Engine on a tiny random Llama (torch backend, CPU): for exercises whose answer is
    counted by running the engine rather than stored."""
    from ..config import ModelConfig
    from ..engine import Engine
    from ..models import random_model

    config = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=num_layers, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8)
    return Engine(random_model(config, seed=0), backend="torch", device="cpu",
                  max_slots=max_slots, max_seq_len=max_seq_len)
