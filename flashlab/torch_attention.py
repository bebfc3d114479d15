"""flashlab's ``flash_attn_func`` on torch tensors: registered custom ops, autograd, ``torch.compile``.

Optional: this module imports torch, ``import flashlab`` never does. Replace flash_attn's
import and the rest of the model stays as it is::

    from flashlab.torch_attention import flash_attn_func
    out = flash_attn_func(q, k, v, dropout_p=0.1 if self.training else 0.0, causal=True)

``q``, ``k``, ``v`` are CPU tensors ``(batch, seqlen, nheads, headdim)``, float16, bfloat16,
float32 or float64, with the conventions of :mod:`flashlab.compat` (bottom-right
causal/window, MQA/GQA, ``headdim_v != headdim``). float16 and bfloat16 are computed in
float32 and returned in the input dtype; ``softmax_lse`` is float32 (float64 for float64
inputs), as in :func:`flashlab.flash_attention`.

**Custom ops.** The forward and the backward are two operators registered with
:func:`torch.library.custom_op`, ``flashlab::flash_attn_forward`` and
``flashlab::flash_attn_backward``, as flash-attn registers its own: each has a fake
implementation (output shapes and dtypes from the input shapes, for ``torch.compile``'s
tracing) and the forward has an autograd formula (:func:`torch.library.register_autograd`)
that calls the backward op. ``torch.compile`` therefore sees two opaque nodes: Dynamo never
traces into Numba, and the eager, ``aot_eager`` and ``inductor`` backends all run the same
kernels as eager mode.

**Eager mode** does not go through the op's dispatch (the dispatcher, the op's autograd
wrapper, a second dispatch to the CPU kernel: more than flashlab's own work at small shapes,
issue 22): outside ``torch.compile`` the front door calls an
autograd Function with the op's own bodies, the same saved tensors and the same
non-differentiable outputs, so both paths give the same bits (tests/test_small_shapes.py).
Its forward keeps the checked problem (``flashlab.compat.flash_attn_func(..., return_state=True)``), so the
backward does not check q, k and v again.

The forward saves ``out``, ``softmax_lse`` (in eager mode, when the caller is not given it, as
the array inside the forward's state) and the dropout seed; the backward recomputes ``P``
from them tile by tile, as FlashAttention does (:func:`flashlab.compat.flash_attn_func_backward`).

**Import and first call.** Importing this module imports ``torch._dynamo`` and runs Numba's
one-time setup (:func:`flashlab.numba_cache.numba_setup`), both costs that would otherwise
land in the first training step; that step then only loads its kernels from Numba's cache
(``python -m flashlab.bench.overhead`` times it).

**Not supported**, each with a ``NotImplementedError`` that says so: double backward
(``create_graph=True`` then differentiating the gradients), ``torch.vmap`` / ``torch.func``
batching rules.

**Dropout**: each forward with ``dropout_p > 0`` draws a seed from torch's default generator
inside the op (so ``torch.manual_seed`` makes a run reproducible, compiled or not) and
returns it as a saved int64 tensor: the backward rebuilds the same keep mask from it
(:mod:`flashlab.dropout`). With ``dropout_p == 0`` nothing is drawn, so the generator's stream
is the same as without this layer.

**What this door does: translate, check nothing itself.** Every argument is checked once,
by :mod:`flashlab.validation`'s rules behind :mod:`flashlab.compat` (flash_attn's names, the
same messages as the numpy doors; the scalar options by :func:`flashlab.compat.scalar_options`
before the op, so a ``dropout_p='0.1'`` is refused in those words and not the op schema's).
This module translates tensors to arrays (views, no copy; bfloat16 through
``ml_dtypes.bfloat16``) and checks only what numpy cannot see: a tensor, on the CPU.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

# a custom op's first call runs behind torch._disable_dynamo, which imports torch._dynamo
# (measured: 11.8 s of a 12.8 s first forward on the loaded 2-core machine); importing it
# here puts that cost at import, where a user expects it, not in the first training step
import torch._dynamo  # noqa: F401,E402

from flashlab import compat
from flashlab.numba_cache import numba_setup
from flashlab.validation import BFLOAT16

# Numba's one-time setup (its typing and lowering tables, ~0.1 s) at import too, for the same
# reason as torch._dynamo above: otherwise it is most of the first training step's time
numba_setup()

__all__ = ["flash_attn_func", "FlashlabAttention"]


# ------------------------------------------------------------------------------ tensors <-> arrays
def _numpy(name: str, x) -> np.ndarray:
    """The tensor's memory as a numpy array (a view, no copy); bfloat16 as ``ml_dtypes.bfloat16``.

    Only what numpy cannot check is checked here (a tensor, on the CPU); dtype and shape are
    :func:`flashlab.validation.prepare`'s, with the same messages as every other entry point.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not x.is_cpu:         # (0.1 us; x.device.type builds a device object, 0.4 us)
        raise ValueError(f"{name} must be on the CPU; got device {x.device}")
    x = x.detach()
    if x.dtype == torch.bfloat16:
        if BFLOAT16 is None:
            raise TypeError(f"{name} is bfloat16, which needs the ml_dtypes package (not installed)")
        # same bits, read as ml_dtypes.bfloat16 (numpy has no bfloat16 of its own)
        return x.view(torch.int16).numpy().view(BFLOAT16)
    try:
        return x.numpy()
    except TypeError:       # a dtype numpy has no name for (e.g. float8): prepare's message
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64; got dtype "
                        f"{x.dtype}") from None


def _tensor(x: np.ndarray) -> torch.Tensor:
    """A numpy result as a tensor (no copy); ``ml_dtypes.bfloat16`` as ``torch.bfloat16``."""
    if BFLOAT16 is not None and x.dtype == BFLOAT16:
        return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """softmax_lse's dtype: float64 for float64 inputs, float32 otherwise (the compute dtype)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ------------------------------------------------------------------------------ the two computations
def _forward_impl(q, k, v, dropout_p, softmax_scale, causal, window_left, window_right,
                  softcap, alibi_slopes, return_probs):
    """``(out, softmax_lse, seed, attn_probs)``: out (B, Sq, H, Dv) in q's dtype, softmax_lse
    (B, H, Sq) float32 (float64 for float64 q), seed () int64 (0 without dropout), attn_probs
    (B, H, Sq, Sk) in q's dtype with ``return_probs``, else (0,). The body of the forward op."""
    out, lse, seed, probs, _ = _forward_state(q, k, v, dropout_p, softmax_scale, causal,
                                              window_left, window_right, softcap,
                                              alibi_slopes, return_probs)
    return out, _tensor(lse), torch.full((), seed, dtype=torch.int64), _probs_or_empty(q, probs)


def _probs_or_empty(q: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    """``attn_probs``, or the op's empty (0,) tensor in its place without ``return_probs``."""
    return q.new_empty((0,)) if probs is None else probs


def _forward_state(q, k, v, dropout_p, softmax_scale, causal, window_left, window_right,
                   softcap, alibi_slopes, return_probs):
    """``(out, softmax_lse, seed, attn_probs, state)``: :func:`_forward_impl`'s outputs with
    softmax_lse as a numpy array, the seed as an int, and the forward's state
    (:class:`flashlab.compat.ForwardState`; None with ``return_probs``), which the eager
    path's backward reuses instead of checking q, k, v again. ``attn_probs`` is None without
    ``return_probs``."""
    slopes = None if alibi_slopes is None else _numpy("alibi_slopes", alibi_slopes)
    seed = _draw_seed() if dropout_p > 0 else 0
    args = (_numpy("q", q), _numpy("k", k), _numpy("v", v), dropout_p, softmax_scale, causal,
            (window_left, window_right), softcap, slopes, False)
    if return_probs:
        out, lse, probs = compat.flash_attn_func(*args, True, seed=seed)
        state = None
        probs = _tensor(probs)
    else:
        out, lse, state = compat.flash_attn_func(*args, seed=seed, return_state=True)
        probs = None
    return _tensor(out), lse, seed, probs, state


def _backward_impl(dout, q, k, v, out, lse, seed, dropout_p, softmax_scale, causal,
                   window_left, window_right, softcap, alibi_slopes):
    """``(dq, dk, dv)`` with the shapes and dtypes of q, k, v: the body of the backward op and
    of the eager path's backward."""
    slopes = None if alibi_slopes is None else _numpy("alibi_slopes", alibi_slopes)
    # the autograd engine may hand a gradient of another dtype/layout: q's dtype, as the
    # forward's out (numpy then reads it in any strides)
    dout = dout.to(q.dtype)
    grads = compat.flash_attn_func_backward(
        _numpy("dout", dout), _numpy("q", q), _numpy("k", k), _numpy("v", v), _numpy("out", out),
        _numpy("softmax_lse", lse), dropout_p, softmax_scale, causal, (window_left, window_right),
        softcap, slopes, False, seed=int(seed))
    return tuple(_tensor(g) for g in grads)


# ------------------------------------------------------------------------------ the custom ops
@torch.library.custom_op("flashlab::flash_attn_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
                softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
                softcap: float, alibi_slopes: Optional[torch.Tensor], return_probs: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, softmax_lse, seed, attn_probs)`` (:func:`_forward_impl`)."""
    return _forward_impl(q, k, v, dropout_p, softmax_scale, causal, window_left, window_right,
                         softcap, alibi_slopes, return_probs)


@_forward_op.register_fake
def _forward_fake(q, k, v, dropout_p, softmax_scale, causal, window_left, window_right,
                  softcap, alibi_slopes, return_probs):
    B, Sq, H, _ = q.shape
    Sk, Dv = k.shape[1], v.shape[3]
    out = q.new_empty((B, Sq, H, Dv))
    lse = q.new_empty((B, H, Sq), dtype=_lse_dtype(q.dtype))
    probs = q.new_empty((B, H, Sq, Sk) if return_probs else (0,))
    return out, lse, q.new_empty((), dtype=torch.int64), probs


@torch.library.custom_op("flashlab::flash_attn_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, seed: torch.Tensor, dropout_p: float,
                 softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
                 softcap: float, alibi_slopes: Optional[torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` with the shapes and dtypes of q, k, v (:func:`_backward_impl`)."""
    return _backward_impl(dout, q, k, v, out, lse, seed, dropout_p, softmax_scale, causal,
                          window_left, window_right, softcap, alibi_slopes)


@_backward_op.register_fake
def _backward_fake(dout, q, k, v, out, lse, seed, dropout_p, softmax_scale, causal,
                   window_left, window_right, softcap, alibi_slopes):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _draw_seed() -> int:
    """A dropout seed from torch's default generator: [0, 2**63)."""
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))


# ------------------------------------------------------------------------------ autograd
def _setup_context(ctx, inputs, output):
    q, k, v, dropout_p, scale, causal, wl, wr, softcap, alibi_slopes, _ = inputs
    out, lse, seed, _ = output
    ctx.save_for_backward(q, k, v, out, lse, seed)
    ctx.options = (dropout_p, scale, causal, wl, wr, softcap)
    ctx.alibi_slopes = alibi_slopes
    ctx.mark_non_differentiable(lse, seed, output[3])


def _backward(ctx, dout, *_):
    q, k, v, out, lse, seed = ctx.saved_tensors
    dq, dk, dv = _backward_op(dout, q, k, v, out, lse, seed, *ctx.options, ctx.alibi_slopes)
    # one gradient per forward input: q, k, v, then None for the options and alibi_slopes
    return (dq, dk, dv) + (None,) * 8


torch.library.register_autograd("flashlab::flash_attn_forward", _backward,
                                setup_context=_setup_context)


def _no_double_backward(ctx, *grads):
    raise NotImplementedError(
        "flashlab's attention has no double backward: its backward (flashlab::flash_attn_backward) "
        "is not differentiable. Use create_graph=False, or torch's own attention for "
        "second derivatives.")


def _save_nothing(ctx, inputs, output):
    pass


torch.library.register_autograd("flashlab::flash_attn_backward", _no_double_backward,
                                setup_context=_save_nothing)


def _no_vmap(name):
    def rule(info, in_dims, *args):
        raise NotImplementedError(
            f"{name} has no vmap rule: torch.vmap / torch.func batching over flashlab's "
            f"attention is not supported. Batch the tensors along their batch dimension instead.")
    return rule


torch.library.register_vmap("flashlab::flash_attn_forward", _no_vmap("flashlab::flash_attn_forward"))
torch.library.register_vmap("flashlab::flash_attn_backward", _no_vmap("flashlab::flash_attn_backward"))


# ------------------------------------------------------------------------------ eager mode
class _EagerAttention(torch.autograd.Function):
    """The forward op's computation and autograd formula, called without the op's dispatch.

    Outside ``torch.compile`` nothing needs the registered op: its eager call goes through the
    dispatcher, the op's autograd wrapper and a second dispatch to the CPU kernel, which cost
    more than the small problems' arithmetic (issue 22). This class runs the same
    computation as :func:`_forward_impl` and :func:`_backward_impl` (the forward's validated
    state reused by the backward), saves q, k, v and out as the op does (and softmax_lse as a
    tensor when the caller gets it), marks the same outputs non-differentiable. With
    ``create_graph=True`` its backward calls the backward *op*, whose own autograd formula
    refuses double backward with the op path's message.

    It returns ``out`` alone unless ``need_lse`` (then ``(out, softmax_lse, attn_probs)``) and
    keeps the seed as an int: each extra output of an autograd Function costs its own
    bookkeeping.
    """

    @staticmethod
    def forward(ctx, q, k, v, dropout_p, softmax_scale, causal, window_left, window_right,
                softcap, alibi_slopes, return_probs, need_lse):
        out, lse, ctx.seed, probs, ctx.state = _forward_state(
            q, k, v, dropout_p, softmax_scale, causal, window_left, window_right, softcap,
            alibi_slopes, return_probs)
        if ctx.state is not None and not need_lse:
            # an LSE the caller never sees cannot be changed in place: the state keeps the
            # array (saving it as a tensor costs a conversion each way, ~4 us of a small step)
            ctx.save_for_backward(q, k, v, out)
        else:
            lse = _tensor(lse)
            ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (dropout_p, softmax_scale, causal, window_left, window_right, softcap)
        ctx.alibi_slopes = alibi_slopes
        if not need_lse:
            return out
        probs = _probs_or_empty(q, probs)
        ctx.mark_non_differentiable(lse, probs)
        return out, lse, probs

    @staticmethod
    def backward(ctx, dout, *_):
        # unpacked for torch's check that none was changed in place since the forward
        q, k, v, out, *saved_lse = ctx.saved_tensors
        if ctx.state is not None and not torch.is_grad_enabled():
            # the forward's validated problem: q, k, v and the options are not checked again
            if dout.dtype != q.dtype:   # as _backward_impl: the forward's dtype
                dout = dout.to(q.dtype)
            # the forward's own LSE (None) unless the caller was given it as a tensor
            given = None if not saved_lse else _numpy("softmax_lse", saved_lse[0])
            grads = compat.flash_attn_func_backward(_numpy("dout", dout), softmax_lse=given,
                                                    state=ctx.state)
            dq, dk, dv = (_tensor(g) for g in grads)
        else:
            lse = saved_lse[0] if saved_lse else torch.from_numpy(ctx.state.lse)
            if torch.is_grad_enabled():
                # create_graph=True: through the op, so that the gradients carry its refusal
                seed = torch.full((), ctx.seed, dtype=torch.int64)
                dq, dk, dv = _backward_op(dout, q, k, v, out, lse, seed, *ctx.options,
                                          ctx.alibi_slopes)
            else:
                dropout_p, softmax_scale, causal, window_left, window_right, softcap = ctx.options
                dq, dk, dv = _backward_impl(dout, q, k, v, out, lse, ctx.seed, dropout_p, softmax_scale,
                                            causal, window_left, window_right, softcap,
                                            ctx.alibi_slopes)
        # one gradient per forward input: q, k, v, then None for the options and flags
        return (dq, dk, dv) + (None,) * 9


# ------------------------------------------------------------------------------ the front door
def _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
               deterministic, return_probs, need_lse):
    """``(out, softmax_lse, attn_probs)``, arguments checked first; ``softmax_lse`` and
    ``attn_probs`` are None in eager mode unless ``need_lse`` or ``return_probs``."""
    # the scalar options are checked here, by compat's rules and with its messages (the op's
    # schema would refuse a str with torch's own words); under torch.compile Dynamo runs this
    # as Python on constants while it traces (then nothing is remembered between calls)
    compiling = torch.compiler.is_compiling()
    dropout_p, softmax_scale, causal, (wl, wr), softcap = compat.scalar_options(
        dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
        remember=not compiling)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if alibi_slopes is not None and not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None; got {type(alibi_slopes).__name__}")
    # torch.compile traces the registered op (Dynamo never enters Numba); eager mode runs the
    # same computation without the op's dispatch (:class:`_EagerAttention`)
    if compiling:
        out, lse, _, probs = _forward_op(q, k, v, dropout_p, softmax_scale, causal, wl, wr,
                                         softcap, alibi_slopes, bool(return_probs))
        return out, lse, probs
    if torch._C._are_functorch_transforms_active():
        # torch.func.grad/vmap/jacrev wrap the tensors: the op reads them as numpy, which a
        # wrapped tensor cannot give (torch's own error would name autograd.Function internals)
        raise NotImplementedError(
            "torch.func transforms (grad, vmap, jacrev, jvp, ...) are not supported by flashlab's "
            "attention: its ops read the tensors' memory through numpy. Use torch.autograd "
            "(loss.backward() / torch.autograd.grad) and batch along the batch dimension.")
    need_lse = bool(need_lse or return_probs)
    result = _EagerAttention.apply(q, k, v, dropout_p, softmax_scale, causal, wl, wr, softcap,
                                   alibi_slopes, bool(return_probs), need_lse)
    return result if need_lse else (result, None, None)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn's ``flash_attn_func`` (flash-attn 2.6+ argument order) on CPU torch tensors.

    q (batch, seqlen_q, nheads, headdim), k (batch, seqlen_k, nheads_k, headdim),
    v (batch, seqlen_k, nheads_k, headdim_v); float16, bfloat16, float32 or float64. Returns
    ``out`` (batch, seqlen_q, nheads, headdim_v) in q's dtype, or with ``return_attn_probs``
    ``(out, softmax_lse, attn_probs)`` as :func:`flashlab.compat.flash_attn_func` defines
    them (only ``out`` is differentiable). ``softcap`` > 0 soft-caps the scaled scores,
    ``softcap * tanh(s / softcap)`` (flash_attn's, forward and backward); ``deterministic`` is
    accepted (flashlab's backward is always deterministic).

    Raises the same ``TypeError``/``ValueError`` as :func:`flashlab.compat.flash_attn_func`
    for the same bad argument (checked by :func:`flashlab.validation.prepare`), plus
    ``TypeError`` for a q, k, v or alibi_slopes that is not a tensor and ``ValueError`` for
    one not on the CPU; ``NotImplementedError`` for double backward and vmap.
    """
    out, lse, probs = _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                                 alibi_slopes, deterministic, return_attn_probs, return_attn_probs)
    return (out, lse, probs) if return_attn_probs else out


class FlashlabAttention:
    """Kept for code written against the earlier autograd Function:
    ``FlashlabAttention.apply(q, k, v, dropout_p, softmax_scale, causal, window_size,
    alibi_slopes, deterministic, return_lse, return_attn_probs)`` (every argument after ``v``
    optional) calls the registered op. Returns ``out``, with ``return_lse`` ``(out,
    softmax_lse)``, with ``return_attn_probs`` ``(out, softmax_lse, attn_probs)``.
    """

    @staticmethod
    def apply(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
              alibi_slopes=None, deterministic=False, return_lse=False, return_attn_probs=False):
        out, lse, probs = _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, 0.0,
                                     alibi_slopes, deterministic, return_attn_probs, return_lse)
        if return_attn_probs:
            return out, lse, probs
        return (out, lse) if return_lse else out
