"""Additive bias, ALiBi and dropout in the kernels, against the float64 reference.

The reference adds the bias to the dense score matrix and multiplies P by the dense keep mask
of :mod:`flashlab.dropout`; the kernels add the bias tile by tile (read through its broadcast
shape) and recompute each keep bit from its counter. Tolerances: the forward by the shared
rule of ``conftest`` (twice the same-dtype naive error); gradients 1e-12 (float64) and the
rule's error of the naive-derived yardstick (float32, 2e-4 relative to the largest gradient).
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import check_forward, make_qkv, mask_options

import flashlab
from flashlab.dropout import keep_mask

PAIRS = [(1, 7), (7, 1), (129, 64), (64, 129)]
KINDS = ["none", "causal", "window(-2,30)", "mask(B,1,Sq,Sk)", "mask(B,1,1,Sk)"]
BIAS_SHAPES = {"full": lambda B, H, Sq, Sk: (B, H, Sq, Sk), "per-key": lambda B, H, Sq, Sk: (1, H, 1, Sk),
               "per-row": lambda B, H, Sq, Sk: (B, 1, Sq, 1), "2-D": lambda B, H, Sq, Sk: (Sq, Sk)}
B, H, HKV, DQK, DV = 2, 4, 2, 24, 16


def _grad_tol(dtype, ref) -> float:
    return (1e-12 if dtype == np.float64 else 2e-4) * max(1.0, float(np.abs(ref).max()))


def _check_backward(x, opts, dtype, blocks=(16, 32), return_dbias=False):
    o, lse = flashlab.flash_attention(**x, **opts, block_q=blocks[0], block_k=blocks[1])
    do = np.random.default_rng(11).standard_normal(o.shape).astype(dtype)
    grads = flashlab.flash_attention_backward(do, **x, o=o, lse=lse, **opts, block_q=blocks[0],
                                              block_k=blocks[1], return_dbias=return_dbias)
    refs = flashlab.attention_reference_backward(do, **x, **opts, return_dbias=return_dbias)
    assert len(grads) == len(refs)
    for i, (g, r) in enumerate(zip(grads, refs)):
        assert g.shape == r.shape and not np.isnan(g).any()
        err = np.abs(g.astype(np.float64) - r).max()
        assert err <= _grad_tol(dtype, r), f"grad {i}: max abs error {err:.3g}"
    return o, grads


@pytest.mark.parametrize("bias_shape", list(BIAS_SHAPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"Sq{p[0]}-Sk{p[1]}")
def test_bias_forward_and_backward(pair, kind, bias_shape):
    Sq, Sk = pair
    x = make_qkv(B, H, HKV, Sq, Sk, DQK, DV, seed=Sq + Sk)
    bias = np.random.default_rng(2).standard_normal(BIAS_SHAPES[bias_shape](B, H, Sq, Sk)).astype(np.float32)
    opts = dict(mask_options(kind, B, H, Sq, Sk), bias=bias)
    check_forward(x, **opts, block_q=16, block_k=32)
    x64 = {n: a.astype(np.float64) for n, a in x.items()}
    _check_backward(x64, dict(opts, bias=bias.astype(np.float64)), np.float64, return_dbias=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("slopes_shape", [(H,), (B, H)], ids=str)
@pytest.mark.parametrize("offset, sqrt", [(None, False), (3, False), (0, True)], ids=str)
def test_alibi_is_the_bias_it_means(dtype, slopes_shape, offset, sqrt):
    Sq, Sk = 37, 53
    x = make_qkv(B, H, HKV, Sq, Sk, DQK, DV, dtype=dtype, seed=5)
    slopes = np.abs(np.random.default_rng(3).standard_normal(slopes_shape)) * 0.3
    c = Sk - Sq if offset is None else offset
    dist = np.abs(np.arange(Sk)[None, :] - np.arange(Sq)[:, None] - c).astype(np.float64)
    bias = -np.reshape(slopes, (-1, H, 1, 1)) * (np.sqrt(dist) if sqrt else dist)
    o, lse = flashlab.flash_attention(**x, alibi_slopes=slopes, alibi_offset=offset, alibi_sqrt=sqrt,
                                      causal=True, block_q=8, block_k=16)
    ref_o, ref_lse = flashlab.attention_reference(**x, bias=bias.astype(dtype), causal=True)
    atol = 1e-12 if dtype == np.float64 else 3e-6
    np.testing.assert_allclose(o, ref_o, atol=atol)
    np.testing.assert_allclose(lse, ref_lse, atol=atol * 10)
    _check_backward(x, dict(alibi_slopes=slopes, alibi_offset=offset, alibi_sqrt=sqrt, causal=True), dtype)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"Sq{p[0]}-Sk{p[1]}")
def test_dropout_forward_and_backward(pair, kind, p):
    Sq, Sk = pair
    x = make_qkv(B, H, HKV, Sq, Sk, DQK, DV, dtype=np.float64, seed=Sq * Sk)
    opts = dict(mask_options(kind, B, H, Sq, Sk), dropout_p=p, seed=1234, offset=99)
    o, lse = flashlab.flash_attention(**x, **opts, block_q=16, block_k=32)
    ref_o, ref_lse = flashlab.attention_reference(**x, **opts)
    np.testing.assert_allclose(o, ref_o, atol=1e-12)
    np.testing.assert_allclose(np.where(np.isinf(lse), 0, lse), np.where(np.isinf(ref_lse), 0, ref_lse),
                               atol=1e-12)
    _check_backward(x, opts, np.float64)


def test_dropout_mask_is_a_function_of_position_only():
    x = make_qkv(1, 2, 1, 50, 70, 16, 16, dtype=np.float64, seed=1)
    opts = dict(dropout_p=0.3, seed=7, offset=5)
    outs = [flashlab.flash_attention(**x, **opts, block_q=bq, block_k=bk)[0]
            for bq, bk in ((1, 1), (7, 13), (64, 128), (256, 128))]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], atol=1e-13)
    # the same seed and offset: the same bits; another seed or offset: another mask
    again = flashlab.flash_attention(**x, **opts, block_q=7, block_k=13)[0]
    assert np.array_equal(again, outs[1])
    for other in (dict(opts, seed=8), dict(opts, offset=6)):
        assert not np.allclose(flashlab.flash_attention(**x, **other)[0], outs[0])
    # keep_mask's statistics: about 1 - p kept, and the keep bits uncorrelated with position
    z = keep_mask((2, 4, 300, 400), 0.3, seed=7)
    assert abs(z.mean() - 0.7) < 0.005
    assert abs(z[..., ::2].mean() - z[..., 1::2].mean()) < 0.01


def test_dropout_gradients_match_finite_differences():
    """The loss sum(o * do) with a fixed seed is a smooth function: its finite differences
    agree with the backward only if forward and backward drop the same entries."""
    x = make_qkv(1, 2, 1, 5, 6, 4, 3, dtype=np.float64, seed=8)
    bias = np.random.default_rng(1).standard_normal((1, 2, 5, 6))
    opts = dict(dropout_p=0.4, seed=3, offset=0, bias=bias, causal=True, block_q=2, block_k=4)
    o, lse = flashlab.flash_attention(**x, **opts)
    do = np.random.default_rng(2).standard_normal(o.shape)
    dq, dk, dv, dbias = flashlab.flash_attention_backward(do, **x, o=o, lse=lse, **opts,
                                                         return_dbias=True)

    def loss(name, value):
        args, o_opts = dict(x), dict(opts)
        (o_opts if name == "bias" else args)[name] = value
        return float((flashlab.flash_attention(**args, **o_opts)[0] * do).sum())

    eps = 1e-6
    for name, grad in (("q", dq), ("k", dk), ("v", dv), ("bias", dbias)):
        base = opts["bias"] if name == "bias" else x[name]
        for idx in [(0, 0, 1, 0), (0, 1, 3, 2), (0, 0, 4, 1)]:
            if name in ("k", "v"):
                idx = (0, 0) + idx[2:]
            plus, minus = base.copy(), base.copy()
            plus[idx] += eps
            minus[idx] -= eps
            fd = (loss(name, plus) - loss(name, minus)) / (2 * eps)
            assert abs(fd - grad[idx]) < 1e-6 * max(1.0, abs(fd)), f"d{name}{idx}: fd {fd} vs {grad[idx]}"
