"""Run engine.generate from several threads at once (tests of thread safety)."""

from __future__ import annotations

import threading


def generate_in_threads(engine, jobs: dict, max_tokens) -> dict:
    """One thread per job ``{key: prompts}``, each calling ``engine.generate(prompts,
    max_tokens=max_tokens(key))``; returns ``{key: [token ids per prompt]}`` and
    re-raises the first exception a thread met."""
    out, errors = {}, []

    def work(key):
        try:
            out[key] = [r.token_ids for r in engine.generate(
                jobs[key], max_tokens=max_tokens(key))]
        except BaseException as exc:           # noqa: BLE001 - handed to the test below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(key,)) for key in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    assert set(out) == set(jobs), "a thread did not finish"
    return out
