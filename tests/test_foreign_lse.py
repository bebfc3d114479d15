"""A backward given an LSE that is not its forward's refuses it (issue 35).

The backward recomputes P = exp(S - LSE) tile by tile; with the forward's LSE each row of P
sums to 1 (:func:`flashlab.kernels.backward.first_foreign_row`, tolerance
:data:`flashlab.api.LSE_TOLERANCE`). Another LSE (a constant, a shifted one, another
forward's) raises ``ValueError`` naming the LSE as the door calls it and the first bad row,
through every door: the kernel API, compat (numpy flash_attn), the torch door's backward op,
and CANN's softmax statistics. Rows with no allowed key (LSE = -inf, o = 0) still pass.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import flashlab
from flashlab import api, cann, compat


def _problem(dtype=np.float32, B=2, H=3, S=40, D=8, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((B, H, S, D)).astype(dtype) for _ in range(4))
    return q, k, v, do


def _bad_lses(lse, q, k, v):
    """A constant (the issue's -100), a shift of 0.01, and the LSE of the forward without
    the causal mask."""
    return {"constant": np.full_like(lse, -100.0), "shifted": lse + 0.01,
            "other forward": flashlab.flash_attention(q, k, v)[1].astype(lse.dtype)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_api_refuses_a_foreign_lse_and_names_the_first_bad_row(dtype):
    q, k, v, do = _problem(dtype)
    o, lse = flashlab.flash_attention(q, k, v, causal=True)
    flashlab.flash_attention_backward(do, q, k, v, o, lse, causal=True)     # its own: accepted
    for bad in _bad_lses(lse, q, k, v).values():
        with pytest.raises(ValueError, match=r"lse is not the forward's.*row \(b=0, h=0, i=0\)"):
            flashlab.flash_attention_backward(do, q, k, v, o, bad, causal=True)
    # one wrong row: the message names it, whatever its q-block and work item
    bad = lse.copy()
    bad[1, 2, 33] += 0.5
    with pytest.raises(ValueError, match=r"row \(b=1, h=2, i=33\) .* sums to 0\.60653"):
        flashlab.flash_attention_backward(do, q, k, v, o, bad, causal=True, block_q=16)
    # the tolerance: a shift well inside it passes, one just above it does not
    tol = api.LSE_TOLERANCE[np.dtype(dtype)]
    small = lse.copy()
    small[0, 0, 5] += tol / 10
    flashlab.flash_attention_backward(do, q, k, v, o, small, causal=True)
    small[0, 0, 5] = lse[0, 0, 5] + 3 * tol * max(1.0, abs(lse[0, 0, 5]))
    with pytest.raises(ValueError, match=r"row \(b=0, h=0, i=5\)"):
        flashlab.flash_attention_backward(do, q, k, v, o, small, causal=True)


def test_rows_without_keys_pass_and_a_minus_inf_lse_on_a_row_with_keys_does_not():
    """A fully masked row has LSE = -inf and o = 0: P is 0 there and the check passes; the
    same -inf on a row that has keys is refused. float64 inputs with the float32 LSE (which
    the backward accepts) are checked at float32's tolerance."""
    q, k, v, do = _problem(np.float64)
    mask = np.zeros((1, 1, 40, 40), dtype=bool)
    mask[..., 7, :] = True                     # row 7 sees no key
    o, lse = flashlab.flash_attention(q, k, v, mask=mask)
    assert np.isneginf(lse[..., 7]).all() and not o[..., 7, :].any()
    flashlab.flash_attention_backward(do, q, k, v, o, lse, mask=mask)
    flashlab.flash_attention_backward(do, q, k, v, o, lse.astype(np.float32), mask=mask)
    bad = lse.copy()
    bad[0, 1, 9] = -np.inf
    with pytest.raises(ValueError, match=r"row \(b=0, h=1, i=9\) .* sums to 40"):
        flashlab.flash_attention_backward(do, q, k, v, o, bad, mask=mask)
    bad = lse.copy()
    bad[0, 0, 7] = 0.0                         # a finite LSE on the row without keys
    with pytest.raises(ValueError, match=r"row \(b=0, h=0, i=7\) .* sums to 0,"):
        flashlab.flash_attention_backward(do, q, k, v, o, bad, mask=mask)


def test_dropout_bias_and_gqa_keep_their_own_lse():
    """P before dropout sums to 1: dropout, an ALiBi bias and GQA pass with their own LSE."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 4, 33, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 50, 8)).astype(np.float32) for _ in range(2))
    opts = dict(causal=True, dropout_p=0.3, seed=5, alibi_slopes=np.array([0.5, 0.25, 0.1, 0.05]))
    o, lse = flashlab.flash_attention(q, k, v, **opts)
    flashlab.flash_attention_backward(np.ones_like(o), q, k, v, o, lse, **opts)
    with pytest.raises(ValueError, match="lse is not the forward's"):
        flashlab.flash_attention_backward(np.ones_like(o), q, k, v, o, lse - 1.0, **opts)


def test_compat_names_softmax_lse():
    rng = np.random.default_rng(2)
    q, k, v, dout = (rng.standard_normal((2, 30, 4, 8)).astype(np.float32) for _ in range(4))
    out, lse, _ = compat.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    compat.flash_attn_func_backward(dout, q, k, v, out, lse, causal=True)
    with pytest.raises(ValueError, match=r"^softmax_lse is not the forward's.*row \(b=0, h=0, i=0\)"):
        compat.flash_attn_func_backward(dout, q, k, v, out, np.full_like(lse, -100.0), causal=True)


def test_torch_door_names_softmax_lse():
    torch = pytest.importorskip("torch", reason="the torch door")
    from flashlab import torch_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 20, 2, 8, generator=g) for _ in range(3))
    out, lse, seed, _ = torch_attention._forward_op(q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
    dout = torch.randn_like(out)
    args = (0.0, None, True, -1, -1, 0.0, None)
    torch_attention._backward_op(dout, q, k, v, out, lse, seed, *args)
    with pytest.raises(ValueError, match=r"^softmax_lse is not the forward's.*row \(b=0, h=1, i=3\)"):
        bad = lse.clone()
        bad[0, 1, 3] = -100.0
        torch_attention._backward_op(dout, q, k, v, out, bad, seed, *args)


def test_cann_names_its_softmax_statistics():
    rng = np.random.default_rng(3)
    q, k, v, dy = (rng.standard_normal((1, 2, 24, 8)).astype(np.float32) for _ in range(4))
    out, smax, ssum = cann.flash_attention_score(q, k, v, 2, "BNSD", scale=0.35)
    good = dict(softmax_max=smax, softmax_sum=ssum, attention_in=out, scale=0.35)
    cann.flash_attention_score_grad(q, k, v, dy, 2, "BNSD", **good)
    with pytest.raises(ValueError, match=re.escape("softmax_max/softmax_sum is not the forward's")):
        cann.flash_attention_score_grad(q, k, v, dy, 2, "BNSD", **dict(good, softmax_sum=ssum * 2))
