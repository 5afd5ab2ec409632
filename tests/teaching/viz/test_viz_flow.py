"""The article's flow in one figure (paged_tutorial.teaching.chapters.ch00_overview.flow), filled from a live tiny engine."""

from __future__ import annotations

import matplotlib
import pytest

import paged_tutorial as pt
from paged_tutorial.teaching.chapters.ch00_overview import flow

matplotlib.use("Agg")


def running_engine():
    config = pt.ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=8)
    block_bytes = pt.CacheConfig.for_model(config).BLOCK_BYTES
    engine = pt.Engine(pt.random_model(config, seed=0), backend="torch", device="cpu",
                       max_slots=2, max_seq_len=64, kv_cache_bytes=20 * block_bytes)
    request = engine.add_request(list(range(3, 23)), max_tokens=5)    # 20 prompt tokens
    engine.step()
    engine.step()                                                          # 21 tokens cached
    return engine, request


def test_flow_values_read_the_live_engine():
    engine, request = running_engine()
    values = flow.flow_values(engine, request.slot)
    cache = engine.cache
    row = cache.block_table[request.slot, 0, :3].tolist()
    assert values["table"] == f"[{request.slot}, 0, :] = {row}"
    assert row[2] == -1                                 # one -1 after the 2 blocks in use
    assert values["kernel"] == "seq_len 21 -> 2 logical blocks"
    k = cache.k_byte_offset(row[1], 4, 0)                # token 20 = logical 1, row 4
    assert values["address"] == f"token 20: K at byte {k:,}"
    assert str(cache.free_blocks[-1]) in values["free"] and f"{cache.num_free} free" in values["free"]
    assert values["release"] == f"slot {request.slot} owns 4 blocks (all layers)"
    with pytest.raises(ValueError, match="no running request"):
        flow.flow_values(engine, 1)


def test_plot_article_flow():
    import matplotlib.pyplot as plt

    engine, request = running_engine()
    values = flow.flow_values(engine, request.slot)
    fig = flow.plot_article_flow(values)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert len(ax.patches) >= len(flow.STAGES) + 9                   # 8 boxes, 9 arrows
    for key, name, *_ in flow.STAGES:
        assert name in texts
    for value in values.values():
        assert value in texts
    plt.close(fig)
    fig = flow.plot_article_flow()                                    # boxes without live values
    assert not any(v in [t.get_text() for t in fig.axes[0].texts] for v in values.values())
    plt.close(fig)
