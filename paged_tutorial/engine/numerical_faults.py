"""Naming a numerical fault: where a request's activations first went non-finite.

The engine reads, with each step's sampled tokens, whether every row of logits is finite (one
flag per row, in the same device-to-host copy).  A request whose row holds a NaN or an inf is
finished with finish_reason ``"non_finite"`` -- its token is not appended, the other requests
go on -- and only then is the fault searched for: the request's tokens are run again as one
prefill on a scratch cache, through ``ActivationWatch``, a backend that forwards every op to
the engine's backend and looks at what each op returns.  The first op whose output is not
finite names the layer (or the embedding, or the final norm and LM head); the message says so
and what to check.
"""

from __future__ import annotations

import dataclasses

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.engine.request import NON_FINITE, Request
from paged_tutorial.model.decoder import build_network
from paged_tutorial.step_inputs import StepInputPacker

__all__ = ["NON_FINITE", "ActivationWatch", "describe_non_finite", "find_non_finite"]


def is_finite(x) -> bool:
    return not torch.is_tensor(x) or bool(torch.isfinite(x).all())


class ActivationWatch(Backend):
    """Forwards every op to ``inner`` and remembers the first one whose output is not finite:
    ``where`` ("layer 3", "the embedding", "the final norm / LM head") and ``op``.  The layer
    an op belongs to is the one whose input norm ran last (``input_norms``: the id of each
    layer's input-norm weight -> its index; ``final_norm``: the final norm's weight)."""

    def __init__(self, inner: Backend, input_norms: dict[int, int],
                 final_norm: torch.Tensor | None):
        self.inner = inner
        self.name = f"watch({inner.name})"
        self.device = inner.device
        self.input_norms = input_norms
        self.final_norm = final_norm
        self.part = "the embedding"
        self.where: str | None = None
        self.op: str | None = None

    def observe(self, op: str, out):
        if self.where is None and not all(is_finite(t) for t in
                                          (out if isinstance(out, tuple) else (out,))):
            self.where, self.op = self.part, op
        return out

    def enter(self, norm_weight: torch.Tensor) -> None:
        if norm_weight is self.final_norm:
            self.part = "the final norm / LM head"
        elif id(norm_weight) in self.input_norms:
            self.part = f"layer {self.input_norms[id(norm_weight)]}"

    # --- the contract, forwarded and watched -------------------------------------------------
    def linear(self, x, weight, bias=None):
        return self.observe("linear", self.inner.linear(x, weight, bias))

    def embed(self, weight, token_ids):
        return self.observe("embed", self.inner.embed(weight, token_ids))

    def rms_norm(self, x, weight, eps):
        self.enter(weight)
        return self.observe("rms_norm", self.inner.rms_norm(x, weight, eps))

    def add_rms_norm(self, x, residual, weight, eps):
        self.enter(weight)
        out = self.inner.add_rms_norm(x, residual, weight, eps)
        return self.observe("add_rms_norm", (out, residual))[0]

    def rope(self, q, k, positions, cos, sin):
        self.inner.rope(q, k, positions, cos, sin)
        self.observe("rope", (q, k))

    def silu_mul(self, gate_up):
        return self.observe("silu_mul", self.inner.silu_mul(gate_up))

    def linear_silu_mul(self, x, gate_up_weight):
        return self.observe("linear_silu_mul", self.inner.linear_silu_mul(x, gate_up_weight))

    def write_kv(self, cache, k, v, block_table, layer, slots, positions):
        self.inner.write_kv(cache, k, v, block_table, layer, slots, positions)

    def qkv_rope_write_kv(self, x, qkv_weight, n_q_heads, positions, cos, sin, cache,
                          block_table, layer, slots):
        return self.observe("qkv_rope_write_kv", self.inner.qkv_rope_write_kv(
            x, qkv_weight, n_q_heads, positions, cos, sin, cache, block_table, layer, slots))

    def prefill_attention(self, q, k, v, inputs, scale):
        return self.observe("prefill_attention",
                            self.inner.prefill_attention(q, k, v, inputs, scale))

    def prefill_attention_from_cache(self, q, cache, block_table, layer, inputs, scale):
        return self.observe("prefill_attention_from_cache",
                            self.inner.prefill_attention_from_cache(q, cache, block_table,
                                                                    layer, inputs, scale))

    def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                         max_seq_len=None):
        return self.observe("decode_attention", self.inner.decode_attention(
            q, cache, block_table, layer, seq_lens, active_slots, scale, max_seq_len))

    def sample(self, logits, temperature, top_p, uniforms):
        return self.inner.sample(logits, temperature, top_p, uniforms)

    def synchronize(self) -> None:
        self.inner.synchronize()


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
