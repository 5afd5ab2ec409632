"""Drive an engine through a random stream of events (the hypothesis tests of the engine's
lifecycle and of prefix caching share it): requests and streams submitted at given steps,
streams closed, requests cancelled from another thread, the model made to fail."""

from __future__ import annotations

import threading

import pytest

import paged_tutorial as pt

#: every op a step may run attention through (prefill, prefill after a cached prefix, decode)
ATTENTION_OPS = ("prefill_attention", "prefill_attention_from_cache", "decode_attention")


class Boom(Exception):
    """The failure the tests inject."""


class SwitchableFailure(pt.RecordingBackend):
    """The torch backend, raising Boom from the model at the next attention call after
    ``arm()``."""

    def __init__(self):
        self.armed = False

        def on_call(call):
            if self.armed:
                self.armed = False
                raise Boom("injected")
        super().__init__("torch", ops=ATTENTION_OPS, on_call=on_call)

    def arm(self):
        self.armed = True


def drive(engine, events, make_prompt, arm_failure, failure, rng, check, max_seq_len: int):
    """``events``: tuples ``(step, what, *prompt_args, max_tokens)`` with ``what`` one of
    submit / stream / close / cancel_thread / fail; ``make_prompt(*prompt_args)`` builds the
    prompt.  Steps until everything ended, calling ``check()`` after every step (a step that
    raises ``failure`` is part of the stream).  Returns [(result, prompt, max_tokens)] of
    every request submitted, streams closed at the end."""
    cache = engine.cache
    pending = sorted(events, key=lambda e: e[0])
    live, streams = [], []
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, what, *prompt_args, n = pending.pop(0)
            prompt = make_prompt(*prompt_args)
            worst = min(len(prompt) + n, max_seq_len)
            fits = cache.config.blocks_for_tokens(worst) * cache.config.num_layers \
                <= cache.NUM_BLOCKS
            if what in ("submit", "stream"):
                if not fits:                     # refused at once, nothing queued
                    with pytest.raises(ValueError, match="raise kv_cache_bytes"):
                        engine.add_request(prompt, max_tokens=n)
                    continue
                if len(prompt) >= max_seq_len:
                    continue
                if what == "submit":
                    live.append((engine.add_request(prompt, max_tokens=n), prompt, n))
                else:
                    streams.append((engine.stream(prompt, max_tokens=n), prompt, n))
            elif what == "close" and streams:
                streams[int(rng.integers(len(streams)))][0].close()
            elif what == "cancel_thread" and live:
                victim = live[int(rng.integers(len(live)))][0]
                t = threading.Thread(target=engine.cancel, args=(victim.request_id,))
                t.start()
                t.join(30)
            elif what == "fail":
                arm_failure()
        try:
            engine.step()
        except failure:
            pass
        step += 1
        check()
    finished = [(engine.result(r.request_id), p, n) for r, p, n in live]
    for s, p, n in streams:
        s.close()
        finished.append((s.result, p, n))
    return finished
