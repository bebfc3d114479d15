"""The options record: everything a kernel needs besides its operands and outputs, in one value.

:mod:`flashlab.api` builds one :class:`TileOptions` per call from a checked
:class:`~flashlab.validation.Problem` (``flashlab.api.tile_options``), and every CPU kernel
takes it last: ``kernel(q, k, v, ...outputs, options)``. It is a ``NamedTuple``, which Numba
passes to ``@njit`` (and ``prange``) code as a typed tuple of scalars and arrays: a field is
read as ``options.scale``, and one tuple type exists per compute dtype (absent operands are
placeholder arrays of the same type, so a problem without a bias compiles nothing new).

Fields (the shapes are the kernels' layout, :mod:`flashlab.kernels.forward`):

- ``scale``: the factor of ``q k^T`` (compute dtype); ``softcap``: logit soft-cap, 0 = off
  (scores become ``softcap * tanh(s / softcap)`` after scaling, before bias and mask);
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

from typing import NamedTuple

import numpy as np

__all__ = ["TileOptions", "NO_MASK", "NO_SLOPES", "no_operand"]

#: placeholder for an absent dense mask (never read, ``has_mask`` is False)
NO_MASK = np.zeros((1, 1, 1, 1), dtype=np.bool_)
#: placeholder for absent ALiBi slopes
NO_SLOPES = np.zeros((1, 1), dtype=np.float64)
_NO_OPERAND = {np.dtype(t): np.zeros((1, 1, 1, 1), dtype=t) for t in (np.float32, np.float64)}


def no_operand(dtype) -> np.ndarray:
    """The shared (1, 1, 1, 1) placeholder of an absent bias or RoPE operand of ``dtype``
    (read-only to the kernels; shared, so that a small call allocates none)."""
    return _NO_OPERAND[np.dtype(dtype)]


class TileOptions(NamedTuple):
    """Everything a kernel needs besides its operands and outputs (see the module docstring)."""

    scale: float
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
