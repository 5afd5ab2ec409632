"""Reading compute-sanitizer's racecheck report on the decode kernel: its summary line, every
race it analysed (two accesses, their source lines, a hazard count) or every single hazard
(kind, shared byte offset, thread block, the two threads), and the shared cell each one is on,
named from the kernel's source line (``dot_products[0]``, ``score``).

``parse_report`` is pure text in, data out; ``kernel_source_lines`` gives it the lines of
``kernels/attention.py`` (and of a reader's part) to name the cells.
"""

from __future__ import annotations

import re
from pathlib import Path

SHARED_ARRAYS = ("dot_products", "score")            # the kernel's shared arrays

_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+) hazards? displayed\s*\((\d+) errors?,\s*"
                      r"(\d+) warnings?\)")
_RACE = re.compile(r"(Error|Warning|ERROR|WARN\S*)\s*:?\s*Race reported between (Read|Write) "
                   r"access at (.+?)\s*$")
_AND = re.compile(r"^\s*and (Read|Write) access at (.+?)\s*\[(\d+) hazards?\]")
_HAZARD = re.compile(r"(ERROR|WARN|Error|Warning)\S*.*?Potential (RAW|WAR|WAW) hazard "
                     r"detected at __shared__ (0x[0-9a-fA-F]+) in block \(([^)]*)\)")
_THREAD = re.compile(r"^\s*(Read|Write) Thread \(([^)]*)\) at (.+?)\s*$")
_WHERE = re.compile(r"\bin (\S+?):(\d+)\b")
_PREFIX = re.compile(r"^=+\s?")


def _ints(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def source_line(location: str, source: dict) -> dict:
    """{'file', 'line', 'code', 'array', 'index'} for a sanitizer location such as
    ``paged_attention_kernel+0x2f0 in /x/attention.py:313:...``; ``source`` maps a file's base
    name to its lines."""
    found = _WHERE.search(location)
    out = {"at": location.strip()}
    if not found:
        return out
    name, line = Path(found.group(1)).name, int(found.group(2))
    out.update(file=name, line=line)
    lines = source.get(name)
    if lines and 1 <= line <= len(lines):
        code = lines[line - 1].strip()
        out["code"] = code
        cell = re.search(r"\b(" + "|".join(SHARED_ARRAYS) + r")\[([^\]]+)\]", code)
        if cell:
            out["array"], out["index"] = cell.group(1), cell.group(2).strip()
    return out


def cell_name(access: dict, thread: tuple | None = None) -> str | None:
    """``dot_products[0]`` from an access's source line (a literal index, or ``thread_id //
    WARP_SIZE`` with the thread known); the array alone when the element cannot be told."""
    array, index = access.get("array"), access.get("index")
    if array is None:
        return None
    if index is not None and index.isdigit():
        return f"{array}[{index}]"
    if index is not None and thread and re.fullmatch(r"thread_id\s*//\s*WARP_SIZE", index):
        return f"{array}[{thread[0] // 32}]"
    return array


def parse_report(text: str, source: dict) -> dict:
    """The racecheck report ``text`` as data: summary, races (analysis mode: two accesses and
    a hazard count each), single hazards (hazard mode: one per byte) and hazards per shared
    cell.  ``source``: {file base name: list of lines} to name the shared arrays."""
    lines = [_PREFIX.sub("", line.rstrip()) for line in text.splitlines()]
    summary, first = None, None
    races, hazards = [], []
    for i, line in enumerate(lines):
        m = _SUMMARY.search(line)
        if m:
            summary = dict(zip(("displayed", "errors", "warnings"), _ints(m.group(0))))
            continue
        m = _RACE.search(line)
        if m:
            rest = m.group(3)
            inline = re.search(r"^(.*?)\s+and (Read|Write) access at (.+?)\s*\[(\d+) hazards?\]",
                               rest)
            first = (m.group(1), m.group(2), inline.group(1) if inline else rest)
            if inline:
                races.append(_race(first, inline.group(2), inline.group(3),
                                   int(inline.group(4)), source))
            continue
        m = _AND.search(line)
        if m and first is not None:
            races.append(_race(first, m.group(1), m.group(2), int(m.group(3)), source))
            continue
        m = _HAZARD.search(line)
        if m:
            hazard = {"severity": m.group(1), "kind": m.group(2), "offset": m.group(3),
                      "block": list(_ints(m.group(4))), "accesses": []}
            for follow in lines[i + 1:i + 4]:
                t = _THREAD.search(follow)
                if not t:
                    continue
                access = source_line(t.group(3), source)
                thread = _ints(t.group(2))
                access.update(op=t.group(1), thread=list(thread), cell=cell_name(access, thread))
                hazard["accesses"].append(access)
            hazards.append(hazard)
    by_cell: dict = {}
    if races:
        for r in races:
            key = _where(r["first"].get("cell"), r["second"].get("cell"), hazards) \
                if _in_kernel(r["first"], r["second"]) else OUTSIDE
            by_cell[key] = by_cell.get(key, 0) + r["hazards"]
    else:
        for h in hazards:
            cells = [a.get("cell") for a in h["accesses"]] + [None, None]
            key = _where(cells[0], cells[1], [h]) if _in_kernel(*h["accesses"]) else OUTSIDE
            by_cell[key] = by_cell.get(key, 0) + 1
    return {"summary": summary,
            "hazards": sum(r["hazards"] for r in races) if races else len(hazards),
            "counted_from": "races (analysis)" if races else "single hazards (one per byte)",
            "by_cell": by_cell, "races": races, "single_hazards": len(hazards),
            "single_hazard_kinds": _count(h["kind"] for h in hazards),
            "single_hazard_offsets": _count(h["offset"] for h in hazards),
            "single_hazard_examples": hazards[:4]}


def _race(first, op: str, location: str, count: int, source) -> dict:
    a = source_line(first[2], source)
    a.update(op=first[1], cell=cell_name(a))
    b = source_line(location, source)
    b.update(op=op, cell=cell_name(b))
    return {"severity": first[0], "first": a, "second": b, "hazards": count}


OUTSIDE = "outside the attention kernel"
KERNEL_NAME = "paged_attention_kernel"


def _in_kernel(*accesses) -> bool:
    """True unless the accesses' locations name a function other than the attention kernel
    (a location without a function name counts as the kernel's)."""
    text = " ".join(a.get("at", "") for a in accesses)
    return KERNEL_NAME in text or not re.search(r"[A-Za-z_]\w*\s*(\(|\+0x)", text) or \
        "attention.py" in text


def _where(cell_a, cell_b, hazards) -> str:
    """One name for the place of a race: the element both accesses name, else the array,
    else the byte offsets the single hazards give."""
    cells = [c for c in (cell_a, cell_b) if c]
    if cells:
        exact = [c for c in cells if "[" in c]
        return exact[0] if exact else cells[0]
    offsets = sorted({h["offset"] for h in hazards})
    return f"__shared__ {','.join(offsets)}" if offsets else "unknown"


def _count(items) -> dict:
    out: dict = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def kernel_source_lines(part: str | None = None) -> dict:
    """{base name: lines} of the files a report can name (the kernel's module, and the file of
    a reader's ``--part``)."""
    from paged_tutorial.backends.numba_cuda.kernels import attention

    path = Path(attention.__file__)
    lines = {path.name: path.read_text().splitlines()}
    if part:
        mine = Path(part.rpartition(":")[0])
        lines[mine.name] = mine.read_text().splitlines()
    return lines
