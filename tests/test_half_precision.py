"""float16 and bfloat16 through every front door: the kernel API, compat, CANN and torch.

The contract is CANN's: computed in float32, ``o`` (and the gradients) returned in the
inputs' dtype, the LSE in float32. bfloat16 numpy arrays are ``ml_dtypes.bfloat16``. Each
result is judged against the float64 reference with the peers' rule (tests/conftest.py:
twice the error of a naive implementation computed in the same half dtype, plus two
rounding steps of the result's dtype); the torch door is compared with the same numbers
as the numpy doors, bit for bit.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import check_forward, make_qkv, mask_options
from test_backward import check_backward

import flashlab
from flashlab import cann, compat

HALF = [np.float16, ml_dtypes.bfloat16]
IDS = ["float16", "bfloat16"]


@pytest.mark.parametrize("kind", ["none", "causal", "window+causal"])
@pytest.mark.parametrize("dtype", HALF, ids=IDS)
@pytest.mark.parametrize("sq_sk", [(37, 100), (100, 37), (1, 239), (128, 128)], ids=str)
def test_kernel_api_forward(dtype, sq_sk, kind):
    Sq, Sk = sq_sk
    inputs = make_qkv(2, 4, 2, Sq, Sk, 32, 16, dtype=dtype, seed=Sq + Sk)
    o, lse = check_forward(inputs, **mask_options(kind, 2, 4, Sq, Sk))
    assert o.dtype == dtype and lse.dtype == np.float32


@pytest.mark.parametrize("kind", ["none", "causal"])
@pytest.mark.parametrize("dtype", HALF, ids=IDS)
@pytest.mark.parametrize("sq_sk", [(37, 100), (64, 64), (3, 70)], ids=str)
def test_kernel_api_backward(dtype, sq_sk, kind):
    Sq, Sk = sq_sk
    inputs = make_qkv(2, 4, 2, Sq, Sk, 32, 16, dtype=dtype, seed=Sq * Sk)
    grads = check_backward(inputs, block_q=32, block_k=48, **mask_options(kind, 2, 4, Sq, Sk))
    assert all(g.dtype == dtype for g in grads)


@pytest.mark.parametrize("dtype", HALF, ids=IDS)
def test_compat_is_the_kernel_api_in_flash_attn_layout(dtype):
    """compat on (B, S, H, D) half arrays: the kernel API's numbers, layouts translated."""
    x = make_qkv(2, 4, 2, 20, 33, 16, 16, dtype=dtype, seed=5)
    bshd = {n: np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for n, a in x.items()}
    out, lse = compat.flash_attn_func(bshd["q"], bshd["k"], bshd["v"], causal=True, return_lse=True)
    o, lse_api = flashlab.flash_attention(**x, window=compat.band_from_window(20, 33, True))
    assert out.dtype == dtype and lse.dtype == np.float32
    np.testing.assert_array_equal(out.transpose(0, 2, 1, 3), o)
    np.testing.assert_array_equal(lse, lse_api)
    dout = np.ones_like(out)
    grads = compat.flash_attn_func_backward(dout, bshd["q"], bshd["k"], bshd["v"], out, lse,
                                            causal=True)
    assert [g.dtype for g in grads] == [dtype] * 3


@pytest.mark.parametrize("dtype", HALF, ids=IDS)
def test_cann_half(dtype):
    x = make_qkv(1, 2, 2, 16, 16, 16, 16, dtype=dtype, seed=2)
    out, smax, ssum = cann.flash_attention_score(x["q"], x["k"], x["v"], 2, "BNSD", scale=0.25)
    o, _ = flashlab.flash_attention(**x, scale=0.25)
    assert out.dtype == dtype and smax.dtype == ssum.dtype == np.float32
    np.testing.assert_array_equal(out, o)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_torch_door_half(dtype_name):
    """The torch wrapper on half tensors: the compat numbers, bit for bit, and gradients in
    the tensors' dtype."""
    torch = pytest.importorskip("torch", reason="the torch front door needs torch")
    from flashlab.torch_attention import flash_attn_func
    tdtype = getattr(torch, dtype_name)
    ndtype = np.float16 if dtype_name == "float16" else ml_dtypes.bfloat16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 4, 8, generator=g).to(tdtype).requires_grad_() for _ in range(3))
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.dtype == tdtype and lse.dtype == torch.float32

    def arr(t):
        return t.detach().float().numpy().astype(ndtype)

    ref_out, ref_lse = compat.flash_attn_func(arr(q), arr(k), arr(v), causal=True, return_lse=True)
    np.testing.assert_array_equal(out.detach().float().numpy(), ref_out.astype(np.float32))
    np.testing.assert_array_equal(lse.numpy(), ref_lse)
    out.float().sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == tdtype
    ref_grads = compat.flash_attn_func_backward(np.ones(ref_out.shape, ndtype), arr(q), arr(k), arr(v),
                                                ref_out, ref_lse, causal=True)
    for t, r in zip((q.grad, k.grad, v.grad), ref_grads):
        np.testing.assert_array_equal(t.float().numpy(), r.astype(np.float32))
