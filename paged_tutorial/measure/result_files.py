"""Where a run's JSON goes (``<stem>-<date>.json`` in a folder) and which commit of the tree it
measured."""

from __future__ import annotations

import json
import subprocess
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


def tree_commit(folder: Path) -> str | None:
    """The short git commit of the checkout holding ``folder`` (None outside a git checkout)."""
    try:
        res = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return res.stdout.strip() or None
