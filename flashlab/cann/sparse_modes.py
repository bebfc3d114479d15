"""CANN ``sparse_mode`` 0..8: the table and each mode as flashlab's band (plus a dense prefix).

The Ascend operator FlashAttentionScore (torch_npu.npu_fusion_attention) names its masks by a
``sparse_mode`` and two band offsets, ``pre_tokens`` (keys allowed *before* the diagonal) and
``next_tokens`` (keys allowed *after* it). In the terms of :mod:`flashlab.masks`, ``pre/next``
measured from the top-left corner are exactly the band ``left = pre, right = next``: key j is
allowed for row i iff ``i - pre <= j <= i + next``. Measured from the bottom-right corner (the
diagonal through (Sq-1, Sk-1)) the same offsets become ``left = pre + Sq - Sk, right = next + Sk - Sq``.

Sources: CANN ops-transformer docs, "sparse_mode参数说明" (the sparse_mode parameter) and
"FlashAttentionScore" constraints; Ascend op-plugin docs, torch_npu.npu_fusion_attention
(mirrored in github.com/Ascend/op-plugin docs/context/torch_npu-npu_fusion_attention.md).
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from flashlab.masks import NO_LIMIT

__all__ = ["CANN_COMPRESSED", "SparseMode", "SPARSE_MODES", "compressed_mask", "sparse_mode_band",
           "prefix_mask", "varlen_sequence_mode"]

#: edge of the compressed causal mask that modes 2, 3, 4, 7, 8 expect (2048 x 2048)
CANN_COMPRESSED = 2048


class SparseMode(NamedTuple):
    """One row of the sparse_mode table: what the user passes and what is computed."""

    mode: int
    name: str
    rule: str        # the allowed set, in band terms (top-left i, j; Sq, Sk of the sequence)
    atten_mask: str  # the atten_mask the user passes
    varlen: str      # "yes", "no" (not with TND) or "only" (TND only)


#: every sparse_mode of the operator, in order; rules use top-left (i, j) and the sequence's
#: Sq, Sk; ``pre``/``next`` are ``pre_tokens``/``next_tokens``
SPARSE_MODES: tuple[SparseMode, ...] = (
    SparseMode(0, "defaultMask", "i-pre <= j <= i+next, and not atten_mask",
               "[Sq,Sk], [1,1,Sq,Sk], [B,1,Sq,Sk] or [B,N,Sq,Sk] (TND: [maxSq,maxSk]); optional",
               "yes"),
    SparseMode(1, "allMask", "not atten_mask (pre/next ignored)",
               "full mask, shapes as mode 0; optional", "yes"),
    SparseMode(2, "leftUpCausal", "j <= i", "compressed [2048,2048] upper triangle", "yes"),
    SparseMode(3, "rightDownCausal", "j <= i + Sk - Sq", "compressed [2048,2048] upper triangle",
               "yes"),
    SparseMode(4, "band", "i-pre <= j-(Sk-Sq) <= i+next  (pre/next from the bottom-right)",
               "compressed [2048,2048] upper triangle", "yes"),
    SparseMode(5, "prefix (uncompressed)", "j <= i + Sk - Sq  or  j < prefix[b]",
               "full [B,N,Sq,Sk] or [B,1,Sq,Sk] equal to that rule", "no"),
    SparseMode(6, "prefix (compressed)", "j <= i + Sk - Sq  or  j < prefix[b]",
               "compressed [3072,2048]: the triangle over 1024 rows of [0 x 1024, 1 x 1024]", "yes"),
    SparseMode(7, "rightDownCausal, varlen split",
               "each sequence as mode 3; the last non-empty one as mode 4 (band)",
               "compressed [2048,2048] upper triangle", "only"),
    SparseMode(8, "leftUpCausal, varlen split",
               "each sequence as mode 2; the first non-empty one as mode 4 (band)",
               "compressed [2048,2048] upper triangle", "only"),
)


@lru_cache(maxsize=None)
def _compressed(mode: int) -> np.ndarray:
    tri = np.triu(np.ones((CANN_COMPRESSED, CANN_COMPRESSED), dtype=np.bool_), k=1)
    if mode == 6:
        # 1024 extra rows: left half 0 (visible), right half 1 (masked)
        rect = np.zeros((CANN_COMPRESSED // 2, CANN_COMPRESSED), dtype=np.bool_)
        rect[:, CANN_COMPRESSED // 2:] = True
        tri = np.concatenate([tri, rect])
    tri.flags.writeable = False
    return tri


def compressed_mask(mode: int) -> np.ndarray:
    """The compressed ``atten_mask`` the operator expects for ``mode`` (read-only bool, True = masked).

    Modes 2, 3, 4, 7, 8: the ``(2048, 2048)`` strict upper triangle ``np.triu(ones, 1)``; mode 6:
    ``(3072, 2048)``, that triangle over 1024 rows whose left half is 0 and right half is 1.
    The operator reads it only as a stamp for diagonal tiles; the real mask follows from the rule.
    """
    if mode not in (2, 3, 4, 6, 7, 8):
        raise ValueError(f"mode must be one of 2, 3, 4, 6, 7, 8 (the compressed-mask modes); got {mode!r}")
    return _compressed(6 if mode == 6 else 2)


def sparse_mode_band(mode: int, sq: int, sk: int, pre_tokens: int = 2147483647,
                     next_tokens: int = 2147483647, prefix: int | None = None) -> tuple[int, int]:
    """Band ``(left, right)`` (top-left, as :func:`~flashlab.masks.band_from`) of ``mode`` for one sequence ``sq x sk``.

    Modes 7 and 8 mix modes per sequence: pick the sequence's own mode with
    :func:`varlen_sequence_mode` first. For the prefix modes 5 and 6 the band is only the
    envelope of the allowed set (a union, which no band expresses); :func:`prefix_mask` masks
    the rest.
    """
    if mode == 0:
        # (i, j) masked iff j - i > next or i - j > pre
        return int(pre_tokens), int(next_tokens)
    if mode == 1:
        return NO_LIMIT, NO_LIMIT
    if mode == 2:
        # leftUpCausal: j <= i
        return NO_LIMIT, 0
    if mode == 3:
        # rightDownCausal: j <= i + (Sk - Sq)
        return NO_LIMIT, sk - sq
    if mode == 4:
        # pre/next from the bottom-right: shift both by the corner offset Sk - Sq
        return int(pre_tokens) + sq - sk, int(next_tokens) + sk - sq
    if mode in (5, 6):
        if prefix is None:
            raise ValueError(f"sparse_mode {mode} needs the sequence's prefix length")
        # envelope of {j <= i + Sk - Sq} u {j < prefix}: j - i <= max(Sk - Sq, prefix - 1 - i)
        return NO_LIMIT, max(sk - sq, int(prefix) - 1)
    if mode in (7, 8):
        raise ValueError(f"sparse_mode {mode} is per sequence: map it with varlen_sequence_mode first")
    raise ValueError(f"sparse_mode must be an int in 0..8; got {mode!r}")


def prefix_mask(sq: int, sk: int, prefix: int) -> np.ndarray:
    """``(sq, sk)`` bool, True = masked, of the prefix modes 5/6 for one sequence.

    Allowed: rightDownCausal ``j <= i + sk - sq`` **or** one of the first ``prefix`` keys
    ``j < prefix`` (visible to every query).
    """
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return (j > i + sk - sq) & (j >= prefix)


def varlen_sequence_mode(mode: int, index: int, first: int, last: int) -> int:
    """The mode sequence ``index`` of a varlen batch runs under.

    ``first``/``last`` are the indices of the first and last non-empty sequences, non-empty
    meaning with at least one *query* (``Sq != 0``), as the device's tiling picks them
    (``firstValidIndex``/``lastValidIndex``, see :func:`flashlab.cann.plan.plan`). Mode 7
    (a query split across devices after a rightDownCausal layout): every sequence is
    rightDownCausal (3) except the last non-empty one, which is a band (4). Mode 8 (split after
    leftUpCausal): every sequence is leftUpCausal (2) except the first non-empty one, a band (4).
    Other modes apply to every sequence unchanged.
    """
    if mode == 7:
        return 4 if index == last else 3
    if mode == 8:
        return 4 if index == first else 2
    return mode
