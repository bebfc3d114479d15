r"""Tile operations shared by the kernels: one tile's scores, bias, mask, dropout, exp and the
online-softmax update, and the order the q-blocks are handed to the threads.

The forward (:mod:`flashlab.kernels.forward`), the backward (:mod:`flashlab.kernels.backward`),
split-KV decoding (:mod:`flashlab.kernels.decode`), the tile walk (:mod:`flashlab.walk`) and the
schedule replay (:mod:`flashlab.replay`) all call these ``@njit`` helpers, so each operation is
written once. Which tiles are visited at all (the band and the dense mask) is decided in
:mod:`flashlab.masks`.

One tile, rows ``[i0, i1)`` of query block $Q_i$ against key/value block $K_j, V_j$:

$$
\begin{aligned}
S &= \text{scale}\,(Q_i K_j^\top + Q^{rope}_i {K^{rope}_j}^\top) + \text{bias} \quad\text{(masked entries} = -\infty)\\
m' &= \max\big(m, \operatorname{rowmax}(S)\big), \quad \tilde P = e^{S - m'}\\
\ell' &= e^{m - m'}\,\ell + \operatorname{rowsum}(\tilde P), \quad
\tilde O' = e^{m - m'}\,\tilde O + \tilde P V_j
\end{aligned}
$$
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from flashlab.dropout import keep
from flashlab.kernels.blas import gemm_nn, gemm_nt  # (importing blas also pins it to one thread)
from flashlab.kernels.intrinsics import int_bits_as_float32, maxnum
from flashlab.kernels.rowstep import online_row_step as _online_row_step
from flashlab.kernels.scorestep import score as _score
from flashlab.kernels.scorestep import slope as _slope
from flashlab.kernels.scorestep import transforms as _transforms
from flashlab.masks import mask_at
from flashlab.numba_cache import CACHE

__all__ = ["qblock_order", "head_operands", "score_tile", "add_bias_tile", "all_finite",
           "drop_tile", "mask_tile", "stage_scores", "finish_scores", "scores_chain", "tile_scores",
           "exp_nonpositive", "exp_shifted", "row_max",
           "online_softmax_update", "rescale_rows", "finalize_rows", "store_scaled"]


#: :func:`flashlab.kernels.rowstep.online_row_step` compiled for the CPU (the one per-row
#: update of the online softmax; ``numba.cuda.jit(device=True)`` compiles the same source;
#: documented there, so not in ``__all__``)
online_row_step = njit(cache=CACHE, inline="always")(_online_row_step)
#: the scores stage's scalar steps (:mod:`flashlab.kernels.scorestep`, documented there) compiled
#: for the CPU: whether the stage transforms, one score, its slope
stage_transforms = njit(cache=CACHE, inline="always")(_transforms)
score_step = njit(cache=CACHE, inline="always")(_score)
score_slope = njit(cache=CACHE, inline="always")(_slope)


@njit(cache=CACHE, inline="always")
def qblock_order(i, n_qb):
    """The q-block the kernels' ``i``-th work item of a head computes: 0, n-1, 1, n-2, ...

    ``prange`` hands each thread a contiguous run of work items, and with a causal mask late
    q-blocks have more tiles than early ones; pairing them (zig-zag) evens the threads out.

    >>> [qblock_order(i, 5) for i in range(5)]
    [0, 4, 1, 3, 2]
    """
    # even i: the (i/2)-th block from the top; odd i: the ((i-1)/2)-th from the bottom
    return i // 2 if i % 2 == 0 else n_qb - 1 - i // 2


@njit(cache=CACHE, inline="always")
def head_operands(options, b, h):
    """The 2-D mask and bias and the ALiBi slope of head ``h`` of batch ``b``.

    ``options`` (:class:`~flashlab.kernels.options.TileOptions`): its mask (Bm, Hm, Sqm, Skm)
    and bias (Bb, Hb, Sqb, Skb) have axes of length 1 or full (broadcast, never expanded):
    index 0 along a length-1 axis. slopes (Bs, H); the slope is 0 without ALiBi. Returns
    ``(mask2d, bias2d, slope)``, the 2-D ones views.
    """
    mask, bias, slopes = options.mask, options.bias, options.slopes
    mask2d = mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0]
    bias2d = bias[b if bias.shape[0] > 1 else 0, h if bias.shape[1] > 1 else 0]
    slope = slopes[b if slopes.shape[0] > 1 else 0, h] if options.has_alibi else 0.0
    return mask2d, bias2d, slope


@njit(cache=CACHE)
def score_tile(qs_blk, k_blk, qrs_blk, kr_blk, has_rope, s):
    """Scores of one tile into ``s``, shape ``(rows, cols)``.

    ``qs_blk`` (rows, Dqk) is the query block already multiplied by ``scale``; ``k_blk``
    (cols, Dqk). With ``has_rope`` the RoPE part ``qrs_blk`` (rows, Dr) x ``kr_blk`` (cols, Dr)
    is accumulated into the same tile: no concatenated Q or K, no second score buffer.
    """
    # S = (scale Q_i) K_j^T               (one BLAS gemm written straight into the tile buffer)
    gemm_nt(qs_blk, k_blk, s, 1.0, 0.0)
    if has_rope:
        # S += (scale Q^rope_i) K^rope_j^T  (gemm with beta = 1: accumulated in place, RECT-FA)
        gemm_nt(qrs_blk, kr_blk, s, 1.0, 1.0)


@njit(cache=CACHE)
def add_bias_tile(s, i0, j0, bias2d, has_bias, slope, has_alibi, alibi_offset, alibi_sqrt,
                  check_overflow):
    """``S += bias`` on tile ``s`` (rows ``i0..``, cols ``j0..``); returns True if a sum overflowed.

    ``bias2d`` (Sq or 1, Sk or 1), read only when ``has_bias`` (an axis of length 1 is
    broadcast); with ``has_alibi`` the generated ALiBi bias ``-slope * |j - i - alibi_offset|``
    (``sqrt`` of the distance when ``alibi_sqrt``) is added too. A ``-inf`` bias entry masks
    its score; with ``check_overflow`` a finite bias that turns a finite score into ``+-inf``
    or NaN is reported.
    """
    rows, cols = s.shape
    overflow = False
    for r in range(rows):
        i = i0 + r
        for c in range(cols):
            j = j0 + c
            add = 0.0
            if has_bias:
                add = mask_at(bias2d, i, j)
            if has_alibi:
                dist = abs(j - i - alibi_offset)
                # ALiBi: -slope |j - i - c|  (or -slope sqrt|j - i - c|)
                add -= slope * (math.sqrt(dist) if alibi_sqrt else dist)
            # (the sum is rounded to the tile's dtype when stored: test the stored value)
            s[r, c] += add
            if check_overflow and math.isfinite(add) and not math.isfinite(s[r, c]):
                overflow = True
    return overflow


@njit(cache=CACHE)
def all_finite(s):
    """True when every score of the tile is finite (no float overflow in ``Q K^T``)."""
    for r in range(s.shape[0]):
        for c in range(s.shape[1]):
            if not math.isfinite(s[r, c]):
                return False
    return True


@njit(cache=CACHE)
def drop_tile(p, counter0, row_stride, seed, threshold):
    """Zero the dropped entries of ``p`` (rows, cols) in place; return how many were kept.

    Entry ``(r, c)`` has counter ``counter0 + r * row_stride + c`` (the counter of
    :mod:`flashlab.dropout`: ``counter0`` is the tile's top-left entry, ``row_stride`` = Sk);
    it is kept iff :func:`flashlab.dropout.keep` says so. The survivors are not rescaled
    here: the kernels divide by the keep probability once per row.
    """
    rows, cols = p.shape
    kept = 0
    for r in range(rows):
        base = counter0 + r * row_stride
        for c in range(cols):
            # Z_ij = keep(seed, counter_ij)
            if keep(seed, base + c, threshold):
                kept += 1
            else:
                p[r, c] = 0.0
    return kept


@njit(cache=CACHE)
def mask_tile(s, i0, j0, left, right, band_partial, mask2d, has_mask):
    """Set masked entries of tile ``s`` (rows ``i0..``, cols ``j0..``) to ``-inf``.

    ``band_partial``: the band cuts through this tile (otherwise no band test is needed).
    ``mask2d`` (Sq or 1, Sk or 1) bool, True = masked out, read only when ``has_mask``: an
    axis of length 1 is broadcast (a key-padding mask is (1, Sk)), see :func:`~flashlab.masks.mask_at`.
    """
    rows, cols = s.shape
    for r in range(rows):
        i = i0 + r
        for c in range(cols):
            j = j0 + c
            # allowed iff i - left <= j <= i + right  and  not mask[i, j]
            if band_partial and (j < i - left or j > i + right):
                s[r, c] = -np.inf
            elif has_mask and mask_at(mask2d, i, j):
                s[r, c] = -np.inf


@njit(cache=CACHE)
def stage_scores(s, stage, dscore, keep_dscore):
    """The scores stage in place on a tile of scaled products: ``S <- score(s)`` entry by
    entry (:func:`flashlab.kernels.scorestep.score`; call it where ``transforms(stage)``).
    ``stage``: a record with the stage's fields (the kernels' ``TileOptions``).

    With ``keep_dscore`` the derivative ``dS/ds`` of each entry
    (:func:`~flashlab.kernels.scorestep.slope`) is written to ``dscore`` (same shape as ``s``):
    the backward's ``dS`` picks it up. Computed in float64 and rounded once to the tile's
    dtype (one rounding instead of three in float32).
    """
    rows, cols = s.shape
    for r in range(rows):
        for c in range(cols):
            # S = score(s);  dS/ds = slope(S)   (in float64: s is widened, the result rounded once)
            v = score_step(np.float64(s[r, c]), stage)
            s[r, c] = v
            if keep_dscore:
                dscore[r, c] = score_slope(v, stage)


@njit(cache=CACHE)
def finish_scores(s, i0, j0, band_partial, mask2d, bias2d, slope, dscore, keep_dscore, options):
    """The scores stage, bias and mask on a tile of raw scaled scores ``s`` (rows ``i0..``,
    cols ``j0..``); returns True if a bias sum overflowed (with ``options.check_overflow``).

    The order is flash_attn's: ``S = score(scale q k^T) + bias`` (``score`` of
    :mod:`flashlab.kernels.scorestep`: the logit soft-cap), then the masked entries (band,
    when ``band_partial``; the dense mask) are set to ``-inf``. With ``keep_dscore`` (only
    where :func:`scores_chain` is True) the derivative of each score with respect to its
    scaled product is written to ``dscore`` (see :func:`stage_scores`).
    """
    bad = False
    if stage_transforms(options):
        # S <- score(s)   (the scores stage: the record carries its fields)
        stage_scores(s, options, dscore, keep_dscore)
    if options.has_bias or options.has_alibi:
        # S += bias_ij  (and the ALiBi term)
        bad = add_bias_tile(s, i0, j0, bias2d, options.has_bias, slope, options.has_alibi,
                            options.alibi_offset, options.alibi_sqrt, options.check_overflow)
    if band_partial or options.has_mask:
        mask_tile(s, i0, j0, options.left, options.right, band_partial, mask2d,
                  options.has_mask)
    return bad


@njit(cache=CACHE)
def scores_chain(options) -> bool:
    """Whether the stage's scores are a nonlinear function of the scaled products (a logit
    soft-cap makes them one), so that the backward must chain ``dS`` through the derivative :func:`tile_scores`
    keeps in ``dscore``. The bias and the masks are added after it and need no factor."""
    return stage_transforms(options)


@njit(cache=CACHE)
def tile_scores(s, qs_blk, k_blk, qrs_blk, kr_blk, i0, j0, band_partial, mask2d, bias2d,
                slope, dscore, keep_dscore, options):
    """The scores of one tile, as every kernel sees them; returns True if a score overflowed.

    ``s`` (rows, cols) gets
    ``S = score(scale (Q_i K_j^T + Q^rope_i K^rope_j^T)) + bias``, masked
    entries ``-inf``: :func:`score_tile` (``qs_blk`` already scaled), the overflow test of
    ``options.check_overflow`` (:func:`all_finite`), then :func:`finish_scores` (which keeps
    the scores' derivative in ``dscore`` with ``keep_dscore``). The forward, the backward and
    the walk call it; the decode kernel stacks a kv group's rows for the gemm and calls the
    two halves itself.
    """
    score_tile(qs_blk, k_blk, qrs_blk, kr_blk, options.has_rope, s)
    bad = options.check_overflow and not all_finite(s)
    if finish_scores(s, i0, j0, band_partial, mask2d, bias2d, slope, dscore, keep_dscore, options):
        bad = True
    return bad


# --- exp on a row of scores ----------------------------------------------------------------
# Numba's scalar math.exp does not vectorise here (no SVML): measured ~0.3-0.4 Gexp/s per core,
# which made exp ~40% of the forward's time at D=128. The float32 path below is a range-reduced
# polynomial written as plain arithmetic, so LLVM turns it into AVX-512 code:
#   e^d = 2^k e^r,  k = round(d / ln 2),  r = d - k ln 2 in [-ln2/2, ln2/2]
# ln 2 is split in a high part with few bits (k * LN2_HI is exact) and a low part (Cody-Waite),
# e^r is a degree-6 Taylor polynomial (error < 2e-8 on that interval) and 2^k is the float whose
# exponent field is k + 127 (a bit cast, :mod:`flashlab.kernels.intrinsics`). Max relative error
# 2.2e-7 (2 ulp) against float64 exp on [-87, 0]. Measured on a 256 x 512 float32 tile, one
# thread, per entry: 0.45 ns for an earlier version that added k into the exponent bits in a
# second loop (an int32 view of the row) and summed in a third, 0.34 ns with the bit cast and
# a separate sum, 0.23 ns with the sum in the same pass. float64 inputs keep math.exp.
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_ROUND = np.float32(12582912.0)   # 1.5 * 2^23: (x + _ROUND) - _ROUND rounds x to an integer
_LOWEST = np.float32(-87.0)       # e^-87 ~ 1.6e-38: below it (and for masked -inf) give 0
_ONE = np.float32(1.0)
_C2, _C3, _C4 = np.float32(1 / 2), np.float32(1 / 6), np.float32(1 / 24)
_C5, _C6 = np.float32(1 / 120), np.float32(1 / 720)


@njit(cache=CACHE, fastmath={"contract"})   # contract: allow FMA; no assumptions about inf/NaN
def exp_nonpositive(d):
    """``e^d`` of one float32 ``d <= 0``; 0 at or below -87 (and for -inf)."""
    d = d if d > _LOWEST else _LOWEST
    # k = round(d log2 e);  r = d - k ln2
    k = (d * _LOG2E + _ROUND) - _ROUND
    r = (d - k * _LN2_HI) - k * _LN2_LO
    # e^r ~ 1 + r + r^2/2 + ... + r^6/720
    p = _ONE + r * (_ONE + r * (_C2 + r * (_C3 + r * (_C4 + r * (_C5 + r * _C6)))))
    # 2^k: exponent field k + 127 (k >= -126 above the floor: a normal float)
    two_k = int_bits_as_float32((np.int32(k) + 127) << 23)
    # e^d = 2^k e^r; at or below the floor exactly 0 (masked keys contribute nothing)
    return p * two_k if d > _LOWEST else np.float32(0.0)


# The sum below is taken in the same pass, in SIMD lanes ("reassoc"). The flag is on this
# function only: LLVM keeps fast-math flags per instruction when it inlines
# exp_nonpositive, whose (y + R) - R rounding and Cody-Waite split must not be re-associated
# (the accuracy test in tests/test_kernels_exp.py would catch it).
@njit(cache=CACHE, fastmath={"reassoc"})
def exp_shifted(x, shift):
    """Overwrite the 1-D row ``x`` with ``e^{x - shift}`` and return its sum.

    ``shift`` >= max(x) (the row max), so every exponent is <= 0; masked entries (-inf) give 0.
    """
    n = x.shape[0]
    if x.itemsize != 4:
        total = 0.0
        for c in range(n):
            e = math.exp(x[c] - shift)
            x[c] = e
            total += e
        return total
    sh = np.float32(shift)
    total32 = np.float32(0.0)
    for c in range(n):
        e = exp_nonpositive(x[c] - sh)
        x[c] = e
        total32 += e
    return total32


@njit(cache=CACHE)
def row_max(x, start):
    """max(start, max_c x[c]) of a 1-D row, exact (a NaN entry is ignored).

    Written with LLVM's ``maxnum`` (``flashlab.kernels.intrinsics.maxnum``), which LLVM
    vectorises: a compare-and-select loop (``m = x[c] if x[c] > m else m``, or Numba's
    ``max``) compiles to one chain of scalar ``vmaxss``, each waiting for the last.
    """
    m = start
    for c in range(x.shape[0]):
        # m = max(m, x_c)
        m = maxnum(m, x[c])
    return m


@njit(cache=CACHE)
def online_softmax_update(s, v_blk, m, l, acc):
    """Fold one score tile into the running state; ``s`` is overwritten with P~ = e^{S - m_new}.

    s (rows, cols) scores; v_blk (cols, Dv); m, l (rows,); acc (rows, Dv) = O~, the
    unnormalised output. This is :func:`rescale_rows` followed by ``O~ += P~ V_j``; the kernel
    calls the two apart so that dropout can act on P~ in between.
    """
    rescale_rows(s, m, l, acc)
    # O~ <- O~ + P~ V_j                  (gemm with beta = 1: no P~V scratch tile, no extra pass)
    gemm_nn(s, v_blk, acc, 1.0, 1.0)


@njit(cache=CACHE)
def rescale_rows(s, m, l, acc):
    """The softmax half of the update: ``s`` becomes P~ = e^{S - m_new}; m, l, acc rescaled.

    s (rows, cols) scores; m, l (rows,); acc (rows, Dv). After it, ``acc`` still lacks this
    tile's ``P~ V_j``.
    """
    rows, cols = s.shape
    for r in range(rows):
        # rowmax(S), with m: the vectorised max of the row (row_max)
        tile_max = row_max(s[r], m[r])
        if tile_max == -np.inf:
            # no allowed key seen yet in this row: P~ = 0 and the state stays (m=-inf, l=0, O~=0)
            for c in range(cols):
                s[r, c] = 0.0
            continue
        # m_new = max(m, rowmax(S)), alpha = e^{m - m_new}, alpha l: the scalar per-row update
        # (flashlab.kernels.rowstep, the same source the GPU compiles)
        m_new, alpha, l_scaled = online_row_step(m[r], l[r], tile_max)
        # P~ = e^{S - m_new}, rowsum(P~);  masked entries: e^{-inf} = 0
        rowsum = exp_shifted(s[r], m_new)
        # l <- alpha l + rowsum(P~)
        l[r] = l_scaled + rowsum
        # O~ <- alpha O~   (the P~ V_j term is added below, for all rows in one gemm);
        # skipped when the max did not move (alpha = 1), the common case after the first tiles
        if m_new != m[r]:
            for d in range(acc.shape[1]):
                acc[r, d] *= alpha
        m[r] = m_new


@njit(cache=CACHE)
def finalize_rows(m, l, acc, o_blk, lse_blk):
    """O = O~ / l and LSE = m + log(l); a row with no allowed key (l = 0) gets O = 0, LSE = -inf."""
    for r in range(acc.shape[0]):
        if l[r] == 0.0:
            lse_blk[r] = -np.inf
            for d in range(acc.shape[1]):
                o_blk[r, d] = 0.0
        else:
            # LSE = m + log(l)
            lse_blk[r] = m[r] + math.log(l[r])
            inv = 1.0 / l[r]
            # O = O~ / l
            for d in range(acc.shape[1]):
                o_blk[r, d] = acc[r, d] * inv


@njit(cache=CACHE, inline="always")
def store_scaled(dst, src, scale):
    """``dst[r, c] = scale * src[r, c]`` for 2-D arrays of one shape.

    A loop, not ``dst[...] = src * scale``: assigning an *array* to a slice makes Numba
    compile a shape-mismatch error with a formatted message (string building code, a third
    of a kernel's LLVM module), which every new process then reads back from the cache
    (issue 22: the first call's time), and the product would be a temporary array.
    """
    for r in range(src.shape[0]):
        for c in range(src.shape[1]):
            dst[r, c] = src[r, c] * scale
