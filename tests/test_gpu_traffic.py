"""Counted global-memory traffic of the CUDA twin equals flashlab.cost's closed forms, to the byte.

The instrumented build of each kernel (count_traffic=True) adds every byte a thread loads
from or stores to global memory into a counter; the closed forms
(flashlab.cost.tiled_attention_traffic / standard_attention_traffic) are written from the
tiling alone, without the kernels' skip function (checked against it separately below).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import make_qkv

from flashlab.cost import gpu_keys_visited, standard_attention_traffic, tiled_attention_traffic
from flashlab.gpu import Traffic, flash_attention_backward_gpu, flash_attention_gpu, standard_attention_gpu
from flashlab.gpu.standard import STANDARD_TILE
from flashlab.masks import band_from, clamp_band, kv_block_range

# (B, H, Hkv, Sq, Sk, Dqk, Dv, causal, block_q, block_k)
SHAPES = {
    "7x33 causal GQA": (1, 2, 1, 7, 33, 8, 8, True, 4, 8),
    "33x7 causal": (2, 1, 1, 33, 7, 8, 4, True, 8, 4),
    "20x20 non-causal 192/128": (1, 1, 1, 20, 20, 192, 128, False, 8, 8),
    "64x64 causal": (1, 1, 1, 64, 64, 4, 4, True, 16, 16),
}


def closed_form(shape, backward=False):
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = shape
    return tiled_attention_traffic(Sq, Sk, Dqk, Dv, block_q=bq, block_k=bk, batch=B, heads=H,
                                   causal=causal, backward=backward)


def run_forward(shape, count=True):
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = shape
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=5)
    return x, flash_attention_gpu(**x, causal=causal, block_q=bq, block_k=bk, count_traffic=count)


@pytest.mark.parametrize("name", list(SHAPES))
def test_forward_count_equals_closed_form(name):
    x, (o, lse, traffic) = run_forward(SHAPES[name])
    assert isinstance(traffic, Traffic)
    assert (traffic.read_bytes, traffic.write_bytes) == closed_form(SHAPES[name])
    # the counting build computes the same numbers as the plain one
    _, (o2, lse2) = run_forward(SHAPES[name], count=False)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse, lse2)


@pytest.mark.parametrize("name", ["7x33 causal GQA", "20x20 non-causal 192/128"])
def test_backward_count_equals_closed_form(name):
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = SHAPES[name]
    x, (o, lse, _) = run_forward(SHAPES[name])
    *_, traffic = flash_attention_backward_gpu(o, **x, o=o, lse=lse, causal=causal, block_q=bq,
                                               block_k=bk, count_traffic=True)
    assert (traffic.read_bytes, traffic.write_bytes) == closed_form(SHAPES[name], backward=True)


@pytest.mark.parametrize("causal", [False, True])
def test_standard_count_equals_closed_form(causal):
    B, H, Hkv, Sq, Sk, Dqk, Dv = 1, 2, 1, 37, 21, 8, 4
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=5)
    _, traffic = standard_attention_gpu(**x, causal=causal, count_traffic=True)
    assert (traffic.read_bytes, traffic.write_bytes) == standard_attention_traffic(
        Sq, Sk, Dqk, Dv, tile=STANDARD_TILE, batch=B, heads=H)


def test_causal_skip_reads_fewer_kv_bytes():
    shape = SHAPES["64x64 causal"]
    _, (*_, causal) = run_forward(shape)
    _, (*_, full) = run_forward(shape[:7] + (False,) + shape[8:])
    # 4 q-blocks of 16: causal visits 1+2+3+4 = 10 of the 16 kv tiles
    kv_tile = 16 * (4 + 4) * 4
    assert full.read_bytes - causal.read_bytes == 6 * kv_tile
    assert full.write_bytes == causal.write_bytes


def test_keys_visited_is_the_kernels_skip_rule():
    # the closed form's own causal rule against flashlab.masks.kv_block_range (what the kernels use)
    for sq, sk, bq, bk, causal in itertools.product((1, 5, 16, 33), (1, 7, 16, 40), (1, 4, 16),
                                                    (1, 3, 16), (False, True)):
        bq, bk = min(bq, sq), min(bk, sk)
        left, right = clamp_band(*band_from(causal), sq, sk)
        for i, i0 in enumerate(range(0, sq, bq)):
            kb0, kb1 = kv_block_range(i0, min(i0 + bq, sq), sk, bk, left, right)
            keys = min(sk, kb1 * bk) - kb0 * bk
            assert gpu_keys_visited(sq, sk, bq, bk, i, causal=causal) == keys


def test_closed_forms_reject_bad_sizes():
    with pytest.raises(ValueError, match="block_q"):
        tiled_attention_traffic(8, 8, 4, 4, block_q=0, block_k=4)
    with pytest.raises(ValueError, match="tile"):
        standard_attention_traffic(8, 8, 4, 4, tile=0)


def test_fused_traffic_falls_with_the_tile_as_theorem_2_says():
    # K and V are re-read once per q-block: doubling block_q halves that term (N = 4096, d = 64)
    n, d = 4096, 64
    reads = [tiled_attention_traffic(n, n, d, d, block_q=b, block_k=b)[0] for b in (32, 64, 128)]
    kv = [r - 4 * n * d for r in reads]
    assert kv[0] == 2 * kv[1] == 4 * kv[2]
    std = sum(standard_attention_traffic(n, n, d, d, tile=32))
    assert std > 5 * sum(tiled_attention_traffic(n, n, d, d, block_q=128, block_k=128))


@pytest.mark.parametrize("sq, sk, bq, bk", [(33, 7, 8, 4), (7, 33, 4, 8), (40, 40, 16, 8)])
def test_twin_visits_the_tiles_the_cpu_kernel_computes(sq, sk, bq, bk):
    # the kernels' skip table is the CPU forward's tile skipping, q-block by q-block
    from flashlab import tiles_computed
    from flashlab.gpu.attention import kv_blocks
    from flashlab.validation import prepare
    x = make_qkv(1, 1, 1, sq, sk, 4, 4, seed=5)
    for causal in (False, True):
        ranges = kv_blocks(prepare(**x, causal=causal, block_q=bq, block_k=bk))
        cpu = tiles_computed(**x, causal=causal, block_q=bq, block_k=bk)[0, 0]
        np.testing.assert_array_equal(ranges[:, 1] - ranges[:, 0], cpu)
