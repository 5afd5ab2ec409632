"""Naming a numerical fault: where a request's activations first went non-finite.

The engine reads, with each step's sampled tokens, whether every row of logits is finite (one
flag per row, in the same device-to-host copy).  A request whose row holds a NaN or an inf is
finished with finish_reason ``"non_finite"`` -- its token is not appended, the other requests
go on -- and only then is the fault searched for: the request's tokens are run again as one
prefill on a scratch cache, through ``ActivationWatch``, a ``RecordingBackend`` that forwards
every op to the engine's backend and looks at what each op returns.  The first op whose
output is not finite names the layer (or the embedding, or the final norm and LM head); the
message says so and what to check.
"""

from __future__ import annotations

import dataclasses

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.recording import RecordingBackend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.engine.request import NON_FINITE, Request
from paged_tutorial.model.decoder import build_network
from paged_tutorial.step_inputs import StepInputPacker

__all__ = ["NON_FINITE", "ActivationWatch", "describe_non_finite", "find_non_finite"]


def is_finite(x) -> bool:
    return not torch.is_tensor(x) or bool(torch.isfinite(x).all())


class ActivationWatch(RecordingBackend):
    """A ``RecordingBackend`` that remembers the first op whose output is not finite:
    ``where`` ("layer 3", "the embedding", "the final norm / LM head") and ``op``.  The layer
    an op belongs to is the one whose input norm ran last (``input_norms``: the id of each
    layer's input-norm weight -> its index; ``final_norm``: the final norm's weight).  Ops
    that write in place (``rope``, ``rope_write_kv``) are judged by the q and k they wrote."""

    def __init__(self, inner: Backend, input_norms: dict[int, int],
                 final_norm: torch.Tensor | None):
        super().__init__(inner)
        self.name = f"watch({inner.name})"
        self.input_norms = input_norms
        self.final_norm = final_norm
        self.part = "the embedding"
        self.where: str | None = None
        self.op: str | None = None

    def returned(self, name: str, arguments: dict, out) -> None:
        if "norm" in name:
            self.enter(arguments["weight"])
        if name in ("rope", "rope_write_kv"):
            out = (arguments["q"], arguments["k"])
        if self.where is None and name != "sample" and not all(
                is_finite(t) for t in (out if isinstance(out, tuple) else (out,))):
            self.where, self.op = self.part, name

    def enter(self, norm_weight: torch.Tensor) -> None:
        if norm_weight is self.final_norm:
            self.part = "the final norm / LM head"
        elif id(norm_weight) in self.input_norms:
            self.part = f"layer {self.input_norms[id(norm_weight)]}"


def find_non_finite(model, backend: Backend, cache_config, token_ids: list[int],
                    max_positions: int) -> tuple[str, str] | None:
    """Run ``token_ids`` through ``model`` on ``backend`` as one prefill on a scratch cache,
    watched; return (where, op) of the first output that is not finite, or None."""
    watch = ActivationWatch(backend, {}, None)
    network = build_network(model, watch, max_positions=max_positions)
    watch.input_norms = {id(layer.input_norm): i for i, layer in enumerate(network.layers)}
    watch.final_norm = network.final_norm
    n = len(token_ids)
    blocks = cache_config.blocks_for_tokens(n) * cache_config.num_layers
    scratch = PagedKVCache(dataclasses.replace(
        cache_config, max_slots=1, max_seq_len=n,
        kv_cache_bytes=blocks * cache_config.BLOCK_BYTES), backend.device)
    scratch.ensure_capacity(0, n)
    inputs = StepInputPacker(backend.device).prefill([token_ids], [0], [0],
                                                     scratch.device_block_table())
    network.forward(inputs, scratch)
    return None if watch.where is None else (watch.where, watch.op)


def describe_non_finite(request: Request, runner, step_index: int) -> str:
    """The message of a request finished with ``"non_finite"``: the step, and where its
    activations first went non-finite (searched now, once: the fault is rare, the search a
    prefill of this one request)."""
    head = (f"request {request.request_id}: its logits went non-finite (NaN or inf) at step "
            f"{step_index}, after {len(request.output_ids)} generated token(s)")
    try:
        found = find_non_finite(runner.model, runner.backend, runner.cache.config,
                                request.all_ids, runner.max_seq_len)
    except Exception as exc:                     # noqa: BLE001 - the message still stands
        return f"{head}; the search for the layer failed ({type(exc).__name__}: {exc})"
    if found is None:
        return (f"{head}; run again alone, every activation stayed finite (the fault depends "
                "on the batch or the cached context)")
    where, op = found
    return (f"{head}; the activations first went non-finite in {where} (its {op}).  Check the "
            f"model's weights there for NaN/inf, or load it in float32 if a float16 value "
            f"overflowed")
