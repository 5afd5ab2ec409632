"""The block-lifetime recorder and its figures (paged_tutorial.teaching.chapters.ch06_block_lifetime.lifetime), on a tiny random
model whose cache is small enough to force slot reuse and a preemption."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.teaching.chapters.ch06_block_lifetime import lifetime

matplotlib.use("Agg")

LAYERS = 3


def tiny_engine(num_blocks: int = 18, max_slots: int = 2):
    config = pt.ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                            num_hidden_layers=LAYERS, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=8)
    block_bytes = pt.CacheConfig.for_model(config, dtype="float32").BLOCK_BYTES
    return pt.Engine(pt.random_model(config, seed=0), backend="torch", device="cpu",
                     max_slots=max_slots, max_seq_len=96, kv_cache_bytes=num_blocks * block_bytes)


@pytest.fixture(scope="module")
def recorded():
    engine = tiny_engine()
    recorder = lifetime.LifetimeRecorder(engine)
    # 6 logical blocks' worth in all (18 blocks / 3 layers): two 20-token prompts take 4, and
    # growing past 48 tokens needs more than the cache has, so one request is preempted
    for n_new in (40, 6, 30, 10):
        engine.add_request([1 + n_new % 7] * 20, max_tokens=n_new)
    recorder.run()
    return engine, recorder


def test_pops_and_pushes_match_the_table(recorded):
    engine, recorder = recorded
    steps = recorder.steps
    assert steps[0].kind == "start" and steps[0].num_free == engine.cache.NUM_BLOCKS
    # replaying the logged operations on a stack: every pop took the top, and the result is
    # the cache's free list, order included
    stack = list(range(engine.cache.NUM_BLOCKS))
    for op, block in recorder.log:
        if op == "pop":
            assert stack.pop() == block
        else:
            stack.append(block)
    assert stack == list(engine.cache.free_blocks)
    for prev, s in zip(steps, steps[1:]):
        assert s.num_free == prev.num_free - len(s.popped) + len(s.pushed)
        owned_now = set(s.block_table[s.block_table >= 0].tolist())
        owned_before = set(prev.block_table[prev.block_table >= 0].tolist())
        touched = set(s.popped) | set(s.pushed)
        assert owned_now - touched == owned_before - touched     # nothing else changed hands
        assert set(s.popped) - set(s.pushed) <= owned_now
        assert not (set(s.pushed) - set(s.popped)) & owned_now
    assert sum(len(s.popped) for s in steps) == [op for op, _ in recorder.log].count("pop")
    assert sum(len(s.pushed) for s in steps) == [op for op, _ in recorder.log].count("push")


def test_run_reuses_blocks_and_preempts(recorded):
    engine, recorder = recorded
    steps = recorder.steps
    assert any(s.preempted for s in steps)
    assert recorder.reused_blocks()
    assert engine.cache.num_free == engine.cache.NUM_BLOCKS
    keys = recorder.key_steps()
    assert keys == sorted(keys) and len(keys) == 5
    assert steps[recorder.fullest_step()].num_free == min(s.num_free for s in steps)


def test_release_follows_the_article_loop_order(recorded):
    _, recorder = recorded
    checked = 0
    for prev, s in zip(recorder.steps, recorder.steps[1:]):
        if not s.pushed or s.popped:
            continue
        was = {rid: slot for slot, rid in prev.slot_owner.items()}
        slots = [was[rid] for rid in s.preempted + s.finished if rid in was]
        walk = [int(b) for slot in slots for b in prev.block_table[slot].ravel() if b >= 0]
        assert s.pushed == walk
        checked += 1
    assert checked >= 2


def test_synced_entries_and_traffic(recorded):
    engine, recorder = recorded
    steps = recorder.steps
    cache = engine.cache
    assert sum(s.synced_entries for s in steps) == cache.dirty_entries_synced
    entries = cache.config.block_table_entries
    t = lifetime.traffic_table(steps, entries, LAYERS)
    run = [s for s in steps if s.kind in ("prefill", "decode")]
    assert t["steps"] == len(run)
    n_prefill = sum(s.kind == "prefill" for s in run)
    n_decode = len(run) - n_prefill
    releases = sum(s.releases for s in run)
    assert t["article_entries"] == (n_prefill + LAYERS * n_decode + releases) * entries
    assert t["engine_bytes"] == 12 * t["engine_entries"]
    # each pop or push dirties one entry; an entry dirtied twice between syncs is sent once
    ops = sum(len(s.popped) + len(s.pushed) for s in steps)
    assert sum(len(s.popped) for s in steps) <= t["engine_entries"] <= ops


def test_figures_and_widget(recorded):
    engine, recorder = recorded
    steps, n = recorder.steps, engine.cache.NUM_BLOCKS
    colors = lifetime.owner_colors(steps[1].block_table, n)
    assert colors.shape == (n, 4)
    free = set(range(n)) - set(steps[1].block_table[steps[1].block_table >= 0].tolist())
    assert all(np.allclose(colors[b], lifetime.FREE_RGBA) for b in free)
    fig = lifetime.plot_lifetime(steps, recorder.key_steps(), n)
    assert len(fig.axes) == len(recorder.key_steps()) + 1
    fig = lifetime.plot_step(steps, 3, n)
    assert len(fig.axes) == 2
    box = lifetime.lifetime_widget(steps, n)
    slider = box.children[0]
    assert (slider.min, slider.max, slider.value) == (steps[0].index, steps[-1].index,
                                                      steps[0].index)
    slider.value = steps[5].index             # redraws without error


def test_recorder_watches_generate():
    engine = tiny_engine(num_blocks=60)
    engine.generate([[3] * 5], max_tokens=4, seed=0)      # steps 0..3, before recording
    recorder = lifetime.LifetimeRecorder(engine)
    assert recorder.steps[0].index == 3
    engine.generate([[1] * 17, [2] * 5, [4] * 9], max_tokens=5, seed=0,
                    on_step=recorder.on_step)
    steps = recorder.steps
    assert [s.index for s in steps] == list(range(3, 3 + len(steps)))
    assert sum(len(s.popped) for s in steps) == sum(len(s.pushed) for s in steps)
    recorder.close()
    assert type(engine.cache.free_blocks) is list
    with pytest.raises(RuntimeError, match="closed"):
        recorder.step()


def test_table_and_free_list_figure_marks_differences():
    import matplotlib.pyplot as plt

    mine = np.array([[[3, -1], [2, -1]]])
    article = np.array([[[3, -1], [1, -1]]])
    fig = lifetime.plot_table_and_free_list(mine, [0, 1, 4], article, [0, 2, 4], title="step 3")
    tables = [ax for ax in fig.axes if ax.get_title().startswith("block table")]
    img = tables[0].images[0].get_array()
    assert not np.allclose(img[0, 0], img[1, 0])        # the differing entry is marked
    plt.close(fig)
