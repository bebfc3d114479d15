"""Input validation: every bad input raises the documented error, naming the argument.

All public entry points share :func:`flashlab.checks.prepare`, so each case is run through the
kernel, the float64 reference and the naive implementation alike.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import flashlab
from conftest import make_qkv

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
    ("q-list", with_(q=good()["q"].tolist()), TypeError, r"q must be a numpy\.ndarray of shape \(B, H, Sq, Dqk\)"),
    ("k-int-scalar", with_(k=3), TypeError, r"k must be a numpy\.ndarray of shape \(B, Hkv, Sk, Dqk\)"),
    ("q-rank3", with_(q=f32(H, SQ, DQK)), ValueError, r"q must have shape " + esc("(B, H, Sq, Dqk)")),
    ("k-rank5", with_(k=f32(1, B, HKV, SK, DQK)), ValueError, r"k must have shape " + esc("(B, Hkv, Sk, Dqk)")),
    ("v-rank2", with_(v=f32(SK, DV)), ValueError, r"v must have shape " + esc("(B, Hkv, Sk, Dv)")),
    ("q-int-dtype", with_(q=np.zeros((B, H, SQ, DQK), dtype=np.int32)), TypeError, r"q must be float16, float32 or float64"),
    ("v-bool-dtype", with_(v=np.zeros((B, HKV, SK, DV), dtype=bool)), TypeError, r"v must be float16, float32 or float64"),
    ("k-complex", with_(k=np.zeros((B, HKV, SK, DQK), dtype=np.complex64)), TypeError, r"k must be float16"),
    ("q-empty-seq", with_(q=f32(B, H, 0, DQK)), ValueError, r"q must have every dim >= 1"),
    ("mixed-dtypes", with_(k=good()["k"].astype(np.float64)), TypeError, r"q, k, v must share one dtype"),
    # --- shapes that do not fit together
    ("batch", with_(k=f32(3, HKV, SK, DQK)), ValueError, r"k and v must have batch B=2"),
    ("v-batch", with_(v=f32(1, HKV, SK, DV)), ValueError, r"k and v must have batch B=2"),
    ("k-dqk", with_(k=f32(B, HKV, SK, DQK + 1)), ValueError, r"k must have shape " + esc("(B, Hkv, Sk, Dqk)") + r" with Dqk=8"),
    ("v-heads", with_(v=f32(B, HKV + 1, SK, DV)), ValueError, r"v must have shape " + esc("(B, Hkv, Sk, Dv) = (2, 2, 6, Dv)")),
    ("v-seq", with_(v=f32(B, HKV, SK + 1, DV)), ValueError, r"v must have shape " + esc("(B, Hkv, Sk, Dv) = (2, 2, 6, Dv)")),
    ("H%Hkv", with_(k=f32(B, 3, SK, DQK), v=f32(B, 3, SK, DV)), ValueError, r"H=4 must be a multiple of k's heads Hkv=3"),
    # --- scale
    ("scale=nan", dict(good(), scale=float("nan")), ValueError, r"scale must be finite"),
    ("scale=inf", dict(good(), scale=float("inf")), ValueError, r"scale must be finite"),
    ("scale=-inf", dict(good(), scale=-np.inf), ValueError, r"scale must be finite"),
    ("scale='0.5'", dict(good(), scale="0.5"), TypeError, r"scale must be a real number"),
    ("scale=True", dict(good(), scale=True), TypeError, r"scale must be a real number"),
    ("scale=array", dict(good(), scale=np.array([0.5])), TypeError, r"scale must be a real number"),
    # --- non-finite values
    ("q-nan", with_(q=np.where(np.arange(DQK) == 3, np.nan, good()["q"]).astype(np.float32)), ValueError, r"q, k or v contains NaN or inf"),
    ("k-inf", with_(k=np.full((B, HKV, SK, DQK), np.inf, dtype=np.float32)), ValueError, r"q, k or v contains NaN or inf"),
    ("v-neg-inf", with_(v=np.full((B, HKV, SK, DV), -np.inf, dtype=np.float32)), ValueError, r"q, k or v contains NaN or inf"),
    ("q_rope-nan", dict(good(), q_rope=np.full((B, H, SQ, 2), np.nan, dtype=np.float32), k_rope=f32(B, 1, SK, 2)),
     ValueError, r"q_rope or k_rope contains NaN or inf"),
    # --- mask
    ("mask-shape", dict(good(), mask=np.zeros((SQ, SK + 1), dtype=bool)), ValueError,
     r"mask must be broadcastable to " + esc("(B, H, Sq, Sk) = (2, 4, 5, 6)")),
    ("mask-heads", dict(good(), mask=np.zeros((B, 2, SQ, SK), dtype=bool)), ValueError, r"mask must be broadcastable to"),
    ("mask-rank5", dict(good(), mask=np.zeros((1, B, H, SQ, SK), dtype=bool)), ValueError, r"mask must be broadcastable to"),
    ("mask-float", dict(good(), mask=np.zeros((SQ, SK), dtype=np.float32)), TypeError, r"mask must have dtype bool"),
    ("mask-int", dict(good(), mask=np.zeros((SQ, SK), dtype=np.int8)), TypeError, r"mask must have dtype bool"),
    ("mask-list", dict(good(), mask=[[False] * SK] * SQ), TypeError, r"mask must be a numpy bool array"),
    # --- window and causal
    ("window-triple", dict(good(), window=(1, 2, 3)), ValueError, r"window must be a pair \(left, right\)"),
    ("window-int", dict(good(), window=4), ValueError, r"window must be a pair \(left, right\)"),
    ("window-str", dict(good(), window="ab"), ValueError, r"window must be a pair \(left, right\)"),
    ("window-float-left", dict(good(), window=(1.5, None)), TypeError, r"window left must be an int or None"),
    ("window-bool-right", dict(good(), window=(None, True)), TypeError, r"window right must be an int or None"),
    ("causal-int", dict(good(), causal=1), TypeError, r"causal must be a bool"),
    ("causal-str", dict(good(), causal="yes"), TypeError, r"causal must be a bool"),
    ("causal-None", dict(good(), causal=None), TypeError, r"causal must be a bool"),
    # --- rope operands
    ("q_rope-alone", dict(good(), q_rope=f32(B, H, SQ, 2)), ValueError, r"q_rope and k_rope must be given together"),
    ("k_rope-alone", dict(good(), k_rope=f32(B, 1, SK, 2)), ValueError, r"q_rope and k_rope must be given together"),
    ("q_rope-shape", dict(good(), q_rope=f32(B, H, SQ + 1, 2), k_rope=f32(B, 1, SK, 2)), ValueError,
     r"q_rope must have shape " + esc("(B, H, Sq, Dr) = (2, 4, 5, Dr)")),
    ("k_rope-dr", dict(good(), q_rope=f32(B, H, SQ, 2), k_rope=f32(B, 1, SK, 3)), ValueError,
     r"k_rope must have shape " + esc("(B, Hr, Sk, Dr) = (2, Hr, 6, 2)")),
    ("k_rope-heads", dict(good(), q_rope=f32(B, H, SQ, 2), k_rope=f32(B, 3, SK, 2)), ValueError,
     r"H=4 must be a multiple of k_rope's heads Hr=3"),
    ("k_rope-rank3", dict(good(), q_rope=f32(B, H, SQ, 2), k_rope=f32(B, SK, 2)), ValueError,
     r"k_rope must have shape " + esc("(B, Hr, Sk, Dr)")),
    ("q_rope-dtype", dict(good(), q_rope=np.zeros((B, H, SQ, 2)), k_rope=f32(B, 1, SK, 2)), TypeError,
     r"q_rope and k_rope must have q's dtype float32"),
]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kwargs, error, message", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises(entry, kwargs, error, message):
    with pytest.raises(error, match=message):
        entry(**kwargs)


# block sizes mean something only to the tiled kernel: the reference and the naive ignore them
BAD_BLOCKS = [
    ("block_q=0", dict(good(), block_q=0), ValueError, r"block_q must be >= 1"),
    ("block_k=-3", dict(good(), block_k=-3), ValueError, r"block_k must be >= 1"),
    ("block_q=2.0", dict(good(), block_q=2.0), TypeError, r"block_q must be an int >= 1"),
    ("block_k=True", dict(good(), block_k=True), TypeError, r"block_k must be an int >= 1"),
    ("block_k='8'", dict(good(), block_k="8"), TypeError, r"block_k must be an int >= 1"),
    ("block_q=None", dict(good(), block_q=None), TypeError, r"block_q must be an int >= 1"),
]


@pytest.mark.parametrize("entry", [flashlab.flash_attention, flashlab.tiles_computed], ids=lambda f: f.__name__)
@pytest.mark.parametrize("kwargs, error, message", [c[1:] for c in BAD_BLOCKS], ids=[c[0] for c in BAD_BLOCKS])
def test_bad_block_size_raises(entry, kwargs, error, message):
    with pytest.raises(error, match=message):
        entry(**kwargs)


def test_backward_reference_checks_do_shape():
    args = good()
    with pytest.raises(ValueError, match=r"do must have the output's shape " + esc("(B, H, Sq, Dv) = (2, 4, 5, 3)")):
        flashlab.attention_reference_backward(np.zeros((B, H, SQ, DQK)), **args)


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
