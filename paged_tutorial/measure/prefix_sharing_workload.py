"""The prefix-sharing benchmark's workloads: N requests that share a system prompt, each
followed by its own question, and the model that serves them.

- ``cpu``: the embedded SmolLM2 in float32 on the torch backend, chat prompts (``SYSTEM_PROMPT``
  and ``QUESTIONS``);
- ``gpu``: Llama-3.2-1B's shapes with random bf16 weights on the numba backend, random token
  prompts (no model file needed);
- ``tiny``: the ``gpu`` run's block geometry (16 layers, the same requests and cache layout)
  with a model too small to cost anything (float32, torch on the CPU): the host's work per step.

``workload`` builds one of them; ``prefix_sharing_bench`` measures it.
"""

from __future__ import annotations

import dataclasses
import platform
from typing import Callable

import numpy as np
import torch

import paged_tutorial as pt
from paged_tutorial.measure.wall_clock import no_sync

MODES = ("cpu", "gpu", "tiny")

SYSTEM_PROMPT = (
    "You are the teaching assistant of a course on how large language models are served. "
    "The course follows a Korean article series that builds a CUDA C++ engine for "
    "Llama-3.2-1B step by step, and this part is about paged attention. Answer the student's "
    "question in plain words, in at most three sentences, and stay precise. When the question "
    "is about memory, say which quantity is stored, where it lives and how many bytes it takes. "
    "When the question is about speed, say which resource limits the step: reading the weights, "
    "reading the KV cache, or launching kernels. Never invent numbers: if a figure depends on "
    "the model or the GPU, say what it depends on. The vocabulary of the course: a block holds "
    "the keys and values of sixteen tokens of one layer; the block table maps a sequence's "
    "logical blocks to physical blocks; free_blocks is the stack of physical blocks that hold "
    "nothing; a slot is one row of the block table; prefill computes a whole prompt at once and "
    "decode adds one token per step. Keep answers short and friendly, and do not repeat the "
    "question.")
QUESTIONS = [
    "Why does the KV cache grow with every generated token?",
    "What is a block table?",
    "Why are blocks sixteen tokens long?",
    "What does free_blocks hold?",
    "Why is decode slower per token than prefill?",
    "What happens when the cache is full?",
    "Can two requests share a block?",
    "What limits the speed of one decode step?",
    "Why does every layer own its own blocks?",
    "What is a slot?",
    "How big is one block of Llama-3.2-1B in bf16?",
    "What does the attention kernel read for one token?",
    "Why copy only the changed entries of the table?",
    "What is continuous batching?",
    "Why recompute a preempted request?",
    "What is time to first token?",
]


def tiny_1b_geometry_config():
    """Llama-3.2-1B's layers (so its block table's shape) with every width shrunk."""
    return dataclasses.replace(pt.llama_3_2_1b_config(), vocab_size=512, hidden_size=64,
                               intermediate_size=128, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=32)


def chat_prompts(model, n: int) -> tuple[list[list[int]], int]:
    """(token ids of the N chat prompts, tokens they all share at the start)."""
    tok = model.tokenizer
    prompts = [tok.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT},
                                        {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]
                                         + ("" if i < len(QUESTIONS) else f" ({i})")}])
               for i in range(n)]
    return prompts, common_prefix(prompts)


def random_prompts(vocab: int, n: int, system_len: int, question_len: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, system_len).tolist()
    return [system + rng.integers(0, vocab, question_len).tolist() for _ in range(n)], system_len


def random_workload(config, dtype: str, n: int, system_len: int, question_len: int):
    """A random-weights model of ``config`` (seed 0), ``n`` prompts sharing a system prefix,
    and a warm-up set drawn the same way with another seed: (model, prompts, shared, warmup)."""
    model = pt.random_model(config, dtype=dtype, seed=0)
    prompts, shared = random_prompts(config.vocab_size, n, system_len, question_len)
    warmup, _ = random_prompts(config.vocab_size, n, system_len, question_len, seed=1)
    return model, prompts, shared, warmup


def common_prefix(prompts) -> int:
    n = min(len(p) for p in prompts)
    for i in range(n):
        if len({p[i] for p in prompts}) > 1:
            return i
    return n


@dataclasses.dataclass
class Workload:
    """What one run serves: the model, the prompts (sharing ``shared`` tokens at the start),
    the warm-up prompts, and how (backend, cache length, what waits for the device)."""
    mode: str
    model: object
    prompts: list
    shared: int
    warmup: list
    max_new: int
    backend: str
    max_seq_len: int
    model_name: str
    device: str
    sync: Callable[[], None] = no_sync

    @property
    def requests(self) -> int:
        return len(self.prompts)


def workload(mode: str, requests: int | None = None, max_tokens: int | None = None,
             system_tokens: int = 1024, question_tokens: int = 32) -> Workload:
    """The workload of ``mode`` (``MODES``): ``requests`` prompts (default 8 on the CPU, 16
    otherwise) each generating ``max_tokens`` tokens (default 8 on the CPU, 32 otherwise);
    ``system_tokens`` / ``question_tokens``: the random prompts' lengths (gpu, tiny)."""
    if mode not in MODES:
        raise ValueError(f"unknown prefix-sharing mode {mode!r}: pick one of {MODES}")
    if mode == "gpu":
        if not torch.cuda.is_available():
            raise ValueError("--gpu needs a CUDA GPU")
        n, max_new = requests or 16, max_tokens or 32
        model, prompts, shared, warmup = random_workload(
            pt.llama_3_2_1b_config(), "bfloat16", n, system_tokens, question_tokens)
        return Workload(mode, model, prompts, shared, warmup, max_new, "numba", 2048,
                        "Llama-3.2-1B shapes, random weights (seed 0)",
                        torch.cuda.get_device_name(0), torch.cuda.synchronize)
    if mode == "tiny":
        n, max_new = requests or 16, max_tokens or 32
        model, prompts, shared, warmup = random_workload(
            tiny_1b_geometry_config(), "float32", n, system_tokens, question_tokens)
        return Workload(mode, model, prompts, shared, warmup, max_new, "torch", 2048,
                        "Llama-3.2-1B's 16 layers with hidden 64, 2 / 1 heads of 32, "
                        "vocabulary 512, random weights (seed 0)",
                        platform.processor() or platform.machine())
    n, max_new = requests or 8, max_tokens or 8
    model = pt.load_model("smollm2-135m", dtype="float32")
    prompts, shared = chat_prompts(model, n)
    warmup = [model.tokenizer.apply_chat_template(q) for q in QUESTIONS[:n]]
    return Workload(mode, model, prompts, shared, warmup, max_new, "torch", 512,
                    "SmolLM2-135M-Instruct (embedded GGUF)",
                    platform.processor() or platform.machine())
