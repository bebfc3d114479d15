r"""Counter-based dropout: the same keep mask in the forward, the backward and the reference.

Attention dropout drops entries of the probability matrix $P$ (not of the output):

$$
O = \Big(\frac{Z \circ P}{1 - p}\Big) V,\qquad Z_{ij} \in \{0, 1\},\quad \Pr[Z_{ij} = 1] = 1 - p .
$$

A tiled kernel never stores $Z$ (it would be ``Sq x Sk``), so $Z_{ij}$ must be a *function* of
where the entry sits: the backward recomputes exactly the bits the forward used, tile by tile,
as it recomputes $P$. That is what a counter-based generator gives (Philox in cuRAND and in
flash-attention, a seeded hash on the Ascend device). Here the counter of entry
``(b, h, i, j)`` of a ``(B, H, Sq, Sk)`` problem is

$$
c = \text{offset} + ((b H + h) S_q + i) S_k + j ,
$$

hashed with ``seed`` by SplitMix64 (Steele, Lea, Flood 2014; the finaliser of Java's
``SplittableRandom``), and the entry is **kept** when the top 32 bits of the hash, read as a
uniform number $u \in [0, 1)$, satisfy $u \ge p$.

The same ``(seed, offset)`` therefore gives the same mask in every run, for every tile size and
thread count. ``offset`` lets a caller that runs one problem in pieces (the CANN varlen layout,
one sequence at a time) give every piece its own stretch of counters. This generator is
flashlab's own: it does not reproduce the bits of flash-attention's Philox or of the Ascend
device, only their contract (reproducible from seed and offset, the same in forward and
backward).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from flashlab.numba_cache import CACHE

__all__ = ["HASH_RANGE", "keep_threshold", "keep_probability", "inv_keep_probability", "keep",
           "keep_mask"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


#: The range of the hash's top 32 bits, 2^32; they are read as a uniform
#: ``u = (hash >> 32) / 2^32`` in [0, 1)
HASH_RANGE = 4294967296.0


def keep_threshold(p: float) -> int:
    """The integer threshold of drop probability ``p``: keep iff ``hash >> 32 >= threshold``.

    ``p`` in [0, 1): 0 keeps everything (threshold 0).
    """
    return int(min(p, 1.0) * HASH_RANGE)


@njit(cache=CACHE, inline="always")
def keep_probability(threshold) -> float:
    """The exact keep probability of the integer ``threshold``: ``1 - threshold / 2^32``
    (``1 - p`` up to the rounding of :func:`keep_threshold`)."""
    return 1.0 - threshold / HASH_RANGE


@njit(cache=CACHE, inline="always")
def inv_keep_probability(threshold) -> float:
    """``1 / (1 - p)``, the scale of the entries dropout keeps, from the integer ``threshold``.

    ``2^32 / (2^32 - threshold)``: the same number as ``1 / keep_probability(threshold)``,
    written so that its one rounding is the division's. 1 when nothing is dropped.

    >>> inv_keep_probability(0), inv_keep_probability(keep_threshold(0.5))
    (1.0, 2.0)
    """
    return HASH_RANGE / (HASH_RANGE - threshold)


@njit(cache=CACHE, inline="always")
def _mix(seed, counter):
    # SplitMix64: z = (seed * golden + counter + 1) * golden, then two xor-shift-multiply rounds
    z = (np.uint64(seed) * _GOLDEN + np.uint64(counter) + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=CACHE, inline="always")
def keep(seed, counter, threshold) -> bool:
    """Whether the entry with this ``counter`` is kept: the hash's top 32 bits >= ``threshold``."""
    return (_mix(seed, counter) >> np.uint64(32)) >= np.uint64(threshold)


@njit(cache=CACHE)
def _fill(seed, offset, threshold, out):
    B, H, Sq, Sk = out.shape
    for b in range(B):
        for h in range(H):
            for i in range(Sq):
                base = offset + ((b * H + h) * Sq + i) * Sk
                for j in range(Sk):
                    out[b, h, i, j] = keep(seed, base + j, threshold)


def keep_mask(shape: tuple[int, int, int, int], p: float, seed: int = 0,
              offset: int = 0) -> np.ndarray:
    """The dense keep mask ``Z`` (True = kept) of a ``(B, H, Sq, Sk)`` problem.

    For the reference and the tests only: the kernels compute each bit where they need it.
    >>> bool(keep_mask((1, 1, 2, 3), 0.0).all())
    True
    """
    out = np.empty(shape, dtype=np.bool_)
    _fill(np.uint64(seed), np.int64(offset), np.uint64(keep_threshold(p)), out)
    return out
