"""Logit soft-capping (``softcap``, flash_attn >= 2.6, Gemma 2): ``s -> softcap tanh(s / softcap)``.

The scaled scores are capped before the bias, ALiBi and the masks (flash_attn's order); the
backward multiplies dS by ``1 - tanh^2(s / softcap)`` on its way to dQ and dK (the bias's
gradient is dS before that factor). Checked against the float64 reference (itself checked by
finite differences of its forward) over the usual grid: odd lengths 1, 7, 129, Sq != Sk,
Dqk != Dv, GQA, every mask kind, float32 and float64; the kernels' own float64 gradients by
finite differences; the decode, walk, flash_attn and torch doors against the kernel API.
"""
from __future__ import annotations

import conftest as grid
import numpy as np
import pytest
from conftest import check_forward, make_qkv, mask_options, pair_id

import flashlab
from flashlab import api, compat
from flashlab.validation import prepare
from flashlab.walk import walk_forward

#: the grid: odd lengths and 1, both orders (Sq = 1 and 7 take the split-KV decode kernel)
PAIRS = [(1, 7), (7, 1), (1, 129), (7, 129), (129, 7), (129, 64), (64, 129)]


def _case(sq, sk, kind, dtype=np.float32, q_scale=1.0, seed=0):
    """GQA (4 query heads on 2 kv heads), Dqk = 24 != Dv = 16, the mask kind's options."""
    x = make_qkv(2, 4, 2, sq, sk, 24, 16, dtype=dtype, seed=seed, q_scale=q_scale)
    return x, mask_options(kind, 2, 4, sq, sk)


def _grad_err(g, ref) -> float:
    return float(np.abs(g.astype(np.float64) - ref).max() / max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("kind", grid.MASK_KINDS)
@pytest.mark.parametrize("sq_sk", PAIRS, ids=pair_id)
def test_forward_against_reference(sq_sk, kind):
    """float32 kernel (tiled and decode) vs the float64 reference under the tests' tolerance
    rule, softcap = 2 on N(0, 1) logits."""
    x, opts = _case(*sq_sk, kind)
    o, _ = check_forward(x, softcap=2.0, **opts)
    _cap_matters(x, opts, o)


@pytest.mark.parametrize("kind", grid.DTYPE_KINDS)
@pytest.mark.parametrize("sq_sk", grid.DTYPE_PAIRS, ids=pair_id)
def test_forward_gemma2_cap_at_large_logits(sq_sk, kind):
    """Gemma 2's softcap = 50 on logits of 50-100 (the grid's large-logit cases: at Sq = 1 the
    float32 kernel's error at such logits is its own, capped or not, and the naive yardstick's
    luckier)."""
    x, opts = _case(*sq_sk, kind, q_scale=25.0)
    o, _ = check_forward(x, softcap=50.0, **opts)
    _cap_matters(x, opts, o)


def _cap_matters(x, opts, o):
    # the cap changes the result (so the test could fail): not the uncapped attention (a row
    # with one allowed key outputs that key's value, capped or not)
    _, _, p = flashlab.attention_reference(**x, **opts, return_probs=True)
    if ((p > 0).sum(axis=-1) >= 2).any():
        assert not np.allclose(o, flashlab.flash_attention(**x, **opts)[0], atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("kind", grid.MASK_KINDS)
@pytest.mark.parametrize("sq_sk", PAIRS, ids=pair_id)
def test_backward_against_reference(sq_sk, kind, dtype):
    """dq, dk, dv of the kernel vs the float64 analytic backward (softcap = 2 on N(0, 1) logits)."""
    x, opts = _case(*sq_sk, kind, dtype=dtype, seed=3)
    opts = dict(opts, softcap=2.0)
    o, lse = flashlab.flash_attention(**x, **opts)
    do = np.random.default_rng(5).standard_normal(o.shape).astype(dtype)
    grads = flashlab.flash_attention_backward(do, **x, o=o, lse=lse, **opts)
    refs = flashlab.attention_reference_backward(do, **x, **opts)
    tol = 2e-5 if dtype == np.float32 else 1e-11
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        assert g.dtype == dtype and np.isfinite(g).all()
        assert _grad_err(g, r) <= tol, f"{name}: {_grad_err(g, r):.3g}"


def test_gemma2_cap_against_reference_at_large_logits():
    """Gemma 2's softcap = 50 on logits of 50-100: forward and backward, float64 and float32."""
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
        x, opts = _case(129, 64, "causal", dtype=dtype, q_scale=25.0, seed=11)
        o, lse = flashlab.flash_attention(**x, softcap=50.0, **opts)
        ro, rlse = flashlab.attention_reference(**x, softcap=50.0, **opts)
        assert np.abs(o - ro).max() <= tol and np.abs(lse - rlse).max() <= tol * 100
        do = np.random.default_rng(2).standard_normal(o.shape).astype(dtype)
        lse_in = rlse if dtype == np.float64 else lse
        grads = flashlab.flash_attention_backward(do, **x, o=o, lse=lse_in, softcap=50.0, **opts)
        refs = flashlab.attention_reference_backward(do, **x, softcap=50.0, **opts)
        for g, r in zip(grads, refs):
            assert _grad_err(g, r) <= tol * 10


def _loss(x, do, **opts) -> float:
    return float((flashlab.attention_reference(**x, **opts)[0] * do).sum())


@pytest.mark.parametrize("options", [{"causal": True}, {"window": (3, 1)},
                                     {"bias": "bias", "alibi_slopes": np.array([0.3, 0.7])}],
                         ids=["causal", "window", "bias+alibi"])
def test_finite_differences(options):
    """The reference's and the float64 kernel's gradients (q, k, v and the bias) against central
    differences of the reference's forward: the factor 1 - tanh^2 is the exact derivative."""
    rng = np.random.default_rng(0)
    x = make_qkv(1, 2, 1, 7, 9, 5, 3, dtype=np.float64, seed=4, q_scale=2.0)
    opts = dict(options, softcap=1.5)
    if "bias" in opts:
        opts["bias"] = rng.standard_normal((1, 1, 7, 9))
    o, lse = flashlab.flash_attention(**x, **opts)
    do = rng.standard_normal(o.shape)
    want_dbias = "bias" in opts
    refs = flashlab.attention_reference_backward(do, **x, **opts, return_dbias=want_dbias)
    grads = flashlab.flash_attention_backward(do, **x, o=o, lse=lse, **opts,
                                              return_dbias=want_dbias)
    names = ["q", "k", "v"] + (["bias"] if want_dbias else [])
    eps = 1e-6
    for name, g, r in zip(names, grads, refs):
        target = opts if name == "bias" else x
        for idx in [tuple(rng.integers(0, n) for n in target[name].shape) for _ in range(6)]:
            plus = {n: a.copy() if isinstance(a, np.ndarray) else a for n, a in target.items()}
            minus = {n: a.copy() if isinstance(a, np.ndarray) else a for n, a in target.items()}
            plus[name][idx] += eps
            minus[name][idx] -= eps
            if name == "bias":
                fd = (_loss(x, do, **plus) - _loss(x, do, **minus)) / (2 * eps)
            else:
                fd = (_loss(plus, do, **opts) - _loss(minus, do, **opts)) / (2 * eps)
            assert abs(r[idx] - fd) <= 1e-7 * max(1.0, abs(fd)), (name, idx, r[idx], fd)
            assert abs(g[idx] - fd) <= 1e-7 * max(1.0, abs(fd)), (name, idx, g[idx], fd)


def test_off_is_off_and_a_huge_cap_is_no_cap():
    x, opts = _case(129, 64, "causal")
    plain = flashlab.flash_attention(**x, **opts)
    for a, b in zip(flashlab.flash_attention(**x, softcap=0.0, **opts), plain):
        assert np.array_equal(a, b)
    # s / c -> 0: c tanh(s / c) = s (1 - s^2 / 3c^2 + ...)
    for a, b in zip(flashlab.flash_attention(**x, softcap=1e6, **opts), plain):
        assert np.allclose(a, b, atol=1e-5)


def test_scores_are_capped_before_the_mask_and_after_scaling():
    """A -inf bias still masks (added after the cap, not capped); the cap bounds |s| by softcap:
    with a cap of 0.5 every weight lies within e^{+-1} of uniform."""
    x, _ = _case(7, 9, "none", dtype=np.float64, q_scale=30.0)
    _, _, p = flashlab.attention_reference(**x, softcap=0.5, return_probs=True)
    assert p.max() <= np.exp(1.0) / 9 * (1 + 1e-12) and p.min() >= np.exp(-1.0) / 9 * (1 - 1e-12)
    bias = np.zeros((1, 1, 7, 9))
    bias[..., 0] = -np.inf
    _, _, p = flashlab.attention_reference(**x, softcap=0.5, bias=bias, return_probs=True)
    assert (p[..., 0] == 0).all()
    o, _ = flashlab.flash_attention(**x, softcap=0.5, bias=bias)
    ro, _ = flashlab.attention_reference(**x, softcap=0.5, bias=bias)
    assert np.abs(o - ro).max() <= 1e-12


@pytest.mark.parametrize("bad,error,message", [
    (-1.0, ValueError, r"softcap must be >= 0.0; got -1.0"),
    (float("nan"), ValueError, r"softcap must be finite"),
    (float("inf"), ValueError, r"softcap must be finite"),
    ("50", TypeError, r"softcap must be a real number >= 0 \(0.0 = off\); got '50'"),
    (1e39, ValueError, r"softcap=1e\+39 overflows float32"),
])
def test_bad_softcap(bad, error, message):
    x, _ = _case(7, 9, "none")
    with pytest.raises(error, match=message):
        flashlab.flash_attention(**x, softcap=bad)


def test_flash_attn_scalar_options_use_the_same_softcap_rule():
    """compat's scalar check (which the torch door runs before its op) is validation's rule."""
    for bad, error, message in [(1e39, ValueError, r"softcap=1e\+39 overflows float32"),
                                (-1.0, ValueError, r"softcap must be >= 0.0; got -1.0")]:
        with pytest.raises(error, match=message):
            compat.scalar_options(0.0, None, False, (-1, -1), bad, False)
    assert compat.scalar_options(0.0, None, False, (-1, -1), 50, False)[-1] == 50.0


def test_decode_checks_k_before_the_cap():
    """The decode kernel checks K as it reads it: an inf in K is refused, not capped to +-softcap."""
    x, _ = _case(1, 129, "none")
    x["k"][0, 1, 5, 3] = np.inf
    assert api.uses_decode(prepare(**x, softcap=5.0, lazy_kv=True))
    with pytest.raises(ValueError, match="^k "):
        flashlab.flash_attention(**x, softcap=5.0)


def test_walk_is_the_kernel():
    x, opts = _case(37, 29, "causal+mask")
    o, lse = flashlab.flash_attention(**x, **opts, softcap=2.0, block_q=8, block_k=8)
    w = walk_forward(**x, **opts, softcap=2.0, block_q=8, block_k=8, b=1, h=3)
    # the kernel computes the band's box of a partial tile, the walk the whole tile: the same
    # scores, sums that may round apart (tests/test_walk.py's tolerance)
    np.testing.assert_allclose(w.o, o[1, 3], rtol=0, atol=1e-6)
    np.testing.assert_allclose(w.lse, lse[1, 3], rtol=0, atol=1e-6)     # (-inf rows: equal)
    assert max(np.abs(st.s[np.isfinite(st.s)]).max() for st in w.computed) <= 2.0


def test_flash_attn_doors():
    """compat's padded and varlen functions pass flash_attn's softcap to the kernels, forward and
    backward (flash_attn's layout: (batch, seqlen, nheads, headdim))."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, h, 8)).astype(np.float32)
               for n, h in ((7, 4), (11, 2), (11, 2)))
    out, lse = compat.flash_attn_func(q, k, v, causal=True, softcap=3.0, return_lse=True)
    t = lambda a: a.transpose(0, 2, 1, 3)  # noqa: E731
    # flash_attn's causal is bottom-right aligned: window (Sk - Sq + 0 ... ) as kernel options
    kw = compat._options(0.0, None, True, (-1, -1), 3.0, None, False, 0, 2, 4).kernel_kwargs(7, 11, None, 0)
    assert kw["softcap"] == 3.0
    ro, _ = flashlab.attention_reference(t(q), t(k), t(v), **kw)
    assert np.abs(out - t(ro)).max() <= 1e-5
    dout = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = compat.flash_attn_func_backward(dout, q, k, v, out, lse, causal=True, softcap=3.0)
    refs = flashlab.attention_reference_backward(t(dout), t(q), t(k), t(v), **kw)
    for g, r in zip((dq, dk, dv), refs):
        assert _grad_err(t(g), r) <= 2e-5
    # varlen: the packed batch of the same two sequences gives the same out
    cu = np.array([0, 7, 14], dtype=np.int32)
    cuk = np.array([0, 11, 22], dtype=np.int32)
    pack = lambda a: a.reshape(-1, *a.shape[2:])  # noqa: E731
    out_v = compat.flash_attn_varlen_func(pack(q), pack(k), pack(v), cu, cuk, 7, 11, causal=True,
                                          softcap=3.0)
    assert np.abs(out_v - pack(out)).max() <= 1e-6


def test_torch_door():
    torch = pytest.importorskip("torch", reason="the torch door")
    from flashlab import torch_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, h, 8, generator=g, dtype=torch.float64, requires_grad=True)
               for n, h in ((7, 4), (11, 2), (11, 2)))
    out = torch_attention.flash_attn_func(q, k, v, causal=True, softcap=3.0)
    want, lse = compat.flash_attn_func(*(a.detach().numpy() for a in (q, k, v)), causal=True,
                                       softcap=3.0, return_lse=True)
    assert np.array_equal(out.detach().numpy(), want)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    refs = compat.flash_attn_func_backward(dout.numpy(), *(a.detach().numpy() for a in (q, k, v)),
                                           want, lse, causal=True, softcap=3.0)
    for a, b in zip(grads, refs):
        assert np.abs(a.numpy() - b).max() <= 1e-12


def test_flash_attn_qkvpacked_func():
    """The packed self-attention function is flash_attn_func of its three slices, softcap included,
    forward and backward; a qkv without 3 on axis 2 is refused in its own words."""
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((2, 9, 3, 4, 8)).astype(np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out, lse = compat.flash_attn_qkvpacked_func(qkv, causal=True, softcap=3.0, return_lse=True)
    want, want_lse = compat.flash_attn_func(q, k, v, causal=True, softcap=3.0, return_lse=True)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    dqkv = compat.flash_attn_qkvpacked_func_backward(dout, qkv, out, lse, causal=True, softcap=3.0)
    grads = compat.flash_attn_func_backward(dout, q, k, v, out, lse, causal=True, softcap=3.0)
    assert dqkv.shape == qkv.shape and dqkv.dtype == qkv.dtype
    for i, g in enumerate(grads):
        assert np.array_equal(dqkv[:, :, i], g)
    with pytest.raises(ValueError, match=r"qkv must have shape \(batch_size, seqlen, 3, nheads, headdim\)"):
        compat.flash_attn_qkvpacked_func(qkv[:, :, :2])
    with pytest.raises(TypeError, match="qkv must be a numpy.ndarray"):
        compat.flash_attn_qkvpacked_func(list(qkv))


def test_gpu_twin():
    """The CUDA twin (the simulator without a GPU) soft-caps as the CPU kernels do, forward and
    backward, against the float64 reference (causal, GQA, Sq != Sk, one tile size)."""
    from flashlab.gpu import flash_attention_backward_gpu, flash_attention_gpu

    x = make_qkv(1, 2, 1, 13, 21, 8, 8, seed=6)
    kw = dict(causal=True, softcap=2.0, block_q=8, block_k=8)
    o, lse = flash_attention_gpu(**x, **kw)
    ro, rlse = flashlab.attention_reference(**x, causal=True, softcap=2.0)
    assert np.abs(o - ro).max() <= 1e-5 and np.abs(lse - rlse).max() <= 1e-5
    do = np.random.default_rng(8).standard_normal(o.shape).astype(np.float32)
    grads = flash_attention_backward_gpu(do, **x, o=o, lse=lse, **kw)
    refs = flashlab.attention_reference_backward(do, **x, causal=True, softcap=2.0)
    for g, r in zip(grads, refs):
        assert _grad_err(g, r) <= 2e-5
    # and the cap is really applied: not the uncapped output
    assert not np.allclose(o, flash_attention_gpu(**x, causal=True, block_q=8, block_k=8)[0],
                           atol=1e-4)
