"""flashlab.cann's RoPE operands (query_rope / key_rope, the MLA form of FlashAttentionScore).

Scores are ``scale * (Q K^T + Q_rope K_rope^T)``. Checked in every layout against the float64
reference on (B, N, S, D) data (conftest's tolerance rule), against the same operator fed the
concatenations ``[Q, Q_rope]`` and ``[K, K_rope per kv head]`` (no reference code involved),
for the gradients (dq_rope, dk_rope included, dk_rope summed over the heads sharing it), with
sparse modes and TND, and for bad rope operands. Layout conversions are this file's own.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close_to_reference, max_abs_err

import flashlab
from flashlab import cann

LAYOUTS4 = ["BSH", "SBH", "BSND", "BNSD"]
B, N1, N2, S, D, DR, DV = 2, 4, 2, 19, 16, 8, 12
SCALE = 1.0 / np.sqrt(D + DR)
TRI = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
GRAD_RTOL32 = 1e-5


def to_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """(B, N, S, D) -> layout, written here from the layout names."""
    b, n, s, d = x.shape
    if layout == "BSH":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(b, s, n * d))
    if layout == "SBH":
        return np.ascontiguousarray(x.transpose(2, 0, 1, 3).reshape(s, b, n * d))
    if layout == "BSND":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    return x


def from_layout(y: np.ndarray, layout: str, n: int) -> np.ndarray:
    """layout -> (B, N, S, D)."""
    if layout == "BSH":
        b, s, h = y.shape
        return y.reshape(b, s, n, h // n).transpose(0, 2, 1, 3)
    if layout == "SBH":
        s, b, h = y.shape
        return y.reshape(s, b, n, h // n).transpose(1, 2, 0, 3)
    if layout == "BSND":
        return y.transpose(0, 2, 1, 3)
    return y


def operands(nr: int, sq: int = S, sk: int = S, dtype=np.float32, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    shapes = {"q": (B, N1, sq, D), "k": (B, N2, sk, D), "v": (B, N2, sk, DV),
              "q_rope": (B, N1, sq, DR), "k_rope": (B, nr, sk, DR), "do": (B, N1, sq, DV)}
    return {n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()}


def call(x: dict, layout: str, **kw):
    return cann.flash_attention_score(
        to_layout(x["q"], layout), to_layout(x["k"], layout), to_layout(x["v"], layout), N1, layout,
        query_rope=to_layout(x["q_rope"], layout), key_rope=to_layout(x["k_rope"], layout),
        scale=SCALE, **kw)


def call_grad(x: dict, layout: str, out, smax, ssum, **kw):
    return cann.flash_attention_score_grad(
        to_layout(x["q"], layout), to_layout(x["k"], layout), to_layout(x["v"], layout),
        to_layout(x["do"], layout), N1, layout, softmax_max=smax, softmax_sum=ssum,
        attention_in=out, query_rope=to_layout(x["q_rope"], layout),
        key_rope=to_layout(x["k_rope"], layout), scale=SCALE, **kw)


MODES = {
    # the RoPE inputs need an atten_mask: mode 0 with an all-False one is full attention
    "mode0": (dict(atten_mask=np.zeros((S, S), dtype=bool)), False),
    "mode2-leftUpCausal": (dict(sparse_mode=2, atten_mask=TRI), True),
    "mode3-rightDownCausal": (dict(sparse_mode=3, atten_mask=TRI), True),   # Sq = Sk: the same band
}


@pytest.mark.parametrize("mode", MODES, ids=MODES.keys())
@pytest.mark.parametrize("nr", [1, 2], ids=["Nr1-shared", "Nr2"])
@pytest.mark.parametrize("layout", LAYOUTS4)
def test_forward_and_grad_match_reference(layout, nr, mode):
    kw, causal = MODES[mode]
    x = operands(nr, seed=nr)
    ops = dict(q_rope=x["q_rope"], k_rope=x["k_rope"], scale=SCALE, causal=causal)
    out, smax, ssum = call(x, layout, **kw)
    o = from_layout(out, layout, N1)
    lse = smax[..., 0] + np.log(ssum[..., 0])
    ref_o, ref_lse = flashlab.attention_reference(x["q"], x["k"], x["v"], **ops)
    naive_o, naive_lse = flashlab.attention_naive(x["q"], x["k"], x["v"], **ops)
    assert out.shape == to_layout(x["do"], layout).shape and smax.shape == (B, N1, S, 8)
    assert_close_to_reference(o, lse, naive_o, naive_lse, ref_o, ref_lse, what=f"{layout} {mode}")

    grads = call_grad(x, layout, out, smax, ssum, **kw)
    assert len(grads) == 5
    refs = flashlab.attention_reference_backward(x["do"], x["q"], x["k"], x["v"], **ops)
    heads = (N1, N2, N2, N1, nr)
    for name, g, n, ref in zip(("dq", "dk", "dv", "dq_rope", "dk_rope"), grads, heads, refs):
        g4 = from_layout(g, layout, n)
        assert g4.shape == ref.shape, name
        assert max_abs_err(g4, ref) <= GRAD_RTOL32 * np.abs(ref).max(), f"{layout} {mode} {name}"


@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_rope_equals_the_concatenated_operator(layout):
    """Split operands == the plain operator fed [Q, Q_rope] and [K, K_rope copied per kv head]."""
    x = operands(1, sq=13, sk=21, seed=5)
    full = np.zeros((13, 21), dtype=bool)
    out, smax, ssum = call(x, layout, atten_mask=full)
    k_rope_kv = np.repeat(x["k_rope"], N2, axis=1)
    q_cat = np.concatenate([x["q"], x["q_rope"]], axis=-1)
    k_cat = np.concatenate([x["k"], k_rope_kv], axis=-1)
    out_c, smax_c, ssum_c = cann.flash_attention_score(
        to_layout(q_cat, layout), to_layout(k_cat, layout), to_layout(x["v"], layout), N1, layout,
        scale=SCALE)
    np.testing.assert_allclose(out, out_c, atol=2e-6)
    np.testing.assert_allclose(smax, smax_c, atol=2e-6)
    np.testing.assert_allclose(ssum, ssum_c, rtol=2e-6)
    grads = cann.flash_attention_score_grad(
        to_layout(x["q"], layout), to_layout(x["k"], layout), to_layout(x["v"], layout),
        to_layout(x["do"], layout), N1, layout, softmax_max=smax, softmax_sum=ssum,
        attention_in=out, query_rope=to_layout(x["q_rope"], layout),
        key_rope=to_layout(x["k_rope"], layout), scale=SCALE, atten_mask=full)
    dq_c, dk_c, dv_c = (from_layout(g, layout, n) for g, n in zip(cann.flash_attention_score_grad(
        to_layout(q_cat, layout), to_layout(k_cat, layout), to_layout(x["v"], layout),
        to_layout(x["do"], layout), N1, layout, softmax_max=smax, softmax_sum=ssum,
        attention_in=out, scale=SCALE), (N1, N2, N2)))
    dq, dk, dv, dq_rope, dk_rope = (from_layout(g, layout, n) for g, n in zip(grads, (N1, N2, N2, N1, 1)))
    np.testing.assert_allclose(dq, dq_c[..., :D], atol=1e-5)
    np.testing.assert_allclose(dq_rope, dq_c[..., D:], atol=1e-5)
    np.testing.assert_allclose(dk, dk_c[..., :D], atol=1e-5)
    np.testing.assert_allclose(dv, dv_c, atol=1e-5)
    # the shared key_rope's gradient is the sum over the kv heads that received a copy
    np.testing.assert_allclose(dk_rope, dk_c[..., D:].sum(axis=1, keepdims=True), atol=1e-5)


def test_tnd_varlen_with_rope():
    """Two sequences packed along T (lengths q 5, 9; kv 7, 9), causal per sequence (mode 3)."""
    rng = np.random.default_rng(7)
    q_lens, k_lens = [5, 9], [7, 9]
    Tq, Tk = sum(q_lens), sum(k_lens)
    q = rng.standard_normal((Tq, N1, D)).astype(np.float32)
    k = rng.standard_normal((Tk, N2, D)).astype(np.float32)
    v = rng.standard_normal((Tk, N2, DV)).astype(np.float32)
    qr = rng.standard_normal((Tq, N1, DR)).astype(np.float32)
    kr = rng.standard_normal((Tk, 1, DR)).astype(np.float32)
    do = rng.standard_normal((Tq, N1, DV)).astype(np.float32)
    opts = dict(scale=SCALE, sparse_mode=3, atten_mask=TRI, actual_seq_qlen=np.cumsum(q_lens),
                actual_seq_kvlen=np.cumsum(k_lens))
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "TND", query_rope=qr, key_rope=kr, **opts)
    grads = cann.flash_attention_score_grad(q, k, v, do, N1, "TND", softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, query_rope=qr, key_rope=kr, **opts)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, qr.shape, kr.shape]
    q0 = k0 = 0
    for sq, sk in zip(q_lens, k_lens):
        qs, ks = slice(q0, q0 + sq), slice(k0, k0 + sk)
        bnsd = [a[rows].transpose(1, 0, 2)[None] for a, rows in
                ((q, qs), (k, ks), (v, ks), (qr, qs), (kr, ks), (do, qs))]
        # mode 3 (rightDownCausal): key j allowed iff j <= i + (sk - sq)
        ops = dict(q_rope=bnsd[3], k_rope=bnsd[4], scale=SCALE, window=(None, sk - sq))
        ref_o, _ = flashlab.attention_reference(*bnsd[:3], **ops)
        refs = flashlab.attention_reference_backward(bnsd[5], *bnsd[:3], **ops)
        assert max_abs_err(out[qs].transpose(1, 0, 2)[None], ref_o) < 1e-5
        for g, rows, ref in zip(grads, (qs, ks, ks, qs, ks), refs):
            assert max_abs_err(g[rows].transpose(1, 0, 2)[None], ref) <= GRAD_RTOL32 * np.abs(ref).max()
        q0, k0 = q0 + sq, k0 + sk


def test_without_rope_the_grad_still_returns_three():
    x = operands(1)
    out, smax, ssum = cann.flash_attention_score(x["q"], x["k"], x["v"], N1, "BNSD", scale=SCALE)
    grads = cann.flash_attention_score_grad(x["q"], x["k"], x["v"], x["do"], N1, "BNSD",
                                            softmax_max=smax, softmax_sum=ssum, attention_in=out,
                                            scale=SCALE)
    assert len(grads) == 3


def _bad(layout="BNSD", **change):
    x = operands(1)
    kw = dict(query_rope=to_layout(x["q_rope"], layout), key_rope=to_layout(x["k_rope"], layout),
              atten_mask=np.zeros((S, S), dtype=bool))
    kw.update(change)
    return lambda: cann.flash_attention_score(to_layout(x["q"], layout), to_layout(x["k"], layout),
                                              to_layout(x["v"], layout), N1, layout, scale=SCALE, **kw)


@pytest.mark.parametrize("call_, exc, match", [
    (_bad(key_rope=None), ValueError, "given together"),
    (_bad(query_rope=None), ValueError, "given together"),
    (_bad(query_rope=np.zeros((B, N1, S, DR))), TypeError, "query's dtype"),
    (_bad(query_rope=[[0.0]]), TypeError, "query_rope must be a numpy.ndarray"),
    (_bad(key_rope=np.zeros((B, 3, S, DR), dtype=np.float32)), ValueError, "multiple of key_rope's head"),
    (_bad(key_rope=np.zeros((B, 1, S, DR + 1), dtype=np.float32)), ValueError, "key_rope must have shape"),
    (_bad(key_rope=np.zeros((B, 1, S + 1, DR), dtype=np.float32)), ValueError, "key_rope must have shape"),
    (_bad(query_rope=np.zeros((B, N1, S + 1, DR), dtype=np.float32)), ValueError, "query_rope must have shape"),
    (_bad(query_rope=np.zeros((B, N1, S), dtype=np.float32)), ValueError, "4 dims"),
    (_bad("BSH", query_rope=np.zeros((B, S, N1 * DR + 1), dtype=np.float32)), ValueError, "multiple of head_num"),
    (_bad("BSH", key_rope=np.zeros((B, S, DR + 3), dtype=np.float32)), ValueError, "multiple of query_rope's Dr"),
    # the RoPE inputs are documented with an atten_mask (issue 34; see tests/test_door_checks.py)
    (_bad(atten_mask=None), ValueError, "query_rope/key_rope need atten_mask"),
    (_bad("BSND", atten_mask=None), ValueError, "need atten_mask"),
])
def test_bad_rope_operands_raise(call_, exc, match):
    with pytest.raises(exc, match=match):
        call_()


@pytest.mark.parametrize("layout", LAYOUTS4 + ["TND"])
def test_the_rope_pair_is_checked_once_per_call(layout, monkeypatch):
    """issue 32 point 6: the RoPE pair goes down to validation once, with query/key/value
    (layouts.canonical), not back and forth operator -> validation -> layouts per operand; the
    operator holds none of validation's operand rules of its own (so the back and forth cannot
    return unseen). Counted by wrapping the one entry in the module that calls it."""
    from flashlab.cann import layouts, operator
    from flashlab.validation import check_operand, rope_operands

    for name in ("check_operand", "check_rope", "check_rope_pair", "check_same_dtype", "rope_operands"):
        assert not hasattr(operator, name), name
    calls, checks = [], []

    def counted(*args, **kw):
        calls.append(args[0])
        return rope_operands(*args, **kw)

    def counted_operand(name, *args):
        checks.append(name)
        return check_operand(name, *args)

    monkeypatch.setattr(layouts, "rope_operands", counted)
    import flashlab.validation as validation
    monkeypatch.setattr(validation, "check_operand", counted_operand)
    x = operands(1)
    mask = np.zeros((S, S), dtype=bool)
    if layout == "TND":
        # one sequence of S tokens per batch: (B * S, N, D), ends S, 2S
        tnd = {n: np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(-1, a.shape[1], a.shape[3]))
               for n, a in x.items()}
        lens = dict(actual_seq_qlen=[S, 2 * S], actual_seq_kvlen=[S, 2 * S])
        out, smax, ssum = cann.flash_attention_score(
            tnd["q"], tnd["k"], tnd["v"], N1, "TND", query_rope=tnd["q_rope"], key_rope=tnd["k_rope"],
            scale=SCALE, atten_mask=mask, **lens)
        cann.flash_attention_score_grad(
            tnd["q"], tnd["k"], tnd["v"], tnd["do"], N1, "TND", softmax_max=smax, softmax_sum=ssum,
            attention_in=out, query_rope=tnd["q_rope"], key_rope=tnd["k_rope"], scale=SCALE,
            atten_mask=mask, **lens)
    else:
        out, smax, ssum = call(x, layout, atten_mask=mask)
        call_grad(x, layout, out, smax, ssum, atten_mask=mask)
    # one entry per forward and one per grad, each checking the pair once
    assert len(calls) == 2
    assert checks.count("query_rope") == 2 and checks.count("key_rope") == 2
