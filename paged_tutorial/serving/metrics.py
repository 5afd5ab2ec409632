"""``/metrics``: the engine loop's counters through ``prometheus_client``, with vLLM's names.

vLLM's names, so its dashboards read this server (each sample labelled ``model_name``):

    vllm:num_requests_running          requests holding a slot (gauge)
    vllm:num_requests_waiting          requests queued for a slot, preempted ones included
    vllm:kv_cache_usage_perc           fraction of the KV cache's blocks in use (0 to 1)
    vllm:prefix_cache_queries_total    prompt tokens looked up in the prefix cache (counter)
    vllm:prefix_cache_hits_total       of those, tokens whose K/V was found and reused
    vllm:prompt_tokens_total           prompt tokens of finished answers
    vllm:generation_tokens_total       tokens generated for finished answers
    vllm:request_success_total         finished answers, by ``finished_reason``
    vllm:num_preemptions_total         times a request was preempted (blocks freed, recomputed)
    vllm:time_to_first_token_seconds   histogram: request received -> its first token
    vllm:e2e_request_latency_seconds   histogram: request received -> its last token

and the blocks this tutorial is about, under its own prefix:

    paged_tutorial_num_free_blocks     physical KV blocks on the free list (gauge)
    paged_tutorial_num_blocks          physical KV blocks in the cache (gauge)
    paged_tutorial_steps_total         engine steps run
    paged_tutorial_requests_finished_total / _cancelled_total   client requests

Every application has its own ``CollectorRegistry`` (a test may start several servers in one
process).  ``parse_metrics(text)`` reads the text back into a dict keyed by the name without
its prefix (``{"num_free_blocks": 120.0, "request_success_total{finished_reason=stop}": 3.0,
...}``): the notebook and the tests use it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from paged_tutorial.serving.engine_loop import LoopStats

VLLM = "vllm:"
OURS = "paged_tutorial_"
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: histogram buckets (seconds) for first-token and whole-request latency, as vLLM's
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)


class LoopCollector:
    """Reads the engine loop's latest snapshot whenever ``/metrics`` is scraped."""

    def __init__(self, stats, model_name: str):
        self.stats = stats                    # () -> LoopStats
        self.model_name = model_name

    def collect(self):
        s: LoopStats = self.stats()
        label = ["model_name"], [self.model_name]

        def gauge(name, doc, value):
            family = GaugeMetricFamily(name, doc, labels=label[0])
            family.add_metric(label[1], value)
            return family

        def counter(name, doc, value):
            family = CounterMetricFamily(name, doc, labels=label[0])
            family.add_metric(label[1], value)
            return family

        used = (s.total_blocks - s.free_blocks) / s.total_blocks if s.total_blocks else 0.0
        yield gauge(VLLM + "num_requests_running", "Requests holding a slot of the engine.",
                    s.running)
        yield gauge(VLLM + "num_requests_waiting",
                    "Requests queued for a slot (preempted ones included).", s.waiting)
        yield gauge(VLLM + "kv_cache_usage_perc",
                    "Fraction of the KV cache's blocks in use (1 = 100%).", used)
        yield counter(VLLM + "prefix_cache_queries",
                      "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries)
        yield counter(VLLM + "prefix_cache_hits",
                      "Prompt tokens found in the prefix cache (their K/V reused).",
                      s.prefix_cache_hits)
        yield counter(VLLM + "prompt_tokens", "Prompt tokens of finished answers.",
                      s.prompt_tokens)
        yield counter(VLLM + "generation_tokens", "Tokens generated for finished answers.",
                      s.tokens_generated)
        yield counter(VLLM + "num_preemptions", "Times a request was preempted.", s.preemptions)
        success = CounterMetricFamily(VLLM + "request_success", "Finished answers.",
                                      labels=["model_name", "finished_reason"])
        for reason, count in s.finished_by_reason:
            success.add_metric([self.model_name, reason], count)
        yield success
        yield gauge(OURS + "num_free_blocks", "Physical KV-cache blocks on the free list.",
                    s.free_blocks)
        yield gauge(OURS + "num_blocks", "Physical KV-cache blocks in the cache.",
                    s.total_blocks)
        yield counter(OURS + "steps", "Engine steps run.", s.steps)
        yield counter(OURS + "requests_finished", "Client requests served to the end.",
                      s.jobs_finished)
        yield counter(OURS + "requests_cancelled",
                      "Client requests cancelled (the client went away).", s.jobs_cancelled)


class ServerMetrics:
    """One application's registry: the loop's snapshot plus the latency histograms the
    request handlers observe."""

    def __init__(self, stats, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(LoopCollector(stats, model_name))
        self.time_to_first_token = Histogram(
            VLLM + "time_to_first_token_seconds", "Request received -> its first token.",
            ["model_name"], registry=self.registry, buckets=LATENCY_BUCKETS
        ).labels(model_name)
        self.e2e_latency = Histogram(
            VLLM + "e2e_request_latency_seconds", "Request received -> its last token.",
            ["model_name"], registry=self.registry, buckets=LATENCY_BUCKETS
        ).labels(model_name)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def parse_metrics(text: str) -> dict[str, float]:
    """``{"num_free_blocks": 120.0, ...}`` from ``/metrics``' text: each sample keyed by its
    name without the ``vllm:`` or ``paged_tutorial_`` prefix, labels other than
    ``model_name`` appended as ``{name=value}``."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix(VLLM).removeprefix(OURS)
            labels = {k: v for k, v in sample.labels.items() if k != "model_name"}
            if labels:
                name += "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
            values[name] = sample.value
    return values
