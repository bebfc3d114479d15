"""flashlab.walk: the tile-by-tile walk is the kernel (same o/lse), skips exactly the empty tiles,
and its recorded state behaves as the online softmax says it must."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close_to_reference, make_qkv, mask_options

import flashlab
from flashlab.masks import EMPTY, classify_tiles
from flashlab.walk import COMPUTED, MASKED_OUT, OUTSIDE_BAND, walk_forward

B, H, HKV, SQ, SK, DQK, DV = 2, 2, 1, 37, 29, 16, 8
BLOCK_Q, BLOCK_K = 8, 6
KINDS = ["none", "causal", "window(-2,30)", "window(40,-3)", "window+causal", "causal+mask",
         "mask(B,H,Sq,Sk)"]


def _case(kind: str, dtype=np.float32, b: int = 1, h: int = 1):
    inputs = make_qkv(B, H, HKV, SQ, SK, DQK, DV, dtype=dtype, seed=3)
    options = mask_options(kind, B, H, SQ, SK, seed=4)
    walk = walk_forward(**inputs, **options, block_q=BLOCK_Q, block_k=BLOCK_K, b=b, h=h)
    return inputs, options, walk


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_walk_output_is_the_kernels(kind, dtype):
    inputs, options, walk = _case(kind, dtype)
    o, lse = flashlab.flash_attention(**inputs, **options, block_q=BLOCK_Q, block_k=BLOCK_K)
    # same helpers, same order, same dtype: equal to float rounding (in practice bit for bit)
    np.testing.assert_allclose(walk.o, o[1, 1], rtol=0, atol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_array_equal(np.isneginf(walk.lse), np.isneginf(lse[1, 1]))
    np.testing.assert_allclose(walk.lse, lse[1, 1], rtol=0, atol=1e-6)
    # and the kernel counts the same computed tiles per q-block
    tiles = flashlab.tiles_computed(**inputs, **options, block_q=BLOCK_Q, block_k=BLOCK_K)
    np.testing.assert_array_equal(walk.tiles_done, tiles[1, 1])
    # within the tolerance rule of the reference
    ref_o, ref_lse = flashlab.attention_reference(**inputs, **options)
    naive_o, naive_lse = flashlab.attention_naive(**inputs, **options)
    assert_close_to_reference(walk.o, walk.lse, naive_o[1, 1], naive_lse[1, 1],
                              ref_o[1, 1], ref_lse[1, 1], what=kind)


@pytest.mark.parametrize("kind", KINDS)
def test_skipped_tiles_are_the_empty_tiles(kind):
    _, options, walk = _case(kind)
    mask2d = None if "mask" not in options else options["mask"][1, 1]
    classes = classify_tiles(SQ, SK, BLOCK_Q, BLOCK_K, walk.left, walk.right, mask2d)
    assert len(walk.steps) == classes.size
    assert [(st.qb, st.kb) for st in walk.steps] == [
        (a, c) for a in range(classes.shape[0]) for c in range(classes.shape[1])]
    skipped = np.zeros_like(classes, dtype=bool)
    for st in walk.steps:
        skipped[st.qb, st.kb] = st.skipped
        assert st.skipped == (st.reason != COMPUTED)
        assert (st.s is None) == st.skipped and (st.p is None) == st.skipped
        assert st.reason in (COMPUTED, OUTSIDE_BAND, MASKED_OUT)
    np.testing.assert_array_equal(skipped, classes == EMPTY)


def test_skip_reasons():
    _, _, walk = _case("causal+mask")
    reasons = {st.reason for st in walk.steps}
    # causal skips blocks above the diagonal; the mask's fully masked first row alone does not
    # empty a tile, so only the band reason is expected here
    assert OUTSIDE_BAND in reasons and COMPUTED in reasons
    inputs = make_qkv(1, 1, 1, 16, 16, 4, 4)
    mask = np.zeros((16, 16), dtype=bool)
    mask[:8, 8:] = True  # the top-right 8 x 8 tile is masked out whole
    walk = walk_forward(**inputs, mask=mask, block_q=8, block_k=8)
    assert [st.reason for st in walk.steps] == [COMPUTED, MASKED_OUT, COMPUTED, COMPUTED]


@pytest.mark.parametrize("kind", ["none", "causal", "window(40,-3)", "causal+mask"])
def test_partial_output_converges_after_the_last_block(kind):
    inputs, options, walk = _case(kind, np.float64)
    ref_o, _ = flashlab.attention_reference(**inputs, **options)
    ref = ref_o[1, 1]
    for qb in range(walk.n_qb):
        last = walk.last_step_of(qb)
        i0, i1 = last.rows
        np.testing.assert_allclose(last.o_partial, ref[i0:i1], rtol=0, atol=1e-12)
        # the final output is that last partial output
        np.testing.assert_array_equal(walk.o[i0:i1], last.o_partial)
    # and before its last block a q-block that needs several blocks is not yet there
    if kind == "none":
        first = walk.steps[0]
        assert np.abs(first.o_partial - ref[first.rows[0]:first.rows[1]]).max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_running_max_never_decreases(kind):
    _, _, walk = _case(kind)
    for st in walk.steps:
        np.testing.assert_array_equal(st.m_prev <= st.m, True)
        if st.skipped:
            # a skipped tile leaves the state untouched
            np.testing.assert_array_equal(st.m, st.m_prev)
    for qb in range(walk.n_qb):
        ms = np.array([st.m for st in walk.steps if st.qb == qb])   # (steps, rows)
        assert (ms[1:] >= ms[:-1]).all()


def test_recorded_tiles_are_consistent():
    _, _, walk = _case("causal")
    for st in walk.computed:
        r, c = st.rows[1] - st.rows[0], st.cols[1] - st.cols[0]
        assert st.s.shape == st.p.shape == (r, c)
        # P~ = e^{S - m'}: 0 where S = -inf, in (0, 1] elsewhere, 1 at each row's new maximum
        assert (st.p[np.isneginf(st.s)] == 0).all()
        assert (st.p >= 0).all() and (st.p <= 1).all()
        rows_with_max = np.isclose(st.s.max(axis=1), st.m)
        np.testing.assert_allclose(st.p.max(axis=1)[rows_with_max], 1.0, rtol=1e-6)


def test_walk_validates_inputs():
    inputs = make_qkv(1, 2, 1, 8, 8, 4, 4)
    with pytest.raises(ValueError, match="h must be in"):
        walk_forward(**inputs, h=2)
    with pytest.raises(TypeError, match="b must be an int"):
        walk_forward(**inputs, b=0.5)
    with pytest.raises(ValueError, match="block_q"):
        walk_forward(**inputs, block_q=0)
    with pytest.raises(TypeError, match="mask"):
        walk_forward(**inputs, mask=np.zeros((8, 8)))


def test_walk_with_rope_and_gqa_matches_the_kernel():
    # MLA-like: QK dim 24 split as 16 (nope) + 8 (rope), V dim 12, one shared k_rope head
    inputs = make_qkv(1, 4, 2, 21, 30, 16, 12, Dr=8, Hr=1, seed=5)
    options = dict(causal=True, block_q=8, block_k=8)
    o, lse = flashlab.flash_attention(**inputs, **options)
    for h in range(4):
        walk = walk_forward(**inputs, **options, h=h)
        np.testing.assert_allclose(walk.o, o[0, h], rtol=0, atol=1e-6)
        np.testing.assert_allclose(walk.lse, lse[0, h], rtol=0, atol=1e-6)


def test_walk_defaults_to_the_kernels_tiles():
    """Called with flash_attention's arguments and no block sizes, the walk takes
    flash_attention's default tiles: it is the walk of that very call."""
    inputs = make_qkv(1, 1, 1, 600, 570, 8, 8, seed=6)
    walk = walk_forward(**inputs, causal=True)
    assert (walk.block_q, walk.block_k) == flashlab.api.FORWARD_BLOCK
    assert walk.block_q < 600 and walk.block_k < 570    # the defaults themselves, not the lengths
    o, lse = flashlab.flash_attention(**inputs, causal=True)
    np.testing.assert_allclose(walk.o, o[0, 0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(walk.lse, lse[0, 0], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(walk.tiles_done, flashlab.tiles_computed(**inputs, causal=True)[0, 0])


def test_walk_takes_every_option_of_the_scores_stage():
    """The walk hands its options to prepare and its scores come from the kernels' stage: a bias,
    ALiBi slopes and a soft-cap (none of which the walk names) are walked as the kernel computes
    them."""
    inputs = make_qkv(2, 4, 2, 19, 23, 8, 8, seed=7)
    rng = np.random.default_rng(8)
    options = dict(causal=True, bias=rng.standard_normal((1, 4, 19, 23)).astype(np.float32),
                   alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]), softcap=3.0, block_q=8, block_k=8)
    o, lse = flashlab.flash_attention(**inputs, **options)
    for b, h in ((0, 0), (1, 3)):
        walk = walk_forward(**inputs, **options, b=b, h=h)
        np.testing.assert_allclose(walk.o, o[b, h], rtol=0, atol=1e-6)
        np.testing.assert_allclose(walk.lse, lse[b, h], rtol=0, atol=1e-6)
    # without the bias the walk differs: the option reached the stage
    assert np.abs(walk_forward(**inputs, causal=True, softcap=3.0, block_q=8, block_k=8, b=1, h=3).o
                  - o[1, 3]).max() > 1e-3


def test_walk_of_a_checked_problem():
    inputs = make_qkv(1, 2, 1, 13, 17, 8, 8, seed=9)
    p = flashlab.validation.prepare(**inputs, causal=True, block_q=4, block_k=8)
    a, b = walk_forward(problem=p, h=1), walk_forward(**inputs, causal=True, block_q=4, block_k=8, h=1)
    np.testing.assert_array_equal(a.o, b.o)
    np.testing.assert_array_equal(a.lse, b.lse)
    # a lazily scanned problem (the kernel API's decode kind) is scanned before the walk reads it
    lazy = flashlab.validation.prepare(**make_qkv(1, 1, 1, 1, 17, 8, 8, seed=10), lazy_kv=True)
    bad_k = lazy.k.copy()
    bad_k[0, 0, 5, 0] = np.nan
    with pytest.raises(ValueError, match="^k "):
        walk_forward(problem=flashlab.validation.prepare(lazy.q, bad_k, lazy.v, lazy_kv=True))
    with pytest.raises(TypeError, match="either q, k, v"):
        walk_forward(**inputs, problem=p)
    with pytest.raises(TypeError, match="either q, k, v"):
        walk_forward(problem=p, causal=True)


def test_walk_refuses_dropout():
    inputs = make_qkv(1, 1, 1, 8, 8, 4, 4)
    with pytest.raises(ValueError, match="dropout_p must be 0 in a walk"):
        walk_forward(**inputs, dropout_p=0.1)
    walk_forward(**inputs, dropout_p=0.0)        # off is fine
