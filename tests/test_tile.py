"""The shared tile operations' order and arithmetic (flashlab.kernels.tile, flashlab.masks):
the zig-zag q-block order, the one ceiling division compiled for Numba, and the one tile-skip
rule that the kernels and classify_tiles both apply."""
from __future__ import annotations

import numpy as np
import pytest

from flashlab.kernels.tile import qblock_order
from flashlab.masks import (
    EMPTY,
    FULL,
    PARTIAL,
    cdiv_jit,
    classify_tiles,
    tile_class,
    tile_fully_masked,
    tile_visit_class,
)
from flashlab.tiling import cdiv


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8])
def test_qblock_order_is_the_zigzag_permutation(n):
    order = [qblock_order(i, n) for i in range(n)]
    assert sorted(order) == list(range(n))
    # 0, n-1, 1, n-2, ...: each even position takes the next block from the top, each odd one
    # the next from the bottom
    assert order[0::2] == list(range(len(order[0::2])))
    assert order[1::2] == [n - 1 - j for j in range(len(order[1::2]))]


def test_qblock_order_pairs_long_and_short_causal_rows():
    # causal: q-block i has i + 1 tiles; two threads with contiguous halves of the work items
    n = 8
    tiles = [qblock_order(i, n) + 1 for i in range(n)]
    assert sum(tiles[: n // 2]) == sum(tiles[n // 2:])     # zig-zag: an even split
    plain = [i + 1 for i in range(n)]
    assert sum(plain[: n // 2]) < sum(plain[n // 2:])       # plain order: the last thread waits


@pytest.mark.parametrize("a", [0, 1, 5, 63, 64, 65, 1000, -7])
@pytest.mark.parametrize("b", [1, 3, 64])
def test_cdiv_jit_is_cdiv(a, b):
    assert cdiv_jit(a, b) == cdiv(a, b) == -(-a // b)


def test_tile_visit_class_is_the_band_class_with_the_mask_skip():
    rng = np.random.default_rng(0)
    sq, sk, bq, bk = 12, 10, 4, 3
    for left, right in [(100, 0), (2, 1), (0, 0), (100, 100)]:
        for density in (0.0, 0.6, 1.0):
            mask = rng.random((sq, sk)) < density
            for i0 in range(0, sq, bq):
                for j0 in range(0, sk, bk):
                    i1, j1 = min(i0 + bq, sq), min(j0 + bk, sk)
                    band = tile_class(i0, i1, j0, j1, left, right)
                    got = tile_visit_class(i0, i1, j0, j1, left, right, mask, True)
                    skipped = band != EMPTY and tile_fully_masked(mask, i0, i1, j0, j1, left, right)
                    assert got == (EMPTY if skipped else band)
                    assert tile_visit_class(i0, i1, j0, j1, left, right, mask, False) == band


def test_classify_tiles_applies_the_kernels_rule_with_a_broadcast_mask():
    # a key-padding mask (1, Sk): the last 4 keys masked for every row
    sq, sk = 8, 10
    pad = np.zeros((1, sk), dtype=bool)
    pad[0, 6:] = True
    got = classify_tiles(sq, sk, 4, 3, 100, 100, pad)
    dense = classify_tiles(sq, sk, 4, 3, 100, 100, np.broadcast_to(pad, (sq, sk)).copy())
    np.testing.assert_array_equal(got, dense)
    # keys 0-5 full, 6-8 fully masked (skipped), 9 masked too
    assert got[:, 0].tolist() == [FULL, FULL] and got[:, 1].tolist() == [FULL, FULL]
    assert (got[:, 2:] == EMPTY).all()
    causal = classify_tiles(sq, sk, 4, 3, 100, 0, pad)
    assert PARTIAL in causal.tolist()[0]
