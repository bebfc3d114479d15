"""flashlab.flash_attention against the float64 reference, under the tolerance rule of conftest.

The grid is a set of products chosen so that every listed value meets every other relevant axis
without a combinatorial blow-up:

* lengths x mask kinds (all ordered pairs ``Sq != Sk`` of {1, 7, 64, 129, 1000}, every mask kind),
  with fixed heads and dims;
* head dims x head counts x a few lengths;
* block sizes (dividing and not dividing the lengths) x a few lengths x a few masks;
* dtypes x large-magnitude logits x a few lengths and masks;
* rows with no allowed key, tile skipping, the rope operands, and a hypothesis property test.
"""
from __future__ import annotations

import dataclasses
import itertools

import conftest as grid  # the shared grid: lengths, dims, heads, dtypes, masks
import numpy as np
import pytest
from conftest import (
    assert_close_to_reference,
    check_forward,
    dense_allowed,
    make_qkv,
    mask_options,
    pair_id,
    random_mask,
    tolerance,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import flashlab
from flashlab import api
from flashlab.masks import EMPTY, band_from, classify_tiles
from flashlab.validation import prepare


# ----------------------------------------------------------------- the rule itself can fail
def test_tolerance_rule_rejects_wrong_results():
    """The checker passes the kernel's answer and rejects small corruptions of it."""
    inputs = make_qkv(1, 2, 2, 64, 100, 32, 32, seed=12)
    opts = dict(window=(None, -3))  # rows 0..2 have no allowed key
    o, lse = flashlab.flash_attention(**inputs, **opts)
    naive = flashlab.attention_naive(**inputs, **opts)
    ref = flashlab.attention_reference(**inputs, **opts)
    assert_close_to_reference(o, lse, *naive, *ref)
    corrupt = []
    bad_o = o.copy()
    bad_o[0, 1, 40, 5] += 3 * tolerance(naive[0], ref[0])
    corrupt.append((bad_o, lse))
    bad_o = o.copy()
    bad_o[0, 0, 7, 0] = np.nan
    corrupt.append((bad_o, lse))
    for row, value in [(0, 0.0), (10, -np.inf), (10, lse[0, 0, 10] + 3 * tolerance(naive[1], ref[1]))]:
        bad_lse = lse.copy()
        bad_lse[0, 0, row] = value
        corrupt.append((o, bad_lse))
    for bad_o, bad_lse in corrupt:
        with pytest.raises(AssertionError):
            assert_close_to_reference(bad_o, bad_lse, *naive, *ref)


# --------------------------------------------------------------------- lengths x mask kinds
@pytest.mark.parametrize("kind", grid.MASK_KINDS)
@pytest.mark.parametrize("sq_sk", grid.LENGTH_PAIRS, ids=pair_id)
def test_lengths_x_masks(sq_sk, kind):
    """Every ordered pair of unequal lengths under every mask kind (B=2, H=4, Hkv=2, 72/40)."""
    Sq, Sk = sq_sk
    B, H, Hkv = 2, 4, 2
    inputs = make_qkv(B, H, Hkv, Sq, Sk, 72, 40, seed=Sq * 7 + Sk)
    check_forward(inputs, **mask_options(kind, B, H, Sq, Sk))


@pytest.mark.parametrize("kind", ["none", "causal", "window(40,-3)", "mask(B,H,Sq,Sk)"])
@pytest.mark.parametrize("n", [1, 129, 1000])
def test_equal_lengths(n, kind):
    """Square problems too (Sq == Sk), where causal is the usual lower triangle."""
    inputs = make_qkv(1, 2, 1, n, n, 64, 64, seed=n)
    check_forward(inputs, **mask_options(kind, 1, 2, n, n))


# ------------------------------------------------------------------------ dims x heads
@pytest.mark.parametrize("kind", ["none", "causal+mask"])
@pytest.mark.parametrize("sq_sk", [(1, 7), (129, 64), (64, 1000)], ids=pair_id)
@pytest.mark.parametrize("heads", grid.HEADS, ids=lambda h: f"H{h[0]}-Hkv{h[1]}")
@pytest.mark.parametrize("dims", grid.DIMS, ids=lambda d: f"Dqk{d[0]}-Dv{d[1]}")
def test_dims_x_heads(dims, heads, sq_sk, kind):
    """QK dim != V dim (192/128, 72/40) and GQA/MQA, with no padding anywhere."""
    (Dqk, Dv), (H, Hkv), (Sq, Sk) = dims, heads, sq_sk
    inputs = make_qkv(2, H, Hkv, Sq, Sk, Dqk, Dv, seed=Dqk + H + Sq)
    check_forward(inputs, **mask_options(kind, 2, H, Sq, Sk))


# ------------------------------------------------------------------------ block sizes
BLOCKS = [(64, 64), (7, 13), (13, 7), (128, 32), (32, 128), (1000, 1000)]


@pytest.mark.parametrize("kind", ["none", "causal", "window(40,-3)", "causal+mask", "mask(1,H,Sq,Sk)"])
@pytest.mark.parametrize("sq_sk", [(129, 1000), (1000, 129), (64, 64)], ids=pair_id)
@pytest.mark.parametrize("blocks", BLOCKS, ids=lambda b: f"bq{b[0]}-bk{b[1]}")
def test_block_sizes(blocks, sq_sk, kind):
    """Blocks that divide the lengths and blocks that do not; the result must not depend on them."""
    (bq, bk), (Sq, Sk) = blocks, sq_sk
    inputs = make_qkv(1, 2, 1, Sq, Sk, 64, 64, seed=bq + bk)
    check_forward(inputs, block_q=bq, block_k=bk, **mask_options(kind, 1, 2, Sq, Sk))


@pytest.mark.parametrize("kind", grid.ONE_BY_ONE_KINDS)
@pytest.mark.parametrize("sq_sk", grid.ONE_BY_ONE_PAIRS, ids=pair_id)
def test_block_one_by_one(sq_sk, kind):
    """1 x 1 tiles: every score is its own tile, every online-softmax step rescales."""
    Sq, Sk = sq_sk
    inputs = make_qkv(2, 2, 1, Sq, Sk, 8, 5, seed=3)
    check_forward(inputs, block_q=1, block_k=1, **mask_options(kind, 2, 2, Sq, Sk))


# --------------------------------------------------------- dtypes and large-magnitude logits
@pytest.mark.parametrize("q_scale", grid.Q_SCALES, ids=grid.Q_SCALE_IDS)
@pytest.mark.parametrize("kind", grid.DTYPE_KINDS)
@pytest.mark.parametrize("sq_sk", grid.DTYPE_PAIRS, ids=pair_id)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_dtypes_and_large_logits(dtype, sq_sk, kind, q_scale):
    """float16/32/64 inputs, with ordinary and large (|scores| ~ 50..100) logits."""
    Sq, Sk = sq_sk
    inputs = make_qkv(2, 2, 2, Sq, Sk, 64, 64, dtype=dtype, seed=Sk, q_scale=q_scale)
    opts = mask_options(kind, 2, 2, Sq, Sk)
    if q_scale > 1:
        # the test is about what it says: the largest logits really are ~ 50..100 or more
        q, k = (inputs[n].astype(np.float64) for n in ("q", "k"))
        top = np.abs(q @ k.swapaxes(-1, -2)).max() / 8.0
        assert 50 <= top <= 400, top
    check_forward(inputs, **opts)


def test_float16_output_is_not_computed_in_float16():
    """Sanity of the rule: float16 inputs accumulate in float32, so the kernel beats the naive."""
    inputs = make_qkv(1, 2, 2, 64, 1000, 64, 64, dtype=np.float16, seed=5, q_scale=10.0)
    o, _ = flashlab.flash_attention(**inputs)
    naive, _ = flashlab.attention_naive(**inputs)
    ref, _ = flashlab.attention_reference(**inputs)
    assert np.abs(o - ref).max() < np.abs(naive - ref).max()


# --------------------------------------------------------------- rows with no allowed key
EMPTY_ROW_CASES = {
    "window(-5,-3) every row": dict(window=(-5, -3)),
    "window(5,-3) first rows": dict(window=(5, -3)),
    "window(-3,5) last rows": dict(window=(-3, 5)),
    "window(None,-4) first rows": dict(window=(None, -4)),
    "causal+window(-1,None) every row": dict(causal=True, window=(-1, None)),
    "causal+window(None,-2) first rows": dict(causal=True, window=(None, -2)),
    "causal+window(3,-1) first row": dict(causal=True, window=(3, -1)),
}


@pytest.mark.parametrize("blocks", [(64, 64), (4, 3)], ids=lambda b: f"bq{b[0]}-bk{b[1]}")
@pytest.mark.parametrize("opts", EMPTY_ROW_CASES.values(), ids=EMPTY_ROW_CASES.keys())
def test_rows_without_keys_give_zero_and_neg_inf(opts, blocks):
    """o = 0 exactly and lse = -inf on rows the band empties; the other rows as the reference."""
    B, H, Sq, Sk = 1, 2, 40, 40
    inputs = make_qkv(B, H, 1, Sq, Sk, 16, 8, seed=11)
    o, lse = check_forward(inputs, block_q=blocks[0], block_k=blocks[1], **opts)
    empty = ~dense_allowed(B, H, Sq, Sk, **opts).any(axis=-1)
    assert empty.any(), "the case must contain rows with no allowed key"
    assert (o[empty] == 0).all() and np.isneginf(lse[empty]).all()
    assert np.isfinite(lse[~empty]).all() and np.isfinite(o).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_mask_rows_all_true(dtype):
    """A dense mask that removes whole rows (and one whole head) gives o = 0, lse = -inf there."""
    B, H, Sq, Sk = 2, 2, 30, 50
    inputs = make_qkv(B, H, 2, Sq, Sk, 16, 8, dtype=dtype, seed=2)
    mask = np.zeros((B, H, Sq, Sk), dtype=bool)
    mask[0, 0, [0, 7, 29]] = True
    mask[1, 1] = True
    o, lse = check_forward(inputs, mask=mask, block_q=8, block_k=16)
    assert (o[0, 0, [0, 7, 29]] == 0).all() and (o[1, 1] == 0).all()
    assert np.isneginf(lse[0, 0, [0, 7, 29]]).all() and np.isneginf(lse[1, 1]).all()
    assert np.isfinite(lse[0, 1]).all() and np.isfinite(lse[1, 0]).all()


# ------------------------------------------------------------------------- tile skipping
def _tiles_expected(B, H, Sq, Sk, bq, bk, opts) -> np.ndarray:
    """Non-EMPTY tiles per (b, h, q-block) by classify_tiles, the dense mask taken per (b, h)."""
    left, right = band_from(opts.get("causal", False), opts.get("window"))
    mask = opts.get("mask")
    out = np.zeros((B, H, -(-Sq // bq)), dtype=np.int64)
    for b, h in itertools.product(range(B), range(H)):
        m2 = None if mask is None else np.broadcast_to(mask, (B, H, Sq, Sk))[b, h]
        out[b, h] = (classify_tiles(Sq, Sk, bq, bk, left, right, m2) != EMPTY).sum(axis=1)
    return out


def _tiles_brute_force(B, H, Sq, Sk, bq, bk, opts) -> np.ndarray:
    """Tiles holding at least one allowed (i, j) per (b, h, q-block), from the dense matrix."""
    ok = dense_allowed(B, H, Sq, Sk, **opts)
    nq, nk = -(-Sq // bq), -(-Sk // bk)
    out = np.zeros((B, H, nq), dtype=np.int64)
    for a, c in itertools.product(range(nq), range(nk)):
        out[:, :, a] += ok[:, :, a * bq:(a + 1) * bq, c * bk:(c + 1) * bk].any(axis=(2, 3))
    return out


SKIP_KINDS = ["none", "causal", "window(40,17)", "window(20,None)", "window(None,10)",
              "window(-2,30)", "window(40,-3)", "mask(Sq,Sk)", "mask(B,H,Sq,Sk)",
              "causal+mask",
              "window+causal"]


@pytest.mark.parametrize("kind", SKIP_KINDS)
@pytest.mark.parametrize("case", [(129, 200, 32, 16), (200, 129, 16, 64), (64, 64, 7, 13)],
                         ids=lambda c: f"Sq{c[0]}-Sk{c[1]}-bq{c[2]}-bk{c[3]}")
def test_tiles_computed_match_classification(case, kind):
    """The kernel computes exactly the non-EMPTY tiles of classify_tiles, and those are exactly
    the tiles holding an allowed (i, j) of the brute-force dense matrix."""
    Sq, Sk, bq, bk = case
    B, H = 2, 2
    opts = mask_options(kind, B, H, Sq, Sk)
    if "mask" in opts:
        # block-structured mask so that some tiles are masked out completely
        rng = np.random.default_rng(4)
        blocky = rng.random((B, H, -(-Sq // 8), -(-Sk // 8))) < 0.5
        opts["mask"] = np.kron(blocky, np.ones((8, 8), dtype=bool))[..., :Sq, :Sk].copy()
        opts["mask"] = opts["mask"] | random_mask((B, H, Sq, Sk), p_masked=0.1)
        if kind == "mask(Sq,Sk)":
            opts["mask"] = opts["mask"][0, 0]
    inputs = make_qkv(B, H, 1, Sq, Sk, 8, 8)
    got = flashlab.tiles_computed(**inputs, block_q=bq, block_k=bk, **opts)
    assert got.shape == (B, H, -(-Sq // bq))
    np.testing.assert_array_equal(got, _tiles_expected(B, H, Sq, Sk, bq, bk, opts))
    np.testing.assert_array_equal(got, _tiles_brute_force(B, H, Sq, Sk, bq, bk, opts))


def test_band_and_mask_skip_2x2():
    """Minimal case: one 2x2 tile, causal allows (0,0), (1,0), (1,1) and the mask hides exactly
    those, so no pair is allowed: the tile is EMPTY and must not be computed."""
    q = np.zeros((1, 1, 2, 4))
    mask = np.array([[True, False], [True, True]])
    left, right = band_from(True, None)
    assert classify_tiles(2, 2, 2, 2, left, right, mask)[0, 0] == EMPTY
    got = flashlab.tiles_computed(q, q, q, causal=True, mask=mask, block_q=2, block_k=2)
    assert got[0, 0, 0] == 0


@pytest.mark.parametrize("opts", [dict(window=(-5, -3)), dict(causal=True, window=(-1, None))],
                         ids=["window(-5,-3)", "causal+window(-1,None)"])
def test_empty_band_computes_no_tile(opts):
    inputs = make_qkv(1, 1, 1, 64, 64, 8, 8)
    got = flashlab.tiles_computed(**inputs, block_q=16, block_k=16, **opts)
    np.testing.assert_array_equal(got, 0)


def test_causal_computes_about_half_the_tiles():
    """Causal at N = 2048 with 64-blocks: exactly n(n+1)/2 of n^2 tiles, i.e. about half."""
    N, blk = 2048, 64
    inputs = make_qkv(1, 1, 1, N, N, 8, 8)
    full = flashlab.tiles_computed(**inputs, block_q=blk, block_k=blk).sum()
    causal = flashlab.tiles_computed(**inputs, block_q=blk, block_k=blk, causal=True).sum()
    n = N // blk
    assert full == n * n and causal == n * (n + 1) // 2
    assert 0.5 < causal / full < 0.52


def _run_poisoned(inputs, poison_keys, **opts):
    """Run the kernel with NaN in k and v at key positions ``poison_keys``.

    The public API rejects NaN, so the validated problem is built on clean inputs and the
    poisoned arrays are swapped in before the kernel runs: a tile that touches a poisoned key
    spreads NaN into its rows (0 * NaN = NaN in P~ V), a skipped one cannot.
    """
    p = prepare(**inputs, **opts)
    k, v = p.k.copy(), p.v.copy()
    k[:, :, poison_keys] = np.nan
    v[:, :, poison_keys] = np.nan
    o, lse = api._forward(dataclasses.replace(p, k=k, v=v), False)[:2]
    return o, lse


@pytest.mark.parametrize("opts, clean_rows", [
    (dict(causal=True), slice(0, 192)),                 # q-blocks 0..2 never reach kv-block 3
    (dict(window=(10, 10)), slice(0, 128)),             # q-blocks 0, 1 reach kv-blocks 0..2 only
    (dict(window=(None, -70)), slice(0, 128)),          # j <= i - 70: q-blocks 0, 1 stop at key 57
], ids=["causal", "window(10,10)", "window(None,-70)"])
def test_skipped_tiles_are_never_read(opts, clean_rows):
    """NaN planted in the keys past the clean rows' last kv-block must not reach those rows."""
    N = 256
    inputs = make_qkv(1, 2, 1, N, N, 16, 16, dtype=np.float64, seed=9)
    # keys 192.. (causal, window(10,10)) or 64.. (window(None,-70)): the kv-blocks the clean rows skip
    poison = slice(64 if opts.get("window") == (None, -70) else 192, N)
    o, lse = _run_poisoned(inputs, poison, block_q=64, block_k=64, **opts)
    ref_o, ref_lse = flashlab.attention_reference(**inputs, **opts)
    np.testing.assert_allclose(o[:, :, clean_rows], ref_o[:, :, clean_rows], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse[:, :, clean_rows]), np.isneginf(ref_lse[:, :, clean_rows]))
    # and the poison works: rows whose tiles do touch the poisoned keys come out NaN
    assert np.isnan(o[:, :, clean_rows.stop:]).any()


def test_fully_masked_tiles_are_never_read():
    """A dense mask that hides keys 64..127 from every row: those tiles are skipped, so NaN in
    those keys cannot reach the output; without the mask it does."""
    N = 200
    inputs = make_qkv(1, 2, 1, N, N, 16, 16, dtype=np.float64, seed=8)
    mask = np.zeros((N, N), dtype=bool)
    mask[:, 64:128] = True
    o, _ = _run_poisoned(inputs, slice(64, 128), mask=mask, block_q=32, block_k=64)
    ref_o, _ = flashlab.attention_reference(**inputs, mask=mask)
    np.testing.assert_allclose(o, ref_o, rtol=0, atol=1e-12)
    o_unmasked, _ = _run_poisoned(inputs, slice(64, 128), block_q=32, block_k=64)
    assert np.isnan(o_unmasked).all()


# ---------------------------------------------------------------------------- rope operands
@pytest.mark.parametrize("Hr", [1, 2, 4], ids=lambda h: f"Hr{h}")
@pytest.mark.parametrize("kind", ["none", "causal", "mask(B,H,Sq,Sk)"])
def test_rope_operands_match_reference(kind, Hr):
    """q_rope (B, H, Sq, Dr) and k_rope (B, Hr, Sk, Dr), Hr = 1 being MLA's shared k_rope."""
    B, H, Sq, Sk = 2, 4, 129, 70
    inputs = make_qkv(B, H, 2, Sq, Sk, 128, 128, Dr=64, Hr=Hr, seed=Hr, q_scale=2.0)
    assert inputs["k_rope"].shape == (B, Hr, Sk, 64)
    check_forward(inputs, block_q=64, block_k=32, **mask_options(kind, B, H, Sq, Sk))


@pytest.mark.parametrize("Hkv", [1, 2, 4], ids=lambda h: f"Hkv{h}")
def test_rope_equals_concatenated_head_dim(Hkv):
    """Split accumulation equals one attention over the concatenated QK dim [q, q_rope] . [k, k_rope]."""
    B, H, Sq, Sk, Dr = 2, 4, 50, 77, 16
    x = make_qkv(B, H, Hkv, Sq, Sk, 48, 24, dtype=np.float64, Dr=Dr, Hr=1, seed=Hkv)
    q_cat = np.concatenate([x["q"], x["q_rope"]], axis=-1)
    # the one shared k_rope head, expanded to every kv head
    k_cat = np.concatenate([x["k"], np.repeat(x["k_rope"], Hkv, axis=1)], axis=-1)
    for opts in (dict(), dict(causal=True, window=(20, None))):
        o, lse = flashlab.flash_attention(**x, block_q=16, block_k=32, **opts)
        o_cat, lse_cat = flashlab.flash_attention(q_cat, k_cat, x["v"], block_q=16, block_k=32, **opts)
        ref, ref_lse = flashlab.attention_reference(**x, **opts)
        ref_cat, _ = flashlab.attention_reference(q_cat, k_cat, x["v"], **opts)
        np.testing.assert_allclose(o, o_cat, rtol=0, atol=1e-12)
        np.testing.assert_allclose(lse, lse_cat, rtol=1e-6)
        np.testing.assert_allclose(ref, ref_cat, rtol=0, atol=1e-12)
        np.testing.assert_allclose(o, ref, rtol=0, atol=1e-12)


# ------------------------------------------------------------------- hypothesis property test
@st.composite
def problems(draw):
    """Random shapes, heads, dims, blocks, dtype, rope and mask options."""
    B = draw(st.integers(1, 2))
    Hkv = draw(st.sampled_from([1, 2]))
    H = Hkv * draw(st.sampled_from([1, 2, 3]))
    Sq, Sk = draw(st.integers(1, 90)), draw(st.integers(1, 90))
    Dqk, Dv = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    Dr = draw(st.sampled_from([0, 0, 8]))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    q_scale = draw(st.sampled_from([1.0, 1.0, 10.0]))
    inputs = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, dtype=dtype, Dr=Dr, Hr=1,
                      seed=draw(st.integers(0, 2**16)), q_scale=q_scale)
    side = st.one_of(st.none(), st.integers(-10, 100))
    opts = dict(block_q=draw(st.integers(1, 70)), block_k=draw(st.integers(1, 70)),
                causal=draw(st.booleans()))
    if draw(st.booleans()):
        opts["window"] = (draw(side), draw(side))
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(Sq, Sk), (B, 1, Sq, Sk), (1, H, Sq, Sk), (B, H, Sq, Sk), (1, Sk)]))
        opts["mask"] = random_mask(shape, seed=draw(st.integers(0, 99)),
                                   p_masked=draw(st.sampled_from([0.1, 0.5, 0.95])), full_rows=0)
    return inputs, opts


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problems())
def test_property_random_problems(problem):
    inputs, opts = problem
    o, lse = check_forward(inputs, **opts)
    B, H, Sq, _ = inputs["q"].shape
    Sk = inputs["k"].shape[2]
    band_opts = {k: opts[k] for k in ("causal", "window", "mask") if k in opts}
    empty = ~dense_allowed(B, H, Sq, Sk, **band_opts).any(axis=-1)
    assert (o[empty] == 0).all() and np.isneginf(lse[empty]).all()
