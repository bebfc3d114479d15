"""flashlab.compat (flash_attn's interface) against the float64 reference on the equivalent problem.

Each case is rebuilt in flashlab's (B, H, S, D) layout with a dense mask written here from
flash_attn's docstring (query ``i`` keeps key ``j`` iff
``i + Sk - Sq - wl <= j <= i + Sk - Sq + wr``, -1 unbounded, causal sets ``wr = 0``), so the
mapping to flashlab's top-left band in :func:`flashlab.compat.band_from_window` is checked, not
reused. Errors follow flash-attention's rule (conftest): at most twice a same-dtype naive
implementation's, plus a floor. The lengths are flash-attention's own test grid
(tests/test_flash_attn.py): (1, 1), (113, 203), (239, 1), (799, 3), (1023, 1024), (128, 217).
No torch is needed here (see test_torch_attention.py).
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
from conftest import assert_close_to_reference, max_abs_err
from test_backward import naive_backward

import flashlab
from flashlab.compat import (
    band_from_window,
    flash_attn_func,
    flash_attn_func_backward,
    flash_attn_varlen_func,
    flash_attn_varlen_func_backward,
)
from flashlab.dropout import keep_mask

PAIRS = [(1, 1), (113, 203), (239, 1), (799, 3), (1023, 1024), (128, 217)]
WINDOWS = [(-1, -1), (0, 0), (3, 5), (-1, 0)]
#: (H, Hkv) rotating through the grid: MHA, MQA, GQA
HEADS = [(2, 2), (4, 1), (6, 2)]
GRAD_FLOOR = 1e-6



# ------------------------------------------------------------------------------ helpers
def bshd_qkv(B, Sq, Sk, H, Hkv, D, Dv, *, dtype=np.float32, seed=0):
    """Random q (B, Sq, H, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) in flash_attn's layout."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Sq, H, D)).astype(dtype),
            rng.standard_normal((B, Sk, Hkv, D)).astype(dtype),
            rng.standard_normal((B, Sk, Hkv, Dv)).astype(dtype))


def bottom_right_allowed(sq, sk, causal=False, window_size=(-1, -1)) -> np.ndarray:
    """(sq, sk) bool, flash_attn's docstring written out: True where query i keeps key j."""
    wl, wr = window_size
    if causal:
        wr = 0
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    ok = np.ones((sq, sk), dtype=bool)
    if wl >= 0:
        ok &= j >= i + sk - sq - wl
    if wr >= 0:
        ok &= j <= i + sk - sq + wr
    return ok


def bhsd(x):
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


def check_grads(grads, refs, naive, operands, what):
    """The backward's tolerance rule of test_backward.py, per gradient."""
    for name, g, ref, nv, x in zip(("dq", "dk", "dv"), grads, refs, naive, operands):
        assert g.shape == x.shape and g.dtype == x.dtype, f"{what}: {name} {g.shape} {g.dtype}"
        err = max_abs_err(g, ref)
        tol = 2.0 * max_abs_err(nv, ref) + GRAD_FLOOR * max(1.0, float(np.abs(ref).max()))
        assert err <= tol, f"{what}: {name} max abs error {err:.3g} > tolerance {tol:.3g}"


def check_case(q, k, v, *, causal, window_size, backward=True, seed=3):
    """flash_attn_func (and its backward) vs the reference on the (B, H, S, D) problem."""
    Sq, Sk = q.shape[1], k.shape[1]
    what = f"Sq={Sq} Sk={Sk} causal={causal} window_size={window_size} heads={q.shape[2]}/{k.shape[2]}"
    out, lse = flash_attn_func(q, k, v, causal=causal, window_size=window_size, return_lse=True)
    assert out.shape == q.shape[:3] + v.shape[3:] and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], Sq)
    mask = ~bottom_right_allowed(Sq, Sk, causal, window_size)       # True = masked out
    ops = dict(q=bhsd(q), k=bhsd(k), v=bhsd(v), mask=mask)
    ref_o, ref_lse = flashlab.attention_reference(**ops)
    naive_o, naive_lse = flashlab.attention_naive(**ops)
    assert_close_to_reference(bhsd(out), lse, naive_o, naive_lse, ref_o, ref_lse, what=what)
    assert (bhsd(out)[np.isneginf(ref_lse)] == 0).all(), f"{what}: a row without keys must give 0"
    if not backward:
        return
    dout = np.random.default_rng(seed).standard_normal(out.shape).astype(q.dtype)
    grads = flash_attn_func_backward(dout, q, k, v, out, lse, causal=causal, window_size=window_size)
    refs = flashlab.attention_reference_backward(bhsd(dout), **ops)
    naive = naive_backward(bhsd(dout), **ops, lse_dtype=lse.dtype)
    check_grads([bhsd(g) for g in grads], refs, naive, [ops["q"], ops["k"], ops["v"]], what)


# ------------------------------------------------------------------------------ the mask
@pytest.mark.parametrize("sq,sk", [(2, 5), (5, 2), (1, 1), (7, 7), (3, 10), (10, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", WINDOWS + [(2, -1), (0, 4), (10**15, 10**15)])
def test_band_from_window_matches_the_dense_mask(sq, sk, causal, window_size):
    left, right = band_from_window(sq, sk, causal, window_size)
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    band = np.ones((sq, sk), dtype=bool)
    if left is not None:
        band &= j >= i - left
    if right is not None:
        band &= j <= i + right
    np.testing.assert_array_equal(band, bottom_right_allowed(sq, sk, causal, window_size))


def test_causal_examples_of_the_flash_attn_docstring():
    """Sq=2, Sk=5 keeps [[1 1 1 1 0], [1 1 1 1 1]]; Sq=5, Sk=2 keeps no key in rows 0-2."""
    q, k, v = bshd_qkv(1, 2, 5, 1, 1, 8, 8, dtype=np.float64)
    _, _, p = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    np.testing.assert_array_equal(p[0, 0] > 0, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    q, k, v = bshd_qkv(1, 5, 2, 1, 1, 8, 8, dtype=np.float64)
    out, lse, p = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    np.testing.assert_array_equal(p[0, 0] > 0, [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]])
    assert (out[0, :3] == 0).all() and np.isneginf(lse[0, 0, :3]).all()
    dq, dk, dv = flash_attn_func_backward(np.ones_like(out), q, k, v, out, lse, causal=True)
    assert (dq[0, :3] == 0).all()


def test_huge_window_equals_no_window():
    q, k, v = bshd_qkv(1, 64, 129, 2, 2, 16, 16)
    a = flash_attn_func(q, k, v, window_size=(2**62, 2**62))
    b = flash_attn_func(q, k, v)
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ padded grid
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window_size", WINDOWS, ids=str)
@pytest.mark.parametrize("sq,sk", PAIRS)
def test_forward_backward_grid(sq, sk, window_size, causal):
    n = PAIRS.index((sq, sk)) + WINDOWS.index(window_size)
    H, Hkv = HEADS[n % 3]
    q, k, v = bshd_qkv(2, sq, sk, H, Hkv, 32, 32, seed=n)
    check_case(q, k, v, causal=causal, window_size=window_size)


@pytest.mark.parametrize("heads", [(6, 1), (6, 2), (6, 6)], ids=["MQA", "GQA", "MHA"])
@pytest.mark.parametrize("dims", [(192, 128), (64, 64)], ids=["192-128", "64-64"])
@pytest.mark.parametrize("sq,sk", [(113, 203), (239, 1)])
def test_heads_and_head_dims(sq, sk, dims, heads):
    q, k, v = bshd_qkv(1, sq, sk, *heads, *dims)
    check_case(q, k, v, causal=True, window_size=(3, 5))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_dtypes(dtype):
    q, k, v = bshd_qkv(2, 113, 203, 4, 2, 32, 16, dtype=dtype)
    check_case(q, k, v, causal=True, window_size=(-1, -1), backward=dtype == np.float64)


def test_return_values_and_probabilities():
    q, k, v = bshd_qkv(2, 7, 13, 4, 2, 16, 8, dtype=np.float64)
    out = flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, np.ndarray) and out.shape == (2, 7, 4, 8)
    out2, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    out3, lse3, p = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(out, out3)
    np.testing.assert_array_equal(lse, lse3)
    assert p.shape == (2, 4, 7, 13) and p.dtype == q.dtype
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)
    # out = P V with kv head h // 2 serving query head h
    pv = p @ np.repeat(bhsd(v), 2, axis=1)
    np.testing.assert_allclose(bhsd(out), pv, atol=1e-12)
    # the default softmax_scale is 1/sqrt(headdim)
    np.testing.assert_allclose(flash_attn_func(q, k, v, softmax_scale=16 ** -0.5, causal=True), out,
                               atol=1e-14)


# ------------------------------------------------------------------------------ varlen
def pack(lengths: list[int], H: int, D: int, *, dtype, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((sum(lengths), H, D)).astype(dtype)


def cumulative(lengths, dtype=np.int32) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)


def block_diagonal_allowed(lq, lk, causal, window_size) -> np.ndarray:
    """(total_q, total_k) bool: each sequence's bottom-right band on its own diagonal block."""
    cq, ck = cumulative(lq), cumulative(lk)
    ok = np.zeros((cq[-1], ck[-1]), dtype=bool)
    for b in range(len(lq)):
        ok[cq[b]:cq[b + 1], ck[b]:ck[b + 1]] = bottom_right_allowed(lq[b], lk[b], causal, window_size)
    return ok


#: sequence lengths with every empty case: no keys (sq > 0, sk = 0), no queries, neither
VARLEN = [([5, 0, 113, 1, 30, 0, 64], [7, 3, 203, 1, 0, 0, 64]),
          ([239, 1, 0], [1, 799, 4])]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window_size", WINDOWS, ids=str)
@pytest.mark.parametrize("case", range(len(VARLEN)))
def test_varlen_against_the_packed_problem(case, window_size, causal):
    """One reference call on the packed (1, H, total_q, D) problem, masked block-diagonally."""
    lq, lk = VARLEN[case]
    H, Hkv = HEADS[case + 1]
    q = pack(lq, H, 32, dtype=np.float32, seed=1)
    k = pack(lk, Hkv, 32, dtype=np.float32, seed=2)
    v = pack(lk, Hkv, 24, dtype=np.float32, seed=3)
    cq, ck = cumulative(lq, np.int32), cumulative(lk, np.int64)
    args = (cq, ck, max(lq), max(lk))
    opts = dict(causal=causal, window_size=window_size)
    out, lse = flash_attn_varlen_func(q, k, v, *args, **opts, return_lse=True)
    assert out.shape == (sum(lq), H, 24) and lse.shape == (H, sum(lq))

    def as_one(x):                      # (total, H, D) -> (1, H, total, D)
        return np.ascontiguousarray(x.transpose(1, 0, 2)[None])

    mask = ~block_diagonal_allowed(lq, lk, causal, window_size)
    ops = dict(q=as_one(q), k=as_one(k), v=as_one(v), mask=mask)
    ref_o, ref_lse = flashlab.attention_reference(**ops)
    naive_o, naive_lse = flashlab.attention_naive(**ops)
    assert_close_to_reference(as_one(out), lse[None], naive_o, naive_lse, ref_o, ref_lse,
                              what=f"varlen {case} {opts}")
    dout = pack(lq, H, 24, dtype=np.float32, seed=4)
    grads = flash_attn_varlen_func_backward(dout, q, k, v, out, lse, *args, **opts)
    refs = flashlab.attention_reference_backward(as_one(dout), **ops)
    naive = naive_backward(as_one(dout), **ops, lse_dtype=lse.dtype)
    check_grads([as_one(g) for g in grads], refs, naive, [ops["q"], ops["k"], ops["v"]],
                f"varlen {case} {opts}")


def test_varlen_equals_padded_for_equal_lengths():
    q, k, v = bshd_qkv(3, 50, 70, 4, 2, 16, 16, seed=5)
    cq, ck = cumulative([50] * 3), cumulative([70] * 3)
    out, lse = flash_attn_func(q, k, v, causal=True, window_size=(9, -1), return_lse=True)
    vout, vlse = flash_attn_varlen_func(q.reshape(150, 4, 16), k.reshape(210, 2, 16),
                                        v.reshape(210, 2, 16), cq, ck, 50, 70, causal=True,
                                        window_size=(9, -1), return_lse=True)
    np.testing.assert_allclose(vout.reshape(out.shape), out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(vlse, lse.transpose(1, 0, 2).reshape(4, 150), rtol=1e-6)


def test_varlen_probabilities_are_padded_per_sequence():
    lq, lk = [3, 0, 2], [4, 2, 0]
    q, k, v = (pack(n, 2, 8, dtype=np.float64, seed=s) for n, s in ((lq, 0), (lk, 1), (lk, 2)))
    out, lse, p = flash_attn_varlen_func(q, k, v, cumulative(lq), cumulative(lk), 5, 6,
                                         causal=True, return_attn_probs=True)
    assert p.shape == (3, 2, 5, 6)
    np.testing.assert_array_equal(p[0, 0, :3, :4] > 0, bottom_right_allowed(3, 4, True))
    assert (p[0, :, 3:] == 0).all() and (p[0, :, :, 4:] == 0).all() and (p[1:] == 0).all()
    assert (out[3:] == 0).all() and np.isneginf(lse[:, 3:]).all()     # sequence 2 has no keys


# ------------------------------------------------------------------------------ training
def test_numpy_training_matches_the_reference():
    """SGD on a one-layer causal attention model: gradients from flash_attn_func_backward vs
    from attention_reference_backward, the losses agreeing at every step (float64)."""
    B, S, d, H, Dh = 4, 48, 16, 2, 8
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, S, d))
    target = rng.standard_normal((B, S, d))
    init = {n: rng.standard_normal(shape) / np.sqrt(shape[0])
            for n, shape in (("wq", (d, H * Dh)), ("wk", (d, H * Dh)), ("wv", (d, H * Dh)),
                             ("wo", (H * Dh, d)))}
    window = (12, -1)                        # causal, 12 keys back: local attention
    mask = ~bottom_right_allowed(S, S, True, window)

    def flash(q, k, v):
        out, lse = flash_attn_func(q, k, v, causal=True, window_size=window, return_lse=True)
        return out, lambda do: flash_attn_func_backward(do, q, k, v, out, lse, causal=True,
                                                        window_size=window)

    def reference(q, k, v):
        qh, kh, vh = bhsd(q), bhsd(k), bhsd(v)
        out = flashlab.attention_reference(qh, kh, vh, mask=mask)[0]
        return bhsd(out), lambda do: tuple(bhsd(g) for g in flashlab.attention_reference_backward(
            bhsd(do), qh, kh, vh, mask=mask))

    def train(attention, steps=12, lr=0.5):
        w = {n: a.copy() for n, a in init.items()}
        losses = []
        for _ in range(steps):
            q, k, v = ((x @ w[n]).reshape(B, S, H, Dh) for n in ("wq", "wk", "wv"))
            o, attn_backward = attention(q, k, v)
            o2 = o.reshape(B, S, H * Dh)
            err = o2 @ w["wo"] - target
            losses.append(0.5 * float(np.mean(err ** 2)))
            dy = err / err.size                                   # d loss / d y
            grads = {"wo": o2.reshape(-1, H * Dh).T @ dy.reshape(-1, d)}
            dq, dk, dv = attn_backward((dy @ w["wo"].T).reshape(B, S, H, Dh))
            for n, g in (("wq", dq), ("wk", dk), ("wv", dv)):
                grads[n] = x.reshape(-1, d).T @ g.reshape(-1, H * Dh)
            for n in w:
                w[n] -= lr * grads[n]
        return np.array(losses)

    flash_losses, ref_losses = train(flash), train(reference)
    assert flash_losses[-1] < flash_losses[0]
    np.testing.assert_allclose(flash_losses, ref_losses, rtol=1e-6)


# ------------------------------------------------------------------------------ dropout, ALiBi
@pytest.mark.parametrize("sq,sk", [(113, 203), (239, 1), (64, 64)])
def test_dropout_matches_the_reference(sq, sk):
    q, k, v = bshd_qkv(2, sq, sk, 4, 2, 16, 16, dtype=np.float64)
    opts = dict(dropout_p=0.17, causal=True, seed=1234)
    out, lse, p = flash_attn_func(q, k, v, **opts, return_attn_probs=True)
    mask = ~bottom_right_allowed(sq, sk, True)
    ops = dict(q=bhsd(q), k=bhsd(k), v=bhsd(v), mask=mask)
    ref_o, _ = flashlab.attention_reference(**ops, dropout_p=0.17, seed=1234, offset=0)
    np.testing.assert_allclose(bhsd(out), ref_o, atol=1e-6)
    # S_dmask encoding: the kept entries are the non-negative ones
    keep = keep_mask(p.shape, 0.17, 1234)
    allowed = np.broadcast_to(~mask, p.shape)
    np.testing.assert_array_equal((p >= 0)[allowed], keep[allowed])
    dout = np.random.default_rng(1).standard_normal(out.shape)
    grads = flash_attn_func_backward(dout, q, k, v, out, lse, **opts)
    refs = flashlab.attention_reference_backward(bhsd(dout), **ops, dropout_p=0.17, seed=1234, offset=0)
    for g, r in zip(grads, refs):
        np.testing.assert_allclose(bhsd(g), r, atol=1e-6)


def test_varlen_dropout_gives_each_sequence_its_own_counters():
    lq, lk = [5, 0, 7], [6, 2, 9]
    H = 2
    q, k, v = (pack(n, H, 8, dtype=np.float64, seed=s) for n, s in ((lq, 0), (lk, 1), (lk, 2)))
    cq, ck = cumulative(lq), cumulative(lk)
    out = flash_attn_varlen_func(q, k, v, cq, ck, 7, 9, dropout_p=0.3, seed=9)
    offset = 0
    for b in range(3):
        sq, sk = lq[b], lk[b]
        if sq and sk:
            qs = q[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None]
            ks, vs = (x[ck[b]:ck[b + 1]].transpose(1, 0, 2)[None] for x in (k, v))
            ref = flashlab.attention_reference(qs, ks, vs, dropout_p=0.3, seed=9, offset=offset)[0]
            np.testing.assert_allclose(out[cq[b]:cq[b + 1]], ref[0].transpose(1, 0, 2), atol=1e-6)
        offset += H * sq * sk


@pytest.mark.parametrize("sq,sk", [(113, 203), (239, 1), (64, 64)])
@pytest.mark.parametrize("batch_slopes", [False, True], ids=["(H,)", "(B,H)"])
def test_alibi_matches_the_bias_written_out(sq, sk, batch_slopes):
    """Scores + (-slope * |i + Sk - Sq - j|), softmax, times V: float64, written here."""
    B, H = 2, 4
    q, k, v = bshd_qkv(B, sq, sk, H, H, 16, 16, dtype=np.float64)
    rng = np.random.default_rng(3)
    slopes = rng.uniform(0.01, 0.5, (B, H) if batch_slopes else (H,))
    out, lse = flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, return_lse=True)
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    s = bhsd(q) @ bhsd(k).swapaxes(-1, -2) / 4.0
    s = s - np.broadcast_to(slopes, (B, H))[..., None, None] * np.abs(i + sk - sq - j)
    s = np.where(bottom_right_allowed(sq, sk, True), s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    ref = (e / np.where(l > 0, l, 1)) @ bhsd(v)
    np.testing.assert_allclose(bhsd(out), ref, atol=1e-6)
    dout = rng.standard_normal(out.shape)
    grads = flash_attn_func_backward(dout, q, k, v, out, lse, causal=True, alibi_slopes=slopes)
    refs = flashlab.attention_reference_backward(
        bhsd(dout), bhsd(q), bhsd(k), bhsd(v), alibi_slopes=slopes,
        mask=~bottom_right_allowed(sq, sk, True))
    for g, r in zip(grads, refs):
        np.testing.assert_allclose(bhsd(g), r, atol=1e-6)


# ------------------------------------------------------------------------------ bad inputs
def _bad_cases():
    q, k, v = bshd_qkv(2, 5, 6, 4, 2, 8, 8)
    k3, v3 = (np.repeat(x, 2, axis=2)[:, :, :3] for x in (k, v))        # 3 kv heads for 4
    cu = cumulative([5, 5])
    qv, kv, vv = q.reshape(10, 4, 8), k[:, :5].reshape(10, 2, 8), v[:, :5].reshape(10, 2, 8)
    f, fv = flash_attn_func, flash_attn_varlen_func
    return {
        "q-list": (lambda: f(q.tolist(), k, v), TypeError, "q must be a numpy.ndarray"),
        "q-3d": (lambda: f(q[0], k, v), ValueError, r"q must have shape \(batch_size, seqlen_q"),
        "q-int": (lambda: f(q.astype(np.int32), k, v), TypeError, "q must be float16"),
        "k-dtype": (lambda: f(q, k.astype(np.float64), v), TypeError, "k must have q's dtype"),
        "k-headdim": (lambda: f(q, k[..., :4], v), ValueError, "k must have shape"),
        "heads": (lambda: f(q, k3, v3), ValueError, "q's heads nheads=4 a multiple of k's heads nheads_k"),
        "v-seqlen": (lambda: f(q, k, v[:, :3]), ValueError, "v must have shape"),
        "window-int": (lambda: f(q, k, v, window_size=3), TypeError, "window_size must be a pair"),
        "window-float": (lambda: f(q, k, v, window_size=(1.5, 2)), TypeError, "window_size"),
        "window-neg": (lambda: f(q, k, v, window_size=(-2, 0)), ValueError, "window_size .* >= -1"),
        "causal": (lambda: f(q, k, v, causal=1), TypeError, "causal must be a bool"),
        "dropout": (lambda: f(q, k, v, dropout_p=1.0), ValueError, r"dropout_p must lie in \[0.0, 1.0\); got 1.0"),
        "scale": (lambda: f(q, k, v, softmax_scale="x"), TypeError, "softmax_scale"),
        "softcap": (lambda: f(q, k, v, softcap=-30.0), ValueError, r"softcap must be >= 0.0; got -30.0"),
        "dout-shape": (lambda: flash_attn_func_backward(q[:, :4], q, k, v, q, np.zeros((2, 4, 5))),
                       ValueError, r"dout must have shape \(batch_size, seqlen_q, nheads, headdim_v\)"),
        "cu-float": (lambda: fv(qv, kv, vv, cu.astype(float), cu, 5, 5), TypeError, "cu_seqlens_q must be"),
        "cu-start": (lambda: fv(qv, kv, vv, cu + 1, cu, 5, 5), ValueError,
                     "cu_seqlens_q must be non-decreasing cumulative ends from 0"),
        "cu-end": (lambda: fv(qv, kv, vv, cu, cumulative([5, 4]), 5, 5), ValueError,
                   "cu_seqlens_k .* to the key token count T=10"),
        "cu-decreasing": (lambda: fv(qv, kv, vv, np.array([0, 6, 5, 10]), np.array([0, 3, 5, 10]), 6, 5),
                          ValueError, "non-decreasing"),
        "cu-count": (lambda: fv(qv, kv, vv, cu, cumulative([3, 3, 4]), 5, 5), ValueError,
                     "same number of sequences"),
        "max-seqlen": (lambda: fv(qv, kv, vv, cu, cu, 4, 5), ValueError,
                       "max_seqlen_q must be >= the longest sequence, 5"),
        "block-table": (lambda: fv(qv, kv, vv, cu, cu, 5, 5, block_table=np.zeros(1)),
                        NotImplementedError, "block_table"),
        "varlen-4d": (lambda: fv(q, kv, vv, cu, cu, 5, 5), ValueError, r"q must have shape \(total_q"),
    }


@pytest.mark.parametrize("name", list(_bad_cases()))
def test_bad_inputs_raise_naming_the_argument(name):
    call, error, message = _bad_cases()[name]
    with pytest.raises(error, match=message):
        call()


def test_the_signatures_follow_flash_attn():
    """flash_attn 2.6+'s positional order, so positional calls mean the same thing."""
    padded = ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
              "alibi_slopes", "deterministic", "return_attn_probs"]
    varlen = padded[:3] + ["cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"] \
        + padded[3:] + ["block_table"]
    for f, names in ((flash_attn_func, padded), (flash_attn_varlen_func, varlen)):
        params = inspect.signature(f).parameters
        positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert positional == names
        assert params["window_size"].default == (-1, -1) and params["dropout_p"].default == 0.0


def test_flashlab_and_compat_never_import_torch():
    import subprocess
    import sys
    code = ("import sys, flashlab, flashlab.compat; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
