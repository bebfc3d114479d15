r"""flash-attention's interface, ``flash_attn_func`` and ``flash_attn_varlen_func``, on numpy arrays.

A flash_attn user's code keeps its arguments and conventions; flashlab's kernels run underneath.

**Layout.** flash_attn puts the sequence before the heads: ``q`` is ``(batch, seqlen_q, nheads,
headdim)`` (varlen: ``(total_q, nheads, headdim)``); flashlab's kernels read ``(B, H, S, D)``.
``k``/``v`` may have fewer heads than ``q`` (MQA/GQA: query head ``h`` reads kv head
``h // (nheads / nheads_k)``) and ``v``'s head dim may differ from ``q``/``k``'s (e.g. 192/128).

**Masks, bottom-right aligned.** flash_attn places the last query on the last key: query ``i``
sits at key position ``i + Sk - Sq``, so with ``window_size = (wl, wr)``

$$
i + S_k - S_q - w_l \;\le\; j \;\le\; i + S_k - S_q + w_r ,
$$

``-1`` meaning that side is unbounded, and ``causal=True`` setting ``w_r = 0``. flashlab's band
is top-left aligned (:mod:`flashlab.masks`: ``i - left <= j <= i + right``), so
:func:`band_from_window` shifts each side by ``Sk - Sq``. For ``Sq = 2, Sk = 5`` causal keeps
``[[1 1 1 1 0], [1 1 1 1 1]]``; for ``Sq = 5, Sk = 2`` the first three rows keep no key and
give ``out = 0``.

**Returns.** ``out`` alone, or with ``return_attn_probs=True`` the triple
``(out, softmax_lse, attn_probs)`` as flash_attn returns it, or with flashlab's
``return_lse=True`` the pair ``(out, softmax_lse)`` (no ``Sq x Sk`` array is formed).

* ``softmax_lse``: ``(B, H, Sq)`` (varlen ``(H, total_q)``), natural-log
  ``log sum_j exp(scale * q_i . k_j + bias_ij)`` over the allowed keys, float32 (float64
  where flashlab's kernels return it for float64 inputs). A row with no allowed key has
  ``-inf`` (flash_attn's CUDA kernel stores ``+inf`` there; both make the backward's
  ``exp(s - lse)`` zero, ``-inf`` is the log of an empty sum).
* ``attn_probs``: the softmax probabilities ``P`` (before dropout, not divided by
  ``1 - dropout_p``), ``(B, H, Sq, Sk)`` in ``q``'s dtype (varlen:
  ``(batch, H, max_seqlen_q, max_seqlen_k)``, each sequence's ``P`` in its top-left corner,
  zeros elsewhere), computed by the float64 reference. With ``dropout_p > 0`` a dropped
  entry is stored negated (flash_attn's ``S_dmask`` encoding: negative = dropped); a masked
  entry is 0 either way. flash_attn's ``S_dmask`` is for testing only, padded to multiples of
  128 and empty when ``dropout_p == 0``; this one is exact and always filled, and costs
  ``Sq x Sk`` memory.

**Backward.** :func:`flash_attn_func_backward` and :func:`flash_attn_varlen_func_backward`
take the forward's arguments plus ``dout``, ``out`` and ``softmax_lse`` and return
``(dq, dk, dv)`` in the layouts of ``q``, ``k``, ``v`` (flash_attn's ``_flash_attn_backward``,
without its in-place outputs). flashlab's backward is always deterministic, so
``deterministic`` is accepted and changes nothing.

**Dropout** follows :mod:`flashlab.dropout`: the keep mask is a function of ``(seed, offset,
position)``, so the backward recomputes it from the same ``seed``; pass a fresh ``seed`` per
step (flash_attn draws it from torch's generator, ``flashlab.torch_attention`` does the
same). The padded problem uses ``offset = 0``; varlen sequence ``b`` starts at
``offset = sum over earlier sequences of H * sq * sk``, so no two sequences share counters.
**ALiBi** adds ``-slope_h * |i + Sk - Sq - j|`` to the scores (``alibi_slopes`` ``(H,)`` or
``(B, H)``). **Soft-capping** (``softcap > 0``, flash-attn 2.6+): the scaled scores become
``softcap * tanh(s / softcap)`` before ALiBi and the masks, forward and backward.
``block_table`` (paged KV) raises ``NotImplementedError``.

Dtypes: float16/32/64 (flashlab's; flash_attn's CUDA kernels take float16/bfloat16).

**What this door does: translate, check nothing itself.** It reads flash_attn's layout
((batch, seqlen, nheads, headdim), packed (total, nheads, headdim)) as flashlab's (B, H, S, D),
turns the bottom-right ``window_size``/``causal`` into the top-left band and cuts a packed
batch into sequences. Every check is a rule of :mod:`flashlab.validation` called with
flash_attn's names (:data:`FLASH_ATTN`, :data:`FLASH_ATTN_VARLEN`: ``q`` of shape
``(batch_size, seqlen_q, nheads, headdim)``, ``softmax_scale``, ``window_size``,
``cu_seqlens_q``, ...), the same rules the kernel API and the CANN operator run; only
flash_attn-only feature it lacks raises here (``block_table``: ``NotImplementedError``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from flashlab.api import flash_attention, flash_attention_backward
from flashlab.arguments import as_bool, as_int
from flashlab.dropout import keep_mask
from flashlab.kernels.options import scores_stage
from flashlab.reference import attention_reference
from flashlab.validation import (
    Door,
    Problem,
    check_alibi_slopes,
    check_dropout,
    check_like,
    check_lse,
    check_operand,
    check_pair,
    check_scale,
    check_seed,
    operands,
    packed_sequences,
    prepare,
    prepare_like,
)

__all__ = ["FLASH_ATTN", "FLASH_ATTN_VARLEN", "flash_attn_func", "flash_attn_func_backward",
           "flash_attn_varlen_func", "flash_attn_varlen_func_backward",
           "flash_attn_qkvpacked_func", "flash_attn_qkvpacked_func_backward", "band_from_window",
           "scalar_options", "ForwardState"]


# ------------------------------------------------------------------------------ the mask
def band_from_window(sq: int, sk: int, causal: bool = False,
                     window_size: tuple[int, int] = (-1, -1)) -> tuple[int | None, int | None]:
    """flash_attn's bottom-right ``(causal, window_size)`` as flashlab's top-left ``window``.

    Key ``j`` is allowed for query ``i`` iff ``i + sk - sq - wl <= j <= i + sk - sq + wr``
    (``-1`` = unbounded, ``causal`` sets ``wr = 0``), i.e. ``i - left <= j <= i + right`` with
    ``left = wl - (sk - sq)`` and ``right = wr + (sk - sq)``. A side no row can reach is
    returned as ``None`` (unbounded), which keeps huge window sizes exact and small.

    >>> band_from_window(2, 5, causal=True)
    (None, 3)
    >>> band_from_window(5, 2, causal=True)
    (None, -3)
    """
    wl, wr = window_size
    if causal:
        wr = 0
    shift = sk - sq                     # query i sits at key position i + shift
    left = None if wl == -1 else wl - shift
    right = None if wr == -1 else wr + shift
    # j >= i - left holds for every j >= 0 and row i <= sq - 1 once left >= sq - 1;
    # j <= i + right holds for every j <= sk - 1 and row i >= 0 once right >= sk - 1
    if left is not None and left >= sq - 1:
        left = None
    if right is not None and right >= sk - 1:
        right = None
    return left, right


# ------------------------------------------------------------------------------ the door's table
_SYMBOLS = (("B", "batch_size"), ("H", "nheads"), ("Hkv", "nheads_k"), ("Sq", "seqlen_q"),
            ("Sk", "seqlen_k"), ("Dqk", "headdim"), ("Dv", "headdim_v"))
#: flash_attn's names and (batch, seqlen, nheads, headdim) layout, for the checks' messages
FLASH_ATTN = Door(names=(("scale", "softmax_scale"), ("lse", "softmax_lse"), ("do", "dout"),
                         ("o", "out")),
                  shapes=("(batch_size, seqlen_q, nheads, headdim)",
                          "(batch_size, seqlen_k, nheads_k, headdim)",
                          "(batch_size, seqlen_k, nheads_k, headdim_v)"),
                  order=(0, 2, 1, 3), symbols=_SYMBOLS)
#: the varlen functions' packed (total, nheads, headdim) layout
FLASH_ATTN_VARLEN = Door(names=FLASH_ATTN.names,
                         shapes=("(total_q, nheads, headdim)", "(total_k, nheads_k, headdim)",
                                 "(total_k, nheads_k, headdim_v)"),
                         order=(2, 1, 3), packed=True,
                         symbols=_SYMBOLS[:3] + (("Sq", "total_q"), ("Sk", "total_k")) + _SYMBOLS[5:])


@dataclass(frozen=True)
class _Options:
    """The checked keyword arguments shared by every entry point."""

    dropout_p: float
    scale: float | None
    causal: bool
    window_size: tuple[int, int]
    alibi_slopes: np.ndarray | None
    seed: int
    softcap: float = 0.0

    def kernel_kwargs(self, sq: int, sk: int, slopes: np.ndarray | None, offset: int) -> dict:
        """Keywords of flashlab's kernels and reference for one ``(sq, sk)`` problem.

        The one place dropout and ALiBi reach the kernels.
        """
        kw: dict[str, Any] = {"scale": self.scale,
                              "window": band_from_window(sq, sk, self.causal, self.window_size),
                              "softcap": self.softcap}
        if self.dropout_p > 0:
            kw.update(dropout_p=self.dropout_p, seed=self.seed, offset=offset)
        if slopes is not None:
            # flashlab's default alibi_offset = sk - sq is flash_attn's bottom-right alignment:
            # bias_ij = -slope * |i + sk - sq - j|
            kw["alibi_slopes"] = slopes
        return kw


def scalar_options(dropout_p, softmax_scale, causal, window_size, softcap, deterministic, *,
                   remember: bool = False
                   ) -> tuple[float, float | None, bool, tuple[int, int], float]:
    """flash_attn's scalar options checked:
    ``(dropout_p, softmax_scale, causal, window_size, softcap)``.

    The rules of :mod:`flashlab.arguments` with flash_attn's argument names (the torch front
    door calls this before its op, so that a ``dropout_p='0.1'`` is refused in these words
    and not in the op schema's). ``softcap``: the scores stage's rule
    (:func:`flashlab.kernels.options.scores_stage`), a real number >= 0 that float32 holds,
    0.0 = off.

    ``remember=True`` (the torch door in eager mode): an accepted set of options is remembered
    by ``_scalars_key`` and not checked again (a training loop passes the same ones every
    step); a refused one never is. Not while
    ``torch.compile`` traces the door: Dynamo would have to trace this module's dict.
    """
    key = _scalars_key(dropout_p, softmax_scale, causal, window_size, softcap,
                       deterministic) if remember else None
    known = None if key is None else _SCALARS.get(key)
    if known is not None:
        return known
    dropout_p = check_dropout("dropout_p", dropout_p)
    softmax_scale = check_scale("softmax_scale", softmax_scale)
    causal = as_bool("causal", causal)
    as_bool("deterministic", deterministic)
    window_size = check_pair("window_size", window_size, "ints >= -1")
    window_size = tuple(as_int(f"window_size {side}", w, lo=-1, what="an int >= -1 (-1 = unbounded)")
                        for side, w in zip(("left", "right"), window_size))
    softcap = scores_stage(softcap=softcap).softcap
    checked = dropout_p, softmax_scale, causal, window_size, softcap
    if key is not None:
        if len(_SCALARS) >= _PLANS_MAX:
            _SCALARS.clear()
        _SCALARS[key] = checked
    return checked


#: :func:`scalar_options`' accepted answers by ``_scalars_key``, bounded as :data:`_PLANS`
_SCALARS: dict[tuple, tuple[float, float | None, bool, tuple[int, int], float]] = {}


def _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
             seed, batch: int, heads: int) -> _Options:
    dropout_p, softmax_scale, causal, window_size, softcap = scalar_options(
        dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    seed = check_seed("seed", seed)
    if alibi_slopes is not None:
        # validation's rule, on the whole array before a varlen call cuts it into sequences
        check_alibi_slopes(alibi_slopes, batch, heads)
    return _Options(float(dropout_p), None if softmax_scale is None else float(softmax_scale),
                    bool(causal), (int(window_size[0]), int(window_size[1])), alibi_slopes, int(seed),
                    float(softcap))


def _slopes_of(opts: _Options, b: slice) -> np.ndarray | None:
    """ALiBi slopes for the batch rows ``b``: (H,) as given, or (len(b), H) rows of (B, H)."""
    s = opts.alibi_slopes
    return s if s is None or s.ndim == 1 else s[b]


def _bhsd(x: np.ndarray) -> np.ndarray:
    """flash_attn's (B, S, H, D) -> flashlab's (B, H, S, D) (a view; the kernels copy once)."""
    return x.transpose(0, 2, 1, 3)


def _bshd(x: np.ndarray) -> np.ndarray:
    """flashlab's (B, H, S, D) -> flash_attn's (B, S, H, D), contiguous."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


def _probs(q, k, v, opts: _Options, slopes, offset: int) -> np.ndarray:
    """``P`` (B, H, Sq, Sk) of (B, H, S, D) operands in q's dtype; dropped entries negated."""
    kw = opts.kernel_kwargs(q.shape[2], k.shape[2], slopes, offset)
    seed, p_drop = kw.pop("seed", 0), kw.pop("dropout_p", 0.0)
    kw.pop("offset", None)
    _, _, p = attention_reference(q, k, v, return_probs=True, **kw)   # before dropout
    if p_drop > 0:
        p = np.where(keep_mask(p.shape, p_drop, seed, offset), p, -p)
    return p.astype(q.dtype)


# ------------------------------------------------------------------------------ padded
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                    *, return_lse=False, seed=0, return_state=False):
    """flash_attn's ``flash_attn_func`` (same positional order, flash-attn 2.6+) on numpy arrays.

    Parameters
    ----------
    q : (batch_size, seqlen_q, nheads, headdim) float16/32/64
    k : (batch_size, seqlen_k, nheads_k, headdim), q's dtype, ``nheads % nheads_k == 0``
    v : (batch_size, seqlen_k, nheads_k, headdim_v), q's dtype
    dropout_p : drop probability in [0, 1) (0.0 at evaluation)
    softmax_scale : multiplies ``q k^T``; default ``1 / sqrt(headdim)``
    causal : bottom-right aligned causal mask (module docstring)
    window_size : ``(left, right)``, ints >= -1, -1 = unbounded, bottom-right aligned
    softcap : logit soft-cap, ``softcap * tanh(s / softcap)`` of the scaled scores; 0.0 = off
    alibi_slopes : (nheads,) or (batch_size, nheads), bias ``-slope * |i + Sk - Sq - j|``
    deterministic : accepted; flashlab's backward is always deterministic
    return_attn_probs : also return ``softmax_lse`` and ``attn_probs`` (module docstring)
    return_lse : also return ``softmax_lse`` (and not the probabilities)
    seed : the dropout seed; pass the same to :func:`flash_attn_func_backward`
    return_state : also return ``softmax_lse`` and, last, the forward's :class:`ForwardState`,
        which ``flash_attn_func_backward(dout, state=...)`` takes instead of q, k, v and the
        options, checking only what it adds (the torch door's training step)

    Returns
    -------
    out : (batch_size, seqlen_q, nheads, headdim_v), q's dtype; 0 on a row with no allowed key
    softmax_lse : (batch_size, nheads, seqlen_q), with ``return_lse``, ``return_attn_probs`` or
        ``return_state``
    attn_probs : (batch_size, nheads, seqlen_q, seqlen_k), with ``return_attn_probs``
    state : :class:`ForwardState`, with ``return_state``

    Raises
    ------
    TypeError, ValueError
        a wrong type/dtype or shape/value (``softcap`` negative); the message names the
        argument and what it expects.
    """
    return_state = as_bool("return_state", return_state)
    out, lse, state, opts = _padded_forward(q, k, v, dropout_p, softmax_scale, causal,
                                            window_size, softcap, alibi_slopes, deterministic,
                                            seed)
    if return_attn_probs:
        result: tuple = (out, lse, _probs(_bhsd(q), _bhsd(k), _bhsd(v), opts, opts.alibi_slopes, 0))
    else:
        result = (out, lse) if return_lse or return_state else (out,)
    return result + (state,) if return_state else result if len(result) > 1 else out


class ForwardState(NamedTuple):
    """What ``flash_attn_func_backward(dout, state=...)`` needs of a
    ``flash_attn_func(..., return_state=True)`` call: the checked problem, ``o`` in the
    kernels' (B, H, Sq, Dv) layout (the backward reads it there: kept, it is not copied back
    from flash_attn's layout) and the forward's ``softmax_lse``."""

    problem: Problem
    o: np.ndarray
    lse: np.ndarray


#: Checked calls by everything their checks depend on except the values in the arrays (see
#: :func:`_plan_key`): ``key -> (problem with placeholder arrays, options)``. A training loop
#: calls with the same shapes and options every step; a repeat skips the shape, dtype and
#: option checks (each passed for this key before) and keeps what depends on the values: the
#: NaN/inf scans of q, k, v and the seed's range. Issue 22: the checks were ~40 % of a
#: (1, 16, 1, 8) call. Bounded: cleared when it holds _PLANS_MAX keys.
_PLANS: dict[tuple, tuple[Problem, _Options]] = {}
_PLANS_MAX = 64
_PLACEHOLDER = np.zeros((1, 1, 1, 1), dtype=np.float32)


#: the scalar types a cache key holds: each hashes and compares by value, so two keys are equal
#: only when the values are (a ``numbers.Real`` subclass may hash by identity and change its
#: value between calls: its call is checked every time, never found in a cache)
_PLAIN_SCALARS = frozenset({bool, int, float, type(None), np.bool_, np.float16, np.float32,
                            np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
                            np.uint16, np.uint32, np.uint64})


def _scalars_key(dropout_p, softmax_scale, causal, window_size, softcap, deterministic
                 ) -> tuple | None:
    """flash_attn's scalar options with their types, as a dict key keyed by value (None when an
    option is not one of :data:`_PLAIN_SCALARS`, or window_size not a tuple or list of them).
    Every value enters with its type, so that ``causal=1`` never finds ``causal=True``'s entry
    (and a NaN never finds any: NaN != NaN)."""
    if type(window_size) not in (tuple, list):
        return None
    scalars = (dropout_p, softmax_scale, causal, softcap, deterministic, *window_size)
    if not all(type(x) in _PLAIN_SCALARS for x in scalars):
        return None
    return (type(window_size),) + tuple((type(x), x) for x in scalars)


def _plan_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
              deterministic) -> tuple | None:
    """The key of :data:`_PLANS`, or None when the call is not cached (ALiBi slopes, whose
    values are checked; arguments that are not plain arrays or not hashable): the operands'
    dtypes and shapes and ``_scalars_key``."""
    if alibi_slopes is not None or not all(type(x) is np.ndarray for x in (q, k, v)):
        return None
    scalars = _scalars_key(dropout_p, softmax_scale, causal, window_size, softcap, deterministic)
    if scalars is None:
        return None
    return (q.dtype, q.shape, k.dtype, k.shape, v.dtype, v.shape) + scalars


def _padded_forward(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, deterministic, seed
                    ) -> tuple[np.ndarray, np.ndarray, ForwardState, _Options]:
    """Checked forward: ``(out, softmax_lse, state, options)``, out in flash_attn's layout."""
    key = _plan_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, deterministic)
    plan = None if key is None else _PLANS.get(key)
    if plan is None:
        qh, kh, vh = operands(FLASH_ATTN, q, k, v)
        B, H, Sq, _ = qh.shape
        Sk = kh.shape[2]
        opts = _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                        deterministic, seed, B, H)
        # a short query's k and v: checked by the decode kernel as it reads them
        p = prepare(qh, kh, vh, lazy_kv=True, door=FLASH_ATTN,
                    **opts.kernel_kwargs(Sq, Sk, opts.alibi_slopes, 0))
        if key is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = (dataclasses.replace(p, q=_PLACEHOLDER, k=_PLACEHOLDER,
                                               v=_PLACEHOLDER, q_sq_norm=None), opts)
    else:
        template, opts = plan
        if type(seed) is not int or seed != opts.seed:   # (the plan's own seed: checked)
            seed = check_seed("seed", seed)
        if seed != opts.seed:
            opts = dataclasses.replace(opts, seed=seed)
        # the per-call part of prepare; as kernel_kwargs: the seed reaches the kernels with
        # dropout only
        p = prepare_like(template, _bhsd(q), _bhsd(k), _bhsd(v), door=FLASH_ATTN,
                         seed=seed if template.dropout_p > 0 else None)
    o, lse = flash_attention(problem=p)
    return _bshd(o), lse, ForwardState(p, o, lse), opts


def flash_attn_func_backward(dout, q=None, k=None, v=None, out=None, softmax_lse=None,
                             dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, *, seed=0,
                             state=None):
    """Gradients of ``sum(out * dout)`` for :func:`flash_attn_func`, recomputing P from ``softmax_lse``.

    ``dout``, ``out`` (batch_size, seqlen_q, nheads, headdim_v) in q's dtype, ``softmax_lse``
    (batch_size, nheads, seqlen_q) as the forward returned them; every other argument as
    given to the forward (``seed`` included). Returns ``(dq, dk, dv)`` with the shapes and
    dtype of ``q``, ``k``, ``v``; dk, dv are summed over the query heads sharing a kv head.

    ``state``: the :class:`ForwardState` of ``flash_attn_func(..., return_state=True)``,
    instead of q, k, v and the options (the checked problem's; q, k, v must not be given):
    only what this call adds is checked, ``dout`` and the ``out`` and ``softmax_lse`` read
    (None: the forward's own). The gradients are then views of the kernels' (B, H, S, D)
    arrays, not C-contiguous (no copy; the torch door hands them to autograd, which reads any
    strides).
    """
    if state is not None:
        # the kernel API's backward checks the problem (and refuses q, k, v beside it)
        if not isinstance(state, ForwardState):
            state = ForwardState(state, _PLACEHOLDER, _PLACEHOLDER)   # refused as a problem
        o = state.o if out is None else _bhsd(out) if isinstance(out, np.ndarray) else out
        grads = flash_attention_backward(_bhsd(dout), q, k, v, o, problem=state.problem,
                                         lse=state.lse if softmax_lse is None else softmax_lse)
        return tuple(g.transpose(0, 2, 1, 3) for g in grads)
    qh, kh, vh = operands(FLASH_ATTN, q, k, v)
    B, H, Sq, _ = qh.shape
    Sk, Dv = kh.shape[2], vh.shape[3]
    opts = _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, seed, B, H)
    for name, x in (("dout", dout), ("out", out)):
        # shapes in flash_attn's layout here; the kernel API's backward scans them (our names)
        check_like(name, x, (B, Sq, H, Dv), "(batch_size, seqlen_q, nheads, headdim_v)", q.dtype,
                   scan=False)
    check_lse("softmax_lse", softmax_lse, (B, H, Sq), "(batch_size, nheads, seqlen_q)", scan=False)
    grads = flash_attention_backward(_bhsd(dout), qh, kh, vh, _bhsd(out), softmax_lse, door=FLASH_ATTN,
                                     **opts.kernel_kwargs(Sq, Sk, opts.alibi_slopes, 0))
    return tuple(_bshd(g) for g in grads)


#: flash_attn's packed operand: q, k and v stacked along axis 2
_QKV_SHAPE = "(batch_size, seqlen, 3, nheads, headdim)"


def _unpack_qkv(qkv) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``qkv`` (batch_size, seqlen, 3, nheads, headdim) checked and cut into q, k, v (views)."""
    qkv = check_operand("qkv", qkv, 5, _QKV_SHAPE)
    if qkv.shape[2] != 3:
        raise ValueError(f"qkv must have shape {_QKV_SHAPE} (q, k, v along axis 2); "
                         f"got shape {qkv.shape}")
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, return_lse=False,
                              seed=0):
    """flash_attn's ``flash_attn_qkvpacked_func``: :func:`flash_attn_func` of ``qkv[:, :, 0]``,
    ``qkv[:, :, 1]``, ``qkv[:, :, 2]``.

    ``qkv`` (batch_size, seqlen, 3, nheads, headdim), float16/32/64 (self-attention: q, k
    and v share the length and the heads); every other argument, the returns and the errors as
    :func:`flash_attn_func` (``qkv`` not 5-D or its axis 2 not 3: ``ValueError``).
    """
    q, k, v = _unpack_qkv(qkv)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, return_lse=return_lse,
                           seed=seed)


def flash_attn_qkvpacked_func_backward(dout, qkv, out, softmax_lse, dropout_p=0.0,
                                       softmax_scale=None, causal=False, window_size=(-1, -1),
                                       softcap=0.0, alibi_slopes=None, deterministic=False, *,
                                       seed=0) -> np.ndarray:
    """Gradient of ``sum(out * dout)`` for :func:`flash_attn_qkvpacked_func`: ``dqkv`` with
    ``qkv``'s shape and dtype (dq, dk, dv stacked along axis 2); arguments as
    :func:`flash_attn_func_backward`."""
    q, k, v = _unpack_qkv(qkv)
    grads = flash_attn_func_backward(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale,
                                     causal, window_size, softcap, alibi_slopes, deterministic,
                                     seed=seed)
    return np.stack(grads, axis=2)


# ------------------------------------------------------------------------------ varlen
@dataclass(frozen=True)
class _Packed:
    """Checked varlen operands: every sequence's token ranges and dropout counter offset."""

    H: int
    Dv: int
    ranges: list[tuple[int, int, int, int]]   # (q0, q1, k0, k1) per sequence
    offsets: list[int]                          # first dropout counter of each sequence


def _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> _Packed:
    """The packed operands and sequences, checked by :mod:`flashlab.validation` in flash_attn's words."""
    qh, _, vh = operands(FLASH_ATTN_VARLEN, q, k, v)
    H = qh.shape[1]
    ranges = packed_sequences(("cu_seqlens_q", "cu_seqlens_k"), cu_seqlens_q, cu_seqlens_k,
                              (q.shape[0], k.shape[0]), leading_zero=True, example="[0, 2, 4, 6]",
                              max_seqlens=(("max_seqlen_q", max_seqlen_q),
                                           ("max_seqlen_k", max_seqlen_k)))
    # sequence b's dropout counters follow those of the (H, sq, sk) problems before it
    sizes = [H * (q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in ranges]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64).tolist() if sizes else []
    return _Packed(H, vh.shape[3], ranges, offsets)


def _seq(x: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """Rows ``r0:r1`` of a packed (total, H, D) array as one (1, H, s, D) sequence."""
    return x[r0:r1].transpose(1, 0, 2)[None]


def _unseq(x: np.ndarray) -> np.ndarray:
    """(1, H, s, D) -> (s, H, D)."""
    return x[0].transpose(1, 0, 2)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, return_lse=False, seed=0):
    """flash_attn's ``flash_attn_varlen_func`` on packed numpy arrays; each sequence attends within itself.

    Parameters
    ----------
    q : (total_q, nheads, headdim); k : (total_k, nheads_k, headdim); v : (total_k, nheads_k, headdim_v)
    cu_seqlens_q, cu_seqlens_k : (batch_size + 1,) int32/int64, cumulative lengths: sequence
        ``b`` holds query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key rows
        ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``; 0 first, non-decreasing (a length may be 0),
        the total last
    max_seqlen_q, max_seqlen_k : ints >= the longest query / key sequence
    block_table : must be None (paged KV is not implemented)
    others : as :func:`flash_attn_func`; masks and ALiBi are aligned per sequence (its own
        ``sk - sq``), ``alibi_slopes`` (nheads,) or (batch_size, nheads)

    Returns
    -------
    out : (total_q, nheads, headdim_v); rows of a sequence with no keys are 0
    softmax_lse : (nheads, total_q), with ``return_lse``/``return_attn_probs``
    attn_probs : (batch_size, nheads, max_seqlen_q, max_seqlen_k), with ``return_attn_probs``
    """
    if block_table is not None:
        raise NotImplementedError("block_table must be None (paged KV cache is not implemented)")
    pk = _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    opts = _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, seed, len(pk.ranges), pk.H)
    out = np.zeros((q.shape[0], pk.H, pk.Dv), dtype=q.dtype)
    lse_rows = []                     # (q0, q1, lse (H, sq)) of every sequence with keys
    probs = np.zeros((len(pk.ranges), pk.H, max_seqlen_q, max_seqlen_k), dtype=q.dtype) \
        if return_attn_probs else None
    for b, ((q0, q1, k0, k1), offset) in enumerate(zip(pk.ranges, pk.offsets)):
        if q1 == q0 or k1 == k0:      # no queries, or no keys: out stays 0, lse -inf
            continue
        qs, ks, vs = _seq(q, q0, q1), _seq(k, k0, k1), _seq(v, k0, k1)
        slopes = _slopes_of(opts, slice(b, b + 1))
        o, lse = flash_attention(qs, ks, vs, door=FLASH_ATTN, **opts.kernel_kwargs(q1 - q0, k1 - k0, slopes, offset))
        out[q0:q1] = _unseq(o)
        lse_rows.append((q0, q1, lse[0]))
        if probs is not None:
            probs[b, :, :q1 - q0, :k1 - k0] = _probs(qs, ks, vs, opts, slopes, offset)[0]
    lse_dtype = lse_rows[0][2].dtype if lse_rows else np.float32
    softmax_lse = np.full((pk.H, q.shape[0]), -np.inf, dtype=lse_dtype)
    for q0, q1, lse in lse_rows:
        softmax_lse[:, q0:q1] = lse
    if return_attn_probs:
        return out, softmax_lse, probs
    return (out, softmax_lse) if return_lse else out


def flash_attn_varlen_func_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                                    max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, *, seed=0):
    """Gradients of ``sum(out * dout)`` for :func:`flash_attn_varlen_func`.

    ``dout``, ``out`` (total_q, nheads, headdim_v) in q's dtype, ``softmax_lse``
    (nheads, total_q) as the forward returned them; every other argument as given to the
    forward. Returns ``(dq, dk, dv)`` shaped as ``q``, ``k``, ``v``; key rows of a sequence
    with no queries, and query rows of one with no keys, get 0.
    """
    pk = _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    opts = _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, seed, len(pk.ranges), pk.H)
    Tq = q.shape[0]
    for name, x in (("dout", dout), ("out", out)):
        check_like(name, x, (Tq, pk.H, pk.Dv), "(total_q, nheads, headdim_v)", q.dtype, scan=False)
    check_lse("softmax_lse", softmax_lse, (pk.H, Tq), "(nheads, total_q)", scan=False)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b, ((q0, q1, k0, k1), offset) in enumerate(zip(pk.ranges, pk.offsets)):
        if q1 == q0 or k1 == k0:
            continue
        slopes = _slopes_of(opts, slice(b, b + 1))
        g = flash_attention_backward(_seq(dout, q0, q1), _seq(q, q0, q1), _seq(k, k0, k1),
                                     _seq(v, k0, k1), _seq(out, q0, q1), softmax_lse[None, :, q0:q1],
                                     door=FLASH_ATTN,
                                     **opts.kernel_kwargs(q1 - q0, k1 - k0, slopes, offset))
        # every key row belongs to one sequence, so the slices never overlap
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (_unseq(x) for x in g)
    return dq, dk, dv
