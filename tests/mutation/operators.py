"""A small AST mutator for function-level puzzle code.

Operators (each mutant changes one place):

- ``constant``: a named constant (an upper-case name: BLOCK_SIZE, HEAD_DIM, KV_DIM...) replaced
  by the value it has in the article's setting and by that value's neighbours;
- ``literal``: an integer literal replaced by its neighbours, its double and its half (a
  shuffle offset among them);
- ``binop``: an arithmetic operator swapped (``+ -``, ``* //``, ``// / %``...);
- ``compare``: a comparison swapped (``< <=``, ``> >=``, ``== !=``, ``< >``);
- ``drop_term``: one operand of a ``+``/``-`` dropped (an index term);
- ``swap_args``: two positional arguments of a call swapped;
- ``range``: a loop bound moved by one;
- ``delete``: a statement removed (``barrier`` when it is ``cuda.syncthreads()``);
- ``minmax``: ``min`` and ``max`` swapped;
- ``boolop``: ``and`` and ``or`` swapped; ``not`` dropped.

mutmut and cosmic-ray mutate whole modules on disk and run a test command per mutant; a puzzle's
answer is one function compiled into a kernel or handed to an engine in-process, and the
operators the puzzles need (a named constant replaced by today's value, a barrier removed, a
shuffle offset changed) are not among theirs, so the mutator is this file.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

#: the value each named constant has in the article's setting (Llama-3.2-1B, bf16, 16-token
#: blocks): the number an answer hard-codes when it copies today's value
ARTICLE_VALUES = {
    "BLOCK_SIZE": 16, "HEAD_DIM": 64, "KV_DIM": 512, "N_LAYERS": 16, "ITEMSIZE": 2,
    "MAX_BLOCKS_PER_SEQ": 128, "MAX_SEQ_LEN": 2048, "BLOCK_ELEMS": 16384,
    "V_OFFSET_ELEMS": 8192, "V_OFFSET": 16384, "Q_PER_KV": 4, "WARP_SIZE": 32,
    "NUM_WARPS": 2, "WARP_FULL_MASK": 0xFFFFFFFF,
}

_BINOP_SWAPS = {
    ast.Add: (ast.Sub, ast.Mult), ast.Sub: (ast.Add,), ast.Mult: (ast.Add, ast.FloorDiv),
    ast.FloorDiv: (ast.Mult, ast.Mod, ast.Div), ast.Div: (ast.Mult, ast.FloorDiv),
    ast.Mod: (ast.FloorDiv,),
}
_COMPARE_SWAPS = {
    ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
}


@dataclass(frozen=True)
class Mutant:
    """One mutant of a worked solution: ``key`` names it stably (operator, line, the place's
    ordinal among the operator's places, the replacement), ``source`` is its code."""

    key: str
    operator: str
    line: int
    description: str
    source: str


def _label(node) -> str:
    try:
        return ast.unparse(node)
    except Exception:
        return type(node).__name__


def _is_barrier(stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and _label(stmt.value.func).endswith("syncthreads"))


def _places(tree):
    """(operator, node path, replacement builder, description) for every mutation place, in a
    fixed order (ast.walk is breadth first and deterministic)."""
    out = []
    for node in ast.walk(tree):
        for field, value in ast.iter_fields(node):
            if isinstance(value, list) and value and all(isinstance(v, ast.stmt) for v in value):
                for i, stmt in enumerate(value):
                    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) or (
                            i == 0 and isinstance(stmt, ast.Expr)
                            and isinstance(stmt.value, ast.Constant)
                            and isinstance(stmt.value.value, str)):
                        continue                         # the function itself, a docstring
                    op = "barrier" if _is_barrier(stmt) else "delete"
                    out.append((op, stmt, ("delete", node, field, i),
                                f"delete `{_label(stmt).splitlines()[0]}`"))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) \
                and node.id in ARTICLE_VALUES:
            v = ARTICLE_VALUES[node.id]
            for new in (v, v - 1, v + 1):
                out.append(("constant", node, ("expr", ast.Constant(new)),
                            f"{node.id} -> {new}"))
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value < 1 << 20:
            for new in sorted({node.value - 1, node.value + 1, node.value * 2,
                               node.value // 2} - {node.value}):
                out.append(("literal", node, ("expr", ast.Constant(new)),
                            f"{node.value} -> {new}"))
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP_SWAPS:
            for new in _BINOP_SWAPS[type(node.op)]:
                out.append(("binop", node, ("op", new()),
                            f"`{_label(node)}`: {type(node.op).__name__} -> {new.__name__}"))
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            out.append(("drop_term", node, ("expr_of", "left"), f"`{_label(node)}` -> "
                        f"`{_label(node.left)}`"))
            out.append(("drop_term", node, ("expr_of", "right"), f"`{_label(node)}` -> "
                        f"`{_label(node.right)}`"))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 \
                and type(node.ops[0]) in _COMPARE_SWAPS:
            for new in _COMPARE_SWAPS[type(node.ops[0])]:
                out.append(("compare", node, ("cmp", new()),
                            f"`{_label(node)}`: {type(node.ops[0]).__name__} -> "
                            f"{new.__name__}"))
        if isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            out.append(("boolop", node, ("op", new()), f"`{_label(node)}`: -> {new.__name__}"))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            out.append(("boolop" if isinstance(node.op, ast.Not) else "binop", node,
                        ("expr_of", "operand"), f"`{_label(node)}` -> `{_label(node.operand)}`"))
        if isinstance(node, ast.Call):
            name = _label(node.func)
            if name in ("min", "max"):
                out.append(("minmax", node, ("func", "max" if name == "min" else "min"),
                            f"`{_label(node)}`: {name} -> {'max' if name == 'min' else 'min'}"))
            if name == "range" and node.args:
                for delta in (-1, 1):
                    out.append(("range", node, ("range", delta),
                                f"`{_label(node)}`: bound {delta:+d}"))
            args = node.args
            for i in range(len(args)):
                for j in range(i + 1, len(args)):
                    if not all(isinstance(a, (ast.Name, ast.Attribute)) for a in
                               (args[i], args[j])):
                        continue                 # arguments of one kind: names
                    if _label(args[i]) == _label(args[j]):
                        continue
                    out.append(("swap_args", node, ("swap", i, j),
                                f"`{name}(...)`: arguments {i} and {j} "
                                f"(`{_label(args[i])}`, `{_label(args[j])}`) swapped"))
    return out


def _apply(tree, target, change):
    """A copy of ``tree`` with ``change`` applied at ``target`` (found by identity in the
    original, then at the same place in the copy)."""
    twin = copy.deepcopy(tree)
    originals = list(ast.walk(tree))
    copies = list(ast.walk(twin))
    node = copies[next(i for i, n in enumerate(originals) if n is target)]
    kind = change[0]
    if kind == "delete":
        _, parent, field, i = change
        parent_twin = copies[next(k for k, n in enumerate(originals) if n is parent)]
        body = getattr(parent_twin, field)
        body[i] = ast.Pass()
        ast.copy_location(body[i], node)
    elif kind in ("expr", "expr_of"):
        new = change[1] if kind == "expr" else getattr(node, change[1])
        _replace(twin, node, new)
    elif kind == "op":
        node.op = change[1]
    elif kind == "cmp":
        node.ops = [change[1]]
    elif kind == "func":
        node.func = ast.Name(change[1], ast.Load())
    elif kind == "range":
        last = len(node.args) - 1 if len(node.args) > 1 else 0
        bound = 1 if len(node.args) > 1 else 0
        node.args[bound] = ast.BinOp(node.args[bound], ast.Add(), ast.Constant(change[1]))
        del last
    elif kind == "swap":
        _, i, j = change
        node.args[i], node.args[j] = node.args[j], node.args[i]
    return ast.fix_missing_locations(twin)


def _replace(tree, old, new):
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
    raise ValueError("node not found")


def mutants(source: str) -> list[Mutant]:
    """Every mutant of ``source`` (one function or class), each compiling, none the same code
    as the original or as an earlier mutant."""
    tree = ast.parse(source)
    original = ast.unparse(tree)
    seen = {original}
    out = []
    ordinals: dict = {}
    for operator, node, change, description in _places(tree):
        ordinal = ordinals.setdefault((operator, node.lineno), {}).setdefault(id(node), len(
            ordinals[(operator, node.lineno)]))
        try:
            text = ast.unparse(_apply(tree, node, change))
            compile(text, "<mutant>", "exec")
        except Exception:
            continue
        if text in seen:
            continue
        seen.add(text)
        line = getattr(node, "lineno", 0)
        key = f"{operator}:L{line}.{ordinal}:{description}"
        out.append(Mutant(key, operator, line, description, text))
    return out
