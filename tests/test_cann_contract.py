"""The CANN operator's contract beyond the arithmetic (issue 34, point 5).

- :func:`flashlab.cann.npu_fusion_attention`: torch_npu's seven outputs, the first three
  bit-equal to :func:`flashlab.cann.flash_attention_score`'s, ``numels`` as op-plugin's
  ``npu_flash_attention`` computes it, and ``(seed, offset)`` that regenerate the dropout mask
  in the grad;
- ``input_layout`` in any case (op-plugin upper-cases it before its check);
- TND with ``T > sum(actual_seq)`` (the tiling's ``t1Size < accumS1`` refusal only);
- the prefix ``B <= 32`` and the RoPE ``atten_mask`` rules.

Expected values are computed here with the float64 reference on explicit masks.
"""
from __future__ import annotations

import numpy as np
import pytest

import flashlab
from flashlab import cann

TRI = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
N1, N2, D, DV = 4, 2, 16, 8
SCALE = 1.0 / np.sqrt(D)


def bnsd(b=2, sq=12, sk=16, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, N1, sq, D)).astype(dtype)
    k = rng.standard_normal((b, N2, sk, D)).astype(dtype)
    v = rng.standard_normal((b, N2, sk, DV)).astype(dtype)
    return q, k, v


# ------------------------------------------------------------------- the seven outputs
@pytest.mark.parametrize("keep_prob", [1.0, 0.8])
def test_seven_outputs_agree_with_the_three(keep_prob):
    q, k, v = bnsd()
    kw = dict(scale=SCALE, keep_prob=keep_prob, seed=7, offset=3, atten_mask=TRI, sparse_mode=2)
    three = cann.flash_attention_score(q, k, v, N1, "BNSD", **kw)
    seven = cann.npu_fusion_attention(q, k, v, N1, "BNSD", **kw)
    assert len(seven) == 7
    for a, b in zip(three, seven[:3]):
        np.testing.assert_array_equal(a, b)
    softmax_out, seed, offset, numels = seven[3:]
    assert softmax_out.shape == (0,) and softmax_out.dtype == q.dtype
    assert (seed, offset) == (7, 3)
    # numels: B * N * Sq * Skv, the [B, N, S, S] mask (op-plugin dropout_gen_mask)
    assert numels == 2 * N1 * 12 * 16
    assert all(type(x) is int for x in (seed, offset, numels))


@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND"])
def test_numels_in_every_layout(layout):
    """numels = B * head_num * Sq * Skv whatever the layout (read from the right axes)."""
    q, k, v = bnsd(b=3, sq=5, sk=9)
    perm = {"BSND": (0, 2, 1, 3), "BSH": (0, 2, 1, 3), "SBH": (2, 0, 1, 3)}[layout]

    def put(x):
        y = np.ascontiguousarray(x.transpose(perm))
        return y.reshape(y.shape[0], y.shape[1], -1) if layout in ("BSH", "SBH") else y

    numels = cann.npu_fusion_attention(put(q), put(k), put(v), N1, layout, scale=SCALE)[6]
    assert numels == 3 * N1 * 5 * 9


def test_tnd_numels_follows_the_source_loop():
    """TND: N * (q_0 k_0 + sum (q_i - q_{i-1})(k_i - k_{i-1})) over the cumulative lists as
    given; with trailing zeros the step back to 0 is counted too, as in op-plugin."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((9, N1, D)).astype(np.float32)
    k = rng.standard_normal((12, N2, D)).astype(np.float32)
    v = rng.standard_normal((12, N2, DV)).astype(np.float32)
    lens = dict(actual_seq_qlen=[2, 5, 9], actual_seq_kvlen=[4, 4, 12])
    assert cann.npu_fusion_attention(q, k, v, N1, "TND", scale=SCALE, **lens)[6] == \
        N1 * (2 * 4 + 3 * 0 + 4 * 8)
    lens = dict(actual_seq_qlen=[2, 5, 9, 0], actual_seq_kvlen=[4, 4, 12, 0])
    assert cann.npu_fusion_attention(q, k, v, N1, "TND", scale=SCALE, **lens)[6] == \
        N1 * (2 * 4 + 3 * 0 + 4 * 8 + 9 * 12)


def test_seed_and_offset_regenerate_the_mask_in_the_grad():
    """The returned (seed, offset) handed to the grad give the gradients of the same mask:
    equal to the float64 reference's on the explicit keep mask of flashlab.dropout."""
    q, k, v = (x.astype(np.float64) for x in bnsd(seed=2))
    out, smax, ssum, _, seed, offset, _ = cann.npu_fusion_attention(
        q, k, v, N1, "BNSD", scale=SCALE, keep_prob=0.75, seed=11, offset=5)
    dy = np.random.default_rng(3).standard_normal(out.shape)
    grads = cann.flash_attention_score_grad(q, k, v, dy, N1, "BNSD", softmax_max=smax,
                                            softmax_sum=ssum, attention_in=out, scale=SCALE,
                                            keep_prob=0.75, seed=seed, offset=offset)
    ref = flashlab.attention_reference_backward(dy, q, k, v, scale=SCALE, dropout_p=0.25,
                                                seed=11, offset=5)
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, atol=1e-10, rtol=1e-9)


# ------------------------------------------------------------------ input_layout's case
@pytest.mark.parametrize("layout", ["bnsd", "Bsnd", "bsh", "sbH", "tnd"])
def test_input_layout_in_any_case(layout):
    """op-plugin upper-cases input_layout ("for (auto &c : input_layout_str) { c = toupper(c); }")
    before "The input_layout should be BSH/SBH/BNSD/BSND/TND(case-insensitive)"."""
    upper = layout.upper()
    rng = np.random.default_rng(4)
    if upper == "TND":
        q = rng.standard_normal((9, N1, D)).astype(np.float32)
        k = rng.standard_normal((9, N2, D)).astype(np.float32)
        v = rng.standard_normal((9, N2, DV)).astype(np.float32)
        kw = dict(actual_seq_qlen=[4, 9], actual_seq_kvlen=[5, 9])
    else:
        shape = {"BNSD": (2, N1, 6, D), "BSND": (2, 6, N1, D), "BSH": (2, 6, N1 * D),
                 "SBH": (6, 2, N1 * D)}[upper]
        q = rng.standard_normal(shape).astype(np.float32)
        k, v = q.copy(), q.copy()
        kw = {}
    a = cann.flash_attention_score(q, k, v, N1, layout, scale=SCALE, **kw)
    b = cann.flash_attention_score(q, k, v, N1, upper, scale=SCALE, **kw)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    dy = np.ones_like(a[0])
    ga = cann.flash_attention_score_grad(q, k, v, dy, N1, layout, softmax_max=a[1],
                                         softmax_sum=a[2], attention_in=a[0], scale=SCALE, **kw)
    gb = cann.flash_attention_score_grad(q, k, v, dy, N1, upper, softmax_max=b[1],
                                         softmax_sum=b[2], attention_in=b[0], scale=SCALE, **kw)
    for x, y in zip(ga, gb):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("layout", ["BNDS", "", "BNSD ", 3])
def test_unknown_input_layout_is_refused(layout):
    q, k, v = bnsd()
    with pytest.raises(ValueError, match="input_layout must be one of"):
        cann.flash_attention_score(q, k, v, N1, layout)


# ------------------------------------------------------------------ TND with T > sum(lengths)
def tnd_padded(extra_q: int, extra_k: int, seed: int = 5, dtype=np.float64):
    """Three sequences (3, 0, 6 queries; 4, 2, 7 keys) and extra rows after them."""
    q_lens, k_lens = [3, 0, 6], [4, 2, 7]
    rng = np.random.default_rng(seed)
    tq, tk = sum(q_lens) + extra_q, sum(k_lens) + extra_k
    q = rng.standard_normal((tq, N1, D)).astype(dtype)
    k = rng.standard_normal((tk, N2, D)).astype(dtype)
    v = rng.standard_normal((tk, N2, DV)).astype(dtype)
    lens = dict(actual_seq_qlen=np.cumsum(q_lens).tolist(), actual_seq_kvlen=np.cumsum(k_lens).tolist())
    return q, k, v, q_lens, k_lens, lens


def reference_sequences(q, k, v, q_lens, k_lens, dy=None):
    """Per-sequence float64 reference (causal = mode 3, bottom-right) on explicit masks, in TND."""
    o = np.zeros((q.shape[0], N1, DV))
    lse = np.full((q.shape[0], N1), -np.inf)
    grads = [np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)]
    q0 = k0 = 0
    for sq, sk in zip(q_lens, k_lens):
        if sq:
            qs = q[q0:q0 + sq].transpose(1, 0, 2)[None]
            ks = k[k0:k0 + sk].transpose(1, 0, 2)[None]
            vs = v[k0:k0 + sk].transpose(1, 0, 2)[None]
            mask = np.triu(np.ones((sq, sk), dtype=bool), k=sk - sq + 1)
            ro, rl = flashlab.attention_reference(qs, ks, vs, scale=SCALE, mask=mask)[:2]
            o[q0:q0 + sq] = ro[0].transpose(1, 0, 2)
            lse[q0:q0 + sq] = rl[0].T
            if dy is not None:
                dys = dy[q0:q0 + sq].transpose(1, 0, 2)[None]
                g = flashlab.attention_reference_backward(dys, qs, ks, vs, scale=SCALE, mask=mask)
                grads[0][q0:q0 + sq] = g[0][0].transpose(1, 0, 2)
                grads[1][k0:k0 + sk] = g[1][0].transpose(1, 0, 2)
                grads[2][k0:k0 + sk] = g[2][0].transpose(1, 0, 2)
        q0, k0 = q0 + sq, k0 + sk
    return o, lse, grads


@pytest.mark.parametrize("softmax_layout", ["", "TND"])
@pytest.mark.parametrize("extra", [(4, 0), (0, 5), (3, 2)])
def test_tnd_rows_after_the_last_sequence(extra, softmax_layout):
    """T > sum(lengths) is accepted (the tiling refuses only t1Size < accumS1). The sequences'
    rows match the float64 reference; the rows after the last sequence are no sequence's:
    output 0, the no-key statistics, zero gradients; the key rows after it get zero dk, dv."""
    q, k, v, q_lens, k_lens, lens = tnd_padded(*extra)
    kw = dict(scale=SCALE, atten_mask=TRI, sparse_mode=3, softmax_layout=softmax_layout, **lens)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "TND", **kw)
    dy = np.random.default_rng(9).standard_normal(out.shape)
    ref_o, ref_lse, ref_g = reference_sequences(q, k, v, q_lens, k_lens, dy)
    used = sum(q_lens)
    np.testing.assert_allclose(out, ref_o, atol=1e-12)
    assert (out[used:] == 0).all()
    # softmax statistics back to token-major (NTD: the sequences' blocks, then the tail rows)
    m, s = smax[..., 0], ssum[..., 0]
    if softmax_layout == "":
        flat_m, flat_s = m.reshape(-1), s.reshape(-1)
        rows_m, rows_s, pos = np.empty_like(m), np.empty_like(s), 0
        for q0, sq in zip(np.cumsum([0] + q_lens[:-1]), q_lens):
            rows_m[q0:q0 + sq] = flat_m[pos:pos + N1 * sq].reshape(N1, sq).T
            rows_s[q0:q0 + sq] = flat_s[pos:pos + N1 * sq].reshape(N1, sq).T
            pos += N1 * sq
        rows_m[used:] = flat_m[pos:].reshape(N1, -1).T
        rows_s[used:] = flat_s[pos:].reshape(N1, -1).T
        m, s = rows_m, rows_s
    np.testing.assert_allclose(m[:used] + np.log(s[:used]), ref_lse[:used], atol=1e-12)
    assert (m[used:] == np.finfo(np.float32).min).all() and (s[used:] == np.finfo(np.float32).max).all()
    grads = cann.flash_attention_score_grad(q, k, v, dy, N1, "TND", softmax_max=smax,
                                            softmax_sum=ssum, attention_in=out, **kw)
    for g, r, name in zip(grads, ref_g, ("dq", "dk", "dv")):
        np.testing.assert_allclose(g, r, atol=1e-10, err_msg=name)
    assert (grads[0][used:] == 0).all() and (grads[1][sum(k_lens):] == 0).all()


def test_tnd_extra_rows_do_not_change_the_sequences():
    """The same sequences with and without trailing rows give the same values, bit for bit."""
    q, k, v, _, _, lens = tnd_padded(3, 2)
    a = cann.flash_attention_score(q, k, v, N1, "TND", scale=SCALE, softmax_layout="TND", **lens)
    b = cann.flash_attention_score(q[:9], k[:13], v[:13], N1, "TND", scale=SCALE,
                                   softmax_layout="TND", **lens)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x[:9], y)


@pytest.mark.parametrize("name, qlen, kvlen, text", [
    ("query", [3, 3, 10], [4, 6, 13], "actual_seq_qlen must be non-decreasing cumulative ends from 0 "
                                      "up to the query token count T=9"),
    ("key", [3, 3, 9], [4, 6, 14], "actual_seq_kvlen must be non-decreasing cumulative ends from 0 "
                                   "up to the key token count T=13"),
])
def test_tnd_t_below_the_sum_is_refused(name, qlen, kvlen, text):
    """T < sum(lengths): the tiling's refusal ("Query T(%ld) and key T(%ld) need larger than
    respectively sum of seqLen")."""
    q, k, v, _, _, _ = tnd_padded(0, 0)
    with pytest.raises(ValueError, match=text.replace("(", r"\(")):
        cann.flash_attention_score(q, k, v, N1, "TND", actual_seq_qlen=qlen, actual_seq_kvlen=kvlen)


# ------------------------------------------------------------------ prefix B <= 32, RoPE mask
@pytest.mark.parametrize("mode", [5, 6])
def test_prefix_modes_take_at_most_32_batches(mode):
    """PTA: "prefix稀疏计算场景B不大于32". B = 32 runs and matches the reference; 33 is refused."""
    mask = {5: None, 6: np.concatenate([TRI, np.pad(np.ones((1024, 1024), bool), ((0, 0), (1024, 0)))])}[mode]
    for b in (32, 33):
        q, k, v = (x.astype(np.float64) for x in bnsd(b=b, sq=6, sk=8, seed=b))
        atten = np.triu(np.ones((b, 1, 6, 8), dtype=bool), k=8 - 6 + 1) if mode == 5 else mask
        if mode == 5:
            atten[..., :3] = False
        kw = dict(scale=SCALE, sparse_mode=mode, atten_mask=atten, prefix=[3] * b)
        if b == 33:
            with pytest.raises(ValueError, match="sparse_mode=.* at most B=32 batches.*got B=33"):
                cann.flash_attention_score(q, k, v, N1, "BNSD", **kw)
            continue
        out = cann.flash_attention_score(q, k, v, N1, "BNSD", **kw)[0]
        allowed = ~np.triu(np.ones((6, 8), dtype=bool), k=3)
        allowed[:, :3] = True
        ref = flashlab.attention_reference(q, k, v, scale=SCALE, mask=~allowed)[0]
        np.testing.assert_allclose(out, ref, atol=1e-12)


def test_prefix_batch_rule_needs_the_mask():
    """Without atten_mask every mode is full attention (the mask arguments take no effect), so
    B > 32 with sparse_mode 6 is not a prefix computation and runs."""
    q, k, v = bnsd(b=33, sq=4, sk=4)
    cann.flash_attention_score(q, k, v, N1, "BNSD", sparse_mode=6, prefix=[2] * 33)


def test_tnd_prefix_counts_sequences():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((33, N1, D)).astype(np.float32)
    k = rng.standard_normal((33, N2, D)).astype(np.float32)
    v = rng.standard_normal((33, N2, DV)).astype(np.float32)
    mask6 = np.concatenate([TRI, np.pad(np.ones((1024, 1024), bool), ((0, 0), (1024, 0)))])
    lens = dict(actual_seq_qlen=list(range(1, 34)), actual_seq_kvlen=list(range(1, 34)))
    with pytest.raises(ValueError, match="got B=33"):
        cann.flash_attention_score(q, k, v, N1, "TND", sparse_mode=6, atten_mask=mask6,
                                   prefix=[1] * 33, **lens)


def test_rope_without_atten_mask_is_refused_in_the_grad_too():
    rng = np.random.default_rng(6)
    q, k, v = bnsd(b=1, sq=4, sk=4)
    qr = rng.standard_normal((1, N1, 4, 8)).astype(np.float32)
    kr = rng.standard_normal((1, 1, 4, 8)).astype(np.float32)
    full = np.zeros((4, 4), dtype=bool)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "BNSD", query_rope=qr, key_rope=kr,
                                                 atten_mask=full)
    with pytest.raises(ValueError, match="query_rope/key_rope need atten_mask"):
        cann.flash_attention_score_grad(q, k, v, np.ones_like(out), N1, "BNSD", softmax_max=smax,
                                        softmax_sum=ssum, attention_in=out, query_rope=qr,
                                        key_rope=kr)


def test_seven_outputs_in_tnd_with_dropout_and_extra_rows():
    """TND (NTD statistics, T > sum, dropout): the first three outputs are the three-output
    path's, bit for bit, and the grad from the returned (seed, offset) equals the grad of the
    three-output path's call with the same seed and offset."""
    q, k, v, _, _, lens = tnd_padded(2, 1, dtype=np.float32)
    kw = dict(scale=SCALE, keep_prob=0.9, seed=123, offset=40, **lens)
    three = cann.flash_attention_score(q, k, v, N1, "TND", **kw)
    out, smax, ssum, softmax_out, seed, offset, numels = cann.npu_fusion_attention(q, k, v, N1, "tnd", **kw)
    for a, b in zip(three, (out, smax, ssum)):
        np.testing.assert_array_equal(a, b)
    assert softmax_out.size == 0 and (seed, offset) == (123, 40)
    assert numels == N1 * (3 * 4 + 0 * 2 + 6 * 7)
    dy = np.ones_like(out)
    g1 = cann.flash_attention_score_grad(q, k, v, dy, N1, "TND", softmax_max=smax, softmax_sum=ssum,
                                         attention_in=out, **{**kw, "seed": seed, "offset": offset})
    g2 = cann.flash_attention_score_grad(q, k, v, dy, N1, "TND", softmax_max=three[1],
                                         softmax_sum=three[2], attention_in=three[0], **kw)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)
