"""Backends are found in one registry and say what they can do: no code outside the registry
knows them by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from paged_tutorial.backends import BACKEND_NAMES, BACKENDS, make_backend
from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.recording import RecordingBackend
from paged_tutorial.backends.torch_ref import TorchBackend

PACKAGE = Path(__file__).resolve().parents[2] / "paged_tutorial"


def test_every_name_has_help_and_builds_a_backend():
    assert BACKEND_NAMES == tuple(BACKENDS) == ("auto", "torch", "numba", "numba-sim")
    for name, entry in BACKENDS.items():
        assert entry.name == name and len(entry.help) > 20
    built = make_backend("torch")
    assert isinstance(built, TorchBackend) and not built.simulated
    # Numba picks the simulator or the GPU once per process: build the one this process runs
    from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

    numba = make_backend("numba-sim" if SIMULATING else "numba")
    assert numba.simulated == SIMULATING and numba.graph_capturable
    assert numba.check_inputs == SIMULATING and numba.compiles_kernels != SIMULATING
    if not torch.cuda.is_available():
        assert make_backend("auto").name == "torch"


def test_an_unknown_name_lists_the_registry():
    with pytest.raises(ValueError, match="choose one of auto, torch, numba, numba-sim"):
        make_backend("cuda")
    with pytest.raises(ValueError, match="unknown backend 3"):
        make_backend(3)


def test_capabilities_are_attributes_of_the_backend():
    assert Backend.graph_capturable is False and Backend.check_inputs is False
    assert Backend.simulated is False
    assert TorchBackend.graph_capturable
    assert TorchBackend("cpu").check_inputs and not TorchBackend("cpu", check_inputs=False).check_inputs
    recorder = RecordingBackend("torch")       # calls Python per op: a graph would skip them
    assert not recorder.graph_capturable and not recorder.check_inputs


def test_no_backend_name_string_is_compared_outside_the_registry():
    """The names live in backends/__init__.py: elsewhere code asks the backend's attributes
    (a comparison with a backend name string, or a membership test in a tuple of them)."""
    names = set(BACKEND_NAMES) - {"auto"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ("backends/__init__.py", "backends/numba_cuda/backend.py") \
                or rel.startswith("teaching/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c for c in ast.walk(node) if isinstance(c, ast.Constant)]
                if any(c.value in names for c in consts if isinstance(c.value, str)) and \
                        any(isinstance(n, ast.Attribute) and n.attr == "name"
                            for n in ast.walk(node)):
                    offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders
