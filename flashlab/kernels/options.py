"""The options record: everything a kernel needs besides its operands and outputs, in one value.

:mod:`flashlab.api` builds one :class:`TileOptions` per call from a checked
:class:`~flashlab.validation.Problem` (``flashlab.api.tile_options``), and every CPU kernel
takes it last: ``kernel(q, k, v, ...outputs, options)``. It is a ``NamedTuple``, which Numba
passes to ``@njit`` (and ``prange``) code as a typed tuple of scalars and arrays: a field is
read as ``options.scale``, and one tuple type exists per compute dtype (absent operands are
placeholder arrays of the same type, so a problem without a bias compiles nothing new).

Fields (the shapes are the kernels' layout, :mod:`flashlab.kernels.forward`):

- ``scale``: the factor of ``q k^T`` (compute dtype);
- the scores stage's options, :class:`ScoresStage`'s fields in the compute dtype, flat (a
  parallel kernel's arguments cannot hold a nested tuple): the record is itself a stage that
  :mod:`flashlab.kernels.scorestep` reads (applied after scaling, before bias and mask);
- ``left``, ``right``: the band ``[i - left, i + right]``, clamped to the lengths;
- ``block_q``, ``block_k``: the tile;
- ``mask`` (Bm, Hm, Sqm, Skm) bool, True = masked out, read when ``has_mask``;
- ``bias`` (Bb, Hb, Sqb, Skb), compute dtype, read when ``has_bias``;
- ``slopes`` (Bs, H) float64 ALiBi slopes, read when ``has_alibi``, with ``alibi_offset`` and
  ``alibi_sqrt``;
- ``q_rope`` (B, H, Sq, Dr), ``k_rope`` (B, Hr, Sk, Dr), compute dtype, read when ``has_rope``;
- ``drop_threshold`` (0 = no dropout), ``seed`` (uint64), ``offset``: the dropout counters of
  :mod:`flashlab.dropout`;
- ``check_overflow``: test every score tile for float overflow;
- ``want_dbias``: the backward also sums dS into the bias's shape.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import numpy as np

from flashlab.arguments import as_real

__all__ = ["TileOptions", "ScoresStage", "scores_stage", "takes_scores_stage", "NO_MASK", "NO_SLOPES",
           "no_operand"]

#: placeholder for an absent dense mask (never read, ``has_mask`` is False)
NO_MASK = np.zeros((1, 1, 1, 1), dtype=np.bool_)
#: placeholder for absent ALiBi slopes
NO_SLOPES = np.zeros((1, 1), dtype=np.float64)
_NO_OPERAND = {np.dtype(t): np.zeros((1, 1, 1, 1), dtype=t) for t in (np.float32, np.float64)}


def no_operand(dtype) -> np.ndarray:
    """The shared (1, 1, 1, 1) placeholder of an absent bias or RoPE operand of ``dtype``
    (read-only to the kernels; shared, so that a small call allocates none)."""
    return _NO_OPERAND[np.dtype(dtype)]


class ScoresStage(NamedTuple):
    """The options of the scores stage (:mod:`flashlab.kernels.scorestep`): what turns a scaled
    product into a score. Built and checked by :func:`scores_stage`; the kernels read it in
    the compute dtype (:meth:`in_dtype`)."""

    #: logit soft-cap ``c`` (0 = off): the scores become ``c tanh(s / c)``
    softcap: float = 0.0

    def in_dtype(self, dtype) -> ScoresStage:
        """The record with every field in ``dtype`` (a float32 kernel reads float32 options)."""
        return type(self)(*(dtype(x) for x in self))


def scores_stage(name: Callable[[str], str] = str, **given) -> ScoresStage:
    """The :class:`ScoresStage` of the keyword arguments ``given`` (absent ones: off), each
    checked by its rule here, the one rule every entry point uses; ``name`` maps a field to
    the caller's name for it in messages (a door's own spelling).

    ``softcap``: a real number >= 0 (0.0 = off) that float32, the narrowest compute dtype,
    holds (a cap beyond 3.4e38 caps nothing). An unknown keyword is a ``TypeError``.
    """
    unknown = sorted(set(given) - set(ScoresStage._fields))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)}; the scores stage "
                        f"takes {', '.join(ScoresStage._fields)}")
    cap = as_real(name("softcap"), given.get("softcap", 0.0), lo=0.0,
                  what="a real number >= 0 (0.0 = off)")
    if cap > float(np.finfo(np.float32).max):
        raise ValueError(f"{name('softcap')}={cap} overflows float32 (it must be < 3.4e38; 0.0 = off)")
    return ScoresStage(softcap=cap)


_F = TypeVar("_F", bound=Callable)


def takes_scores_stage(fn: _F) -> _F:
    """Show ``fn``'s ``**scores`` as the stage's own keywords: ``help(fn)`` and
    ``inspect.signature(fn)`` list each :class:`ScoresStage` field, keyword-only, with its
    default (off). The call itself is unchanged: ``fn`` still hands them to
    :func:`scores_stage`, which checks them (an unknown keyword is its ``TypeError``)."""
    signature = inspect.signature(fn)
    kept = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    stage = [inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, default=default)
             for field, default in ScoresStage._field_defaults.items()]
    fn.__signature__ = signature.replace(parameters=kept + stage)  # type: ignore[attr-defined]
    return fn


class TileOptions(NamedTuple):
    """Everything a kernel needs besides its operands and outputs (see the module docstring)."""

    scale: float
    # the scores stage: ScoresStage's fields, flat (tests/test_scorestep.py holds them there)
    softcap: float
    left: int
    right: int
    block_q: int
    block_k: int
    mask: np.ndarray
    has_mask: bool
    bias: np.ndarray
    has_bias: bool
    slopes: np.ndarray
    has_alibi: bool
    alibi_offset: int
    alibi_sqrt: bool
    q_rope: np.ndarray
    k_rope: np.ndarray
    has_rope: bool
    drop_threshold: int
    seed: np.uint64
    offset: int
    check_overflow: bool
    want_dbias: bool
