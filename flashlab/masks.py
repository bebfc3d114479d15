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
element) — :func:`tile_class`. With a dense mask, a tile whose band-allowed entries the mask
removes entirely is skipped too (:func:`tile_fully_masked`); :func:`tile_visit_class` is the
whole rule the kernels, the tile walk and :func:`classify_tiles` apply.

The Ascend operator's ``sparse_mode`` 0..8 are translated into this model's band in
:mod:`flashlab.cann.sparse_modes`.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from flashlab.numba_cache import CACHE
from flashlab.tiling import cdiv

__all__ = ["NO_LIMIT", "EMPTY", "PARTIAL", "FULL", "TILE_CLASS_NAMES", "band_from", "clamp_side",
           "clamp_band", "cdiv_jit", "kv_block_range", "tile_class", "mask_at", "tile_fully_masked",
           "tile_visit_class", "band_box", "allowed", "classify_tiles"]

#: :func:`flashlab.tiling.cdiv` compiled for Numba code (the same function: one spelling of
#: ``ceil(a / b)`` for the kernels and for Python alike)
cdiv_jit = njit(cache=CACHE, inline="always")(cdiv)

#: Stand-in for an unbounded band side. Large enough that ``i - NO_LIMIT`` and
#: ``i + NO_LIMIT`` never overflow int64 and always lie outside any sequence.
NO_LIMIT = 1 << 60

#: Tile classes, as stored by :func:`classify_tiles`.
EMPTY, PARTIAL, FULL = 0, 1, 2

#: the tile classes' names, for labels and messages
TILE_CLASS_NAMES: dict[int, str] = {EMPTY: "empty", PARTIAL: "partial", FULL: "full"}


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
    return j_lo // block_k, cdiv_jit(j_hi, block_k)


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


@njit(cache=CACHE, inline="always")
def mask_at(x2d, i, j):
    """``x2d[i, j]`` of a 2-D array broadcast to (Sq, Sk): an axis of length 1 is read at 0."""
    return x2d[i if x2d.shape[0] > 1 else 0, j if x2d.shape[1] > 1 else 0]


@njit(cache=CACHE)
def tile_fully_masked(mask2d, i0, i1, j0, j1, left, right):
    """True when band and dense mask together leave no allowed entry in the tile (it is skipped).

    Only the band-allowed entries ``i - left <= j <= i + right`` are checked against the mask,
    so a tile whose few band-allowed entries are all masked is skipped too.
    """
    for i in range(i0, i1):
        # the band-allowed columns of row i, clipped to the tile
        for j in range(max(j0, i - left), min(j1, i + right + 1)):
            if not mask_at(mask2d, i, j):
                return False
    return True


@njit(cache=CACHE)
def tile_visit_class(i0, i1, j0, j1, left, right, mask2d, has_mask):
    """The class a kernel gives tile rows ``[i0, i1)`` x cols ``[j0, j1)``: EMPTY (skipped),
    PARTIAL (masked element by element) or FULL (no masking).

    The band's class (:func:`tile_class`), and EMPTY when the dense mask ``mask2d`` (read only
    when ``has_mask``) removes every band-allowed entry (:func:`tile_fully_masked`). A band-FULL
    tile stays FULL here; the kernels still apply the dense mask to it (``has_mask``).
    """
    cls = tile_class(i0, i1, j0, j1, left, right)
    if cls != EMPTY and has_mask and tile_fully_masked(mask2d, i0, i1, j0, j1, left, right):
        return EMPTY
    return cls


@njit(cache=CACHE)
def band_box(i0: int, i1: int, j0: int, j1: int, left: int, right: int):
    """The smallest rows ``[ilo, ihi)`` x cols ``[jlo, jhi)`` of a tile holding all its band-allowed pairs.

    For a non-EMPTY tile: row ``i`` has an allowed key in ``[j0, j1)`` iff
    ``j0 - right <= i <= j1 - 1 + left``, and column ``j`` an allowed row in ``[ilo, ihi)`` iff
    ``ilo - left <= j <= ihi - 1 + right``. The kernels compute only this box of a partial
    tile: the rows and columns cut off are masked entirely, and their ``e^{-inf} = 0``
    would change no state. On the causal diagonal with ``block_k < block_q`` that skips the
    rows above the diagonal (half of a 256 x 128 tile at the top of its q-block); a FULL tile
    is its own box.

    >>> band_box(0, 256, 128, 256, 1 << 60, 0)    # causal: rows 0..127 see no key >= 128
    (128, 256, 128, 256)
    >>> band_box(0, 8, 0, 8, 2, 0)                 # window (2, 0) on the diagonal: whole tile
    (0, 8, 0, 8)
    """
    left, right = clamp_side(left, j1, i1), clamp_side(right, i1, j1)
    # rows: j0 - right <= i <= j1 - 1 + left
    ilo = max(i0, j0 - right)
    ihi = min(i1, j1 + left)
    # columns: ilo - left <= j <= ihi - 1 + right
    jlo = max(j0, ilo - left)
    jhi = min(j1, ihi + right)
    return ilo, ihi, jlo, jhi


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
    nq, nk = cdiv(sq, block_q), cdiv(sk, block_k)
    out = np.empty((nq, nk), dtype=np.int8)
    has_mask = mask is not None
    mask2d = np.ascontiguousarray(mask, dtype=np.bool_) if has_mask else np.zeros((1, 1), np.bool_)
    dense = np.broadcast_to(mask2d, (sq, sk))
    for a in range(nq):
        i0, i1 = a * block_q, min(sq, (a + 1) * block_q)
        for b in range(nk):
            j0, j1 = b * block_k, min(sk, (b + 1) * block_k)
            # the kernels' rule: band class, EMPTY when the mask leaves no allowed entry
            c = tile_visit_class(i0, i1, j0, j1, left, right, mask2d, has_mask)
            if has_mask and c == FULL and dense[i0:i1, j0:j1].any():
                c = PARTIAL   # a band-FULL tile the mask cuts into
            out[a, b] = c
    return out

