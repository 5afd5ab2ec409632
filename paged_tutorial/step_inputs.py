"""``StepInputs``: everything one engine step feeds the forward pass, moved to the device at once.

The model runner builds one per step.  Every integer input of the step (token ids, positions,
slots, and for a decode the sequence lengths, for a prefill ``cu_seqlens``, the context
lengths, the slot of each sequence and the rows that need logits), and the sampling
parameters of each sequence (float32 bit patterns), are written into one int32 host buffer
and sent to the device with *one* copy; the tensors of ``StepInputs`` are views of that one
device buffer.  On a GPU the host buffer is pinned memory, so the copy is
asynchronous (``non_blocking``); on the CPU the views are of the host buffer itself and nothing
is copied.

The few numbers a backend needs on the host to size its work (how many sequences, the longest
sequence, the ``cu_seqlens`` boundaries) are kept as Python ints next to the tensors, computed
from the host lists while they are built: no backend reads a device tensor back to learn them.

It is a contract between three layers, so it lives at the package's base, below all of them:
the runner (``engine/model_runner.py``) fills it, the forward pass (``model/``) hands it on
and the backends read it; it imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class StepInputs:
    """One step's inputs: int32 device tensors (views of one buffer) and host ints.

    T = tokens in the step, S = sequences.  A decode step has one token per sequence (T == S).
    """
    kind: str                        # "prefill" or "decode"
    token_ids: torch.Tensor          # [T]
    positions: torch.Tensor          # [T] position of each token in its sequence
    slots: torch.Tensor              # [T] block-table row (cache slot) of each token
    seq_slots: torch.Tensor          # [S] block-table row of each sequence
    seq_lens: torch.Tensor           # [S] tokens of each sequence in the cache after this step
    block_table: torch.Tensor | None  # the device block table, int32 [max_slots, L, MAX_BLOCKS]
    cu_seqlens: torch.Tensor | None = None     # prefill: [S + 1] boundaries of the new tokens
    context_lens: torch.Tensor | None = None   # prefill: [S] tokens already in the cache
    logit_rows: torch.Tensor | None = None     # rows that need logits (None: all)
    temperature: torch.Tensor | None = None    # [S] float32: sampling parameters per sequence
    top_p: torch.Tensor | None = None          # [S] float32
    uniforms: torch.Tensor | None = None       # [S] float32 (``backends/sampling_rule.py``)
    # --- host copies, computed while the lists were built ---------------------------------
    num_seqs: int = 0
    max_seq_len: int | None = None   # longest seq_lens entry (None: not known on the host)
    max_query_len: int = 0           # longest run of new tokens of one sequence
    cu_seqlens_host: tuple[int, ...] = ()
    context_lens_host: tuple[int, ...] = ()
    #: tensors a backend derives from these inputs once per step (``derived``)
    _derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_prefill(self) -> bool:
        return self.kind == "prefill"

    @property
    def reads_cached_context(self) -> bool:
        """A prefill where some sequence continues tokens already in the cache (a prefix-cache
        hit): its attention reads them through the block table."""
        return any(self.context_lens_host)

    def derived(self, name: str, build):
        """``build()`` the first time a backend asks for ``name`` in this step, then the same
        value: e.g. the numba prefill kernel's tile list, needed by every layer."""
        if name not in self._derived:
            self._derived[name] = build()
        return self._derived[name]


SAMPLING_ROWS = ("temperature", "top_p", "uniforms")


def _sampling_fields(t: dict) -> dict:
    return {name: t.get(name) for name in SAMPLING_ROWS}


class StepInputPacker:
    """Packs a step's integer lists into one int32 buffer and sends it to ``device`` with one
    copy.  On a GPU it keeps one pinned host buffer, grown when a step needs more, and waits
    for the previous step's copy out of it before writing it again."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self._host: torch.Tensor | None = None
        self._copied = None                    # CUDA event of the last copy out of _host
        #: packed steps and host-to-device copies made (one per step on a GPU, none on a CPU)
        self.packs = 0
        self.copies = 0

    def _host_buffer(self, n: int) -> np.ndarray:
        if self.device.type == "cpu":           # the views are of this buffer: a fresh one
            self._host = torch.empty(n, dtype=torch.int32)
            return self._host.numpy()
        if self._host is None or self._host.numel() < n:
            self._host = torch.empty(max(n, 1024), dtype=torch.int32,
                                     pin_memory=self.device.type == "cuda")
            self._copied = None
        elif self._copied is not None:
            self._copied.synchronize()          # the last step's copy has read the buffer
        return self._host.numpy()

    def pack(self, rows: dict[str, list[int] | np.ndarray],
             sampling: tuple | None = None) -> dict[str, torch.Tensor]:
        """{name: int list} -> {name: int32 device tensor}, all views of one device buffer.
        ``sampling``: (temperature, top_p, uniforms) float lists, packed as float32 bit
        patterns and returned as float32 views under those names."""
        rows = dict(rows)
        if sampling is not None:
            for name, values in zip(SAMPLING_ROWS, sampling):
                rows[name] = np.asarray(values, dtype=np.float32).view(np.int32)
        sizes = {name: len(values) for name, values in rows.items()}
        total = sum(sizes.values())
        host = self._host_buffer(total)
        offset = 0
        for name, values in rows.items():
            host[offset:offset + sizes[name]] = values
            offset += sizes[name]
        packed = self._host[:total]
        if self.device.type != "cpu":
            packed = packed.to(self.device, non_blocking=True)
            if self.device.type == "cuda":
                self._copied = torch.cuda.Event()
                self._copied.record()
            self.copies += 1
        self.packs += 1
        views = dict(zip(sizes, packed.split(list(sizes.values()))))   # one call, all views
        for name in SAMPLING_ROWS:
            if name in views:
                views[name] = views[name].view(torch.float32)
        return views

    # --- the two kinds of step ------------------------------------------------------------
    def decode(self, token_ids: list[int], positions: list[int], slots: list[int],
               block_table: torch.Tensor | None, sampling: tuple | None = None) -> StepInputs:
        """One new token per sequence at ``positions`` of cache row ``slots``.  ``sampling``:
        (temperature, top_p, uniforms) lists, one entry per sequence."""
        seq_lens = [p + 1 for p in positions]
        t = self.pack({"token_ids": token_ids, "positions": positions, "slots": slots,
                       "seq_lens": seq_lens}, sampling)
        return StepInputs("decode", t["token_ids"], t["positions"], t["slots"], t["slots"],
                          t["seq_lens"], block_table, num_seqs=len(token_ids),
                          max_seq_len=max(seq_lens, default=0), max_query_len=1,
                          **_sampling_fields(t))

    def prefill(self, new_tokens: list[list[int]], context_lens: list[int],
                seq_slots: list[int], block_table: torch.Tensor | None,
                sampling: tuple | None = None,
                logit_rows: list[int] | None = None) -> StepInputs:
        """Sequence i adds ``new_tokens[i]`` at positions ``context_lens[i]``, ... of cache row
        ``seq_slots[i]``; the new tokens of all sequences are packed into one batch, and each
        sequence's last row gets logits (or the packed rows ``logit_rows``, in order).
        ``sampling`` as in ``decode``."""
        if not len(new_tokens) == len(context_lens) == len(seq_slots):
            raise ValueError(f"prefill: {len(new_tokens)} token lists, {len(context_lens)} "
                             f"context lengths and {len(seq_slots)} slots: give one of each "
                             "per sequence")
        tokens, positions, slots, cu_seqlens = [], [], [], [0]
        for new, ctx, slot in zip(new_tokens, context_lens, seq_slots):
            tokens += new
            positions += range(ctx, ctx + len(new))
            slots += [slot] * len(new)
            cu_seqlens.append(cu_seqlens[-1] + len(new))
        seq_lens = [ctx + len(new) for new, ctx in zip(new_tokens, context_lens)]
        t = self.pack({"token_ids": tokens, "positions": positions, "slots": slots,
                       "seq_slots": seq_slots, "seq_lens": seq_lens, "cu_seqlens": cu_seqlens,
                       "context_lens": context_lens,
                       "logit_rows": [end - 1 for end in cu_seqlens[1:]]
                       if logit_rows is None else logit_rows}, sampling)
        return StepInputs("prefill", t["token_ids"], t["positions"], t["slots"],
                          t["seq_slots"], t["seq_lens"], block_table,
                          cu_seqlens=t["cu_seqlens"], context_lens=t["context_lens"],
                          logit_rows=t["logit_rows"], num_seqs=len(new_tokens),
                          max_seq_len=max(seq_lens, default=0),
                          max_query_len=max(map(len, new_tokens), default=0),
                          cu_seqlens_host=tuple(cu_seqlens),
                          context_lens_host=tuple(context_lens), **_sampling_fields(t))


def prefill_layout(cu_seqlens: list[int], device: str | torch.device = "cpu",
                   context_lens: list[int] | None = None, seq_slots: list[int] | None = None,
                   block_table: torch.Tensor | None = None) -> StepInputs:
    """The inputs of a prefill whose token ids do not matter (all 0): what a direct call of a
    prefill attention op needs, from its ``cu_seqlens`` boundaries (and, for attention that
    reads cached context, each sequence's context length and slot)."""
    n = len(cu_seqlens) - 1
    lengths = [e - s for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    return StepInputPacker(device).prefill(
        [[0] * m for m in lengths], context_lens or [0] * n,
        seq_slots if seq_slots is not None else list(range(n)), block_table)
