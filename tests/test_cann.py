"""flashlab.cann (the CANN FlashAttentionScore interface) against masks built here from the docs.

Every expected mask is written in this file with dense numpy from the documented rules (CANN
ops-transformer *sparse_mode* docs; the ``np.triu``/``np.tril`` forms are the vendor's own
examples), never through :mod:`flashlab.masks`, and every layout conversion is this file's own,
so that a shared bug cannot hide. Results are compared with :func:`flashlab.attention_reference`
on (B, H, S, D) data under conftest's tolerance rule; gradients with the analytic
:func:`flashlab.attention_reference_backward`.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import assert_close_to_reference, make_qkv, max_abs_err, random_mask

import flashlab
from flashlab import api, cann
from flashlab.validation import prepare

INF = 2147483647
LAYOUTS4 = ["BSH", "SBH", "BSND", "BNSD"]
#: B, N_q, N_kv, D, D_v of the B/N/S/D-layout tests (GQA and D_v < D on purpose)
B, N1, N2, D, DV = 2, 4, 2, 16, 8
SCALE = 1.0 / np.sqrt(D)
BLOCKS = dict(block_q=16, block_k=16)
TRI = np.triu(np.ones((2048, 2048), dtype=bool), k=1)


def tri6() -> np.ndarray:
    """The 3072 x 2048 compressed prefix mask: TRI over 1024 rows of [0 x 1024, 1 x 1024]."""
    rect = np.zeros((1024, 2048), dtype=bool)
    rect[:, 1024:] = True
    return np.concatenate([TRI, rect])


# ------------------------------------------------------------------ independent rules
def rule_allowed(mode: int, sq: int, sk: int, pre: int = INF, nxt: int = INF,
                 prefix: int | None = None) -> np.ndarray:
    """(sq, sk) bool, True = allowed, of one sequence under ``mode`` (0..6), from the docs."""
    ones = np.ones((sq, sk), dtype=bool)
    if mode == 0:
        # top-left origin: masked above diagonal +next and below diagonal -pre
        masked = np.triu(ones, k=nxt + 1) | np.tril(ones, k=-pre - 1)
    elif mode == 1:
        masked = ~ones
    elif mode == 2:
        masked = np.triu(ones, k=1)
    elif mode == 3:
        masked = np.triu(ones, k=sk - sq + 1)
    elif mode == 4:
        # bottom-right origin: the diagonal through (sq-1, sk-1) has offset sk - sq
        masked = np.triu(ones, k=sk - sq + nxt + 1) | np.tril(ones, k=sk - sq - pre - 1)
    elif mode in (5, 6):
        masked = np.triu(ones, k=sk - sq + 1)
        masked[:, :prefix] = False
    else:
        raise AssertionError(mode)
    return ~masked


def to_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """(B, N, S, D) -> layout, written out with transposes (independent of flashlab.cann)."""
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x.copy()
    if layout == "BSND":
        return np.ascontiguousarray(np.einsum("bnsd->bsnd", x))
    if layout == "BSH":
        return np.einsum("bnsd->bsnd", x).reshape(b, s, n * d)
    if layout == "SBH":
        return np.einsum("bnsd->sbnd", x).reshape(s, b, n * d)
    raise AssertionError(layout)


def from_layout(y: np.ndarray, layout: str, n: int) -> np.ndarray:
    """layout -> (B, N, S, D)."""
    if layout == "BNSD":
        return y
    if layout == "BSND":
        return np.einsum("bsnd->bnsd", y)
    if layout == "BSH":
        b, s, h = y.shape
        return np.einsum("bsnd->bnsd", y.reshape(b, s, n, h // n))
    if layout == "SBH":
        s, b, h = y.shape
        return np.einsum("sbnd->bnsd", y.reshape(s, b, n, h // n))
    raise AssertionError(layout)


#: softmax_max / softmax_sum of a row with no allowed key (the vendor golden's float32 min / max)
EMPTY_MAX, EMPTY_SUM = -3.4028235e38, 3.4028235e38


def lse_of(softmax_max: np.ndarray, softmax_sum: np.ndarray) -> np.ndarray:
    """LSE = max + log(sum) of the first copy; -inf where the stats are the empty-row pair."""
    m = softmax_max[..., 0].astype(np.float64)
    s = softmax_sum[..., 0].astype(np.float64)
    empty = (m == np.float32(EMPTY_MAX)) & (s == np.float32(EMPTY_SUM))
    return np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, s)))


def tnd_rows(x: np.ndarray, q_lens: list[int], n: int, layout: str = "") -> np.ndarray:
    """TND softmax stats (T, N, 8) -> token-major (T, N, 8).

    Default layout NTD: sequence by sequence, a block [N, Sq_i, 8] of each (the vendor golden
    concatenates each sequence's flattened [1, N, Sq_i, 8]).
    """
    if layout == "TND":
        return x
    flat = x.reshape(-1, 8)
    out, t = np.empty_like(x), 0
    for sq in q_lens:
        out[t:t + sq] = flat[n * t:n * (t + sq)].reshape(n, sq, 8).transpose(1, 0, 2)
        t += sq
    return out


def check(o, lse, q, k, v, allowed4, what=""):
    """Kernel (o, lse) (B, H, Sq, *) vs reference and naive on the same explicit mask."""
    opts = dict(scale=SCALE, mask=~allowed4)
    ref = flashlab.attention_reference(q, k, v, **opts)
    naive = flashlab.attention_naive(q, k, v, **opts)
    assert_close_to_reference(o, lse.astype(np.float32), *naive, *ref, what=what)
    assert (o[np.isneginf(ref[1])] == 0).all(), f"{what}: a row with no key must give 0"


# ------------------------------------------------------------ the B/N/S/D layouts x modes
def mode_case(mode: int, sq: int, sk: int):
    """(operator kwargs, expected allowed (B, 1, sq, sk)) for one mode, chosen to bite."""
    if mode == 0:
        pre, nxt = 10, 3
        extra = random_mask((B, 1, sq, sk), seed=3, p_masked=0.2)  # row 0: no key at all
        allowed = rule_allowed(0, sq, sk, pre, nxt)[None, None] & ~extra
        return dict(atten_mask=~allowed, pre_tokens=pre, next_tokens=nxt), allowed
    if mode == 1:
        m = random_mask((B, N1, sq, sk), seed=4, p_masked=0.4)
        # pre/next are ignored in mode 1: tiny values would mask nearly everything otherwise
        return dict(atten_mask=m.astype(np.uint8), pre_tokens=0, next_tokens=0), ~m
    if mode in (2, 3):
        allowed = np.broadcast_to(rule_allowed(mode, sq, sk), (B, 1, sq, sk))
        return dict(atten_mask=TRI, pre_tokens=1, next_tokens=1), allowed
    if mode == 4:
        pre, nxt = 9, 4
        allowed = np.broadcast_to(rule_allowed(4, sq, sk, pre, nxt), (B, 1, sq, sk))
        return dict(atten_mask=TRI, pre_tokens=pre, next_tokens=nxt), allowed
    # prefix modes: a different prefix per batch, at the two ends of the allowed range
    lo = 0 if sq > sk else sk - sq
    prefix = [lo + (sk - lo) // 2, lo]
    allowed = np.stack([rule_allowed(mode, sq, sk, prefix=p) for p in prefix])[:, None]
    mask = ~allowed if mode == 5 else tri6()
    return dict(atten_mask=mask, prefix=prefix), allowed


@pytest.mark.parametrize("layout", LAYOUTS4)
@pytest.mark.parametrize("mode", range(7))
@pytest.mark.parametrize("sq, sk", [(37, 53), (53, 37)])
def test_layouts_x_modes_forward(layout, mode, sq, sk):
    data = make_qkv(B, N1, N2, sq, sk, D, DV, seed=mode)
    kw, allowed = mode_case(mode, sq, sk)
    args = [to_layout(data[n], layout) for n in ("q", "k", "v")]
    out, smax, ssum = cann.flash_attention_score(*args, N1, layout, scale=SCALE, sparse_mode=mode,
                                                 **kw, **BLOCKS)
    assert out.dtype == np.float32 and smax.dtype == np.float32 and ssum.dtype == np.float32
    assert smax.shape == ssum.shape == (B, N1, sq, 8)
    o = from_layout(out, layout, N1)
    assert o.shape == (B, N1, sq, DV)
    check(o, lse_of(smax, ssum), data["q"], data["k"], data["v"], allowed,
          what=f"{layout} mode {mode} {sq}x{sk}")


def test_mode0_mask_shapes():
    """atten_mask [Sq,Sk], [1,1,Sq,Sk], [B,1,Sq,Sk], [B,N,Sq,Sk] all mean the same broadcast."""
    sq, sk = 20, 29
    data = make_qkv(B, N1, N2, sq, sk, D, DV, seed=7)
    full = random_mask((B, N1, sq, sk), seed=8)
    for m in (full[0, 0], full[:1, :1], full[:, :1], full):
        out, smax, ssum = cann.flash_attention_score(data["q"], data["k"], data["v"], N1, "BNSD",
                                                     atten_mask=m, scale=SCALE, **BLOCKS)
        allowed = ~np.broadcast_to(m.reshape((1,) * (4 - m.ndim) + m.shape), (B, N1, sq, sk))
        check(out, lse_of(smax, ssum), data["q"], data["k"], data["v"], allowed, what=str(m.shape))


def test_no_mask_is_full_attention_and_float16_keeps_dtype():
    data = make_qkv(1, 2, 1, 9, 30, 16, 16, seed=9, dtype=np.float16)
    out, smax, ssum = cann.flash_attention_score(*(to_layout(data[n], "BSH") for n in "qkv"), 2, "BSH",
                                                 scale=0.25)
    assert out.dtype == np.float16 and smax.dtype == np.float32
    ref = flashlab.attention_reference(data["q"], data["k"], data["v"], scale=0.25)
    assert max_abs_err(from_layout(out, "BSH", 2), ref[0]) < 5e-3
    assert max_abs_err(lse_of(smax, ssum), ref[1]) < 5e-3


# --------------------------------------------------------------------------- softmax stats
def test_softmax_max_and_sum_values():
    """max = row max of the scaled masked scores, sum = sum exp(s - max); a row with no key
    gets max = float32 lowest, sum = float32 max and out = 0 (vendor golden cpu_impl.py)."""
    sq, sk = 21, 13   # Sq > Sk: mode 3 leaves the first 8 rows without a key
    data = make_qkv(B, N1, N2, sq, sk, D, DV, seed=11)
    out, smax, ssum = cann.flash_attention_score(data["q"], data["k"], data["v"], N1, "BNSD",
                                                 atten_mask=TRI, scale=SCALE, sparse_mode=3)
    q, k = data["q"].astype(np.float64), np.repeat(data["k"].astype(np.float64), N1 // N2, axis=1)
    s = SCALE * q @ k.swapaxes(-1, -2)
    ok = rule_allowed(3, sq, sk)
    s = np.where(ok, s, -np.inf)
    row_max = s.max(axis=-1)
    empty = ~ok.any(axis=-1)
    assert empty.sum() == sq - sk
    # the 8 copies are equal
    assert (smax == smax[..., :1]).all() and (ssum == ssum[..., :1]).all()
    np.testing.assert_array_equal(smax[:, :, empty], np.float32(EMPTY_MAX))
    np.testing.assert_array_equal(ssum[:, :, empty], np.float32(EMPTY_SUM))
    assert (out[:, :, empty] == 0).all()
    np.testing.assert_allclose(smax[..., 0][:, :, ~empty], row_max[:, :, ~empty], rtol=1e-5, atol=1e-6)
    with np.errstate(invalid="ignore"):
        row_sum = np.exp(s - row_max[..., None]).sum(axis=-1)
    np.testing.assert_allclose(ssum[..., 0][:, :, ~empty], row_sum[:, :, ~empty], rtol=1e-5)
    assert (ssum[..., 0][:, :, ~empty] >= 1.0 - 1e-6).all()   # the max term contributes e^0


# ------------------------------------------------------------------------------------ TND
Q_LENS = [5, 0, 17, 9, 12]
K_LENS = [7, 3, 11, 20, 12]


def tnd_data(seed: int = 0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    tq, tk = sum(Q_LENS), sum(K_LENS)
    q = rng.standard_normal((tq, N1, D)).astype(dtype)
    k = rng.standard_normal((tk, N2, D)).astype(dtype)
    v = rng.standard_normal((tk, N2, DV)).astype(dtype)
    return q, k, v


def sequence_rules(mode: int, pre: int, nxt: int, prefix, user_mask, q_lens=Q_LENS):
    """Expected allowed (sq, sk) per sequence, the varlen modes mapped as the docs say."""
    nonempty = [s for s, n in enumerate(q_lens) if n]
    out = []
    for s, (sq, sk) in enumerate(zip(q_lens, K_LENS)):
        m = mode
        if mode == 7:   # split after rightDownCausal: the last non-empty sequence is a band
            m = 4 if s == nonempty[-1] else 3
        if mode == 8:   # split after leftUpCausal: the first non-empty sequence is a band
            m = 4 if s == nonempty[0] else 2
        ok = rule_allowed(m, sq, sk, pre, nxt, None if prefix is None else prefix[s])
        if user_mask is not None:
            ok = ok & ~user_mask[:sq, :sk]
        out.append(ok)
    return out


TND_CASES = {
    0: dict(pre=INF, nxt=INF),
    1: dict(pre=0, nxt=0),
    2: dict(pre=INF, nxt=INF),
    # the device refuses Sq - next_tokens > Skv in any sequence (sequence 2: 17 - 6 = 11)
    4: dict(pre=6, nxt=6),
    6: dict(pre=INF, nxt=INF),
    # last sequence: Skv = 12; mode 7 needs Sq <= Skv in every sequence (the device tiling
    # refuses Q_LENS' 17 > 11): the same token counts, other query lengths
    7: dict(pre=12, nxt=-3, q_lens=[5, 0, 11, 18, 9]),   # last: 9 + 3 <= Skv = 12
    8: dict(pre=8, nxt=1),     # first non-empty sequence: Skv = 7
}


def case_lens(mode: int) -> list[int]:
    """The query lengths of a TND_CASES mode (Q_LENS unless it names its own)."""
    return TND_CASES[mode].get("q_lens", Q_LENS)


def tnd_case(mode: int):
    """(operator kwargs, expected allowed (sq, sk) per sequence) of one TND_CASES mode."""
    pre, nxt = TND_CASES[mode]["pre"], TND_CASES[mode]["nxt"]
    q_lens = case_lens(mode)
    kw = dict(pre_tokens=pre, next_tokens=nxt)
    user_mask, prefix = None, None
    if mode in (0, 1):
        user_mask = random_mask((max(q_lens), max(K_LENS)), seed=mode, p_masked=0.3, full_rows=0)
        kw["atten_mask"] = user_mask
    elif mode == 6:
        # past the causal band where it fits (sk - sq + 4, at most Sk: a sequence without
        # queries must have prefix = Skv on the device), else a short one (Sq > Sk: [0, Sk])
        prefix = [min(sk, sk - sq + 4) if sq <= sk else 2 for sq, sk in zip(q_lens, K_LENS)]
        kw.update(atten_mask=tri6(), prefix=prefix)
    else:
        kw["atten_mask"] = TRI
    kw.update(sparse_mode=mode, actual_seq_qlen=np.cumsum(q_lens).tolist(),
              actual_seq_kvlen=np.cumsum(K_LENS).tolist())
    return kw, sequence_rules(mode, pre, nxt, prefix, user_mask, q_lens)


def tnd_seq(x: np.ndarray, start: int, n: int) -> np.ndarray:
    """Tokens [start, start + n) of a (T, N, D) array as (1, N, n, D)."""
    return x[start:start + n].transpose(1, 0, 2)[None]


@pytest.mark.parametrize("mode", sorted(TND_CASES))
def test_tnd_per_sequence(mode):
    q, k, v = tnd_data(seed=mode)
    kw, rules = tnd_case(mode)
    q_lens = case_lens(mode)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "TND", scale=SCALE, **kw, **BLOCKS)
    assert out.shape == (sum(Q_LENS), N1, DV) and smax.shape == ssum.shape == (sum(Q_LENS), N1, 8)
    lse = lse_of(tnd_rows(smax, q_lens, N1), tnd_rows(ssum, q_lens, N1))
    q0 = k0 = 0
    for s, (sq, sk) in enumerate(zip(q_lens, K_LENS)):
        if sq:
            check(tnd_seq(out, q0, sq), lse[q0:q0 + sq].T[None], tnd_seq(q, q0, sq), tnd_seq(k, k0, sk),
                  tnd_seq(v, k0, sk), rules[s][None, None], what=f"TND mode {mode} sequence {s}")
        q0, k0 = q0 + sq, k0 + sk


def test_mode8_band_is_the_first_sequence_with_queries():
    """Issue #22: query lengths [0, 4, 3], key lengths [5, 6, 3]. The device's tiling takes
    the band sequence of sparse_mode=8 from the first sequence with a non-empty *query*
    (firstValidIndex), so sequence 1 is the band (mode 4, next = 2 from the bottom-right) and
    sequence 2 leftUpCausal; sequence 0 has keys but no query and is skipped. (Taking the
    first non-empty *key* sequence, 0, made sequence 1 causal: an output error of 2.65.)"""
    q_lens, k_lens, pre, nxt = [0, 4, 3], [5, 6, 3], INF, 2
    rng = np.random.default_rng(3)
    q = rng.standard_normal((sum(q_lens), N1, D)).astype(np.float32)
    k = rng.standard_normal((sum(k_lens), N2, D)).astype(np.float32)
    v = rng.standard_normal((sum(k_lens), N2, DV)).astype(np.float32)
    out, smax, ssum = cann.flash_attention_score(
        q, k, v, N1, "TND", scale=SCALE, atten_mask=TRI, sparse_mode=8, pre_tokens=pre,
        next_tokens=nxt, actual_seq_qlen=np.cumsum(q_lens).tolist(),
        actual_seq_kvlen=np.cumsum(k_lens).tolist(), **BLOCKS)
    lse = lse_of(tnd_rows(smax, q_lens, N1), tnd_rows(ssum, q_lens, N1))
    rules = {1: rule_allowed(4, 4, 6, pre, nxt), 2: rule_allowed(2, 3, 3)}
    assert not rules[1][0, 5] and rules[1][0, 4]          # the band reaches 2 past the diagonal
    q0, k0 = 0, 5
    for s in (1, 2):
        sq, sk = q_lens[s], k_lens[s]
        check(tnd_seq(out, q0, sq), lse[q0:q0 + sq].T[None], tnd_seq(q, q0, sq),
              tnd_seq(k, k0, sk), tnd_seq(v, k0, sk), rules[s][None, None],
              what=f"mode 8 sequence {s}")
        q0, k0 = q0 + sq, k0 + sk
    # the pre_tokens >= first_Skv rule reads the same sequence: Skv = 6, not 5
    with pytest.raises(ValueError, match="first sequence's Skv=6"):
        cann.flash_attention_score(
            q, k, v, N1, "TND", scale=SCALE, atten_mask=TRI, sparse_mode=8, pre_tokens=5,
            next_tokens=0, actual_seq_qlen=np.cumsum(q_lens).tolist(),
            actual_seq_kvlen=np.cumsum(k_lens).tolist())


def test_tnd_trailing_unused_batches():
    """[2, 5, 9, 0, 0]: the last two batches take no part; same result as [2, 5, 9]."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((9, 2, 16)).astype(np.float32) for _ in range(3))
    a = cann.flash_attention_score(q, k, v, 2, "TND", actual_seq_qlen=[2, 5, 9, 0, 0],
                                   actual_seq_kvlen=[2, 5, 9, 0, 0], atten_mask=TRI, sparse_mode=3)
    b = cann.flash_attention_score(q, k, v, 2, "TND", actual_seq_qlen=[2, 5, 9],
                                   actual_seq_kvlen=[2, 5, 9], atten_mask=TRI, sparse_mode=3)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_tnd_sequences_do_not_see_each_other():
    """Changing the keys of one sequence changes only that sequence's output."""
    q, k, v = tnd_data(seed=3)
    lens = dict(actual_seq_qlen=np.cumsum(Q_LENS), actual_seq_kvlen=np.cumsum(K_LENS))
    a = cann.flash_attention_score(q, k, v, N1, "TND", **lens)[0]
    k2, v2 = k.copy(), v.copy()
    k2[10:21] += 1.0   # sequence 2's keys: [10, 21)
    v2[10:21] -= 1.0
    b = cann.flash_attention_score(q, k2, v2, N1, "TND", **lens)[0]
    changed = np.abs(a - b).max(axis=(1, 2)) > 0
    np.testing.assert_array_equal(np.flatnonzero(changed), np.arange(5, 22))   # sequence 2's queries


# ----------------------------------------------------------------------------------- plan
def test_band_modes_need_no_dense_mask_and_skip_tiles():
    """Modes 2, 3, 4 (and a prefix inside the causal band) become a band only: tiles can be skipped."""
    dims = cann.Dims(1, 1, 1, 100, 120, 1, 1)
    for mode, kw, band in [(2, {}, (cann.NO_LIMIT, 0)), (3, {}, (cann.NO_LIMIT, 20)),
                           (4, dict(pre_tokens=5, next_tokens=1), (5 - 20, 1 + 20)),
                           (6, dict(prefix=[20]), (cann.NO_LIMIT, 20))]:
        mask = cann.compressed_mask(6) if mode == 6 else TRI
        (call,) = cann.plan(dims, sparse_mode=mode, atten_mask=mask, **kw)
        assert call.mask is None and (call.left, call.right) == band, mode
    # a prefix sticking out of the band needs the dense mask
    (call,) = cann.plan(dims, sparse_mode=6, atten_mask=cann.compressed_mask(6), prefix=[60])
    assert call.mask is not None and call.right == 59
    # the band reaches the kernel: leftUpCausal on 128 x 128 in 32 x 32 tiles computes 10 of 16
    (call,) = cann.plan(cann.Dims(1, 1, 1, 128, 128, 1, 1), sparse_mode=2, atten_mask=TRI)
    data = make_qkv(1, 1, 1, 128, 128, 16, 16, seed=1)
    p = prepare(data["q"], data["k"], data["v"], window=call.window, block_q=32, block_k=32)
    assert api.flash_attention(problem=p, stats=True)[3].sum() == 4 + 3 + 2 + 1


def test_sparse_mode_mask_matches_the_rules():
    for mode in range(7):
        kw = dict(atten_mask=TRI)
        if mode == 0:
            kw = dict(atten_mask=~rule_allowed(0, 12, 16, 6, 2), pre_tokens=6, next_tokens=2)
        if mode == 1:
            kw = dict(atten_mask=~rule_allowed(2, 12, 16))
        if mode == 4:
            kw.update(pre_tokens=6, next_tokens=2)
        if mode == 5:
            kw = dict(atten_mask=~rule_allowed(5, 12, 16, prefix=9)[None, None], prefix=[9])
        if mode == 6:
            kw = dict(atten_mask=tri6(), prefix=[9])
        expected = rule_allowed(2 if mode == 1 else mode, 12, 16, 6, 2, 9)
        np.testing.assert_array_equal(cann.sparse_mode_mask(12, 16, mode, **kw), expected, str(mode))


def test_drawing_and_table():
    """Each panel shows what the operator computes for the example; the table has every mode."""
    import matplotlib.pyplot as plt

    from flashlab.viz.sparse_modes import example_arguments, sparse_mode_markdown, sparse_mode_table
    fig = sparse_mode_table(12, 16)
    args = example_arguments(12, 16)
    assert len(fig.axes) == 9
    for mode, ax in enumerate(fig.axes):
        shown = np.asarray(ax.images[0].get_array())
        np.testing.assert_array_equal(shown, cann.sparse_mode_mask(12, 16, mode, **args[mode]))
        assert ax.get_title().startswith(f"{mode}: ")
    # panels differ where the modes differ (3 vs 2: Sq != Sk; 6 vs 3: the prefix sticks out)
    images = [np.asarray(ax.images[0].get_array()) for ax in fig.axes]
    assert (images[2] != images[3]).any() and (images[3] != images[6]).any()
    plt.close(fig)
    md = sparse_mode_markdown().splitlines()
    assert len(md) == 11 and all(line.count(" | ") == 4 for line in md[2:])
    assert [line.split(" | ")[0] for line in md[2:]] == [f"| {m}" for m in range(9)]


# ----------------------------------------------------------------------------------- grad
def grad_tol(ref: np.ndarray) -> float:
    """The grad tests' tolerance: float32 gradient vs float64 analytic, 1e-4 * max(1, max|ref|)."""
    return 1e-4 * max(1.0, float(np.abs(ref).max()))


def assert_grads_close(grads, refs, what: str) -> None:
    """Each of dq, dk, dv within :func:`grad_tol` of the float64 analytic gradient."""
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        assert np.isfinite(g).all(), f"{what}: {name} not finite"
        err = max_abs_err(g, r)
        assert err <= grad_tol(r), f"{what}: {name} error {err:.3g} > {grad_tol(r):.3g}"


@pytest.mark.parametrize("layout", LAYOUTS4)
@pytest.mark.parametrize("mode", range(7))
@pytest.mark.parametrize("sq, sk", [(37, 53), (53, 37)])
def test_layouts_x_modes_grad(layout, mode, sq, sk):
    """Every layout x sparse_mode 0..6 x both orderings of Sq != Sk, the forward's grid: dq, dk,
    dv (in the layout, GQA 4/2, D_v < D) vs the float64 analytic backward on the mask built
    here, within ``1e-4 * max(1, max|reference|)``; rows with no allowed key get dq = 0."""
    data = make_qkv(B, N1, N2, sq, sk, D, DV, seed=20 + mode)
    kw, allowed = mode_case(mode, sq, sk)
    args = [to_layout(data[n], layout) for n in ("q", "k", "v")]
    common = dict(scale=SCALE, sparse_mode=mode, **kw, **BLOCKS)
    out, smax, ssum = cann.flash_attention_score(*args, N1, layout, **common)
    do = np.random.default_rng(1).standard_normal((B, N1, sq, DV)).astype(np.float32)
    dq, dk, dv = cann.flash_attention_score_grad(*args, to_layout(do, layout), N1, layout,
                                                 softmax_max=smax, softmax_sum=ssum,
                                                 attention_in=out, **common)
    assert dq.shape == args[0].shape and dk.shape == args[1].shape and dv.shape == args[2].shape
    assert dq.dtype == dk.dtype == dv.dtype == np.float32
    ref = flashlab.attention_reference_backward(do, data["q"], data["k"], data["v"], scale=SCALE,
                                                mask=~allowed)
    grads = (from_layout(dq, layout, N1), from_layout(dk, layout, N2), from_layout(dv, layout, N2))
    what = f"{layout} mode {mode} {sq}x{sk}"
    assert_grads_close(grads, ref, what)
    empty = ~np.broadcast_to(allowed, (B, N1, sq, sk)).any(axis=-1)
    assert (grads[0][empty] == 0).all(), f"{what}: a row with no key must give dq = 0"


@pytest.mark.parametrize("mode", sorted(TND_CASES))
def test_tnd_grad_per_sequence(mode):
    """TND grad for every mode of the forward's TND_CASES, per sequence against the float64
    analytic backward on :func:`sequence_rules`, within ``1e-4 * max(1, max|reference|)``;
    keys of a sequence without queries get no gradient."""
    q, k, v = tnd_data(seed=30 + mode)
    kw, rules = tnd_case(mode)
    kw.update(scale=SCALE, **BLOCKS)
    out, smax, ssum = cann.flash_attention_score(q, k, v, N1, "TND", **kw)
    dy = np.random.default_rng(2).standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = cann.flash_attention_score_grad(q, k, v, dy, N1, "TND", softmax_max=smax,
                                                 softmax_sum=ssum, attention_in=out, **kw)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    q0 = k0 = 0
    for s, (sq, sk) in enumerate(zip(case_lens(mode), K_LENS)):
        if sq:
            ref = flashlab.attention_reference_backward(tnd_seq(dy, q0, sq), tnd_seq(q, q0, sq),
                                                        tnd_seq(k, k0, sk), tnd_seq(v, k0, sk),
                                                        scale=SCALE, mask=~rules[s][None, None])
            grads = (tnd_seq(dq, q0, sq), tnd_seq(dk, k0, sk), tnd_seq(dv, k0, sk))
            assert_grads_close(grads, ref, f"TND mode {mode} sequence {s}")
        else:   # keys of a sequence without queries get no gradient
            assert (dk[k0:k0 + sk] == 0).all() and (dv[k0:k0 + sk] == 0).all()
        q0, k0 = q0 + sq, k0 + sk


def test_grad_can_fail():
    """A wrong softmax_sum is refused: its rows of P no longer sum to 1 (issue 35; before,
    it gave a wrong dq)."""
    data = make_qkv(1, 2, 2, 16, 16, 16, 16, seed=3)
    base = dict(scale=SCALE, atten_mask=TRI)
    out, smax, ssum = cann.flash_attention_score(data["q"], data["k"], data["v"], 2, "BNSD",
                                                 sparse_mode=2, **base)
    do = np.ones_like(out)
    with pytest.raises(ValueError, match="softmax_max/softmax_sum is not the forward's"):
        cann.flash_attention_score_grad(data["q"], data["k"], data["v"], do, 2, "BNSD",
                                        softmax_max=smax, softmax_sum=ssum * 2, attention_in=out,
                                        sparse_mode=2, **base)


# --------------------------------------------------------------------------------- errors
def _bnsd(sq=12, sk=16, n1=N1, n2=N2, d=D, dv=DV, b=B):
    data = make_qkv(b, n1, n2, sq, sk, d, dv, seed=0)
    return data["q"], data["k"], data["v"]


q4, k4, v4 = _bnsd()
qt, kt, vt = tnd_data()
LENS = dict(actual_seq_qlen=np.cumsum(Q_LENS).tolist(), actual_seq_kvlen=np.cumsum(K_LENS).tolist())
# the same token counts with Sq <= Skv in every sequence
LENS_SQ_LE_SK = dict(actual_seq_qlen=np.cumsum([5, 0, 11, 15, 12]).tolist(),
                     actual_seq_kvlen=np.cumsum(K_LENS).tolist())
OK = (q4, k4, v4, N1, "BNSD")
OK_TND = (qt, kt, vt, N1, "TND")

ERRORS = {
    # not supported by the operator
    "padding_mask": (OK, dict(padding_mask=np.zeros(1)), NotImplementedError, "padding_mask"),
    "pse-shape": (OK, dict(pse=np.zeros((B, N1, 12, 15), np.float32)), ValueError, "[B,N,Sq,Skv]"),
    # options
    "keep_prob-0": (OK, dict(keep_prob=0.0), ValueError, "keep_prob"),
    "keep_prob-big": (OK, dict(keep_prob=1.5), ValueError, "keep_prob"),
    "inner_precise": (OK, dict(inner_precise=3), ValueError, "inner_precise"),
    "scale-None": (OK, dict(scale=None), TypeError, "scale"),
    "mode-9": (OK, dict(sparse_mode=9), ValueError, "sparse_mode"),
    "mode-str": (OK, dict(sparse_mode="2"), TypeError, "sparse_mode"),
    "pre-float": (OK, dict(pre_tokens=1.5, atten_mask=TRI, sparse_mode=4), TypeError, "pre_tokens"),
    # layouts, shapes, heads
    "layout": ((q4, k4, v4, N1, "BHSD"), {}, ValueError, "input_layout"),
    "layout-ndim": ((q4, k4, v4, N1, "BSH"), {}, ValueError, "query"),
    "head_num-mismatch": ((q4, k4, v4, 3, "BNSD"), {}, ValueError, "head_num"),
    "head_num-bool": ((q4, k4, v4, True, "BNSD"), {}, TypeError, "head_num"),
    "head_num-divide": ((q4.reshape(B, N1, 12, D).transpose(0, 2, 1, 3).reshape(B, 12, N1 * D),
                         k4.transpose(0, 2, 1, 3).reshape(B, 16, N2 * D),
                         v4.transpose(0, 2, 1, 3).reshape(B, 16, N2 * DV), 5, "BSH"), {},
                        ValueError, "multiple of head_num"),
    "gqa": ((*_bnsd(n1=3, n2=2), 3, "BNSD"), {}, ValueError, "GQA"),
    "dv>d": ((*_bnsd(d=8, dv=16), N1, "BNSD"), {}, ValueError, "D_q = D_k >= D_v"),
    "dk!=dq": ((q4, k4[..., :8], v4, N1, "BNSD"), {}, ValueError,
               "key must have shape [B, N_kv, Skv, D] with D=16 as query"),
    "kv-mismatch": ((q4, k4, v4[:, :, :10], N1, "BNSD"), {}, ValueError,
                    "value must have shape [B, N_kv, Skv, Dv] = (2, 2, 16, Dv) as key"),
    "batch": ((q4[:1], k4, v4, N1, "BNSD"), {}, ValueError, "with B=1 like query"),
    "query-list": ((q4.tolist(), k4, v4, N1, "BNSD"), {}, TypeError, "query"),
    # masks
    "compressed-shape": (OK, dict(sparse_mode=2, atten_mask=TRI[:1024, :1024]), ValueError, "(2048, 2048)"),
    "compressed-content": (OK, dict(sparse_mode=3, atten_mask=~TRI), ValueError, "differs"),
    "mode6-with-2048": (OK, dict(sparse_mode=6, atten_mask=TRI, prefix=[8, 8]), ValueError, "(3072, 2048)"),
    "mask-dtype": (OK, dict(atten_mask=np.zeros((12, 16), np.float32)), TypeError, "atten_mask"),
    "mask-shape": (OK, dict(atten_mask=np.zeros((1, N1, 12, 16), bool)), ValueError, "atten_mask"),
    "mask-inconsistent": (OK, dict(atten_mask=np.zeros((12, 16), bool), pre_tokens=2, next_tokens=0),
                          ValueError, "outside pre_tokens"),
    "band-empty": (OK, dict(atten_mask=TRI, sparse_mode=4, pre_tokens=-3, next_tokens=1), ValueError,
                   "overlap"),
    "prefix-missing": (OK, dict(sparse_mode=6, atten_mask=tri6()), ValueError, "prefix"),
    "prefix-other-mode": (OK, dict(sparse_mode=3, atten_mask=TRI, prefix=[8.0, 8]), TypeError, "prefix[0]"),
    "prefix-length": (OK, dict(sparse_mode=6, atten_mask=tri6(), prefix=[8]), ValueError, "one value per"),
    "prefix-range": (OK, dict(sparse_mode=6, atten_mask=tri6(), prefix=[8, 3]), ValueError, "[4, 16]"),
    "mode5-mask": (OK, dict(sparse_mode=5, atten_mask=np.zeros((B, 1, 12, 16), bool), prefix=[8, 8]),
                   ValueError, "prefix mask"),
    "mode5-shape": (OK, dict(sparse_mode=5, atten_mask=TRI, prefix=[8, 8]), ValueError, "[B,1,Sq,Sk]"),
    "mode7-not-tnd": (OK, dict(sparse_mode=7, atten_mask=TRI), ValueError, "only for input_layout TND"),
    # TND
    "tnd-no-lens": (OK_TND, {}, ValueError, "actual_seq_qlen"),
    "lens-not-tnd": (OK, dict(actual_seq_qlen=[12], actual_seq_kvlen=[16]), ValueError, "TND only"),
    # an end past T is refused; one short of it is accepted (tests/test_cann_contract.py)
    "lens-end": (OK_TND, dict(actual_seq_qlen=[5, 10, 20, 30, 44], actual_seq_kvlen=LENS["actual_seq_kvlen"]),
                 ValueError, "at most the query token count T=43"),
    "lens-decreasing": (OK_TND, dict(actual_seq_qlen=[5, 3, 43], actual_seq_kvlen=[7, 10, 53]),
                        ValueError, "non-decreasing"),
    "lens-count": (OK_TND, dict(actual_seq_qlen=[5, 43], actual_seq_kvlen=[7, 10, 53]), ValueError,
                   "same number"),
    "mode3-tnd-sq>skv": (OK_TND, dict(sparse_mode=3, atten_mask=TRI, **LENS), ValueError, "Sq <= Skv"),
    "mode5-tnd": (OK_TND, dict(sparse_mode=5, atten_mask=TRI, prefix=[1] * 5, **LENS), ValueError,
                  "not supported with input_layout TND"),
    "tnd-mask-shape": (OK_TND, dict(atten_mask=np.zeros((12, 16), bool), **LENS), ValueError, "maxSq"),
    "mode7-pre": (OK_TND, dict(sparse_mode=7, atten_mask=TRI, pre_tokens=11, next_tokens=0, **LENS),
                  ValueError, "Skv=12"),
    "mode7-next": (OK_TND, dict(sparse_mode=7, atten_mask=TRI, pre_tokens=12, next_tokens=1, **LENS),
                   ValueError, "next_tokens <= 0"),
    "mode8-pre": (OK_TND, dict(sparse_mode=8, atten_mask=TRI, pre_tokens=6, next_tokens=0, **LENS),
                  ValueError, "Skv=7"),
    # issue 22.6: the device tiling's TND checks (flashlab/cann/plan.py cites the source lines)
    "mode7-sq>skv": (OK_TND, dict(sparse_mode=7, atten_mask=TRI, pre_tokens=12, next_tokens=0,
                                  **LENS), ValueError, "s1[17] is larger than s2[11]"),
    "mode7-band-row": (OK_TND, dict(sparse_mode=7, atten_mask=TRI, pre_tokens=12, next_tokens=-1,
                                    **LENS_SQ_LE_SK), ValueError, "has invalid row"),
    "mode8-band-row": (OK_TND, dict(sparse_mode=8, atten_mask=TRI, pre_tokens=7, next_tokens=-3,
                                    **LENS), ValueError, "Batch[0], s1[5], s2[7], next_tokens[-3]"),
    "mode6-tnd-prefix-sq0": (OK_TND, dict(sparse_mode=6, atten_mask=tri6(), prefix=[7, 0, 11, 20, 12],
                                          **LENS), ValueError, "[3, 3]"),
    "mode4-tnd-pre<0": (OK_TND, dict(sparse_mode=4, atten_mask=TRI, pre_tokens=-1, next_tokens=5,
                                     **LENS), ValueError, "needs pre_tokens >= 0"),
    "mode4-tnd-row": (OK_TND, dict(sparse_mode=4, atten_mask=TRI, pre_tokens=100, next_tokens=0,
                                   **LENS), ValueError, "Batch[2], s1[17], s2[11]"),
    "mode0-tnd-next<0": (OK_TND, dict(atten_mask=np.zeros((17, 20), bool), pre_tokens=100,
                                      next_tokens=-1, **LENS), ValueError, "next_tokens >= 0"),
    "mode0-tnd-row": (OK_TND, dict(atten_mask=np.zeros((17, 20), bool), pre_tokens=0, next_tokens=5,
                                   **LENS), ValueError, "Skv + pre_tokens >= Sq"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_forward_errors(name):
    args, kw, exc, text = ERRORS[name]
    with pytest.raises(exc) as info:
        cann.flash_attention_score(*args, **kw)
    assert text in str(info.value), str(info.value)


@pytest.mark.parametrize("name", ["pse-shape", "padding_mask", "mode3-tnd-sq>skv", "prefix-range",
                                  "tnd-no-lens"])
def test_grad_errors_as_forward(name):
    """The grad checks the same options with the same messages."""
    args, kw, exc, text = ERRORS[name]
    q, k, v = args[:3]
    stats = np.zeros(q.shape[:1] + (N1,) + (q.shape[2], 8) if q.ndim == 4 else q.shape[:2] + (8,), np.float32)
    with pytest.raises(exc) as info:
        cann.flash_attention_score_grad(q, k, v, q[..., :DV], *args[3:], softmax_max=stats,
                                        softmax_sum=stats, attention_in=q[..., :DV], **kw)
    assert text in str(info.value)


def test_grad_operand_errors():
    out, smax, ssum = cann.flash_attention_score(q4, k4, v4, N1, "BNSD")
    good = dict(softmax_max=smax, softmax_sum=ssum, attention_in=out)
    do = np.zeros_like(out)
    cases = [
        ((do[:, :, :5], good), ValueError, "dy must have shape attention_out's"),
        ((do.astype(np.float64), good), TypeError, "dy must have query's dtype"),
        ((do, dict(good, attention_in=out[..., :4])), ValueError, "attention_in"),
        ((do, dict(good, softmax_max=smax[..., :1])), ValueError, "softmax_max"),
        ((do, dict(good, softmax_sum=ssum.tolist())), TypeError, "softmax_sum"),
        # issue #22: statistics of another dtype than the forward's (float32 here) are refused
        ((do, dict(good, softmax_max=smax.astype(np.float16))), TypeError,
         "softmax_max must have dtype float32"),
        ((do, dict(good, softmax_sum=ssum.astype(np.int32))), TypeError,
         "softmax_sum must have dtype float32"),
        ((do, dict(good, softmax_sum=ssum.astype(np.float64))), TypeError,
         "softmax_sum must have dtype float32"),
        # a finite max with a sum of 0 (or below) is no softmax row: it gave zero gradients
        ((do, dict(good, softmax_sum=np.zeros_like(ssum))), ValueError,
         "must have a finite max and a sum > 0"),
        ((do, dict(good, softmax_sum=-ssum)), ValueError, "must have a finite max and a sum > 0"),
    ]
    for (dy, kw), exc, text in cases:
        with pytest.raises(exc) as info:
            cann.flash_attention_score_grad(q4, k4, v4, dy, N1, "BNSD", **kw)
        assert text in str(info.value), text


def test_tnd_device_ranges_accept_their_edges():
    """The edges of the ranges the TND checks enforce run (issue 22.6): a prefix equal to Skv on
    the sequence without queries, mode 7 with next_tokens = 0 on the last sequence, mode 8 with
    Sq - next_tokens = Skv on the first sequence with queries."""
    for kw in (dict(sparse_mode=6, atten_mask=tri6(), prefix=[7, 3, 11, 20, 12], **LENS),
               dict(sparse_mode=7, atten_mask=TRI, pre_tokens=12, next_tokens=0, **LENS_SQ_LE_SK),
               dict(sparse_mode=8, atten_mask=TRI, pre_tokens=7, next_tokens=-2, **LENS)):
        out = cann.flash_attention_score(*OK_TND, scale=SCALE, **kw)[0]
        assert out.shape == (sum(Q_LENS), N1, DV) and np.isfinite(out).all()


@pytest.mark.parametrize("prefix, text", [(None, "null pointer"), ([8], "same size as bSize[2]"),
                                          ([8, 3], "prefixN=3 is invalid, should be in range of [4, 16]")])
def test_mode5_bad_prefix_warns_and_uses_the_full_mask(prefix, text):
    """Issue 22.6: for sparse_mode 5 (B, N, S, D) the device's GetPrefixNList only warns on a
    missing, mis-sized or out-of-range prefix and falls back to the full atten_mask (sparse
    type ALL); sparse_mode 6 refuses the same prefix (the ERRORS cases prefix-*)."""
    rng = np.random.default_rng(5)
    mask = rng.random((B, 1, 12, 16)) < 0.3
    mask[..., 0] = False                       # no row fully masked
    with pytest.warns(UserWarning, match=re.escape(text)):
        out = cann.flash_attention_score(q4, k4, v4, N1, "BNSD", scale=SCALE, sparse_mode=5,
                                         atten_mask=mask, prefix=prefix)[0]
    ref = flashlab.attention_reference(q4, k4, v4, scale=SCALE, mask=mask)[0]
    assert max_abs_err(out, ref) < 1e-5
