"""flashlab's ``flash_attn_func`` on torch tensors, with autograd: train a small model on CPU.

Optional: this module imports torch, ``import flashlab`` never does. Replace flash_attn's
import and the rest of the model stays as it is::

    from flashlab.torch_attention import flash_attn_func
    out = flash_attn_func(q, k, v, dropout_p=0.1 if self.training else 0.0, causal=True)

``q``, ``k``, ``v`` are CPU tensors ``(batch, seqlen, nheads, headdim)``, float32 or float64,
with the conventions of :mod:`flashlab.compat` (bottom-right causal/window, MQA/GQA,
``headdim_v != headdim``). The forward runs :func:`flashlab.compat.flash_attn_func` on the
tensors' memory (no copy but flashlab's own change of layout) and saves ``out`` and
``softmax_lse``; the backward runs :func:`flashlab.compat.flash_attn_func_backward`, which
recomputes ``P`` from them tile by tile, as FlashAttention does.

**Dropout**: each forward with ``dropout_p > 0`` draws a seed from torch's default generator
(so ``torch.manual_seed`` makes a run reproducible) and saves it: the backward rebuilds the
same keep mask from it (:mod:`flashlab.dropout`). With ``dropout_p == 0`` nothing is drawn,
so the generator's stream is the same as without this layer.
"""
from __future__ import annotations

import numpy as np
import torch

from flashlab import compat

__all__ = ["FlashlabAttention", "flash_attn_func"]


def _numpy(name: str, x: torch.Tensor) -> np.ndarray:
    """The tensor's memory as a numpy array (a view, no copy)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU; got device {x.device}")
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64; got {x.dtype}")
    return x.detach().numpy()


def _draw_seed() -> int:
    """A dropout seed from torch's default generator: [0, 2**63)."""
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))


class FlashlabAttention(torch.autograd.Function):
    """Autograd Function: ``apply(q, k, v, dropout_p, softmax_scale, causal, window_size,
    alibi_slopes, deterministic, return_lse, return_attn_probs)``, every argument after ``v``
    optional.

    Returns ``out`` (batch, seqlen_q, nheads, headdim_v); with ``return_lse``
    ``(out, softmax_lse)``, with ``return_attn_probs`` ``(out, softmax_lse, attn_probs)``
    (shapes in :mod:`flashlab.compat`; only ``out`` is differentiable).
    """

    @staticmethod
    def forward(ctx, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                alibi_slopes=None, deterministic=False, return_lse=False, return_attn_probs=False):
        slopes = None if alibi_slopes is None else _numpy("alibi_slopes", alibi_slopes)
        seed = _draw_seed() if dropout_p > 0 else 0
        results = compat.flash_attn_func(
            _numpy("q", q), _numpy("k", k), _numpy("v", v), dropout_p, softmax_scale, causal,
            window_size, 0.0, slopes, deterministic, return_attn_probs, return_lse=True, seed=seed)
        out, lse, *probs = (torch.from_numpy(x) for x in results)
        # the backward needs out and lse besides the inputs, and nothing else
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (dropout_p, softmax_scale, causal, tuple(window_size), slopes, deterministic, seed)
        ctx.mark_non_differentiable(lse, *probs)
        if return_attn_probs:
            return out, lse, probs[0]
        return (out, lse) if return_lse else out

    @staticmethod
    def backward(ctx, dout, *_):
        q, k, v, out, lse = ctx.saved_tensors
        dropout_p, scale, causal, window_size, slopes, deterministic, seed = ctx.options
        dq, dk, dv = compat.flash_attn_func_backward(
            _numpy("dout", dout), _numpy("q", q), _numpy("k", k), _numpy("v", v), out.numpy(),
            lse.numpy(), dropout_p, scale, causal, window_size, 0.0, slopes, deterministic, seed=seed)
        # one gradient per forward argument: q, k, v, then None for the 8 options
        return (torch.from_numpy(dq), torch.from_numpy(dk), torch.from_numpy(dv)) + (None,) * 8


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn's ``flash_attn_func`` (flash-attn 2.6+ argument order) on CPU torch tensors.

    q (batch, seqlen_q, nheads, headdim), k (batch, seqlen_k, nheads_k, headdim),
    v (batch, seqlen_k, nheads_k, headdim_v). Returns ``out`` (batch, seqlen_q, nheads,
    headdim_v), or with ``return_attn_probs`` ``(out, softmax_lse, attn_probs)`` as
    :func:`flashlab.compat.flash_attn_func` defines them. ``softcap`` must be 0.0.
    """
    if softcap != 0:
        raise NotImplementedError(f"softcap must be 0.0 (tanh soft-capping is not in flashlab); got {softcap}")
    return FlashlabAttention.apply(q, k, v, dropout_p, softmax_scale, causal, window_size,
                                   alibi_slopes, deterministic, False, return_attn_probs)
