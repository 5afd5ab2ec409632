"""How much KV memory holds tokens: contiguous reservation against 16-token blocks, the
PagedAttention paper's Figure 2 redone on this engine's cache.

The paper (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023, arXiv:2309.06180) profiles how the KV memory of existing systems is
used while serving (its Fig. 2, averaged over the experiment of its section 6.2): only 20.4 %
(Orca with max-length reservation), 26.8 % (power-of-two reservation) and 38.2 % (an oracle that
knows every output length) of it holds token states, against 96.3 % in vLLM.  Its workloads
(section 6.1, Fig. 11) take request lengths from two datasets: ShareGPT (mean input 161.31
tokens, mean output 337.99) and Alpaca (19.31 and 58.45).

``draw_lengths`` draws request lengths with those means (the spread is ours: log-normal; only
the means come from the paper).  ``memory_use`` follows every request through its life -- one
sample per token it generates -- in a real ``PagedKVCache`` (what its blocks hold) and under the
three contiguous policies the paper compares (what a reservation of ``max_seq_len`` tokens, of
the prompt plus the output rounded up to a power of two, or of exactly the final length would
hold), and splits each into the paper's categories: token states (K/V written), reservation
(slots this request will fill later) and internal fragmentation (slots it never fills).  There
is no allocator here, so no external fragmentation: the paper's bars include it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Fig. 2 of the paper: percent of KV cache memory, averaged during the experiment of its 6.2.
#: The oracle reserves exactly the final length, so it has no internal fragmentation bar.
PAPER_FIGURE_2 = {
    "Orca (Max)": {"token states": 20.4, "reservation": 13.3, "internal fragmentation": 57.3,
                   "external fragmentation & others": 8.9},
    "Orca (Pow2)": {"token states": 26.8, "reservation": 17.9, "internal fragmentation": 13.6,
                    "external fragmentation & others": 41.6},
    "Orca (Oracle)": {"token states": 38.2, "reservation": 25.2, "internal fragmentation": 0.0,
                      "external fragmentation & others": 36.6},
    "vLLM": {"token states": 96.3, "reservation": None, "internal fragmentation": None,
             "external fragmentation & others": None},
}

#: Fig. 11 of the paper: mean input and output lengths, in tokens.
PAPER_DATASETS = {"ShareGPT": {"input": 161.31, "output": 337.99},
                  "Alpaca": {"input": 19.31, "output": 58.45}}

#: the contiguous policies of the paper's section 6.1, and this engine's paging
POLICIES = ("contiguous, max_seq_len (Orca Max)", "contiguous, output to a power of 2 (Orca Pow2)",
            "contiguous, exact length (Orca Oracle)", "paged, 16-token blocks (this engine)")
PAPER_NAME = dict(zip(POLICIES, ("Orca (Max)", "Orca (Pow2)", "Orca (Oracle)", "vLLM")))
CATEGORIES = ("token states", "reservation", "internal fragmentation")


def draw_lengths(dataset: str, n: int, seed: int = 0, max_seq_len: int = 2048,
                 sigma: float = 1.0) -> np.ndarray:
    """int [n, 2] (input, output) lengths whose means match ``PAPER_DATASETS[dataset]``
    (log-normal spread ``sigma``; every request at least 1 + 1 tokens and at most
    ``max_seq_len`` in all: outputs are cut there, as the engine stops at ``max_seq_len``)."""
    if dataset not in PAPER_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}: choose from {sorted(PAPER_DATASETS)}")
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(0.0, sigma, size=(n, 2))
    target = np.array([PAPER_DATASETS[dataset]["input"], PAPER_DATASETS[dataset]["output"]])
    scale = target / raw.mean(axis=0)
    for _ in range(20):                       # rounding and the cut move the mean: re-aim
        lengths = np.maximum(1, np.rint(raw * scale)).astype(np.int64)
        lengths[:, 0] = np.minimum(lengths[:, 0], max_seq_len - 1)
        lengths[:, 1] = np.minimum(lengths[:, 1], max_seq_len - lengths[:, 0])
        scale *= target / lengths.mean(axis=0)
    return lengths


@dataclass
class MemoryUse:
    """Token-slots summed over every sample (one per generated token of every request), per
    policy and category; ``percent()`` turns them into shares of the memory each policy holds."""
    slots: dict                      # policy -> {category: token-slots}
    samples: int

    def percent(self) -> dict:
        out = {}
        for policy, cats in self.slots.items():
            total = sum(cats.values())
            out[policy] = {c: 100.0 * v / total for c, v in cats.items()}
        return out


def contiguous_reservation(policy: str, prompt: int, output: int, max_seq_len: int) -> int:
    """Tokens a contiguous policy reserves for a request, at admission."""
    if policy.startswith("contiguous, max_seq_len"):
        return max_seq_len
    if policy.startswith("contiguous, output to a power"):
        return min(max_seq_len, prompt + 2 ** math.ceil(math.log2(max(output, 1))))
    if policy.startswith("contiguous, exact"):
        return prompt + output
    raise ValueError(f"not a contiguous policy: {policy!r}")


def memory_use(cache, lengths) -> MemoryUse:
    """Follow every request of ``lengths`` ([n, 2] input, output) through slot 0 of ``cache``
    (a ``PagedKVCache``, emptied after each request): at its k-th generated token
    (k = 0 .. output-1) the K/V of ``input + k`` tokens are written.  The paged policy's memory
    is what the cache's blocks hold then (layer 0; every layer holds the same), each contiguous
    policy's is its reservation."""
    c = cache.config
    slots = {p: dict.fromkeys(CATEGORIES, 0) for p in POLICIES}
    samples = 0
    for prompt, output in np.asarray(lengths, dtype=np.int64):
        prompt, output = int(prompt), int(output)
        final = prompt + output
        if final > c.max_seq_len:
            raise ValueError(f"a request of {prompt} + {output} tokens exceeds max_seq_len "
                             f"{c.max_seq_len}: draw lengths with that max_seq_len")
        reserved = {p: contiguous_reservation(p, prompt, output, c.max_seq_len)
                    for p in POLICIES[:3]}
        for k in range(output):
            stored = prompt + k
            cache.ensure_capacity(0, stored)
            held = cache.blocks_owned(0, 0) * c.BLOCK_SIZE
            for policy, size in (*reserved.items(), (POLICIES[3], held)):
                slots[policy]["token states"] += stored
                slots[policy]["reservation"] += min(size, final) - stored
                slots[policy]["internal fragmentation"] += max(size - final, 0)
            samples += 1
        cache.release(0)
    return MemoryUse(slots, samples)
