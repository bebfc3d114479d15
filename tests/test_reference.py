"""The float64 reference is itself checked: against a per-row Python loop written from the
definition, and its analytic backward against central finite differences."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_qkv

import flashlab


# --------------------------------------------------------------------- forward, row by row
def attention_loop(q, k, v, *, scale=None, causal=False, window=None, mask=None,
                   q_rope=None, k_rope=None):
    """Attention from the definition, one (b, h, i) row at a time, in float64.

    Query head h reads kv head ``h // (H // Hkv)`` and rope head ``h // (H // Hr)``; key j is
    allowed for row i iff ``j <= i`` (causal), ``i - left <= j <= i + right`` (window) and not
    ``mask[b, h, i, j]``. A row with no allowed key: o = 0, lse = -inf.
    """
    B, H, Sq, Dqk = q.shape
    Hkv, Sk, Dv = k.shape[1], k.shape[2], v.shape[3]
    Dr = 0 if q_rope is None else q_rope.shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(Dqk + Dr)
    if mask is not None:
        mask = np.broadcast_to(mask, (B, H, Sq, Sk))
    o = np.zeros((B, H, Sq, Dv))
    lse = np.full((B, H, Sq), -np.inf)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            for i in range(Sq):
                scores, keys = [], []
                for j in range(Sk):
                    if causal and j > i:
                        continue
                    if window is not None:
                        if window[0] is not None and j < i - window[0]:
                            continue
                        if window[1] is not None and j > i + window[1]:
                            continue
                    if mask is not None and mask[b, h, i, j]:
                        continue
                    s = sum(float(q[b, h, i, d]) * float(k[b, g, j, d]) for d in range(Dqk))
                    if q_rope is not None:
                        gr = h // (H // k_rope.shape[1])
                        s += sum(float(q_rope[b, h, i, d]) * float(k_rope[b, gr, j, d]) for d in range(Dr))
                    scores.append(scale * s)
                    keys.append(j)
                if not keys:
                    continue
                m = max(scores)
                weights = [math.exp(s - m) for s in scores]
                total = sum(weights)
                lse[b, h, i] = m + math.log(total)
                for w, j in zip(weights, keys):
                    o[b, h, i] += (w / total) * v[b, g, j].astype(np.float64)
    return o, lse


def _mask(shape, seed=0, p=0.4):
    m = np.random.default_rng(seed).random(shape) < p
    m[..., 1, :] = True  # a row with no allowed key
    return m


LOOP_CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window(1,2)": dict(window=(1, 2)),
    "window(-1,3)": dict(window=(-1, 3)),
    "window(None,-1)": dict(window=(None, -1)),
    "window(2,None)+causal": dict(window=(2, None), causal=True),
    "mask(B,1,Sq,Sk)": dict(mask=_mask((2, 1, 5, 7))),
    "mask(Sq,Sk)+causal": dict(mask=_mask((5, 7), seed=1), causal=True),
    "scale=0.9": dict(scale=0.9),
}


@pytest.mark.parametrize("rope", [False, True], ids=["no-rope", "rope(Hr=1)"])
@pytest.mark.parametrize("Hkv", [1, 2, 4], ids=lambda h: f"H4-Hkv{h}")
@pytest.mark.parametrize("opts", LOOP_CASES.values(), ids=LOOP_CASES.keys())
def test_reference_equals_row_loop(opts, Hkv, rope):
    x = make_qkv(2, 4, Hkv, 5, 7, 3, 2, dtype=np.float64, Dr=2 if rope else 0, Hr=1, seed=Hkv)
    o, lse = flashlab.attention_reference(**x, **opts)
    o_loop, lse_loop = attention_loop(**x, **opts)
    assert o.dtype == np.float64 and lse.dtype == np.float64
    np.testing.assert_allclose(o, o_loop, rtol=0, atol=1e-13)
    np.testing.assert_allclose(lse, lse_loop, rtol=1e-13, atol=1e-13)  # equal infs compare equal
    assert (o[np.isneginf(lse_loop)] == 0).all()


def test_reference_takes_float32_and_float16_inputs_exactly():
    """The reference computes in float64 whatever the inputs' dtype (values converted exactly)."""
    x = make_qkv(1, 2, 1, 6, 9, 4, 3, dtype=np.float16, seed=3)
    o, lse = flashlab.attention_reference(**x, causal=True)
    o_loop, lse_loop = attention_loop(**{n: a.astype(np.float64) for n, a in x.items()}, causal=True)
    assert o.dtype == np.float64
    np.testing.assert_allclose(o, o_loop, rtol=0, atol=1e-13)
    np.testing.assert_allclose(lse, lse_loop, rtol=1e-13, atol=1e-13)


def test_reference_probs_rows_sum_to_one_or_zero():
    x = make_qkv(1, 2, 2, 6, 6, 4, 4, dtype=np.float64)
    o, lse, p = flashlab.attention_reference(**x, window=(None, -2), return_probs=True)
    sums = p.sum(axis=-1)
    np.testing.assert_allclose(sums[..., 2:], 1.0, rtol=1e-14)
    assert (sums[..., :2] == 0).all() and np.isneginf(lse[..., :2]).all()
    np.testing.assert_allclose(o, p @ x["v"], rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_naive_dtypes_and_values(dtype):
    """attention_naive computes in the inputs' dtype: o in that dtype, lse float64 for float64
    inputs (float32 otherwise, as the kernel's), close to the truth."""
    x = make_qkv(1, 2, 1, 8, 9, 16, 8, dtype=dtype, seed=4)
    o, lse = flashlab.attention_naive(**x, causal=True)
    ref, ref_lse = flashlab.attention_reference(**x, causal=True)
    assert o.dtype == dtype and lse.dtype == (np.float64 if dtype == np.float64 else np.float32)
    tol = {np.float16: 5e-3, np.float32: 1e-6, np.float64: 1e-14}[dtype]
    np.testing.assert_allclose(o, ref, rtol=0, atol=tol)
    if dtype == np.float64:
        assert np.array_equal(o, ref)  # the same algorithm in the same precision
    else:
        assert not np.array_equal(o.astype(np.float64), ref)  # really computed in low precision


# --------------------------------------------------------------- backward, finite differences
def _loss(x: dict, do: np.ndarray, opts: dict) -> float:
    o, _ = flashlab.attention_reference(**x, **opts)
    return float((o * do).sum())


def finite_difference_grads(x: dict, do: np.ndarray, opts: dict, eps: float = 1e-6) -> dict:
    """Central differences of ``sum(o * do)`` for every element of every operand."""
    grads = {}
    for name, arr in x.items():
        g = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            plus = {n: a.copy() for n, a in x.items()}
            minus = {n: a.copy() for n, a in x.items()}
            plus[name][idx] += eps
            minus[name][idx] -= eps
            g[idx] = (_loss(plus, do, opts) - _loss(minus, do, opts)) / (2 * eps)
        grads[name] = g
    return grads


FD_CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window(1,0)": dict(window=(1, 0)),
    "mask+empty-row": dict(mask=_mask((3, 4), seed=2)),
    "scale=0.7": dict(scale=0.7),
}


@pytest.mark.parametrize("rope", [False, True], ids=["no-rope", "rope(Hr=1)"])
@pytest.mark.parametrize("opts", FD_CASES.values(), ids=FD_CASES.keys())
def test_reference_backward_matches_finite_differences(opts, rope):
    """Tiny float64 GQA case (H=2, Hkv=1): dq, dk, dv (+ dq_rope, dk_rope) match central differences."""
    x = make_qkv(1, 2, 1, 3, 4, 3, 2, dtype=np.float64, Dr=2 if rope else 0, Hr=1, seed=5)
    do = np.random.default_rng(6).standard_normal((1, 2, 3, 2))
    analytic = flashlab.attention_reference_backward(do, **x, **opts)
    names = ["q", "k", "v"] + (["q_rope", "k_rope"] if rope else [])
    assert len(analytic) == len(names)
    numeric = finite_difference_grads(x, do, opts)
    for name, g in zip(names, analytic):
        assert g.shape == x[name].shape, name
        np.testing.assert_allclose(g, numeric[name], rtol=1e-6, atol=1e-8, err_msg=name)
    if "mask" in opts:
        # the fully masked row contributes nothing: its dq is exactly 0
        assert (analytic[0][:, :, 1] == 0).all()
