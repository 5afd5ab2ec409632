"""Where a run's JSON goes: ``<stem>-<date>.json`` in a folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def write_json(data: dict, stem: str, folder: str | Path) -> Path:
    """``data`` as ``<folder>/<stem>-<data['date']>.json`` (the folder made if missing); prints
    where it went."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}-{data['date']}.json"
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return path

