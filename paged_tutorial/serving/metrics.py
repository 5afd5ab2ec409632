"""``/metrics``: the engine loop's counters in Prometheus' text exposition format.

    paged_tutorial_num_requests_running   requests holding a slot (gauge)
    paged_tutorial_num_requests_waiting   requests queued for a slot, preempted ones included
    paged_tutorial_num_free_blocks        physical KV blocks on the free list (gauge)
    paged_tutorial_num_blocks             physical KV blocks in the cache (gauge)
    paged_tutorial_steps_total            engine steps run (counter)
    paged_tutorial_requests_finished_total / _cancelled_total, paged_tutorial_generation_tokens_total

``parse_metrics(text)`` reads it back into a dict (the notebook and the tests use it).
"""

from __future__ import annotations

from paged_tutorial.serving.engine_loop import LoopStats

PREFIX = "paged_tutorial_"
#: (name, type, help, LoopStats field)
METRICS = (
    ("num_requests_running", "gauge", "Requests holding a slot of the engine.", "running"),
    ("num_requests_waiting", "gauge", "Requests queued for a slot (preempted ones included).",
     "waiting"),
    ("num_free_blocks", "gauge", "Physical KV-cache blocks on the free list.", "free_blocks"),
    ("num_blocks", "gauge", "Physical KV-cache blocks in the cache.", "total_blocks"),
    ("steps_total", "counter", "Engine steps run.", "steps"),
    ("requests_finished_total", "counter", "Client requests served to the end.",
     "jobs_finished"),
    ("requests_cancelled_total", "counter", "Client requests cancelled (client went away).",
     "jobs_cancelled"),
    ("generation_tokens_total", "counter", "Tokens generated for finished answers.",
     "tokens_generated"),
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render_metrics(stats: LoopStats) -> str:
    lines = []
    for name, kind, help_text, attribute in METRICS:
        lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}",
                  f"{PREFIX}{name} {getattr(stats, attribute)}"]
    return "\n".join(lines) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """``{"num_free_blocks": 120.0, ...}`` from ``render_metrics``' text (prefix dropped)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.removeprefix(PREFIX)] = float(value)
    return values
