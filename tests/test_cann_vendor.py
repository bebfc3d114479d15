"""flashlab.cann against the vendor's own golden: invalid rows, TND softmax layout, no-mask
full attention and the documented ranges, bfloat16, pse / pse_type / dpse and dropout.

Expected values are a float64 numpy port of the vendor golden's formulas
(ops-transformer ``attention/flash_attention_score/tests/pytest/cpu_impl.py`` ``forward`` and
``test_utils.py`` ``generate_pse``; msprobe ``bench_functions/npu_fusion_attention.py``
``fusion_attention_backward``), written in this file: scores ``(QK^T + pse) * scale``
(pse_type 1) or ``QK^T * scale + pse`` (0, 2, 3), a row with no allowed key gives P = 0,
max = float32 min, sum = float32 max. Dropout masks come from the documented generator
:func:`flashlab.dropout.keep_mask` and the counter formula of :mod:`flashlab.cann`'s docstring.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from flashlab import cann
from flashlab.dropout import keep_mask

EMPTY_MAX, EMPTY_SUM = np.float32(-3.4028235e38), np.float32(3.4028235e38)
TRI = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
B, N1, N2, D, DV = 2, 4, 2, 16, 8
SCALE = 1.0 / np.sqrt(D)



# ---------------------------------------------------------------------------- the golden
def qkv(b, n1, n2, sq, sk, d=D, dv=DV, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, n1, sq, d)).astype(dtype),
            rng.standard_normal((b, n2, sk, d)).astype(dtype),
            rng.standard_normal((b, n2, sk, dv)).astype(dtype))


def golden_forward(q, k, v, *, scale, masked=None, pse=None, pse_type=1, keep=None, keep_prob=1.0):
    """(B, N, Sq, D) float64 golden: (out, max, sum, P, P_dropped); ``masked`` True = masked out."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    qk = q @ k.swapaxes(-1, -2)
    if pse is None:
        s = qk * scale
    elif pse_type == 1:
        s = (qk + pse) * scale
    else:
        s = qk * scale + pse
    if masked is not None:
        s = np.where(masked, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    empty = np.isneginf(m)
    e = np.exp(s - np.where(empty, 0.0, m))
    total = e.sum(axis=-1, keepdims=True)
    p = np.where(empty, 0.0, e / np.where(empty, 1.0, total))
    pd = p if keep is None else p * keep / keep_prob
    out = pd @ v
    m = np.where(empty, float(EMPTY_MAX), m)[..., 0]
    total = np.where(empty, float(EMPTY_SUM), total)[..., 0]
    return out, m, total, p, pd


def golden_backward(do, q, k, v, p, pd, *, scale, n2, keep=None, keep_prob=1.0):
    """(dq, dk, dv, dS) of the golden: dS = P (dP - rowsum(dP P)), dP = dO V^T (Z / keep_prob)."""
    g = q.shape[1] // n2
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    dp = do @ vr.swapaxes(-1, -2)
    if keep is not None:
        dp = dp * keep / keep_prob
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = scale * ds @ kr
    dk = scale * ds.swapaxes(-1, -2) @ q
    dv = pd.swapaxes(-1, -2) @ do
    def fold(x):
        return x.reshape(x.shape[0], n2, g, *x.shape[2:]).sum(axis=2)

    return dq, fold(dk), fold(dv), ds


def stats(x):
    return x[..., 0]


# ------------------------------------------------------------------ 9: rows with no key
def test_empty_rows_stats_out_and_grad():
    """Sq > Sk in mode 3: the first Sq - Sk rows have no key; stats are float32 min/max exactly,
    out 0; the grad reads them as rows contributing nothing (zero dq) and matches the golden;
    the (-inf, 0) convention gives the very same gradients."""
    sq, sk = 21, 13
    q, k, v = qkv(B, N1, N2, sq, sk, seed=1)
    masked = np.triu(np.ones((sq, sk), bool), k=sk - sq + 1)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "BNSD", scale=SCALE, sparse_mode=3,
                                                 atten_mask=TRI)
    o_g, m_g, s_g, p, pd = golden_forward(q, k, v, scale=SCALE, masked=masked)
    empty = np.arange(sq) < sq - sk
    assert (smax[:, :, empty] == EMPTY_MAX).all() and (ssum[:, :, empty] == EMPTY_SUM).all()
    assert (out[:, :, empty] == 0).all()
    np.testing.assert_allclose(out, o_g, atol=1e-10)
    np.testing.assert_allclose(stats(smax), m_g, rtol=1e-6)
    np.testing.assert_allclose(stats(ssum), s_g, rtol=1e-6)
    do = np.random.default_rng(2).standard_normal(out.shape)
    kw = dict(scale=SCALE, sparse_mode=3, atten_mask=TRI, attention_in=out)
    grads = cann.flash_attention_score_grad(q, k, v, do, N1, "BNSD", softmax_max=smax,
                                            softmax_sum=ssum, **kw)
    ref = golden_backward(do, q, k, v, p, pd, scale=SCALE, n2=N2)
    for g, r in zip(grads, ref):
        # float64 inputs: float64 stats, gradients at float64 accuracy
        np.testing.assert_allclose(g, r, atol=1e-12 * max(1.0, np.abs(r).max()))
    assert (grads[0][:, :, empty] == 0).all()
    old = cann.flash_attention_score_grad(
        q, k, v, do, N1, "BNSD", softmax_max=np.where(smax == EMPTY_MAX, -np.inf, smax),
        softmax_sum=np.where(ssum == EMPTY_SUM, 0.0, ssum), **kw)
    for g, h in zip(grads, old):
        np.testing.assert_array_equal(g, h)


def test_grad_rejects_stats_that_are_neither():
    q, k, v = qkv(1, 2, 2, 8, 8, seed=3)
    out, smax, ssum = cann.flash_attention_score(q, k, v, 2, "BNSD")
    bad = ssum.copy()
    bad[0, 0, 3] = np.nan
    with pytest.raises(ValueError, match="softmax_max/softmax_sum at row"):
        cann.flash_attention_score_grad(q, k, v, out, 2, "BNSD", softmax_max=smax, softmax_sum=bad,
                                        attention_in=out)


# ------------------------------------------------------------------------- 10: TND stats
Q_LENS, K_LENS = [4, 7, 3], [6, 7, 5]


def tnd(seed=0, q_lens=Q_LENS, k_lens=K_LENS, n1=N1, n2=N2):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((sum(q_lens), n1, D)), rng.standard_normal((sum(k_lens), n2, D)),
            rng.standard_normal((sum(k_lens), n2, DV)))


def per_sequence(x, lens):
    """(T, N, d) -> list of (1, N, S_i, d)."""
    ends = np.cumsum([0] + list(lens))
    return [x[a:b].transpose(1, 0, 2)[None] for a, b in zip(ends[:-1], ends[1:])]


def test_tnd_softmax_default_is_ntd_blocks_and_tnd_keyword():
    """Default: the golden's concatenation of each sequence's flattened [N, Sq_i, 8]; with
    softmax_layout="TND" token-major [T, N, 8]; the grad reads each when told which."""
    q, k, v = tnd(seed=4)
    lens = dict(actual_seq_qlen=np.cumsum(Q_LENS).tolist(), actual_seq_kvlen=np.cumsum(K_LENS).tolist())
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "TND", scale=SCALE, **lens)
    m_blocks, s_blocks, m_rows = [], [], []
    for qi, ki, vi in zip(per_sequence(q, Q_LENS), per_sequence(k, K_LENS), per_sequence(v, K_LENS)):
        _, m, s, _, _ = golden_forward(qi, ki, vi, scale=SCALE)
        m_blocks.append(np.repeat(m[0][..., None], 8, -1).reshape(-1))   # [N, Sq_i, 8] flattened
        s_blocks.append(np.repeat(s[0][..., None], 8, -1).reshape(-1))
        m_rows.append(m[0].T)                                             # (Sq_i, N)
    assert smax.shape == (sum(Q_LENS), N1, 8)
    np.testing.assert_allclose(smax.reshape(-1), np.concatenate(m_blocks), rtol=1e-6)
    np.testing.assert_allclose(ssum.reshape(-1), np.concatenate(s_blocks), rtol=1e-6)
    out_t, smax_t, ssum_t = cann.flash_attention_score(q, k, v, N1, "TND", scale=SCALE,
                                                       softmax_layout="TND", **lens)
    np.testing.assert_array_equal(out_t, out)
    np.testing.assert_allclose(smax_t[..., 0], np.concatenate(m_rows), rtol=1e-6)
    do = np.random.default_rng(5).standard_normal(out.shape)
    g_ntd = cann.flash_attention_score_grad(q, k, v, do, N1, "TND", softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, scale=SCALE, **lens)
    g_tnd = cann.flash_attention_score_grad(q, k, v, do, N1, "TND", softmax_max=smax_t,
                                            softmax_sum=ssum_t, attention_in=out, scale=SCALE,
                                            softmax_layout="TND", **lens)
    for a, b in zip(g_ntd, g_tnd):
        np.testing.assert_allclose(a, b, atol=1e-12)
    # the keyword is read: NTD stats read as TND are another forward's LSE, which the backward refuses
    with pytest.raises(ValueError, match=r"softmax_max/softmax_sum is not the forward's"):
        cann.flash_attention_score_grad(q, k, v, do, N1, "TND", softmax_max=smax, softmax_sum=ssum,
                                        attention_in=out, scale=SCALE, softmax_layout="TND", **lens)


def test_softmax_layout_checks():
    q, k, v = qkv(1, 2, 2, 4, 4)
    with pytest.raises(ValueError, match="input_layout TND only"):
        cann.flash_attention_score(q, k, v, 2, "BNSD", softmax_layout="TND")
    qt, kt, vt = tnd()
    with pytest.raises(ValueError, match="softmax_layout must be"):
        cann.flash_attention_score(qt, kt, vt, N1, "TND", actual_seq_qlen=np.cumsum(Q_LENS),
                                   actual_seq_kvlen=np.cumsum(K_LENS), softmax_layout="NTD")


def test_tnd_sequence_with_queries_and_no_key():
    """Sq > 0 with Skv = 0: zero output, empty-row stats, zero dq; the next sequence unaffected."""
    q_lens, k_lens = [3, 5], [0, 6]
    q, k, v = tnd(seed=6, q_lens=q_lens, k_lens=k_lens)
    lens = dict(actual_seq_qlen=[3, 8], actual_seq_kvlen=[0, 6], scale=SCALE, softmax_layout="TND")
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "TND", **lens)
    assert (out[:3] == 0).all() and (smax[:3] == EMPTY_MAX).all() and (ssum[:3] == EMPTY_SUM).all()
    qi, ki, vi = per_sequence(q, q_lens)[1], per_sequence(k, k_lens)[1], per_sequence(v, k_lens)[1]
    o_g, m_g, _, p, pd = golden_forward(qi, ki, vi, scale=SCALE)
    np.testing.assert_allclose(out[3:], o_g[0].transpose(1, 0, 2), atol=1e-10)
    do = np.random.default_rng(7).standard_normal(out.shape)
    dq, dk, dv = cann.flash_attention_score_grad(q, k, v, do, N1, "TND", softmax_max=smax,
                                                 softmax_sum=ssum, attention_in=out, **lens)
    assert (dq[:3] == 0).all()
    ref = golden_backward(per_sequence(do, q_lens)[1], qi, ki, vi, p, pd, scale=SCALE, n2=N2)
    np.testing.assert_allclose(dk, ref[1][0].transpose(1, 0, 2), atol=1e-5 * max(1, np.abs(ref[1]).max()))


# ------------------------------------------------------- 11: no mask, ranges, arguments
def test_no_atten_mask_is_full_attention_whatever_sparse_mode():
    """"当atten_mask输入为None时，sparse_mode，pre_tockens，next_tockens参数不生效，固定为全计算"."""
    q, k, v = qkv(B, N1, N2, 9, 14, seed=8)
    o_g = golden_forward(q, k, v, scale=SCALE)[0]
    for kw in (dict(sparse_mode=3), dict(sparse_mode=0, pre_tokens=2, next_tokens=0),
               dict(sparse_mode=4, pre_tokens=-1, next_tokens=1), dict(sparse_mode=6)):
        out = cann.flash_attention_score(q, k, v, N1, "BNSD", scale=SCALE, **kw)[0]
        np.testing.assert_allclose(out, o_g, atol=1e-10, err_msg=str(kw))


def test_doc_example_sbh_prefix_with_mode0():
    """The aclnnFlashAttentionScore example: SBH [256, 1, 128], head_num 1, all-zero [256, 256]
    uint8 mask, prefix {0}, pre/next 65536, scale 0.088388."""
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((256, 1, 128)).astype(np.float32) for _ in range(3))
    out, _, _ = cann.flash_attention_score(q, k, v, 1, "SBH", atten_mask=np.zeros((256, 256), np.uint8),
                                           prefix=[0], pre_tokens=65536, next_tokens=65536,
                                           scale=0.088388, sparse_mode=0)
    o_g = golden_forward(*(x.transpose(1, 0, 2)[:, None] for x in (q, k, v)), scale=0.088388)[0]
    np.testing.assert_allclose(out, o_g[:, 0].transpose(1, 0, 2), atol=2e-5)


def test_mode0_negative_offsets():
    """pre=9, next=-3 (the doc's figure) computes the band; |next| >= Skv or |pre| >= Sq raise."""
    sq, sk = 12, 16
    q, k, v = qkv(1, 2, 2, sq, sk, seed=10)
    ones = np.ones((sq, sk), bool)

    def band_mask(pre, nxt):
        return np.triu(ones, k=nxt + 1) | np.tril(ones, k=-pre - 1)

    out = cann.flash_attention_score(q, k, v, 2, "BNSD", scale=SCALE, atten_mask=band_mask(9, -3),
                                     pre_tokens=9, next_tokens=-3)[0]
    np.testing.assert_allclose(out, golden_forward(q, k, v, scale=SCALE, masked=band_mask(9, -3))[0],
                               atol=1e-10)
    with pytest.raises(ValueError, match=r"absolute value must be < Skv=16 .*next_tockens的绝对值小于Skv"):
        cann.flash_attention_score(q, k, v, 2, "BNSD", atten_mask=ones, pre_tokens=20, next_tokens=-16)
    with pytest.raises(ValueError, match=r"absolute value must be < Sq=12 .*pre_tockens的绝对值小于Sq"):
        cann.flash_attention_score(q, k, v, 2, "BNSD", atten_mask=ones, pre_tokens=-12, next_tokens=20)


def test_int64_arguments():
    """2**63 - 1 acts as unbounded (no false error); numpy integers are ints; 2**63, floats and
    strings raise naming the argument."""
    q, k, v = qkv(1, 2, 2, 6, 9, seed=11)
    zeros = np.zeros((6, 9), bool)
    full = cann.flash_attention_score(q, k, v, 2, "BNSD", scale=SCALE)[0]
    for big in (2**63 - 1, np.int64(2**63 - 1), 2147483647):
        out = cann.flash_attention_score(q, k, v, 2, "BNSD", scale=SCALE, atten_mask=zeros,
                                         pre_tokens=big, next_tokens=big)[0]
        np.testing.assert_array_equal(out, full)
    out = cann.flash_attention_score(q, k, v, np.int64(2), "BNSD", scale=SCALE, sparse_mode=np.int32(4),
                                     atten_mask=TRI, pre_tokens=np.int64(2**62), next_tokens=np.uint8(0))[0]
    assert np.isfinite(out).all()
    cases = [(dict(pre_tokens=2**63), ValueError, "pre_tokens must fit in int64"),
             (dict(next_tokens=-(2**63) - 1), ValueError, "next_tokens must fit in int64"),
             (dict(pre_tokens=3.0), TypeError, "pre_tokens must be an int"),
             (dict(sparse_mode="0"), TypeError, "sparse_mode must be an int"),
             (dict(seed=1.5), TypeError, "seed must be an int"),
             (dict(offset=-1), ValueError, r"offset must be in \[0, "),
             (dict(pse_type="1"), TypeError, "pse_type must be an int"),
             (dict(inner_precise=2.0), TypeError, "inner_precise must be an int")]
    for kw, exc, text in cases:
        with pytest.raises(exc, match=text):
            cann.flash_attention_score(q, k, v, 2, "BNSD", atten_mask=zeros, **kw)
    with pytest.raises(TypeError, match="actual_seq_qlen must be a 1-D list or numpy array of ints"):
        qt, kt, vt = tnd()
        cann.flash_attention_score(qt, kt, vt, N1, "TND", actual_seq_qlen=np.cumsum(Q_LENS) * 1.0,
                                   actual_seq_kvlen=np.cumsum(K_LENS))


def test_documented_limits():
    with pytest.raises(ValueError, match=r"head_num must be in 1..256"):
        cann.flash_attention_score(*qkv(1, 257, 1, 2, 2, d=8, dv=8), 257, "BNSD")
    with pytest.raises(ValueError, match=r"D must be in 1..768"):
        cann.flash_attention_score(*qkv(1, 1, 1, 2, 2, d=769, dv=8), 1, "BNSD")
    q, k, v = qkv(1, 2, 1, 4, 4)
    for dr in (4, 24):   # not a multiple of 8; > D = 16
        with pytest.raises(ValueError, match=f"multiple of 8 and <= D=16 .*got Dr={dr}"):
            cann.flash_attention_score(q, k, v, 2, "BNSD", query_rope=np.zeros((1, 2, 4, dr)),
                                       key_rope=np.zeros((1, 1, 4, dr)))


def test_tnd_mask_rules():
    qt, kt, vt = tnd()
    lens = dict(actual_seq_qlen=np.cumsum(Q_LENS), actual_seq_kvlen=np.cumsum(K_LENS))
    m = np.zeros((7, 7), bool)
    m[2] = True
    with pytest.raises(ValueError, match="must not mask a whole row .*row 2 is all 1"):
        cann.flash_attention_score(qt, kt, vt, N1, "TND", atten_mask=m, **lens)
    with pytest.raises(ValueError, match="Sq <= Skv in every sequence"):
        cann.flash_attention_score(qt, kt, vt, N1, "TND", atten_mask=TRI, sparse_mode=3,
                                   actual_seq_qlen=[4, 11, 14], actual_seq_kvlen=[6, 10, 18])


# ------------------------------------------------------------- bfloat16, inner_precise, softmax_in
def test_bfloat16_in_and_out():
    """bfloat16 operands (ml_dtypes) computed in float32, returned in bfloat16; error within
    bfloat16 rounding of the output (2**-8 relative to the largest value, plus one ulp)."""
    bf = ml_dtypes.bfloat16
    q, k, v = (x.astype(bf) for x in qkv(B, N1, N2, 10, 12, seed=12))
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "BNSD", scale=SCALE,
                                                 atten_mask=TRI, sparse_mode=2)
    assert out.dtype == bf and smax.dtype == np.float32
    masked = np.triu(np.ones((10, 12), bool), k=1)
    o_g, m_g, _, p, pd = golden_forward(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                        scale=SCALE, masked=masked)
    assert np.abs(out.astype(np.float64) - o_g).max() <= 2**-7 * np.abs(o_g).max()
    np.testing.assert_allclose(stats(smax), m_g, rtol=1e-5, atol=1e-6)
    do = np.random.default_rng(13).standard_normal(out.shape).astype(bf)
    grads = cann.flash_attention_score_grad(q, k, v, do, N1, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, scale=SCALE, atten_mask=TRI, sparse_mode=2)
    ref = golden_backward(do.astype(np.float64), q.astype(np.float64), k.astype(np.float64),
                          v.astype(np.float64), p, pd, scale=SCALE, n2=N2)
    for g, r in zip(grads, ref):
        assert g.dtype == bf
        assert np.abs(g.astype(np.float64) - r).max() <= 2**-6 * max(1.0, np.abs(r).max())
    with pytest.raises(TypeError, match="key must have query's dtype bfloat16"):
        cann.flash_attention_score(q, k.astype(np.float32), v, N1, "BNSD")


def test_inner_precise_changes_nothing_and_softmax_in_is_reserved():
    q, k, v = qkv(1, 2, 2, 9, 6, seed=14, dtype=np.float32)
    runs = [cann.flash_attention_score(q, k, v, 2, "BNSD", atten_mask=TRI, sparse_mode=3, inner_precise=ip)
            for ip in (0, 1, 2)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            np.testing.assert_array_equal(a, b)
    out, smax, ssum = runs[0]
    g0 = cann.flash_attention_score_grad(q, k, v, out, 2, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                         attention_in=out, atten_mask=TRI, sparse_mode=3)
    g1 = cann.flash_attention_score_grad(q, k, v, out, 2, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                         attention_in=out, atten_mask=TRI, sparse_mode=3,
                                         softmax_in=np.zeros((1, 2, 9, 6), np.float32))
    for a, b in zip(g0, g1):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ 12: pse and dropout
def assert_grads(grads, refs, what):
    for name, g, r in zip(("dq", "dk", "dv", "dpse"), grads, refs):
        np.testing.assert_allclose(g, r, atol=1e-5 * max(1.0, np.abs(r).max()), err_msg=f"{what} {name}")


def reduce_to(x, shape):
    """Sum a (B, N, Sq, Sk) array over the axes where ``shape`` has 1."""
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, x.shape)) if a == 1 and b != 1)
    return x.sum(axis=axes, keepdims=True)


@pytest.mark.parametrize("pse_type", [0, 1])
@pytest.mark.parametrize("shape", ["BNSS", "BN1S", "1NSS"])
def test_pse_tensor_forward_grad_dpse(pse_type, shape):
    sq, sk = 11, 14
    q, k, v = qkv(B, N1, N2, sq, sk, seed=15)
    pshape = {"BNSS": (B, N1, sq, sk), "BN1S": (B, N1, 1, sk), "1NSS": (1, N1, sq, sk)}[shape]
    pse = np.random.default_rng(16).standard_normal(pshape)
    masked = np.triu(np.ones((sq, sk), bool), k=sk - sq + 1)
    kw = dict(scale=SCALE, pse=pse, pse_type=pse_type, atten_mask=TRI, sparse_mode=3)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "BNSD", **kw)
    o_g, m_g, s_g, p, pd = golden_forward(q, k, v, scale=SCALE, masked=masked, pse=pse, pse_type=pse_type)
    np.testing.assert_allclose(out, o_g, atol=1e-10)
    np.testing.assert_allclose(stats(smax), m_g, rtol=1e-6)
    np.testing.assert_allclose(stats(ssum), s_g, rtol=1e-6)
    do = np.random.default_rng(17).standard_normal(out.shape)
    grads = cann.flash_attention_score_grad(q, k, v, do, N1, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, **kw)
    dq, dk, dv, ds = golden_backward(do, q, k, v, p, pd, scale=SCALE, n2=N2)
    dpse = reduce_to(ds * (SCALE if pse_type == 1 else 1.0), pshape)
    assert len(grads) == 4 and grads[3].shape == pshape and grads[3].dtype == pse.dtype
    assert_grads(grads, (dq, dk, dv, dpse), f"pse_type {pse_type} {shape}")


def alibi_bias(slopes, sq, sk, q_start, kv_start, sqrt, b):
    """test_utils.generate_pse for pse_type 2/3: slope * -|j - i - q_start + kv_start| (sqrt)."""
    dist = np.abs(np.arange(sk)[None, :] - np.arange(sq)[:, None] - q_start + kv_start).astype(np.float64)
    base = -(np.sqrt(dist) if sqrt else dist)
    s = slopes.reshape(-1 if slopes.ndim == 2 else 1, slopes.shape[-1])
    return np.broadcast_to(s.reshape(s.shape[0], -1, 1, 1) * base, (b, slopes.shape[-1], sq, sk))


@pytest.mark.parametrize("pse_type", [2, 3])
@pytest.mark.parametrize("per_batch", [False, True])
def test_pse_alibi_slopes(pse_type, per_batch):
    s = 13
    q, k, v = qkv(B, N1, N2, s, s, seed=18)
    rng = np.random.default_rng(19)
    slopes = rng.random((B, N1) if per_batch else (N1,)).astype(np.float32)
    kw = dict(scale=SCALE, pse=slopes, pse_type=pse_type, q_start_idx=[7], kv_start_idx=[3])
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "BNSD", **kw)
    bias = alibi_bias(slopes.astype(np.float64), s, s, 7, 3, pse_type == 3, B)
    o_g, m_g, _, p, pd = golden_forward(q, k, v, scale=SCALE, pse=bias, pse_type=pse_type)
    np.testing.assert_allclose(out, o_g, atol=1e-6)   # slopes are float32 in the kernel
    do = rng.standard_normal(out.shape)
    grads = cann.flash_attention_score_grad(q, k, v, do, N1, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, **kw)
    assert len(grads) == 3
    assert_grads(grads, golden_backward(do, q, k, v, p, pd, scale=SCALE, n2=N2), f"alibi {pse_type}")
    with pytest.raises(ValueError, match="Sq == Skv"):
        cann.flash_attention_score(*qkv(B, N1, N2, s, s + 1), N1, "BNSD", pse=slopes, pse_type=pse_type)


def test_pse_alibi_compressed_last_1024_rows():
    """[1, N, 1024, Sk] = the last 1024 rows of a Toeplitz ALiBi pse, Sq = Sk = 1030, causal:
    the same result as the full pse; dpse is the full one's gradient summed onto the rows and
    diagonals each compressed entry stands for."""
    s, n = 1030, 2
    q, k, v = qkv(1, n, n, s, s, d=8, dv=8, seed=20)
    full = alibi_bias(np.array([0.05, 0.2]), s, s, 0, 0, False, 1).copy()
    comp = np.ascontiguousarray(full[:, :, -1024:])
    kw = dict(scale=SCALE, pse_type=0, atten_mask=TRI, sparse_mode=2)
    out, smax, ssum = cann.flash_attention_score(q, k, v, n, "BNSD", pse=comp, **kw)
    masked = np.triu(np.ones((s, s), bool), k=1)
    o_g, _, _, p, pd = golden_forward(q, k, v, scale=SCALE, masked=masked, pse=full, pse_type=0)
    np.testing.assert_allclose(out, o_g, atol=1e-9)
    do = np.random.default_rng(21).standard_normal(out.shape)
    grads = cann.flash_attention_score_grad(q, k, v, do, n, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, pse=comp, **kw)
    ds = golden_backward(do, q, k, v, p, pd, scale=SCALE, n2=n)[3]
    dcomp = ds[:, :, -1024:].copy()
    for r in range(s - 1024):          # row r, key j <= r: diagonal j - r, in the last row at j + s-1-r
        j = np.arange(r + 1)
        dcomp[:, :, 1023, j + s - 1 - r] += ds[:, :, r, j]
    np.testing.assert_allclose(grads[3], dcomp, atol=1e-7 * max(1.0, np.abs(dcomp).max()))
    with pytest.raises(ValueError, match="lower triangle"):
        cann.flash_attention_score(q, k, v, n, "BNSD", pse=comp, pse_type=0)   # no mask: full attention


def test_pse_tnd_flat_blocks():
    """TND pse [pseTotalLen]: per sequence an [N, Sq_i, Skv_i] block, flattened, one after the other."""
    q, k, v = tnd(seed=22)
    rng = np.random.default_rng(23)
    blocks = [rng.standard_normal((1, N1, a, b)) for a, b in zip(Q_LENS, K_LENS)]
    pse = np.concatenate([x.reshape(-1) for x in blocks])
    lens = dict(actual_seq_qlen=np.cumsum(Q_LENS).tolist(), actual_seq_kvlen=np.cumsum(K_LENS).tolist())
    kw = dict(scale=SCALE, pse=pse, pse_type=1, softmax_layout="TND", **lens)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "TND", **kw)
    do = rng.standard_normal(out.shape)
    grads = cann.flash_attention_score_grad(q, k, v, do, N1, "TND", softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, **kw)
    dpse = []
    seqs = zip(per_sequence(q, Q_LENS), per_sequence(k, K_LENS), per_sequence(v, K_LENS),
               per_sequence(out, Q_LENS), per_sequence(do, Q_LENS), blocks)
    for s, (qi, ki, vi, oi, doi, bi) in enumerate(seqs):
        o_g, _, _, p, pd = golden_forward(qi, ki, vi, scale=SCALE, pse=bi, pse_type=1)
        np.testing.assert_allclose(oi, o_g, atol=1e-10, err_msg=f"sequence {s}")
        dpse.append((SCALE * golden_backward(doi, qi, ki, vi, p, pd, scale=SCALE, n2=N2)[3]).reshape(-1))
    np.testing.assert_allclose(grads[3], np.concatenate(dpse), atol=1e-8)
    with pytest.raises(ValueError, match=r"\[pseTotalLen\]"):
        cann.flash_attention_score(q, k, v, N1, "TND", pse=pse[:-1], **lens)


@pytest.mark.parametrize("sparse_mode", [3, 6])
def test_dropout_mask_counter_forward_and_grad(sparse_mode):
    """keep_prob 0.7: the keep mask of entry (b, h, i, j) is keep_mask's at counter offset +
    ((b N + h) Sq + i) Skv + j, for the one-call mode 3 and the per-batch mode 6 alike."""
    sq, sk, keep_prob, seed, offset = 9, 12, 0.7, 1234, 77
    q, k, v = qkv(B, N1, N2, sq, sk, seed=24)
    mask_kw = dict(atten_mask=TRI) if sparse_mode == 3 else dict(atten_mask=cann.compressed_mask(6),
                                                                 prefix=[5, 3])
    masked = np.triu(np.ones((B, 1, sq, sk), bool), k=sk - sq + 1)
    if sparse_mode == 6:
        masked[0, :, :, :5] = False
        masked[1, :, :, :3] = False
    keep = keep_mask((B, N1, sq, sk), 1 - keep_prob, seed, offset)
    kw = dict(scale=SCALE, keep_prob=keep_prob, seed=seed, offset=offset, sparse_mode=sparse_mode, **mask_kw)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "BNSD", **kw)
    o_g, m_g, s_g, p, pd = golden_forward(q, k, v, scale=SCALE, masked=masked, keep=keep, keep_prob=keep_prob)
    np.testing.assert_allclose(out, o_g, atol=1e-10)
    np.testing.assert_allclose(stats(ssum), s_g, rtol=1e-6)   # stats are before dropout
    do = np.random.default_rng(25).standard_normal(out.shape)
    grads = cann.flash_attention_score_grad(q, k, v, do, N1, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, **kw)
    assert_grads(grads, golden_backward(do, q, k, v, p, pd, scale=SCALE, n2=N2, keep=keep,
                                        keep_prob=keep_prob), f"dropout mode {sparse_mode}")
    other = cann.flash_attention_score(q, k, v, N1, "BNSD", **dict(kw, seed=seed + 1))[0]
    assert np.abs(other - out).max() > 1e-3


def test_dropout_tnd_counter_ranges():
    """TND sequence s counts from offset + N sum_{t<s} Sq_t Skv_t, (h Sq_s + i) Skv_s + j within."""
    q, k, v = tnd(seed=26)
    keep_prob, seed, offset = 0.8, 99, 5
    lens = dict(actual_seq_qlen=np.cumsum(Q_LENS).tolist(), actual_seq_kvlen=np.cumsum(K_LENS).tolist())
    out = cann.flash_attention_score(q, k, v, N1, "TND", scale=SCALE, keep_prob=keep_prob, seed=seed,
                                     offset=offset, **lens)[0]
    start = offset
    for s, (qi, ki, vi, oi) in enumerate(zip(per_sequence(q, Q_LENS), per_sequence(k, K_LENS),
                                             per_sequence(v, K_LENS), per_sequence(out, Q_LENS))):
        sq, sk = Q_LENS[s], K_LENS[s]
        keep = keep_mask((1, N1, sq, sk), 1 - keep_prob, seed, start)
        np.testing.assert_allclose(oi, golden_forward(qi, ki, vi, scale=SCALE, keep=keep,
                                                      keep_prob=keep_prob)[0], atol=1e-10)
        start += N1 * sq * sk


def test_pse_argument_rules():
    """Checked before any kernel runs: modes 7/8, an empty TND sequence, dtypes, ALiBi shapes."""
    q, k, v = qkv(B, N1, N2, 6, 6)
    with pytest.raises(TypeError, match="pse must have the query's dtype float64"):
        cann.flash_attention_score(q, k, v, N1, "BNSD", pse=np.zeros((B, N1, 6, 6), np.float32))
    with pytest.raises(TypeError, match="must be float32"):
        cann.flash_attention_score(q, k, v, N1, "BNSD", pse=np.zeros(N1), pse_type=2)
    with pytest.raises(ValueError, match=r"\[B,N\] = \(2, 4\) or \[N\]"):
        cann.flash_attention_score(q, k, v, N1, "BNSD", pse=np.zeros((3,), np.float32), pse_type=3)
    with pytest.raises(ValueError, match="pse_type must be 0, 1, 2 or 3"):
        cann.flash_attention_score(q, k, v, N1, "BNSD", pse_type=4)
    qt, kt, vt = tnd()
    lens = dict(actual_seq_qlen=np.cumsum(Q_LENS), actual_seq_kvlen=np.cumsum(K_LENS))
    with pytest.raises(ValueError, match="不支持可选参数pse"):
        cann.flash_attention_score(qt, kt, vt, N1, "TND", pse=np.zeros(10), sparse_mode=7, atten_mask=TRI,
                                   pre_tokens=100, next_tokens=0, **lens)
    with pytest.raises(ValueError, match="length 0"):
        cann.flash_attention_score(qt, kt, vt, N1, "TND", pse=np.zeros(10), actual_seq_qlen=[0, 11, 14],
                                   actual_seq_kvlen=lens["actual_seq_kvlen"])
