"""The shared-block recorder and its figures (paged_tutorial.teaching.chapters.ch09_prefix_sharing.sharing), on a tiny random model
with prefix caching and a cache small enough to evict."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.teaching.chapters.ch09_prefix_sharing import sharing

matplotlib.use("Agg")

LAYERS = 3


@pytest.fixture(scope="module")
def recorded():
    config = pt.ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                            num_hidden_layers=LAYERS, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=8)
    block_bytes = pt.CacheConfig.for_model(config, dtype="float32").BLOCK_BYTES
    engine = pt.Engine(pt.random_model(config, seed=0), backend="torch", device="cpu",
                       max_slots=2, max_seq_len=96, kv_cache_bytes=15 * block_bytes,
                       prefix_caching=True)
    recorder = sharing.SharingRecorder(engine)
    system = list(range(1, 33))                       # two full blocks, shared
    for i, (own, n_new) in enumerate(((5, 6), (9, 12), (3, 4))):
        engine.add_request(system + [40 + i] * own, max_tokens=n_new)
    engine.add_request(list(range(33, 63)) + [7] * 20, max_tokens=4)   # forces an eviction
    engine.add_request(system + [50] * 4, max_tokens=3)
    recorder.run()                                    # checks the rebuilt state every step
    return engine, recorder


def test_rebuilt_states_count_what_the_cache_holds(recorded):
    engine, recorder = recorded
    steps = recorder.steps
    assert steps[0].kind == "start" and steps[0].count(sharing.FREE) == engine.cache.NUM_BLOCKS
    for s in steps:
        assert sum(s.count(state) for state in range(4)) == engine.cache.NUM_BLOCKS
        assert (s.ref_counts[s.states == sharing.SHARED] > 1).all()
        assert (s.ref_counts[s.states == sharing.CACHED] == 0).all()
    kinds = set().union(*(s.kinds() for s in steps))
    assert {"register", "share", "unshare", "cache", "evict", "reuse"} <= kinds
    assert steps[-1].matches(engine.cache)
    assert steps[-1].count(sharing.CACHED) == engine.cache.num_evictable_blocks


def test_key_steps_are_in_time_order_and_show_each_event(recorded):
    _, recorder = recorded
    picks = recorder.key_steps()
    assert picks == sorted(picks) and len(picks) == 5
    first = [recorder.steps[p] for p in picks]
    assert first[0].kind == "prefill" and any("evict" in s.kinds() for s in first)


def test_replay_refuses_a_count_that_disagrees():
    states = sharing.BlockStates(4, (1, 1, 2))
    states.apply(pt.BlockEvent("pop", 3, 0, 0, 0, 1))
    with pytest.raises(AssertionError, match="the replay counts"):
        states.apply(pt.BlockEvent("share", 3, 0, 0, 1, 3))
    with pytest.raises(ValueError, match="unknown BlockEvent kind"):
        states.apply(pt.BlockEvent("steal", 3, 0, 0, 1, 1))


def test_a_recorder_needs_an_empty_cache(recorded):
    engine, _ = recorded
    engine.add_request(list(range(1, 40)), max_tokens=20)
    engine.step()
    with pytest.raises(ValueError, match="cache is empty"):
        sharing.SharingRecorder(engine)
    engine.run_until_done()


def test_figures_draw(recorded):
    _, recorder = recorded
    steps = recorder.steps
    fig = sharing.plot_sharing(steps, recorder.key_steps())
    assert len(fig.axes) == 11                         # 5 maps, 5 tables, the usage curve
    fig2 = sharing.plot_step(steps, len(steps) // 2)
    assert len(fig2.axes) == 3
    colors = sharing.block_colors(steps[-1])
    assert colors.shape == (len(steps[-1].states), 4) and np.isfinite(colors).all()
    matplotlib.pyplot.close("all")


def test_widget_builds(recorded):
    pytest.importorskip("ipywidgets")
    _, recorder = recorded
    box = sharing.sharing_widget(recorder.steps)
    slider = box.children[0]
    assert slider.min == recorder.steps[0].index and slider.max == recorder.steps[-1].index
    slider.value = slider.max                          # redraws without error
    matplotlib.pyplot.close("all")
