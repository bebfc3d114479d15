"""The CANN door's contract at its edges (issue 34 point 5): ``input_layout`` in any case, as
op-plugin upper-cases it, and torch_npu's seven-output ``npu_fusion_attention``
(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels).

Sources: op-plugin's ``npu_fusion_attention`` (``for (auto &c : input_layout_str) c =
toupper(c);``, "The input_layout should be BSH/SBH/BNSD/BSND/TND(case-insensitive)"; ``numels``
= B*N*S1*S2, TND: N * sum of Sq_i*Skv_i; ``seed``/``offset`` from the Philox generator only when
0 < keep_prob < 1; ``softmax_out = at::empty({0})``). The PTA documents list the layouts in
capitals and the seven outputs "(Tensor, Tensor, Tensor, Tensor, int, int, int)".
"""
from __future__ import annotations

import numpy as np
import pytest

from flashlab import cann

B, N, SQ, SK, D = 2, 3, 5, 7, 8


def _bnsd(seed=0, dtype=np.float32):
    r = np.random.default_rng(seed)
    q = r.standard_normal((B, N, SQ, D)).astype(dtype)
    k = r.standard_normal((B, N, SK, D)).astype(dtype)
    v = r.standard_normal((B, N, SK, D)).astype(dtype)
    return q, k, v


def _in_layout(x: np.ndarray, layout: str) -> np.ndarray:
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x
    bsnd = x.transpose(0, 2, 1, 3)
    if layout == "BSND":
        return np.ascontiguousarray(bsnd)
    if layout == "BSH":
        return np.ascontiguousarray(bsnd.reshape(b, s, n * d))
    return np.ascontiguousarray(bsnd.transpose(1, 0, 2, 3).reshape(s, b, n * d))   # SBH


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
@pytest.mark.parametrize("spelling", [str.lower, str.title])
def test_input_layout_in_any_case_gives_the_same_bits(layout, spelling):
    q, k, v = (_in_layout(x, layout) for x in _bnsd())
    ref = cann.flash_attention_score(q, k, v, N, layout, scale=0.35, sparse_mode=0)
    got = cann.flash_attention_score(q, k, v, N, spelling(layout), scale=0.35, sparse_mode=0)
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)
    dy = np.random.default_rng(1).standard_normal(ref[0].shape).astype(np.float32)
    kw = dict(softmax_max=ref[1], softmax_sum=ref[2], attention_in=ref[0], scale=0.35)
    g_ref = cann.flash_attention_score_grad(q, k, v, dy, N, layout, **kw)
    g_got = cann.flash_attention_score_grad(q, k, v, dy, N, spelling(layout), **kw)
    for a, b in zip(g_ref, g_got):
        np.testing.assert_array_equal(a, b)


def test_tnd_in_lower_case():
    r = np.random.default_rng(2)
    q, k, v = (r.standard_normal((6, N, D)).astype(np.float32) for _ in range(3))
    lens = dict(actual_seq_qlen=[2, 6], actual_seq_kvlen=[3, 6])
    for a, b in zip(cann.flash_attention_score(q, k, v, N, "TND", **lens),
                    cann.flash_attention_score(q, k, v, N, "tnd", **lens)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", ["BNS", "B N S D", "", 3, None])
def test_unknown_layouts_are_still_refused(bad):
    q, k, v = _bnsd()
    with pytest.raises(ValueError, match=r"input_layout must be one of BSH, SBH, BSND, BNSD, TND \(any case\)"):
        cann.flash_attention_score(q, k, v, N, bad)


def test_seven_outputs_agree_with_the_three():
    q, k, v = _bnsd(3)
    three = cann.flash_attention_score(q, k, v, N, "BNSD", scale=0.3, keep_prob=0.8, seed=11, offset=4)
    seven = cann.npu_fusion_attention(q, k, v, N, "BNSD", scale=0.3, keep_prob=0.8, seed=11, offset=4)
    assert len(seven) == 7
    for a, b in zip(three, seven[:3]):
        np.testing.assert_array_equal(a, b)
    softmax_out, seed, offset, numels = seven[3:]
    assert softmax_out.shape == (0,) and softmax_out.dtype == q.dtype
    assert (seed, offset) == (11, 4)
    assert numels == B * N * SQ * SK
    # the state returned regenerates the forward's mask: the grad from it is the grad of this forward
    dy = np.random.default_rng(4).standard_normal(three[0].shape).astype(np.float32)
    kw = dict(softmax_max=seven[1], softmax_sum=seven[2], attention_in=seven[0], scale=0.3, keep_prob=0.8)
    g = cann.flash_attention_score_grad(q, k, v, dy, N, "BNSD", seed=seed, offset=offset, **kw)
    assert all(np.isfinite(x).all() for x in g)
    # and the state is what the mask depends on: another seed, another mask, other gradients
    g_other = cann.flash_attention_score_grad(q, k, v, dy, N, "BNSD", seed=seed + 1, offset=offset, **kw)
    assert np.abs(g_other[2] - g[2]).max() > 1e-3


@pytest.mark.parametrize("keep_prob", [1.0])
def test_no_stream_drawn_without_dropout(keep_prob):
    q, k, v = _bnsd()
    *_, seed, offset, numels = cann.npu_fusion_attention(q, k, v, N, "BNSD", keep_prob=keep_prob,
                                                         seed=9, offset=3)
    assert (seed, offset) == (0, 0) and numels == B * N * SQ * SK


@pytest.mark.parametrize("layout", ["BSND", "BSH", "SBH"])
def test_numels_per_layout(layout):
    q, k, _ = (_in_layout(x, layout) for x in _bnsd())
    assert cann.dropout_mask_numels(q, k, N, layout) == B * N * SQ * SK


def test_numels_tnd_sums_each_sequence_and_ignores_trailing_ends():
    q = np.zeros((9, N, D), np.float32)
    k = np.zeros((12, N, D), np.float32)
    # lengths q (2, 0, 7), kv (5, 3, 4); the trailing repeated ends are unused batches
    n = cann.dropout_mask_numels(q, k, N, "TND", [2, 2, 9, 9], [5, 8, 12, 12])
    assert n == N * (2 * 5 + 0 * 3 + 7 * 4)


def _tnd(t_q, t_k, seed=6):
    r = np.random.default_rng(seed)
    return (r.standard_normal((t_q, N, D)).astype(np.float64), r.standard_normal((t_k, N, D)),
            r.standard_normal((t_k, N, D)))


@pytest.mark.parametrize("softmax_layout", ["", "TND"])
def test_tnd_tokens_past_the_last_sequence(softmax_layout):
    """T > sum(actual_seq) is accepted as the tiling accepts it (t1Size >= accumS1): the rows past
    the last sequence are no sequence's: output 0, the invalid-row statistics, zero gradients;
    the sequences give the bits they give without the extra rows."""
    lens = dict(actual_seq_qlen=[2, 5], actual_seq_kvlen=[3, 7])
    q, k, v = _tnd(5 + 3, 7 + 2)
    kw = dict(scale=0.3, softmax_layout=softmax_layout, **lens)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N, "TND", **kw)
    ref, rmax, rsum = cann.flash_attention_score(q[:5], k[:7], v[:7], N, "TND", **kw)
    np.testing.assert_array_equal(out[:5], ref)
    assert not out[5:].any()
    if softmax_layout == "TND":
        np.testing.assert_array_equal(smax[:5], rmax)
    else:   # NTD: the sequences' blocks first, then the extra rows' block
        np.testing.assert_array_equal(smax.reshape(-1)[:rmax.size], rmax.reshape(-1))
    assert np.all(smax.reshape(-1)[rmax.size:] == cann.attributes.EMPTY_ROW_MAX)
    dy = np.random.default_rng(7).standard_normal(out.shape)
    g = cann.flash_attention_score_grad(q, k, v, dy, N, "TND", softmax_max=smax, softmax_sum=ssum,
                                        attention_in=out, **kw)
    g_ref = cann.flash_attention_score_grad(q[:5], k[:7], v[:7], dy[:5], N, "TND", softmax_max=rmax,
                                            softmax_sum=rsum, attention_in=ref, **kw)
    np.testing.assert_array_equal(g[0][:5], g_ref[0])
    np.testing.assert_array_equal(g[1][:7], g_ref[1])
    assert not g[0][5:].any() and not g[1][7:].any() and not g[2][7:].any()


def test_tnd_ends_past_the_token_count_are_refused():
    q, k, v = _tnd(4, 4)
    with pytest.raises(ValueError, match="actual_seq_qlen must be non-decreasing cumulative ends from 0 "
                                         "at most the query token count T=4"):
        cann.flash_attention_score(q, k, v, N, "TND", actual_seq_qlen=[2, 5], actual_seq_kvlen=[2, 4])


@pytest.mark.parametrize("batch, refused", [(32, False), (33, True)])
def test_prefix_modes_take_at_most_32_batches(batch, refused):
    """PTA documents: "prefix稀疏计算场景B不大于32" (sparse_mode 5/6 with an atten_mask)."""
    sq = sk = 4
    r = np.random.default_rng(8)
    q, k, v = (r.standard_normal((batch, 1, sq, 8)) for _ in range(3))
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    # prefix mask of prefix 2: rightDownCausal, the first 2 keys visible to every query
    mask = ((j > i + sk - sq) & (j >= 2))[None, None].repeat(batch, 0)   # [B, 1, Sq, Sk]
    kw = dict(sparse_mode=5, atten_mask=mask, prefix=[2] * batch, scale=0.3)
    if refused:
        with pytest.raises(ValueError, match=r"sparse_mode=5 \(prefix\) supports at most B=32 batches"):
            cann.flash_attention_score(q, k, v, 1, "BNSD", **kw)
    else:
        out, _, _ = cann.flash_attention_score(q, k, v, 1, "BNSD", **kw)
        assert np.isfinite(out).all()
