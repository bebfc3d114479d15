"""Input validation: every bad input raises the documented error, naming the argument and the
expected shape or value (each regex below checks both, and what was given).

All public entry points share :func:`flashlab.validation.prepare`, so each case is run through the
kernel, the float64 reference and the naive implementation alike.
"""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
from conftest import make_qkv

import flashlab
from flashlab import api, cann, tiling, validation

ENTRY_POINTS = [flashlab.flash_attention, flashlab.attention_reference, flashlab.attention_naive,
                flashlab.tiles_computed]

B, H, HKV, SQ, SK, DQK, DV = 2, 4, 2, 5, 6, 8, 3


def good() -> dict:
    """Valid float32 operands q (2, 4, 5, 8), k (2, 2, 6, 8), v (2, 2, 6, 3)."""
    return make_qkv(B, H, HKV, SQ, SK, DQK, DV)


def with_(**changes) -> dict:
    """Valid operands with some replaced (a value of ``None`` removes the argument)."""
    args = good()
    args.update(changes)
    return {k: v for k, v in args.items() if v is not None}


def f32(*shape) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


def esc(s: str) -> str:
    return re.escape(s)


# (id, keyword arguments, error type, regex the message must match: argument name + expectation)
BAD_INPUTS = [
    # --- the operands: type, rank, dtype
    ("q-list", with_(q=good()["q"].tolist()), TypeError, esc("q must be a numpy.ndarray of shape (B, H, Sq, Dqk); got list")),
    ("k-int-scalar", with_(k=3), TypeError, esc("k must be a numpy.ndarray of shape (B, Hkv, Sk, Dqk); got int")),
    ("q-rank3", with_(q=f32(H, SQ, DQK)), ValueError, esc("q must have shape (B, H, Sq, Dqk) (4 dims); got shape (4, 5, 8)")),
    ("k-rank5", with_(k=f32(1, B, HKV, SK, DQK)), ValueError,
     esc("k must have shape (B, Hkv, Sk, Dqk) (4 dims); got shape (1, 2, 2, 6, 8)")),
    ("v-rank2", with_(v=f32(SK, DV)), ValueError, esc("v must have shape (B, Hkv, Sk, Dv) (4 dims); got shape (6, 3)")),
    ("q-int-dtype", with_(q=np.zeros((B, H, SQ, DQK), dtype=np.int32)), TypeError, r"q must be float16, bfloat16, float32 or float64; got dtype int32"),
    ("v-bool-dtype", with_(v=np.zeros((B, HKV, SK, DV), dtype=bool)), TypeError, r"v must be float16, bfloat16, float32 or float64; got dtype bool"),
    ("k-complex", with_(k=np.zeros((B, HKV, SK, DQK), dtype=np.complex64)), TypeError, r"k must be float16, bfloat16, float32 or float64; got dtype complex64"),
    ("q-empty-seq", with_(q=f32(B, H, 0, DQK)), ValueError, esc("q must have every dim >= 1 for shape (B, H, Sq, Dqk); got shape (2, 4, 0, 8)")),
    ("mixed-dtypes", with_(k=good()["k"].astype(np.float64)), TypeError, r"k must have q's dtype float32 .*; got float64"),
    ("v-float16", with_(v=good()["v"].astype(np.float16)), TypeError, r"v must have q's dtype float32 .*; got float16"),
    # --- shapes that do not fit together
    ("k-batch", with_(k=f32(3, HKV, SK, DQK)), ValueError,
     esc("k must have shape (B, Hkv, Sk, Dqk) with B=2 like q; got (3, 2, 6, 8)")),
    ("v-batch", with_(v=f32(1, HKV, SK, DV)), ValueError,
     esc("v must have shape (B, Hkv, Sk, Dv) = (2, 2, 6, Dv) as k; got (1, 2, 6, 3)")),
    ("k-dqk", with_(k=f32(B, HKV, SK, DQK + 1)), ValueError,
     esc("k must have shape (B, Hkv, Sk, Dqk) with Dqk=8 as q; got (2, 2, 6, 9)")),
    ("v-heads", with_(v=f32(B, HKV + 1, SK, DV)), ValueError,
     esc("v must have shape (B, Hkv, Sk, Dv) = (2, 2, 6, Dv) as k; got (2, 3, 6, 3)")),
    ("v-seq", with_(v=f32(B, HKV, SK + 1, DV)), ValueError,
     esc("v must have shape (B, Hkv, Sk, Dv) = (2, 2, 6, Dv) as k; got (2, 2, 7, 3)")),
    ("H%Hkv", with_(k=f32(B, 3, SK, DQK), v=f32(B, 3, SK, DV)), ValueError,
     esc("k must have shape (B, Hkv, Sk, Dqk) with q's heads H=4 a multiple of k's heads Hkv "
         "(GQA: H % Hkv == 0); got k (2, 3, 6, 8) for q (2, 4, 5, 8)")),
    # --- scale
    ("scale=nan", dict(good(), scale=float("nan")), ValueError, r"scale must be finite; got nan"),
    ("scale=inf", dict(good(), scale=float("inf")), ValueError, r"scale must be finite; got inf"),
    ("scale=-inf", dict(good(), scale=-np.inf), ValueError, r"scale must be finite; got -inf"),
    ("scale='0.5'", dict(good(), scale="0.5"), TypeError, r"scale must be a real number or None; got '0\.5'"),
    ("scale=True", dict(good(), scale=True), TypeError, r"scale must be a real number or None; got True"),
    ("scale=array", dict(good(), scale=np.array([0.5])), TypeError, r"scale must be a real number or None; got array"),
    # --- non-finite values
    ("q-nan", with_(q=np.where(np.arange(DQK) == 3, np.nan, good()["q"]).astype(np.float32)), ValueError, r"^q contains NaN or inf; attention inputs must be finite"),
    ("k-inf", with_(k=np.full((B, HKV, SK, DQK), np.inf, dtype=np.float32)), ValueError, r"^k contains NaN or inf; attention inputs must be finite"),
    ("v-neg-inf", with_(v=np.full((B, HKV, SK, DV), -np.inf, dtype=np.float32)), ValueError, r"^v contains NaN or inf; attention inputs must be finite"),
    ("q_rope-nan", dict(good(), q_rope=np.full((B, H, SQ, 2), np.nan, dtype=np.float32), k_rope=f32(B, 1, SK, 2)),
     ValueError, r"^q_rope contains NaN or inf; attention inputs must be finite"),
    ("k_rope-inf", dict(good(), q_rope=f32(B, H, SQ, 2), k_rope=np.full((B, 1, SK, 2), np.inf, dtype=np.float32)),
     ValueError, r"^k_rope contains NaN or inf; attention inputs must be finite"),
    # --- mask
    ("mask-shape", dict(good(), mask=np.zeros((SQ, SK + 1), dtype=bool)), ValueError,
     esc("mask must be broadcastable to (B, H, Sq, Sk) = (2, 4, 5, 6); got shape (5, 7)")),
    ("mask-heads", dict(good(), mask=np.zeros((B, 2, SQ, SK), dtype=bool)), ValueError,
     esc("mask must be broadcastable to (B, H, Sq, Sk) = (2, 4, 5, 6); got shape (2, 2, 5, 6)")),
    ("mask-rank5", dict(good(), mask=np.zeros((1, B, H, SQ, SK), dtype=bool)), ValueError,
     esc("mask must be broadcastable to (B, H, Sq, Sk) = (2, 4, 5, 6); got shape (1, 2, 4, 5, 6)")),
    ("mask-float", dict(good(), mask=np.zeros((SQ, SK), dtype=np.float32)), TypeError,
     r"mask must have dtype bool \(True = masked out\); got float32"),
    ("mask-int", dict(good(), mask=np.zeros((SQ, SK), dtype=np.int8)), TypeError,
     r"mask must have dtype bool \(True = masked out\); got int8"),
    ("mask-list", dict(good(), mask=[[False] * SK] * SQ), TypeError,
     esc("mask must be a numpy bool array broadcastable to (B, H, Sq, Sk) = (2, 4, 5, 6); got list")),
    # --- window and causal
    ("window-triple", dict(good(), window=(1, 2, 3)), ValueError, esc("window must be a pair (left, right) of ints or None; got 3 items (1, 2, 3)")),
    ("window-int", dict(good(), window=4), TypeError, r"window must be a pair \(left, right\) of ints or None; got 4 \(int\)"),
    ("window-str", dict(good(), window="ab"), TypeError, r"window must be a pair \(left, right\) of ints or None; got 'ab' \(str\)"),
    ("window-float-left", dict(good(), window=(1.5, None)), TypeError, r"window left must be an int or None; got 1\.5"),
    ("window-bool-right", dict(good(), window=(None, True)), TypeError, r"window right must be an int or None; got True"),
    ("causal-int", dict(good(), causal=1), TypeError, r"causal must be a bool; got 1"),
    ("causal-str", dict(good(), causal="yes"), TypeError, r"causal must be a bool; got 'yes'"),
    ("causal-None", dict(good(), causal=None), TypeError, r"causal must be a bool; got None"),
    # --- rope operands
    ("q_rope-alone", dict(good(), q_rope=f32(B, H, SQ, 2)), ValueError, esc("q_rope and k_rope must be given together (or neither)")),
    ("k_rope-alone", dict(good(), k_rope=f32(B, 1, SK, 2)), ValueError, esc("q_rope and k_rope must be given together (or neither)")),
    ("q_rope-shape", dict(good(), q_rope=f32(B, H, SQ + 1, 2), k_rope=f32(B, 1, SK, 2)), ValueError,
     esc("q_rope must have shape (B, H, Sq, Dr) = (2, 4, 5, Dr); got (2, 4, 6, 2)")),
    ("k_rope-dr", dict(good(), q_rope=f32(B, H, SQ, 2), k_rope=f32(B, 1, SK, 3)), ValueError,
     esc("k_rope must have shape (B, Hr, Sk, Dr) = (2, Hr, 6, 2); got (2, 1, 6, 3)")),
    ("k_rope-heads", dict(good(), q_rope=f32(B, H, SQ, 2), k_rope=f32(B, 3, SK, 2)), ValueError,
     esc("k_rope must have shape (B, Hr, Sk, Dr) with q's heads H=4 a multiple of k_rope's heads Hr "
         "(H % Hr == 0); got k_rope (2, 3, 6, 2)")),
    ("k_rope-rank3", dict(good(), q_rope=f32(B, H, SQ, 2), k_rope=f32(B, SK, 2)), ValueError,
     esc("k_rope must have shape (B, Hr, Sk, Dr) (4 dims); got shape (2, 6, 2)")),
    ("q_rope-dtype", dict(good(), q_rope=np.zeros((B, H, SQ, 2)), k_rope=f32(B, 1, SK, 2)), TypeError,
     r"q_rope must have q's dtype float32; got float64"),
    ("k_rope-dtype", dict(good(), q_rope=f32(B, H, SQ, 2), k_rope=np.zeros((B, 1, SK, 2), dtype=np.float16)), TypeError,
     r"k_rope must have q's dtype float32; got float16"),
]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kwargs, error, message", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises(entry, kwargs, error, message):
    with pytest.raises(error, match=message):
        entry(**kwargs)


# block sizes mean something only to the tiled kernel: the reference and the naive ignore them
BAD_BLOCKS = [
    ("block_q=0", dict(good(), block_q=0), ValueError, r"block_q must be >= 1; got 0"),
    ("block_k=-3", dict(good(), block_k=-3), ValueError, r"block_k must be >= 1; got -3"),
    ("block_q=2.0", dict(good(), block_q=2.0), TypeError, r"block_q must be an int >= 1; got 2\.0"),
    ("block_k=True", dict(good(), block_k=True), TypeError, r"block_k must be an int >= 1; got True"),
    ("block_k='8'", dict(good(), block_k="8"), TypeError, r"block_k must be an int >= 1; got '8'"),
    ("block_q=None", dict(good(), block_q=None), TypeError, r"block_q must be an int >= 1; got None"),
]


@pytest.mark.parametrize("entry", [flashlab.flash_attention, flashlab.tiles_computed], ids=lambda f: f.__name__)
@pytest.mark.parametrize("kwargs, error, message", [c[1:] for c in BAD_BLOCKS], ids=[c[0] for c in BAD_BLOCKS])
def test_bad_block_size_raises(entry, kwargs, error, message):
    with pytest.raises(error, match=message):
        entry(**kwargs)


def test_backward_reference_checks_do_shape():
    args = good()
    with pytest.raises(ValueError, match=r"do must have shape " + esc("(B, H, Sq, Dv) = (2, 4, 5, 3)")):
        flashlab.attention_reference_backward(np.zeros((B, H, SQ, DQK)), **args)


# ------------------------------------------------------------------- default tile sizes
@pytest.mark.parametrize("fn, default", [
    (validation.prepare, api.FORWARD_BLOCK),
    (flashlab.flash_attention, api.FORWARD_BLOCK),
    (flashlab.tiles_computed, api.FORWARD_BLOCK),
    (cann.flash_attention_score, api.FORWARD_BLOCK),
    (flashlab.flash_attention_backward, api.BACKWARD_BLOCK),
    (cann.flash_attention_score_grad, api.BACKWARD_BLOCK),
], ids=lambda x: getattr(x, "__name__", str(x)))
def test_default_tiles_have_one_source(fn, default):
    """Every function taking flash_attention's arguments defaults to flash_attention's tiles
    (the backward ones to the backward's), all read from flashlab.tiling. (walk_forward hands
    its options to prepare and has no defaults of its own: tests/test_walk.py checks its tiles.)"""
    params = inspect.signature(fn).parameters
    assert (params["block_q"].default, params["block_k"].default) == default
    assert api.FORWARD_BLOCK is tiling.FORWARD_BLOCK and api.BACKWARD_BLOCK is tiling.BACKWARD_BLOCK


def test_tiles_computed_defaults_to_the_kernels_tiles():
    """Without block sizes, tiles_computed counts the tiles of the call flash_attention makes."""
    args = make_qkv(1, 1, 1, 600, 300, 4, 4)
    tiles = flashlab.tiles_computed(**args, causal=True)
    bq, bk = api.FORWARD_BLOCK
    assert tiles.shape == (1, 1, -(-600 // bq))
    np.testing.assert_array_equal(tiles, flashlab.tiles_computed(**args, causal=True, block_q=bq, block_k=bk))
    assert validation.prepare(**args).block_q == bq and validation.prepare(**args).block_k == bk


# ------------------------------------------------------------------- inputs that are accepted
def test_accepted_variants_give_the_same_result():
    """Non-contiguous and read-only views, numpy scalar options and a list window are valid
    inputs and give the same result as plain C-contiguous arrays and Python scalars."""
    args = make_qkv(1, 2, 1, 33, 20, 16, 8, dtype=np.float64)
    base_o, base_lse = flashlab.flash_attention(**args, window=(4, None), causal=True, block_q=8, block_k=8,
                                                scale=0.3)
    # q as a transposed view (not C-contiguous), k read-only, v Fortran-ordered
    q_t = np.ascontiguousarray(args["q"].swapaxes(2, 3)).swapaxes(2, 3)
    k_ro = args["k"].copy()
    k_ro.flags.writeable = False
    v_f = np.asfortranarray(args["v"])
    o, lse = flashlab.flash_attention(q_t, k_ro, v_f, window=[np.int64(4), None], causal=np.bool_(True),
                                      block_q=np.int32(8), block_k=8, scale=np.float32(0.3))
    np.testing.assert_allclose(o, base_o, rtol=0, atol=1e-7)  # scale 0.3 vs float32(0.3) differ
    np.testing.assert_allclose(lse, base_lse, rtol=1e-6)


def test_mask_of_fewer_dims_broadcasts():
    """Masks of shape (Sk,), (1, Sk), (Sq, 1), (H, Sq, Sk) broadcast like numpy's rules say."""
    args = make_qkv(2, 2, 1, 6, 7, 4, 4, dtype=np.float64)
    full = np.random.default_rng(0).random((2, 2, 6, 7)) < 0.4
    for m in (full[0, 0, 0], full[0, 0, :1], full[0, 0, :, :1], full[0]):
        o, lse = flashlab.flash_attention(**args, mask=m, block_q=4, block_k=3)
        ref, ref_lse = flashlab.attention_reference(**args, mask=np.broadcast_to(m, full.shape).copy())
        np.testing.assert_allclose(o, ref, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
