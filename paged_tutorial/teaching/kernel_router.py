"""Serve a model with a kernel of your own: a backend that sends chosen decode-attention calls to
it and everything else to another backend.

    kernel = pt.exercises.your_kernel()
    router = KernelRouter(kernel, inner="torch", layers=[3], kv_groups=[0])   # CPU: a little
    router = KernelRouter(kernel, inner="numba")                              # GPU: everything
    engine = pt.Engine(model, backend=router)
    engine.generate(["What is the capital of France?"], max_tokens=8, temperature=0.0)
    router.routed           # one RoutedCall per decode attention the kernel answered

``KernelRouter`` is a ``RecordingBackend`` that records nothing of its own: every op is
forwarded to ``inner`` unchanged, except the decode attention of the chosen ``layers`` (all of
them by default), whose chosen ``kv_groups`` (all by default) the kernel computes.  For those,
``inner`` computes the whole call first, on a copy of q: its output is the reference each
``RoutedCall`` compares the kernel's with (``max_abs_diff``), and the kernel's output is what
goes on through the model.  Prefill attention always stays with ``inner`` (the article's kernel
is a decode kernel).

The kernel is any object with ``decode_attention(q, cache, block_table, layer, seq_lens,
active_slots, scale, kv_group=None)`` writing over q, as ``YourKernel`` has.  In the simulator
every routed call runs the kernel's threads in Python, so route little there (one layer, one kv
group: a few seconds per decode step for SmolLM2); on a GPU, route everything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_tutorial.backends.recording import RecordingBackend


@dataclass(frozen=True)
class RoutedCall:
    """One decode attention the kernel answered: engine step, layer, kv groups, the rows'
    sequence lengths, and the largest difference from ``inner``'s output for those heads."""

    step: int | None
    layer: int
    kv_groups: tuple
    seq_lens: tuple
    max_abs_diff: float


class KernelRouter(RecordingBackend):
    """Every op to ``inner``; the decode attention of ``layers`` x ``kv_groups`` to
    ``kernel`` (see the module docstring).  ``layers`` / ``kv_groups``: iterables of ints, or
    None for all; ``kv_groups`` may also map each layer to its own groups
    (``{0: [0], 15: [1], 29: [2]}``: three layers spread over the model, one group each, as
    much simulated work as one layer's three groups), and then ``layers`` defaults to its
    keys."""

    def __init__(self, kernel, inner="torch", layers=None, kv_groups=None):
        if not callable(getattr(kernel, "decode_attention", None)):
            raise TypeError(f"KernelRouter: the kernel must have a decode_attention method "
                            f"(pt.exercises.your_kernel() returns one), got "
                            f"{type(kernel).__name__}")
        super().__init__(inner, ops=())
        self.kernel = kernel
        #: layer -> its own kv groups, when ``kv_groups`` is a mapping
        self.groups_of_layer = None
        if isinstance(kv_groups, dict):
            self.groups_of_layer = {layer: tuple(sorted(set(_ints(groups, "kv_groups"))))
                                    for layer, groups in zip(_ints(kv_groups, "layers"),
                                                             kv_groups.values())}
            if layers is None:
                layers = list(self.groups_of_layer)
            missing = sorted(set(_ints(layers, "layers")) - set(self.groups_of_layer))
            if missing:
                raise ValueError(f"KernelRouter: layer(s) {missing} have no kv groups in the "
                                 f"kv_groups mapping; give each routed layer its groups")
            kv_groups = None
        self.layers = None if layers is None else frozenset(_ints(layers, "layers"))
        self.kv_groups = None if kv_groups is None else tuple(sorted(set(_ints(kv_groups,
                                                                               "kv_groups"))))
        #: the decode-attention calls the kernel answered, in order
        self.routed: list[RoutedCall] = []
        self.name = f"routed({self.inner.name})"

    def describe(self) -> str:
        layers = "every layer" if self.layers is None else \
            f"layer(s) {', '.join(map(str, sorted(self.layers)))}"
        groups = "every kv group" if self.kv_groups is None else \
            f"kv group(s) {', '.join(map(str, self.kv_groups))}"
        if self.groups_of_layer is not None:
            layers = ", ".join(f"layer {layer} (kv group(s) {', '.join(map(str, groups))})"
                               for layer, groups in sorted(self.groups_of_layer.items()))
            return (f"{self.inner.describe()}, with decode attention of {layers} answered by "
                    f"{getattr(self.kernel, 'label', type(self.kernel).__name__)}")
        return (f"{self.inner.describe()}, with decode attention of {layers}, {groups} "
                f"answered by {getattr(self.kernel, 'label', type(self.kernel).__name__)}")

    def clear(self) -> None:
        self.routed.clear()

    def _groups_for(self, layer: int, num_kv_heads: int) -> tuple:
        if self.layers is not None and layer not in self.layers:
            return ()
        chosen = self.kv_groups if self.groups_of_layer is None else \
            self.groups_of_layer[layer]
        if chosen is None:
            return tuple(range(num_kv_heads))
        bad = [g for g in chosen if g >= num_kv_heads]
        if bad:
            raise ValueError(f"KernelRouter: kv group(s) {bad} do not exist: the cache has "
                             f"{num_kv_heads} kv heads (groups 0-{num_kv_heads - 1})")
        return chosen

    def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                         max_seq_len=None):
        n_kv = cache.config.num_kv_heads
        groups = self._groups_for(int(layer), n_kv)
        if not groups or q.shape[0] == 0:
            return self.inner.decode_attention(q, cache, block_table, layer, seq_lens,
                                               active_slots, scale, max_seq_len)
        mine = q.clone()
        self.inner.decode_attention(q, cache, block_table, layer, seq_lens, active_slots,
                                    scale, max_seq_len)
        if len(groups) == n_kv:
            self.kernel.decode_attention(mine, cache, block_table, layer, seq_lens,
                                         active_slots, scale)
        else:
            for g in groups:
                self.kernel.decode_attention(mine, cache, block_table, layer, seq_lens,
                                             active_slots, scale, kv_group=g)
        per_kv = q.shape[1] // n_kv
        diffs = []
        for g in groups:
            heads = slice(g * per_kv, (g + 1) * per_kv)
            diffs.append(float((mine[:, heads].float() - q[:, heads].float()).abs().max()))
            q[:, heads] = mine[:, heads]
        diff = float("nan") if any(d != d for d in diffs) else max(diffs)
        lens = seq_lens.tolist() if torch.is_tensor(seq_lens) else list(seq_lens)
        self.routed.append(RoutedCall(self.current_step, int(layer), tuple(groups),
                                            tuple(int(n) for n in lens), diff))
        return q


def _ints(values, what: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"KernelRouter: {what} must be non-negative ints, got {v!r}")
        out.append(v)
    return out
