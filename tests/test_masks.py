"""flashlab.masks against brute force: the band, the kv-block range and every tile's class are
recomputed from the dense (Sq, Sk) matrix of allowed pairs over small grids."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import dense_allowed

from flashlab.masks import (
    EMPTY,
    FULL,
    NO_LIMIT,
    PARTIAL,
    allowed,
    band_box,
    band_from,
    clamp_band,
    classify_tiles,
    kv_block_range,
    tile_class,
)


# ------------------------------------------------------------------------------ band_from
@pytest.mark.parametrize("causal, window, expected", [
    (False, None, (NO_LIMIT, NO_LIMIT)),
    (True, None, (NO_LIMIT, 0)),
    (False, (3, 5), (3, 5)),
    (False, (3, None), (3, NO_LIMIT)),
    (False, (None, 4), (NO_LIMIT, 4)),
    (False, (None, None), (NO_LIMIT, NO_LIMIT)),
    (False, (-2, 5), (-2, 5)),
    (True, (3, 5), (3, 0)),
    (True, (None, -2), (NO_LIMIT, -2)),
    (True, (-1, None), (-1, 0)),
    (False, [np.int64(2), None], (2, NO_LIMIT)),
])
def test_band_from(causal, window, expected):
    band = band_from(causal, window)
    assert band == expected and all(type(x) is int for x in band)


BANDS = {
    "none": dict(),
    "causal": dict(causal=True),
    "window(2,3)": dict(window=(2, 3)),
    "window(0,0)": dict(window=(0, 0)),
    "window(None,1)": dict(window=(None, 1)),
    "window(4,None)": dict(window=(4, None)),
    "window(-2,5)": dict(window=(-2, 5)),
    "window(6,-3)": dict(window=(6, -3)),
    "window(-3,3)": dict(window=(-3, 3)),       # one key per row: j = i + 3
    "causal+window(3,None)": dict(causal=True, window=(3, None)),
    "causal+window(None,-2)": dict(causal=True, window=(None, -2)),
    "window(-20,30)": dict(window=(-20, 30)),   # rows see only keys beyond the grid's end
}

# bands with left + right < 0 allow no pair at all: every tile is EMPTY, no block is visited
EMPTY_BANDS = {
    "window(-5,-3)": dict(window=(-5, -3)),
    "window(-3,2)": dict(window=(-3, 2)),
    "causal+window(-1,None)": dict(causal=True, window=(-1, None)),
}
ALL_BANDS = [pytest.param(o, id=n) for n, o in BANDS.items()] + \
            [pytest.param(o, id=n) for n, o in EMPTY_BANDS.items()]
GRID = [(sq, sk, bq, bk) for sq, sk in [(1, 1), (1, 9), (9, 1), (5, 12), (12, 5), (16, 16)]
        for bq, bk in [(1, 1), (3, 4), (4, 3), (16, 16)]]


def _band(opts) -> tuple[int, int]:
    return band_from(opts.get("causal", False), opts.get("window"))


@pytest.mark.parametrize("opts", [pytest.param(o, id=n) for n, o in {**BANDS, **EMPTY_BANDS}.items()])
def test_allowed_matches_brute_force(opts):
    """masks.allowed(band_from(...)) is the dense matrix the definition gives."""
    for sq, sk in [(1, 1), (5, 12), (12, 5), (16, 16)]:
        np.testing.assert_array_equal(allowed(sq, sk, *_band(opts)), dense_allowed(1, 1, sq, sk, **opts)[0, 0])


def _blocks(n: int, blk: int):
    return [(a * blk, min(n, (a + 1) * blk)) for a in range(-(-n // blk))]


def _brute_class(ok: np.ndarray) -> int:
    return EMPTY if not ok.any() else (FULL if ok.all() else PARTIAL)


# --------------------------------------------------------------------------- kv_block_range
@pytest.mark.parametrize("opts", ALL_BANDS)
def test_kv_block_range_is_tight(opts):
    """For every q-block the range is exactly the kv-blocks holding an allowed pair (these are
    contiguous), and an empty range when there is none."""
    left, right = _band(opts)
    for sq, sk, bq, bk in GRID:
        ok = dense_allowed(1, 1, sq, sk, **opts)[0, 0]
        for i0, i1 in _blocks(sq, bq):
            hit = [b for b, (j0, j1) in enumerate(_blocks(sk, bk)) if ok[i0:i1, j0:j1].any()]
            kb0, kb1 = kv_block_range(i0, i1, sk, bk, left, right)
            if hit:
                assert (kb0, kb1) == (hit[0], hit[-1] + 1), (sq, sk, bq, bk, i0)
                assert hit == list(range(hit[0], hit[-1] + 1))
            else:
                assert kb1 <= kb0, (sq, sk, bq, bk, i0, kb0, kb1)


# ------------------------------------------------------------------------------- tile_class
@pytest.mark.parametrize("opts", ALL_BANDS)
def test_tile_class_matches_dense_matrix(opts):
    """Every tile (clipped at the grid's edge) is EMPTY/FULL/PARTIAL exactly as the dense
    allowed matrix says."""
    left, right = _band(opts)
    for sq, sk, bq, bk in GRID:
        ok = dense_allowed(1, 1, sq, sk, **opts)[0, 0]
        for (i0, i1), (j0, j1) in itertools.product(_blocks(sq, bq), _blocks(sk, bk)):
            assert tile_class(i0, i1, j0, j1, left, right) == _brute_class(ok[i0:i1, j0:j1]), \
                (sq, sk, bq, bk, i0, j0)


def test_tile_class_single_elements():
    """1 x 1 tiles: FULL where the pair is allowed, EMPTY where not (never PARTIAL)."""
    for left, right in [(2, 3), (NO_LIMIT, 0), (-1, 4), (5, -2)]:
        ok = allowed(10, 10, left, right)
        for i, j in itertools.product(range(10), range(10)):
            assert tile_class(i, i + 1, j, j + 1, left, right) == (FULL if ok[i, j] else EMPTY)


# --------------------------------------------------------------------------- classify_tiles
# with a dense mask classify_tiles decides from band & ~mask directly, so empty bands pass there
CLASSIFY_CASES = [pytest.param(p.values[0], False, id=f"{p.id}-band", marks=p.marks) for p in ALL_BANDS] + \
                 [pytest.param(o, True, id=f"{n}-band+mask") for n, o in {**BANDS, **EMPTY_BANDS}.items()]


@pytest.mark.parametrize("opts, with_mask", CLASSIFY_CASES)
def test_classify_tiles_matches_dense_matrix(opts, with_mask):
    """The tile map equals the brute-force classes of band & ~mask, tile by tile."""
    left, right = _band(opts)
    rng = np.random.default_rng(0)
    for sq, sk, bq, bk in GRID:
        mask = None
        if with_mask:
            # blocky plus sparse: some tiles fully masked, some partly
            mask = np.kron(rng.random((sq, sk)) < 0.4, np.ones((3, 3), dtype=bool))[:sq, :sk]
            mask = mask | (rng.random((sq, sk)) < 0.1)
        ok = dense_allowed(1, 1, sq, sk, mask=mask, **opts)[0, 0]
        got = classify_tiles(sq, sk, bq, bk, left, right, mask)
        assert got.shape == (-(-sq // bq), -(-sk // bk))
        want = np.array([[_brute_class(ok[i0:i1, j0:j1]) for j0, j1 in _blocks(sk, bk)]
                         for i0, i1 in _blocks(sq, bq)])
        np.testing.assert_array_equal(got, want, err_msg=str((sq, sk, bq, bk)))


def test_classify_tiles_causal_counts():
    """Causal, 8 x 8 blocks of a 64 x 64 grid: the 8 diagonal tiles PARTIAL, 28 FULL below, 28 EMPTY above."""
    c = classify_tiles(64, 64, 8, 8, *band_from(causal=True))
    assert (np.diag(c) == PARTIAL).all()
    assert (c[np.tril_indices(8, -1)] == FULL).all() and (c[np.triu_indices(8, 1)] == EMPTY).all()


@pytest.mark.parametrize("sq,sk", [(9, 12), (12, 9), (7, 7)])
def test_band_box_is_the_bounding_box_of_the_allowed_entries(sq, sk):
    """Every sub-tile of three small problems under 42 bands: band_box against `allowed`."""
    for left in (-3, -1, 0, 1, 2, 5, NO_LIMIT):
        for right in (-3, -1, 0, 1, 3, NO_LIMIT):
            a = allowed(sq, sk, *clamp_band(left, right, sq, sk))
            for i0, i1, j0, j1 in itertools.product(range(sq), range(1, sq + 1),
                                                    range(sk), range(1, sk + 1)):
                if i1 <= i0 or j1 <= j0 or tile_class(i0, i1, j0, j1, left, right) == EMPTY:
                    continue
                sub = a[i0:i1, j0:j1]
                rows, cols = np.flatnonzero(sub.any(1)), np.flatnonzero(sub.any(0))
                want = (i0 + rows[0], i0 + rows[-1] + 1, j0 + cols[0], j0 + cols[-1] + 1)
                assert band_box(i0, i1, j0, j1, left, right) == want, (i0, i1, j0, j1, left, right)
