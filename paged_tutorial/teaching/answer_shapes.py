"""The shapes of a puzzle's worked solution that a page can give away without copying a line of
it: what ``answer_lines`` cannot see because the names, the constants or the way the expression
is written differ.

Three shapes, each compared modulo the names and constants a page would use instead:

* **a sum of products** (an address or an index): the solution's expression multiplied out into
  its terms, each term counted by its number of factors (a name, a number, a call, a subscript or
  a ``//`` is one factor).  ``(token * KV_DIM + head * HEAD_DIM + dim) * ITEMSIZE`` has terms of
  3, 3 and 2 factors; ``physical·BLOCK_BYTES + token·KV_DIM·2 + head·64·2`` on a page holds two
  of them, and so does ``slot * L * M + layer * M + pos // 16`` for ``slot * N_LAYERS * per_row
  + layer * per_row + logical``.  A page gives such an expression away when one of its own
  expressions holds two of the solution's terms of two factors or more.
* **a division of one of her arguments**: ``q_head // Q_PER_KV`` (and both halves of
  ``divmod(position, BLOCK_SIZE)``) are ``("//", "q_head")``; ``q_head // 4`` on a page is the
  same line with the constant written out.
* **a row walked in C order**: two nested loops over ``range(...)`` that read
  ``entries[slot, outer, inner]`` visit the row ``entries[slot]`` in the order ``.ravel()``
  gives; a page that says ``block_table[slot].ravel()`` (or ``.flatten()``, ``.reshape(-1)``) has
  given the walk away.

``shapes_of`` reads a solution's source, ``shapes_in`` a page's text (markdown, an output, code,
with ``·`` and ``×`` read as ``*``), ``formulas_in`` the expressions a hint must not hold.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

#: a page holds a sum-of-products shape when it holds this many of its terms
TERMS_GIVEN_AWAY = 2
#: a term of fewer factors (a bare name or number) is in every sum: not counted
SMALLEST_TERM = 2
#: a product is multiplied out into at most this many terms (bigger ones are not addresses)
MOST_TERMS = 16
#: the calls that flatten an array in C order
FLATTENING = ("ravel", "flatten")

_SEPARATORS = re.compile(r"(?<![=<>!])=(?!=)|[:;]|\s-{1,2}\s|→|->|\?|, (?=[A-Za-z]+ )")
#: what a piece of text must hold to be read as a formula: an operator, or a call that flattens
#: or divides
_OPERATOR = re.compile(r"[*+/%<>=-]|\.(?:ravel|flatten|reshape)\(|divmod\(")


@dataclass(frozen=True)
class Shape:
    """One shape of a worked solution: ``kind`` ("terms", "division" or "walk") and what
    identifies it (the factor counts of the terms; the operator and the divided name; the name
    indexing the walked row)."""
    kind: str
    key: tuple

    def describe(self) -> str:
        if self.kind == "terms":
            return "a sum of terms of " + ", ".join(map(str, self.key)) + " factors"
        if self.kind == "division":
            return f"{self.key[1]} {self.key[0]} ..."
        return f"the row [{self.key[0]}] walked in C order"


def _terms(node: ast.AST) -> list[int] | None:
    """``node`` multiplied out: the number of factors of each term (None when too big)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _terms(node.left), _terms(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _terms(node.left), _terms(node.right)
        if left is None or right is None or len(left) * len(right) > MOST_TERMS:
            return None
        return [a + b for a in left for b in right]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _terms(node.operand)
    if isinstance(node, ast.Constant) and node.value == 1:
        return [0]                                  # a factor of 1 changes nothing
    return [1]


def _big_terms(node: ast.AST) -> tuple[int, ...]:
    terms = _terms(node) or []
    return tuple(sorted((t for t in terms if t >= SMALLEST_TERM), reverse=True))


def _is_variable(node: ast.AST) -> bool:
    """A name that holds a value of her arguments (lower case), not a constant (UPPER_CASE)."""
    return isinstance(node, ast.Name) and not node.id.isupper()


def _divisions(node: ast.AST) -> set[Shape]:
    if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod))
            and _is_variable(node.left)):
        op = "//" if isinstance(node.op, ast.FloorDiv) else "%"
        return {Shape("division", (op, node.left.id.lower()))}
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "divmod" and node.args and _is_variable(node.args[0])):
        name = node.args[0].id.lower()
        return {Shape("division", ("//", name)), Shape("division", ("%", name))}
    return set()


def _index_names(node: ast.Subscript) -> list[str | None]:
    index = node.slice
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    return [item.id if isinstance(item, ast.Name) else None for item in items]


def _walks(node: ast.AST) -> set[Shape]:
    """Two nested ``for`` loops over ``range`` whose body reads ``x[a, outer, inner]``."""
    found = set()
    if not (isinstance(node, ast.For) and isinstance(node.target, ast.Name)):
        return found
    outer = node.target.id
    for inner_loop in ast.walk(node):
        if inner_loop is node or not (isinstance(inner_loop, (ast.For, ast.comprehension))
                                      and isinstance(inner_loop.target, ast.Name)):
            continue
        inner = inner_loop.target.id
        for read in ast.walk(inner_loop if isinstance(inner_loop, ast.For) else node):
            if isinstance(read, ast.Subscript):
                names = _index_names(read)
                if len(names) == 3 and names[0] and names[1:] == [outer, inner]:
                    found.add(Shape("walk", (names[0].lower(),)))
    return found


def _comprehension_walks(node: ast.AST) -> set[Shape]:
    """``[... for outer in range(..) for inner in range(..) if x[a, outer, inner] ...]``."""
    if not isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        return set()
    targets = [g.target.id for g in node.generators if isinstance(g.target, ast.Name)]
    found = set()
    for read in ast.walk(node):
        if isinstance(read, ast.Subscript):
            names = _index_names(read)
            if len(names) == 3 and names[0] and len(targets) >= 2 and names[1:] == targets[:2]:
                found.add(Shape("walk", (names[0].lower(),)))
    return found


def _flattened_rows(node: ast.AST) -> set[Shape]:
    """``x[a].ravel()``, ``x[a].flatten()``, ``x[a].reshape(-1)``, ``np.ravel(x[a])``."""
    if not isinstance(node, ast.Call):
        return set()
    row = None
    func = node.func
    if isinstance(func, ast.Attribute):
        if func.attr in FLATTENING and isinstance(func.value, ast.Subscript):
            row = func.value
        elif (func.attr == "reshape" and isinstance(func.value, ast.Subscript) and node.args
              and isinstance(node.args[0], ast.UnaryOp)):
            row = func.value
        elif func.attr in FLATTENING and node.args and isinstance(node.args[0], ast.Subscript):
            row = node.args[0]
    if row is None:
        return set()
    names = _index_names(row)
    return {Shape("walk", (names[0].lower(),))} if len(names) == 1 and names[0] else set()


def _shapes_of_tree(tree: ast.AST, reading_a_page: bool) -> set[Shape]:
    shapes = set()
    inner = {id(child) for node in ast.walk(tree) if isinstance(node, ast.BinOp)
             for child in (node.left, node.right)}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and id(node) not in inner:
            terms = _big_terms(node)
            if len(terms) >= TERMS_GIVEN_AWAY:
                shapes.add(Shape("terms", terms))
        shapes |= _divisions(node)
        if reading_a_page:
            shapes |= _flattened_rows(node)
        else:
            shapes |= _walks(node) | _comprehension_walks(node)
    return shapes


def shapes_of(source: str) -> set[Shape]:
    """The shapes of a worked solution's source."""
    import textwrap
    return _shapes_of_tree(ast.parse(textwrap.dedent(source)), reading_a_page=False)


def _parsed(text: str, mode: str = "eval") -> ast.AST | None:
    try:
        return ast.parse(text, mode=mode)
    except (SyntaxError, ValueError):
        return None


def _expressions_of_line(line: str) -> list[ast.AST]:
    """The longest pieces of ``line`` that are Python expressions with an operator."""
    found = []
    for chunk in _SEPARATORS.split(line):
        if not _OPERATOR.search(chunk):
            continue
        words = chunk.split()[:40]
        start = 0
        while start < len(words):
            for end in range(len(words), start, -1):
                piece = " ".join(words[start:end]).rstrip(".,;")
                tree = _parsed(piece) if _OPERATOR.search(piece) else None
                if tree is not None:
                    found.append(tree)
                    start = end - 1
                    break
            start += 1
    return found


def _as_code(text: str) -> str:
    return text.replace("·", "*").replace("×", "*").replace("`", " ").replace("\u2212", "-")


def shapes_in(text: str, is_code: bool = False) -> set[Shape]:
    """The shapes a page's text holds: a code cell (parsed whole, its comments read as text), or
    markdown and outputs, read line by line."""
    text = _as_code(text)
    shapes = set()
    lines = text.splitlines()
    if is_code:
        code = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))
        tree = _parsed(code, mode="exec")
        if tree is not None:
            shapes |= _shapes_of_tree(tree, reading_a_page=True)
            lines = [line.split("#", 1)[1] for line in lines if "#" in line]
    for line in lines:
        for tree in _expressions_of_line(line):
            shapes |= _shapes_of_tree(tree, reading_a_page=True)
    return shapes


def gives_away(page: set[Shape], solution: set[Shape]) -> list[Shape]:
    """The solution's shapes that ``page`` holds (a sum of products when the page's holds two of
    its terms)."""
    found = []
    for shape in solution:
        if shape.kind != "terms":
            if shape in page:
                found.append(shape)
            continue
        for held in (s for s in page if s.kind == "terms"):
            left = list(held.key)
            common = 0
            for factors in shape.key:
                if factors in left:
                    left.remove(factors)
                    common += 1
            if common >= TERMS_GIVEN_AWAY:
                found.append(shape)
                break
    return found


def formulas_in(text: str) -> list[str]:
    """The formulas (an arithmetic or comparison expression over a name) in a hint's text.
    ``K/V`` is a word, and ``a -1 entry`` names the value -1."""
    found = []
    text = re.sub(r"(?<=\s)-(?=\d)", "~", text.replace("K/V", "KV"))
    for line in _as_code(text).splitlines():
        for tree in _expressions_of_line(line):
            for node in ast.walk(tree):
                if isinstance(node, (ast.BinOp, ast.Compare)) and any(
                        isinstance(n, (ast.Name, ast.Attribute)) for n in ast.walk(node)):
                    found.append(ast.unparse(node))
                    break
    return found
