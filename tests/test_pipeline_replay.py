"""Replaying a simulated schedule with real data (flashlab.replay)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import flashlab
from flashlab.pipeline.settings import PipelineSettings, simulate_settings
from flashlab.pipeline.simulate import simulate
from flashlab.replay import attention_from_tiles, replay_tiles

BASE = PipelineSettings(kv_blocks=4)


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(0)
    n = BASE.kv_blocks * BASE.block_k
    q = rng.standard_normal((BASE.block_q, 192))
    k, v = rng.standard_normal((n, 192)), rng.standard_normal((n, 128))
    o_ref, _ = flashlab.attention_reference(q[None, None], k[None, None], v[None, None])
    return q, k, v, o_ref[0, 0]


@pytest.mark.parametrize("strategy", ["iterate_all", "self_mte2", "ping_pong"])
def test_every_strategy_delivers_every_tile_intact(strategy, operands):
    q, k, v, o_ref = operands
    result = simulate_settings(dataclasses.replace(BASE, strategy=strategy))
    tiles = replay_tiles(result, k, v, BASE.block_k)
    bk = BASE.block_k
    assert set(tiles) == {(name, t) for name in "KV" for t in range(BASE.kv_blocks)}
    for (name, t), tile in tiles.items():
        np.testing.assert_array_equal(tile, (k if name == "K" else v)[t * bk:(t + 1) * bk])
    o = attention_from_tiles(tiles, q, BASE.kv_blocks, 1 / np.sqrt(192))
    np.testing.assert_allclose(o, o_ref, rtol=0, atol=1e-12)


def test_a_buffer_overwritten_too_early_is_caught(operands):
    # one L1 buffer for K and V but no wait for it to be free: copies overwrite tiles still in use
    q, k, v, o_ref = operands
    graph = simulate_settings(dataclasses.replace(BASE, strategy="self_mte2")).graph
    no_wait = simulate(dataclasses.replace(graph, pools={**graph.pools, "L1.B": len(graph.tasks)}))
    tiles = replay_tiles(no_wait, k, v, BASE.block_k, slot=lambda i: 0)
    bk = BASE.block_k
    intact = sum(np.array_equal(tile, (k if name == "K" else v)[t * bk:(t + 1) * bk])
                 for (name, t), tile in tiles.items())
    assert intact < len(tiles)
    o = attention_from_tiles(tiles, q, BASE.kv_blocks, 1 / np.sqrt(192))
    assert np.abs(o - o_ref).max() > 1e-3
