"""flashlab.torch_attention (the autograd Function) against torch's own attention; needs torch.

Skipped without torch, which flashlab never requires. Checks: ``gradcheck`` in float64 on tiny
shapes (causal, windows, Sq != Sk, MQA/GQA, Dqk != Dv); forward and backward equal to
``torch.nn.functional.scaled_dot_product_attention`` with flash_attn's bottom-right mask
written as SDPA's ``attn_mask``; the tiny transformer of ``examples/train_tiny.py`` trained
for a few steps with either attention, the losses agreeing step by step.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_compat import bottom_right_allowed  # noqa: E402

from flashlab.torch_attention import FlashlabAttention, flash_attn_func  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_tiny.py"


def qkv(B, Sq, Sk, H, Hkv, D, Dv, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, dtype=dtype, requires_grad=True)
                 for shape in ((B, Sq, H, D), (B, Sk, Hkv, D), (B, Sk, Hkv, Dv)))


def sdpa(q, k, v, causal=False, window_size=(-1, -1)):
    """torch's attention on flash_attn's layout: kv heads repeated, the bottom-right mask dense."""
    H, Hkv = q.shape[2], k.shape[2]
    k, v = (x.repeat_interleave(H // Hkv, dim=2) for x in (k, v))
    keep = torch.from_numpy(bottom_right_allowed(q.shape[1], k.shape[1], causal, window_size))
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep)  # True = attend
    return o.transpose(1, 2)


# (Sq, Sk, H, Hkv, D, Dv, causal, window_size): every row keeps at least one key
CASES = [(5, 5, 2, 2, 4, 4, False, (-1, -1)),
         (5, 7, 4, 2, 6, 3, True, (-1, -1)),
         (6, 4, 3, 1, 4, 5, False, (1, 2)),
         (7, 9, 4, 1, 8, 8, True, (2, -1)),
         (8, 8, 2, 1, 4, 4, False, (0, 0))]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradcheck_float64(case):
    Sq, Sk, H, Hkv, D, Dv, causal, window = case
    inputs = qkv(1, Sq, Sk, H, Hkv, D, Dv)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attn_func(q, k, v, causal=causal, window_size=window), inputs)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 2e-5)], ids=["f64", "f32"])
@pytest.mark.parametrize("case", [(64, 64, 4, 4, 16, 16, True, (-1, -1)),
                                  (37, 100, 6, 2, 24, 8, True, (-1, -1)),
                                  (100, 37, 4, 1, 16, 16, False, (5, 3)),
                                  (128, 217, 4, 2, 192 // 4, 128 // 4, True, (20, -1))], ids=str)
def test_forward_and_backward_equal_sdpa(case, dtype, tol):
    Sq, Sk, H, Hkv, D, Dv, causal, window = case
    q, k, v = qkv(2, Sq, Sk, H, Hkv, D, Dv, dtype=dtype)
    dout = torch.randn(2, Sq, H, Dv, dtype=dtype, generator=torch.Generator().manual_seed(1))
    outs, grads = [], []
    for f in (flash_attn_func, sdpa):
        out = f(q, k, v, causal=causal, window_size=window)
        outs.append(out)
        grads.append(torch.autograd.grad(out, (q, k, v), dout))
    torch.testing.assert_close(outs[0], outs[1], atol=tol, rtol=tol)
    for name, a, b in zip(("dq", "dk", "dv"), *grads):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m, name=name: f"{name}: {m}")


def test_return_values_and_what_is_differentiable():
    q, k, v = qkv(2, 5, 9, 4, 2, 8, 4)
    out = FlashlabAttention.apply(q, k, v)
    assert out.shape == (2, 5, 4, 4) and out.requires_grad
    out2, lse = FlashlabAttention.apply(q, k, v, 0.0, None, True, (-1, -1), None, False, True)
    out3, lse3, p = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert lse.shape == (2, 4, 5) and p.shape == (2, 4, 5, 9)
    assert not lse.requires_grad and not p.requires_grad and out3.requires_grad
    torch.testing.assert_close(out2, out3, atol=0, rtol=0)
    torch.testing.assert_close(lse, lse3, atol=0, rtol=0)


def test_rows_without_keys_give_zero_and_no_nan():
    q, k, v = qkv(1, 6, 2, 2, 2, 4, 4)                 # causal, Sq > Sk: rows 0-3 see no key
    out = flash_attn_func(q, k, v, causal=True)
    assert (out[0, :4] == 0).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[0, :4] == 0).all()


def test_bad_tensors_raise():
    q, k, v = qkv(1, 4, 4, 2, 2, 8, 8)
    with pytest.raises(TypeError, match="q must be float16, bfloat16, float32 or float64"):
        flash_attn_func(q.to(torch.int32), k.to(torch.int32), v.to(torch.int32))
    with pytest.raises(TypeError, match="k must have q's dtype"):
        flash_attn_func(q.float(), k, v)
    with pytest.raises(TypeError, match=r"dropout_p must be a real number in \[0, 1\); got '0.1' \(str\)"):
        flash_attn_func(q, k, v, dropout_p="0.1")
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        flash_attn_func(q, k.detach().numpy(), v)
    with pytest.raises(ValueError, match=r"softcap must be >= 0.0; got -5.0"):
        flash_attn_func(q, k, v, softcap=-5.0)


def test_dropout_seed_is_drawn_per_forward_and_replayed_in_backward():
    q, k, v = qkv(1, 6, 6, 2, 2, 4, 4)

    def seeded(q, k, v):
        torch.manual_seed(7)                           # the same keep mask at every call
        return flash_attn_func(q, k, v, dropout_p=0.3, causal=True)

    assert torch.autograd.gradcheck(seeded, (q, k, v))
    torch.manual_seed(7)
    a, b = (flash_attn_func(q, k, v, dropout_p=0.3) for _ in range(2))
    assert not torch.equal(a, b)                       # a fresh seed per forward


# ------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def train_tiny():
    """examples/train_tiny.py as a module (its OMP_WAIT_POLICY default undone afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_WAIT_POLICY", "PASSIVE")
        spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def test_tiny_training_matches_sdpa(train_tiny):
    """25 Adam steps from the same seed: the float64 loss curves agree to 1e-8."""
    sdpa_losses, _ = train_tiny.train("sdpa", steps=25, batch=8)
    flash_losses, _ = train_tiny.train("flashlab", steps=25, batch=8)
    assert np.mean(sdpa_losses[-5:]) < np.mean(sdpa_losses[:5])      # it learns
    np.testing.assert_allclose(flash_losses, sdpa_losses, rtol=0, atol=1e-8)
