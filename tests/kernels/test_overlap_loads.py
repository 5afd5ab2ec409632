"""Overlapped kernels read activations with coherent loads (``device/grid_dependency.py``).

A kernel launched to overlap its predecessor runs while that kernel still writes; the
non-coherent path (``load_u32x4_nc``, PTX ``ld.global.nc``) may serve it stale data or be moved
above ``wait_for_previous_grid()``.  On an H200 that gave wrong tokens under load
(``benchmarks/overlap_race.py``).  The rule is checked on the source, so it holds on a CPU too:
in every module with an ``@overlapping`` kernel, ``load_u32x4_nc`` reads only weights."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import pytest

import paged_tutorial.backends.numba_cuda.kernels as kernels_pkg

#: parameter names of the weights (never written during a step) in the kernel modules
WEIGHT_NAMES = {"w", "weight", "norm_weight"}


def _modules():
    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        module = importlib.import_module(f"{kernels_pkg.__name__}.{info.name}")
        tree = ast.parse(inspect.getsource(module))
        overlapping = any(
            (isinstance(d, ast.Name) and d.id == "overlapping")
            or (isinstance(d, ast.Attribute) and d.attr == "overlapping")
            for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            for d in node.decorator_list)
        yield info.name, tree, overlapping


def nc_reads(tree) -> list[tuple[int, str]]:
    """(line, array expression) of every load_u32x4_nc call."""
    return [(node.lineno, ast.unparse(node.args[0])) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "load_u32x4_nc" and node.args]


MODULES = list(_modules())


def test_the_kernels_with_overlapped_launches_are_found():
    assert {name for name, _, overlapping in MODULES if overlapping} >= {
        "gemv", "norms", "elementwise", "attention_fast", "sampling"}


@pytest.mark.parametrize("name,tree", [(n, t) for n, t, o in MODULES if o],
                         ids=[n for n, _, o in MODULES if o])
def test_non_coherent_loads_read_only_weights(name, tree):
    bad = [(line, arr) for line, arr in nc_reads(tree) if arr not in WEIGHT_NAMES]
    assert not bad, (f"kernels/{name}.py reads {bad} (line, array) with load_u32x4_nc in a "
                     "module of overlapped kernels: read activations with load_u32x4")


def test_the_check_sees_an_activation_read():
    tree = ast.parse("def k(x, w):\n    a = load_u32x4_nc(w, 0)\n    b = load_u32x4_nc(x, 0)\n")
    assert [arr for _, arr in nc_reads(tree) if arr not in WEIGHT_NAMES] == ["x"]
