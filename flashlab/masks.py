r"""One mask model for every kernel, reference and drawing in flashlab.

A query row ``i`` may attend to key column ``j`` when both hold:

* **band**: $i - \text{left} \le j \le i + \text{right}$ (top-left aligned, as torch's
  ``is_causal``). ``causal=True`` is the band ``left = \infty, right = 0``;
  ``window=(left, right)`` sets either side (``None`` = unbounded, negative values allowed:
  ``window=(-2, 5)`` keeps $i+2 \le j \le i+5$). Both together intersect.
* **dense mask** (optional): a boolean array broadcastable to ``(B, H, Sq, Sk)`` where
  ``True`` means *masked out* (CANN's ``atten_mask`` convention).

The band alone decides which tiles a kernel may skip without reading anything: for a query
block of rows ``[i0, i1)`` only keys in ``[i0 - left, i1 - 1 + right]`` can be allowed, so
the kv-blocks outside that range are never visited (:func:`kv_block_range`). Inside it a
tile is *full* (every pair allowed by the band) or *partial* (the kernel masks element by
element) — :func:`tile_class`.

**CANN sparse_mode.** The Ascend operator names its masks by ``sparse_mode`` 0..8 and the
offsets ``pre_tokens``/``next_tokens``; :data:`SPARSE_MODES` lists them and
:func:`sparse_mode_band`, :func:`prefix_mask`, :func:`varlen_sequence_mode` turn each into this
model's band (plus a dense mask only for the prefix columns), which
:mod:`flashlab.cann` runs.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import njit

from flashlab.numba_cache import CACHE

#: Stand-in for an unbounded band side. Large enough that ``i - NO_LIMIT`` and
#: ``i + NO_LIMIT`` never overflow int64 and always lie outside any sequence.
NO_LIMIT = 1 << 60

#: Tile classes, as stored by :func:`classify_tiles`.
EMPTY, PARTIAL, FULL = 0, 1, 2


def band_from(causal: bool = False, window: tuple | None = None) -> tuple[int, int]:
    """Return ``(left, right)`` of the band for ``causal`` and ``window``.

    >>> band_from(causal=True)
    (1152921504606846976, 0)
    >>> band_from(window=(3, None))
    (3, 1152921504606846976)
    """
    left, right = NO_LIMIT, NO_LIMIT
    if window is not None:
        wl, wr = window
        if wl is not None:
            left = int(wl)
        if wr is not None:
            right = int(wr)
    if causal:
        # key j allowed iff j <= i
        right = min(right, 0)
    return left, right


@njit(cache=CACHE)
def clamp_side(side: int, below: int, above: int) -> int:
    """Clamp one band side to ``[-below, above]``, which keeps the allowed set unchanged.

    For rows ``i`` in ``[0, sq)`` and keys ``j`` in ``[0, sk)``: ``j >= i - left`` holds for
    every pair once ``left >= sq`` and for none once ``left <= -sk``, so ``left`` is clamped to
    ``[-sk, sq]`` (``below = sk``, ``above = sq``); ``j <= i + right`` likewise clamps ``right``
    to ``[-sq, sk]``. After clamping, ``i +- side`` cannot overflow int64, whatever was passed
    (``sys.maxsize``, ``2**62``).
    """
    # min/max on the caller's value first: it may be any int64
    return max(-below, min(side, above))


def clamp_band(left: int, right: int, sq: int, sk: int) -> tuple[int, int]:
    """``(left, right)`` clamped to ``[-sk, sq]`` and ``[-sq, sk]``: the same band on an ``sq x sk``
    problem, in numbers small enough for any arithmetic (Python ints of any size accepted).

    >>> clamp_band(2**70, 5, 10, 20), clamp_band(NO_LIMIT, NO_LIMIT, 10, 20)
    ((10, 5), (10, 20))
    """
    return max(-sk, min(int(left), sq)), max(-sq, min(int(right), sk))


@njit(cache=CACHE)
def kv_block_range(i0: int, i1: int, sk: int, block_k: int, left: int, right: int):
    """kv-block indices ``[kb_start, kb_end)`` that can hold an allowed key for rows ``[i0, i1)``.

    Rows ``i0 .. i1-1`` allow keys ``j`` in ``[i0 - left, i1 - 1 + right]``; blocks wholly
    outside that interval are skipped by the kernels. Returns an empty range
    (``kb_start >= kb_end``) when no key is allowed at all.
    """
    # sides beyond the lengths change nothing inside the block but could overflow int64 below
    left, right = clamp_side(left, sk, i1), clamp_side(right, i1, sk)
    # left + right < 0: every row's interval [i - left, i + right] is empty, even though the
    # union over the block's rows below would not be
    if left + right < 0:
        return 0, 0
    # lowest key any row of the block may see: j >= i - left, smallest at i = i0
    j_lo = max(0, i0 - left)
    # highest key (exclusive): j <= i + right, largest at i = i1 - 1
    j_hi = min(sk, i1 + right)
    if j_hi <= j_lo:
        return 0, 0
    return j_lo // block_k, (j_hi + block_k - 1) // block_k


@njit(cache=CACHE)
def tile_class(i0: int, i1: int, j0: int, j1: int, left: int, right: int) -> int:
    """Classify tile rows ``[i0, i1)`` x cols ``[j0, j1)`` under the band: EMPTY, PARTIAL or FULL."""
    # sides beyond the tile's reach change nothing inside it but could overflow int64 below
    left, right = clamp_side(left, j1, i1), clamp_side(right, i1, j1)
    # empty: no row allows any key (left + right < 0), or even the most permissive row
    # misses every column of the tile
    if left + right < 0 or j0 > i1 - 1 + right or j1 - 1 < i0 - left:
        return EMPTY
    # full: the strictest corners are inside: j0 >= (i1-1) - left and j1-1 <= i0 + right
    if j0 >= i1 - 1 - left and j1 - 1 <= i0 + right:
        return FULL
    return PARTIAL


def allowed(sq: int, sk: int, left: int, right: int) -> np.ndarray:
    """Dense ``(sq, sk)`` bool array of the band: ``True`` where key ``j`` is allowed for row ``i``."""
    left, right = clamp_band(left, right, sq, sk)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return (j >= i - left) & (j <= i + right)


def classify_tiles(sq: int, sk: int, block_q: int, block_k: int, left: int, right: int,
                   mask: np.ndarray | None = None) -> np.ndarray:
    """Class of every tile, shape ``(ceil(sq/block_q), ceil(sk/block_k))``, values EMPTY/PARTIAL/FULL.

    With a dense ``mask`` of shape ``(sq, sk)`` (True = masked out) a band-FULL tile becomes
    PARTIAL if the mask removes some of it, and any tile the mask removes entirely becomes EMPTY
    (the forward kernel skips those too, after reading the mask tile).
    """
    left, right = clamp_band(left, right, sq, sk)
    nq, nk = -(-sq // block_q), -(-sk // block_k)
    out = np.empty((nq, nk), dtype=np.int8)
    ok_all = None if mask is None else allowed(sq, sk, left, right) & ~mask
    for a in range(nq):
        i0, i1 = a * block_q, min(sq, (a + 1) * block_q)
        for b in range(nk):
            j0, j1 = b * block_k, min(sk, (b + 1) * block_k)
            c = tile_class(i0, i1, j0, j1, left, right)
            if ok_all is not None and c != EMPTY:
                ok = ok_all[i0:i1, j0:j1]
                c = EMPTY if not ok.any() else (FULL if ok.all() else PARTIAL)
            out[a, b] = c
    return out


# ------------------------------------------------------------------------ CANN sparse_mode
# The Ascend operator FlashAttentionScore (torch_npu.npu_fusion_attention) names its masks by a
# ``sparse_mode`` and two band offsets, ``pre_tokens`` (keys allowed *before* the diagonal) and
# ``next_tokens`` (keys allowed *after* it). In this module's terms, ``pre/next`` measured from
# the top-left corner are exactly the band ``left = pre, right = next``: key j is allowed for
# row i iff ``i - pre <= j <= i + next``. Measured from the bottom-right corner (the diagonal
# through (Sq-1, Sk-1)) the same offsets become ``left = pre + Sq - Sk, right = next + Sk - Sq``.
#
# Sources: CANN ops-transformer docs, "sparse_mode参数说明" (the sparse_mode parameter) and
# "FlashAttentionScore" constraints; Ascend op-plugin docs, torch_npu.npu_fusion_attention
# (mirrored in github.com/Ascend/op-plugin docs/context/torch_npu-npu_fusion_attention.md).

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
    """Band ``(left, right)`` (top-left, as :func:`band_from`) of ``mode`` for one sequence ``sq x sk``.

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

    ``first``/``last`` are the indices of the first and last non-empty sequences. Mode 7
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
