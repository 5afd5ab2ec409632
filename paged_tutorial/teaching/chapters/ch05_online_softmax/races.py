"""Chapter 05 (limit 3 on hardware): what NVIDIA's race checker found in the article's decode
kernel, read from ``benchmarks/results/racecheck-<date>.json`` (written on a GPU by
``benchmarks/racecheck.py``), and re-running it where a GPU and compute-sanitizer are present.

- ``load_racecheck``: the newest committed result (``results.newest``), or a plain message saying
  it is missing;
- ``summary``: one paragraph per shared-memory layout: hazards, on which shared cell, between
  which two lines of ``attention.py``;
- ``plot_hazards``: hazards per layout and shared cell;
- ``rerun_racecheck``: runs the check again (``paged_tutorial.measure.racecheck``, what the
  script calls) when this process is on a GPU with compute-sanitizer, else says why it does not.

matplotlib is imported inside the plotting function only.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from paged_tutorial.measure import racecheck
from paged_tutorial.teaching.results import Measured, newest

__all__ = ["LAYOUT_NAMES", "load_racecheck", "part_spec", "summary", "plot_hazards",
           "rerun_racecheck"]

#: the layouts racecheck.py checks, as the notebook names them
LAYOUT_NAMES = {
    "article": "the article's layout (the score written back into dot_products[0])",
    "port": "the port's layout (the score in its own shared cell)",
    "yours": "your token_score (notebook 04's puzzle)",
}
COMMAND = "python benchmarks/racecheck.py"


def load_racecheck() -> Measured:
    """The newest committed racecheck result (dry runs are never committed under this name)."""
    return newest("racecheck", how_to_make=COMMAND)


def _access(a: dict) -> str:
    where = f"attention.py:{a['line']}" if a.get("line") else a.get("at", "?")
    code = f" `{a['code']}`" if a.get("code") else ""
    return f"{a.get('op', '?').lower()} at {where}{code}"


def summary(data: dict) -> str:
    """The racecheck result ``data`` (racecheck.py's JSON) in words, one paragraph per layout."""
    lines = []
    case = data.get("case", {})
    if case:
        rows = ", ".join(f"slot {r['slot']} ({r['seq_len']} tokens)" for r in case.get("rows", []))
        lines.append(f"one launch of the decode kernel: head_dim {case.get('head_dim')}, "
                     f"{case.get('n_q_heads')} q heads over {case.get('num_kv_heads')} kv heads, "
                     f"{case.get('dtype')}, batch rows {rows}")
    for name, result in data.get("layouts", {}).items():
        title = LAYOUT_NAMES.get(name, name)
        if result.get("error"):
            lines.append(f"{title}: not measured ({result['error']})")
            continue
        hazards = result.get("hazards")
        if hazards is None:
            lines.append(f"{title}: no hazards counted ({result.get('note', 'dry run')})")
            continue
        cells = result.get("by_cell", {})
        where = "; ".join(f"{n} on {cell}" for cell, n in cells.items())
        lines.append(f"{title}: {hazards} hazard{'s' if hazards != 1 else ''}"
                     + (f" ({where})" if where else ""))
        reported = result.get("summary", {})
        total = reported.get("errors", 0) + reported.get("warnings", 0)
        if total > reported.get("displayed", total):
            lines.append(f"    (racecheck reported {total} in all but printed only "
                         f"{reported['displayed']}: the counts above are of those printed)")
        for race in result.get("races", [])[:3]:
            lines.append(f"    {race['hazards']} between the {_access(race['first'])}"
                         f"\n      and the {_access(race['second'])}")
        if "agrees_with_oracle" in result:
            lines.append(f"    output of that launch equals the torch oracle's: "
                         f"{result['agrees_with_oracle']}")
    return "\n".join(lines)


def plot_hazards(data: dict):
    """Hazards per layout, stacked by the shared cell they are on."""
    import matplotlib.pyplot as plt

    layouts = list(data.get("layouts", {}))
    cells = sorted({c for r in data["layouts"].values() for c in (r.get("by_cell") or {})})
    fig, ax = plt.subplots(figsize=(6.4, 2.2 + 0.3 * len(layouts)), dpi=80)
    left = [0] * len(layouts)
    colors = plt.get_cmap("tab10")
    for k, cell in enumerate(cells):
        counts = [(data["layouts"][name].get("by_cell") or {}).get(cell, 0) for name in layouts]
        ax.barh(range(len(layouts)), counts, left=left, color=colors(k), label=cell)
        left = [a + b for a, b in zip(left, counts)]
    for i, name in enumerate(layouts):
        total = data["layouts"][name].get("hazards")
        ax.text(left[i], i, f"  {total if total is not None else 'not measured'}", va="center",
                fontsize=8)
    ax.set_yticks(range(len(layouts)))
    ax.set_yticklabels([LAYOUT_NAMES.get(n, n).split(" (")[0] for n in layouts], fontsize=8)
    ax.set_xlabel("hazards reported by compute-sanitizer --tool racecheck", fontsize=8)
    ax.set_xlim(0, max(left + [1]) * 1.25)
    if cells:
        ax.legend(title="shared cell", fontsize=7, title_fontsize=7, loc="lower right")
    gpu = f" on {data['gpu']}" if data.get("gpu") else ""
    ax.set_title(f"shared-memory hazards in one decode launch{gpu}", fontsize=9)
    fig.tight_layout()
    return fig


def part_spec(fn, folder, part: str = "token_score") -> str:
    """Write the source of the reader's function ``fn`` (e.g. her ``token_score`` from notebook
    04) into ``folder``/reader_part.py and return racecheck.py's ``--part`` spec for it."""
    import inspect
    import textwrap

    path = Path(folder) / "reader_part.py"
    path.write_text("import math\n\n\n" + textwrap.dedent(inspect.getsource(fn)))
    return f"{path}:{fn.__name__}={part}"


def rerun_racecheck(timeout: float = 500, part=None) -> tuple[dict | None, str]:
    """Check the layouts again (``racecheck.run``) when this process runs kernels on a GPU and
    compute-sanitizer is installed; returns (the result, as racecheck.py's JSON, or None; a
    message).  ``part``: the reader's ``token_score`` function, checked as a third layout,
    "yours".  ``timeout``: seconds each layout's run may take."""
    from paged_tutorial.backends.numba_cuda import SIMULATING

    if SIMULATING:
        return None, ("kernels run in the simulator here, so racecheck is not re-run: it "
                      "needs an NVIDIA GPU and compute-sanitizer")
    if racecheck.find_sanitizer() is None:
        return None, ("compute-sanitizer (part of the CUDA toolkit) is not installed here, so "
                      "racecheck is not re-run")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            spec = part_spec(part, tmp) if part is not None else None
            data = racecheck.run(part=spec, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"a racecheck layout did not finish within {timeout:.0f} s: not re-run"
        except SystemExit as exc:                      # no GPU for torch, a bad part
            return None, f"racecheck not re-run: {exc}"
    failed = racecheck.failed_layouts(data)
    if failed:
        return data, f"racecheck re-run now, on this GPU; failed: {', '.join(failed)}"
    return data, "racecheck re-run now, on this GPU"
