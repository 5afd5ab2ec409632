"""Watching the engine without patching it: a recording backend.

``RecordingBackend`` wraps any backend, forwards every operation to it unchanged and records
each call as an ``OpCall``: the op's name, the layer (for the ops that take one), the shapes of
its tensor arguments and, for the arguments you ask for, a CPU copy of their values taken at
the moment of the call (before the op changes anything in place).  It is a Backend itself, so
the engine runs it like any other::

    recorder = RecordingBackend("torch", keep={"decode_attention": ["seq_lens",
                                                                     "active_slots"]})
    engine = pt.Engine(model, backend=recorder)
    engine.generate(["Hi"])
    [c for c in recorder.calls if c.name == "decode_attention" and c.layer == 0]

The other public hooks: ``PagedKVCache.add_listener`` (every pop from and push to
``free_blocks``, and with prefix caching every share, cache hit, release and eviction),
``Engine.step_count`` and the ``StepReport`` each ``Engine.step()`` returns, and, in the
simulator, ``backends.numba_cuda.runtime.access_log`` (which elements a kernel read/wrote).

A recording backend is never captured in a CUDA graph (the engine turns graphs off for it):
a replayed graph calls no Python, so nothing would be recorded.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from paged_tutorial.backends import make_backend
from paged_tutorial.backends.base import Backend

#: the operations of the Backend contract, in the order a layer calls them
OPS = ("embed", "rms_norm", "add_rms_norm", "linear", "rope", "write_kv", "rope_write_kv",
       "prefill_attention", "prefill_attention_from_cache", "decode_attention", "silu_mul",
       "sample")


@dataclass
class OpCall:
    """One recorded backend call."""
    index: int                          # position in the recorder's call list
    name: str
    layer: int | None                   # for ops that receive the layer index, else None
    shapes: dict = field(default_factory=dict)     # argument name -> tuple (tensors only)
    values: dict = field(default_factory=dict)     # kept arguments: CPU copies / plain values
    step: int | None = None             # the engine step it belongs to (``Engine.step_count``)


class RecordingBackend(Backend):
    """Forwards every op to ``inner`` and appends an ``OpCall`` to ``calls``.

    ``inner``: a Backend or a backend name (``make_backend``).  ``ops``: names to record
    (default: all).  ``keep``: {op name: [argument names]} whose values are copied to the CPU
    for each recorded call of that op (tensors are cloned, other values kept as they are).
    ``on_call(call)``: called after each recorded call, with the call."""

    def __init__(self, inner: Backend | str = "torch", ops=None, keep: dict | None = None,
                 on_call=None):
        self.inner = make_backend(inner) if isinstance(inner, str) else inner
        if not isinstance(self.inner, Backend):
            raise TypeError(f"RecordingBackend wraps a Backend or a backend name, got "
                            f"{type(inner).__name__}")
        unknown = set(ops or ()) - set(OPS) | set(keep or {}) - set(OPS)
        if unknown:
            raise ValueError(f"unknown op(s) {sorted(unknown)}: choose from {OPS}")
        self.ops = frozenset(ops) if ops is not None else frozenset(OPS)
        self.keep = {name: tuple(args) for name, args in (keep or {}).items()}
        for name, args in self.keep.items():
            params = inspect.signature(getattr(Backend, name)).parameters
            missing = [a for a in args if a not in params]
            if missing:
                raise ValueError(f"{name} has no argument(s) {missing}; its arguments are "
                                 f"{[p for p in params if p != 'self']}")
        self.on_call = on_call
        self.calls: list[OpCall] = []
        self.current_step: int | None = None
        self.name = f"recording({self.inner.name})"
        self.device = self.inner.device

    def describe(self) -> str:
        return f"recording wrapper around {self.inner.describe()}"

    def use_quantized_rows(self, pairs) -> None:
        """The wrapped backend multiplies by the kept blocks if it can, as it would unwrapped."""
        self.inner.use_quantized_rows(pairs)

    def begin_step(self, step_index: int) -> None:
        """The engine calls this before each step: calls recorded from now on carry it."""
        self.current_step = step_index
        self.inner.begin_step(step_index)

    def clear(self) -> None:
        self.calls.clear()

    def calls_of(self, name: str, layer: int | None = None) -> list[OpCall]:
        return [c for c in self.calls if c.name == name and (layer is None or c.layer == layer)]

    def _record(self, name: str, method, args: tuple, kwargs: dict):
        if name not in self.ops:
            return method(*args, **kwargs)
        bound = inspect.signature(method).bind(*args, **kwargs)
        shapes = {k: tuple(v.shape) for k, v in bound.arguments.items() if torch.is_tensor(v)}
        values = {}
        for arg in self.keep.get(name, ()):
            if arg in bound.arguments:
                v = bound.arguments[arg]
                values[arg] = v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
        layer = bound.arguments.get("layer")
        call = OpCall(len(self.calls), name, None if layer is None else int(layer), shapes,
                      values, self.current_step)
        out = method(*args, **kwargs)
        self.calls.append(call)
        self.returned(name, bound.arguments, out)
        if self.on_call is not None:
            self.on_call(call)
        return out

    def returned(self, name: str, arguments: dict, out) -> None:
        """Called after each recorded op with its arguments (by name) and what it returned: a
        subclass that looks at outputs overrides it (``engine/numerical_faults.py``)."""

    # --- the contract, forwarded -----------------------------------------------------------
    def linear(self, x, weight, bias=None):
        args = (x, weight) if bias is None else (x, weight, bias)
        return self._record("linear", self.inner.linear, args, {})

    def embed(self, weight, token_ids):
        return self._record("embed", self.inner.embed, (weight, token_ids), {})

    def rms_norm(self, x, weight, eps):
        return self._record("rms_norm", self.inner.rms_norm, (x, weight, eps), {})

    def add_rms_norm(self, x, residual, weight, eps):
        return self._record("add_rms_norm", self.inner.add_rms_norm,
                            (x, residual, weight, eps), {})

    def rope(self, q, k, positions, cos, sin):
        return self._record("rope", self.inner.rope, (q, k, positions, cos, sin), {})

    def silu_mul(self, gate_up):
        return self._record("silu_mul", self.inner.silu_mul, (gate_up,), {})

    def rope_write_kv(self, q, k, v, positions, cos, sin, cache, block_table, layer, slots):
        return self._record("rope_write_kv", self.inner.rope_write_kv,
                            (q, k, v, positions, cos, sin, cache, block_table, layer, slots), {})

    def write_kv(self, cache, k, v, block_table, layer, slots, positions):
        return self._record("write_kv", self.inner.write_kv,
                            (cache, k, v, block_table, layer, slots, positions), {})

    def prefill_attention(self, q, k, v, inputs, scale):
        return self._record("prefill_attention", self.inner.prefill_attention,
                            (q, k, v, inputs, scale), {})

    def prefill_attention_from_cache(self, q, cache, block_table, layer, inputs, scale):
        return self._record("prefill_attention_from_cache",
                            self.inner.prefill_attention_from_cache,
                            (q, cache, block_table, layer, inputs, scale), {})

    def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                         max_seq_len=None):
        return self._record("decode_attention", self.inner.decode_attention,
                            (q, cache, block_table, layer, seq_lens, active_slots, scale,
                             max_seq_len), {})

    def sample(self, logits, temperature, top_p, uniforms):
        return self._record("sample", self.inner.sample, (logits, temperature, top_p, uniforms),
                            {})

    def synchronize(self) -> None:
        self.inner.synchronize()
