"""Where a run's JSON goes: ``<stem>-<date>.json`` in a folder, or a file the caller names."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def result_path(stem: str, date: str, out: str | Path) -> Path:
    """``out`` itself when it names a ``.json`` file, else ``<out>/<stem>-<date>.json``."""
    out = Path(out)
    return out if out.suffix == ".json" else out / f"{stem}-{date}.json"


def write_json(data: dict, stem: str, out: str | Path, indent: int = 1) -> Path:
    """``data`` as ``result_path(stem, data['date'], out)`` (its folder made if missing);
    prints where it went, on stderr."""
    path = result_path(stem, data["date"], out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, ensure_ascii=False) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return path
