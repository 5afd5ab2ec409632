"""EngineParts: what an ``Engine`` is made of, built and checked from its arguments.

    backend -> cache config -> weights on the device -> paged cache -> scheduler
            -> model runner -> output processor -> core -> admission -> registry -> transaction

Every argument is checked here, before anything is built, with a message naming it and the
fix; the ``Engine`` keeps the parts as its attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from paged_tutorial.backends import make_backend
from paged_tutorial.backends.base import Backend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.cache.prefix_cache import PrefixCache, PrefixCachingKVCache
from paged_tutorial.config import CPU_KV_CACHE_BYTES_DEFAULT, GPU_KV_CACHE_BYTES_DEFAULT, \
    CacheConfig, ModelConfig
from paged_tutorial.devices import check_device
from paged_tutorial.engine.admission import Admission, positive_int
from paged_tutorial.engine.engine_core import EngineCore
from paged_tutorial.engine.first_call import prepare_first_call
from paged_tutorial.engine.model_runner import ModelRunner
from paged_tutorial.engine.output_processor import OutputProcessor
from paged_tutorial.engine.request_registry import RequestRegistry
from paged_tutorial.engine.scheduler import Scheduler
from paged_tutorial.engine.step_transaction import StepTransaction
from paged_tutorial.loading.models import Model


def default_kv_cache_bytes(cache_kwargs: dict, device: torch.device) -> int:
    """The article's 2 GiB on a GPU; on a CPU just what max_slots full-length sequences need,
    capped at 256 MiB."""
    if device.type == "cuda":
        return GPU_KV_CACHE_BYTES_DEFAULT
    probe = CacheConfig(**{**cache_kwargs, "kv_cache_bytes": 1 << 62})
    need = probe.block_table_entries * probe.BLOCK_BYTES
    return int(min(need, CPU_KV_CACHE_BYTES_DEFAULT))


def checked_max_seq_len(config: ModelConfig, max_seq_len: int | None,
                        allow_beyond_max_positions: bool) -> int:
    positions = config.max_position_embeddings
    max_seq_len = positive_int("max_seq_len", min(2048, positions) if max_seq_len is None
                               else max_seq_len)
    if max_seq_len > positions and not allow_beyond_max_positions:
        raise ValueError(
            f"max_seq_len={max_seq_len} exceeds the model's max_position_embeddings "
            f"({positions}): RoPE was trained only up to there.  Lower max_seq_len, or pass "
            f"allow_beyond_max_positions=True if you mean to go past it")
    return max_seq_len


def checked_cache(cache_factory, cache_config: CacheConfig, device: torch.device,
                  prefix_caching: bool) -> PagedKVCache:
    """The paged cache: ``cache_factory(cache_config, device)`` or the default one."""
    if cache_factory is None:
        cache_factory = PrefixCachingKVCache if prefix_caching else PagedKVCache
    cache = cache_factory(cache_config, device)
    if not isinstance(cache, PagedKVCache) or cache.config != cache_config:
        raise TypeError("cache_factory(cache_config, device) must return a PagedKVCache "
                        "built from the cache_config it was given")
    if prefix_caching and not isinstance(cache.allocator, PrefixCache):
        raise TypeError("prefix_caching=True needs a cache whose allocator is a PrefixCache "
                        "(a PrefixCachingKVCache): the cache_factory built one with a "
                        + type(cache.allocator).__name__)
    return cache


@dataclass
class EngineParts:
    config: ModelConfig
    tokenizer: object
    backend: Backend
    cache_config: CacheConfig
    model: Model                      # the weights, on the backend's device
    cache: PagedKVCache
    prefix_caching: bool              # the cache shares full prompt blocks (prefix_cache.py)
    scheduler: Scheduler
    model_runner: ModelRunner
    max_slots: int
    max_seq_len: int
    outputs: OutputProcessor          # text pieces and on_token callbacks
    core: EngineCore                  # the loop: add_request, step, cancel; commit, rollback
    admission: Admission              # what callers submit, checked and encoded
    requests: RequestRegistry         # the requests whose result is not taken yet
    transaction: StepTransaction      # the guards around a step: lock, Ctrl-C, rollback, timing

    @classmethod
    def build(cls, model: Model, backend: str | Backend, block_size: int,
              kv_cache_bytes: int | None, max_slots: int, max_seq_len: int | None,
              device: str | None, debug: bool | None, cuda_graphs: bool | None,
              allow_beyond_max_positions: bool, prefix_caching: bool,
              cache_factory: Callable | None,
              async_scheduling: bool | None = None) -> "EngineParts":
        if not isinstance(model, Model):
            raise TypeError(f"Engine needs a Model from paged_tutorial.load_model, "
                            f"got {type(model).__name__}")
        max_slots = positive_int("max_slots", max_slots)
        block_size = positive_int("block_size", block_size)
        max_seq_len = checked_max_seq_len(model.config, max_seq_len, allow_beyond_max_positions)
        if kv_cache_bytes is not None:
            kv_cache_bytes = positive_int("kv_cache_bytes", kv_cache_bytes)
        if not isinstance(prefix_caching, bool):
            raise TypeError(f"prefix_caching must be True or False, got {prefix_caching!r}")
        if async_scheduling is not None and not isinstance(async_scheduling, bool):
            raise TypeError(f"async_scheduling must be None, True or False, got "
                            f"{async_scheduling!r}")
        check_device(device)
        config = model.config
        backend = make_backend(backend, device, debug)
        cache_kwargs = dict(num_layers=config.num_hidden_layers,
                            num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
                            dtype=model.dtype, max_slots=max_slots, max_seq_len=max_seq_len,
                            block_size=block_size)
        if kv_cache_bytes is None:
            kv_cache_bytes = default_kv_cache_bytes(cache_kwargs, backend.device)
        cache_config = CacheConfig(kv_cache_bytes=kv_cache_bytes, **cache_kwargs)
        # the weights once, on the backend's device (the caller's CPU copy, if any, is theirs)
        on_device = model.to(backend.device)
        cache = checked_cache(cache_factory, cache_config, backend.device, prefix_caching)
        scheduler = Scheduler(cache.allocator, max_slots, max_seq_len,
                              eos_token_ids=config.eos_token_ids)
        # decode steps replay CUDA graphs (cuda_graphs.py): by default on a backend that can
        # be captured (numba, torch) on a GPU, without host-side input checks
        if cuda_graphs is None:
            cuda_graphs = (backend.graph_capturable and backend.device.type == "cuda"
                           and not backend.check_inputs)
        model_runner = ModelRunner(on_device, backend, cache, max_slots, max_seq_len,
                                   cuda_graphs=bool(cuda_graphs))
        # each decode step launched before the last is read back: by default where decode
        # steps replay CUDA graphs (there the host's commit is what the GPU would wait for)
        if async_scheduling is None:
            async_scheduling = bool(cuda_graphs)
        outputs = OutputProcessor(model.tokenizer)
        core = EngineCore(scheduler, model_runner, backend, cache, outputs, async_scheduling)
        requests = RequestRegistry()
        prepare_first_call(backend, model.tokenizer)     # no first import after this
        return cls(config, model.tokenizer, backend, cache_config, on_device, cache,
                   isinstance(cache.allocator, PrefixCache), scheduler, model_runner,
                   max_slots, max_seq_len, outputs, core,
                   Admission(model.tokenizer, config.vocab_size, model.source, cache_config),
                   requests, StepTransaction(core, requests, outputs))
