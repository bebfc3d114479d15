r"""Tiled FlashAttention forward: online softmax over key blocks, nothing of size Sq x Sk stored.

For one query block $Q_i$ (rows ``[i0, i1)``) and key/value blocks $K_j, V_j$ the kernel keeps,
per row, a running maximum $m$, a running denominator $\ell$ and an unnormalised output
$\tilde O$. Visiting block $j$:

$$
\begin{aligned}
S &= \text{scale}\,(Q_i K_j^\top + Q^{rope}_i {K^{rope}_j}^\top) \quad\text{(masked entries} = -\infty)\\
m' &= \max\big(m, \operatorname{rowmax}(S)\big)\\
\tilde P &= e^{S - m'} \\
\ell' &= e^{m - m'}\,\ell + \operatorname{rowsum}(\tilde P)\\
\tilde O' &= e^{m - m'}\,\tilde O + \tilde P V_j
\end{aligned}
$$

and after the last block $O_i = \tilde O / \ell$ and $\mathrm{LSE}_i = m + \log \ell$. The factor
$e^{m - m'}$ rescales everything accumulated under the old maximum, so the result equals
$\operatorname{softmax}(S) V$ exactly (in exact arithmetic) whatever the block order or size.

**Tile skipping.** For rows ``[i0, i1)`` the band (``causal``/``window``) allows only keys in
``[i0 - left, i1 - 1 + right]``; :func:`flashlab.masks.kv_block_range` turns that into a range
of kv-blocks, and the loop below runs over that range only: blocks outside it are never
loaded or multiplied. Inside it, a tile the band covers fully needs no element-wise masking
(:func:`flashlab.masks.tile_class`), and of a partial tile only the rows and columns that
hold an allowed entry are computed (:func:`flashlab.masks.band_box`); with a dense ``mask`` a
tile whose mask is all ``True`` is skipped after reading the mask tile.

**Bias, ALiBi and dropout.** An additive ``bias`` (broadcastable to (B, H, Sq, Sk), read
through its own shape, never expanded) and a generated ALiBi bias
$-\text{slope}_h\,|j - i - c|$ are added to $S$ after scaling (:func:`add_bias_tile`).
Dropout zeroes entries of $\tilde P$ *after* $\ell$ has summed them (the softmax is of the
undropped scores) and before $\tilde P V$; the output is divided by the keep probability at
the end. Which entries are dropped is a function of their position (:mod:`flashlab.dropout`),
so the backward drops the very same ones.

**Overflow.** When a bound on $|S|$ says the scores could leave the float range
(:func:`flashlab.validation.scores_may_overflow`), every tile is checked and the work item flags
it; the API raises instead of reporting an overflowed row as a masked one.

**Rows with no allowed key** keep $m = -\infty$, $\ell = 0$: they give $O = 0$ and
$\mathrm{LSE} = -\infty$ (never NaN), see :func:`finalize_rows`.

Every helper below is ``@njit``; the tile explorer (:mod:`flashlab.walk`) calls the same
helpers one tile at a time, so what the book animates is this code.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from flashlab.numba_cache import CACHE

from flashlab.dropout import inv_keep_probability, keep
from flashlab.masks import EMPTY, FULL, band_box, kv_block_range, tile_class
from flashlab.kernels.blas import gemm_nn, gemm_nt  # (importing blas also pins it to one thread)
from flashlab.kernels.intrinsics import int_bits_as_float32, maxnum

__all__ = ["head_operands", "score_tile", "mask_at", "add_bias_tile", "all_finite", "drop_tile",
           "mask_tile", "tile_fully_masked", "exp_nonpositive", "exp_shifted", "row_max",
           "online_softmax_update", "rescale_rows", "finalize_rows", "flash_forward_kernel"]


@njit(cache=CACHE, inline="always")
def head_operands(mask, bias, slopes, has_alibi, b, h):
    """The 2-D mask and bias and the ALiBi slope of head ``h`` of batch ``b``.

    mask (Bm, Hm, Sqm, Skm) and bias (Bb, Hb, Sqb, Skb) have axes of length 1 or full
    (broadcast, never expanded): index 0 along a length-1 axis. slopes (Bs, H); the slope is 0
    without ALiBi. Returns ``(mask2d, bias2d, slope)``, the 2-D ones views.
    """
    mask2d = mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0]
    bias2d = bias[b if bias.shape[0] > 1 else 0, h if bias.shape[1] > 1 else 0]
    slope = slopes[b if slopes.shape[0] > 1 else 0, h] if has_alibi else 0.0
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


@njit(cache=CACHE, inline="always")
def mask_at(x2d, i, j):
    """``x2d[i, j]`` of a 2-D array broadcast to (Sq, Sk): an axis of length 1 is read at 0."""
    return x2d[i if x2d.shape[0] > 1 else 0, j if x2d.shape[1] > 1 else 0]


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
    axis of length 1 is broadcast (a key-padding mask is (1, Sk)), see :func:`mask_at`.
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
    ``max``) compiles to one chain of scalar ``vmaxss``, each waiting for the last. Measured
    per entry of a 256 x 512 float32 tile, one thread: 0.15 ns with eight independent scalar
    maxima (the previous version), 0.08 ns with ``maxnum``.
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
        # m_new = max(m, rowmax(S))
        m_new = row_max(s[r], m[r])
        if m_new == -np.inf:
            # no allowed key seen yet in this row: P~ = 0 and the state stays (m=-inf, l=0, O~=0)
            for c in range(cols):
                s[r, c] = 0.0
            continue
        # alpha = e^{m - m_new}   (0 when m was -inf: nothing accumulated yet)
        alpha = math.exp(m[r] - m_new)
        # P~ = e^{S - m_new}, rowsum(P~);  masked entries: e^{-inf} = 0
        rowsum = exp_shifted(s[r], m_new)
        # l <- alpha l + rowsum(P~)
        l[r] = alpha * l[r] + rowsum
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


@njit(parallel=True, cache=CACHE)
def flash_forward_kernel(q, k, v, q_rope, k_rope, has_rope, mask, has_mask, bias, has_bias,
                         slopes, has_alibi, alibi_offset, alibi_sqrt, scale, left, right,
                         block_q, block_k, drop_threshold, seed, offset, check_overflow,
                         o, lse, row_max, tiles_done, overflow):
    """Tiled online-softmax attention forward, in place into ``o`` and ``lse``.

    q (B, H, Sq, Dqk); k (B, Hkv, Sk, Dqk); v (B, Hkv, Sk, Dv); q_rope (B, H, Sq, Dr) and
    k_rope (B, Hr, Sk, Dr), read only when ``has_rope``; mask (Bm, Hm, Sqm, Skm) bool
    (True = masked out) and bias (Bb, Hb, Sqb, Skb), each axis 1 or full (broadcast, never
    expanded), read only when ``has_mask`` / ``has_bias``; slopes (Bs, H) ALiBi slopes,
    Bs in {1, B}, read only when ``has_alibi`` (bias ``-slope |j - i - alibi_offset|``, or its
    ``sqrt`` form); scale a scalar of q's dtype; band ``[i - left, i + right]`` with sides
    clamped to the lengths (:func:`flashlab.masks.clamp_band`); dropout: entries whose hash
    is below ``drop_threshold`` (0 = no dropout) are dropped, counters from ``offset``
    (:mod:`flashlab.dropout`); ``check_overflow``: test every tile for scores that overflow.

    Outputs: o (B, H, Sq, Dv); lse and row_max (B, H, Sq) in o's dtype (row_max = the final
    running max m, the row max of the scaled, masked scores: CANN's ``softmax_max``; -inf for
    a row with no allowed key); tiles_done (B * H * n_qblocks,) int64, the tiles computed per
    q-block; overflow (B * H * n_qblocks,) int64, 1 where a tile's scores overflowed. All
    arrays C-contiguous; o's dtype is the accumulation dtype (float32 or float64).
    """
    B, H, Sq, _ = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    Dv = v.shape[3]
    group = H // Hkv              # GQA: query head h reads kv head h // group
    group_r = H // k_rope.shape[1]
    n_qb = (Sq + block_q - 1) // block_q
    dropout = drop_threshold > 0
    # O = O~ / (l * keep probability): the survivors of dropout are scaled by 1 / (1 - p)
    inv_keep = inv_keep_probability(drop_threshold)
    # one parallel work item per (batch, head, q-block): small head counts still fill both cores
    for t in prange(B * H * n_qb):
        b = t // (H * n_qb)
        h = (t // n_qb) % H
        # q-blocks in zig-zag order 0, n-1, 1, n-2, ...: prange hands each thread a contiguous
        # run of work items, and with a causal mask late q-blocks have more tiles than early
        # ones; pairing them evens the threads out (measured, B=1, H=1, N=4096, 2 threads:
        # causal/non-causal time 0.90 in plain order, 0.45 in zig-zag order)
        i = t % n_qb
        qb = i // 2 if i % 2 == 0 else n_qb - 1 - i // 2
        hk = h // group
        mask2d, bias2d, slope = head_operands(mask, bias, slopes, has_alibi, b, h)
        i0 = qb * block_q
        i1 = min(i0 + block_q, Sq)
        rows = i1 - i0
        # Q_i is read once per q-block and pre-scaled: (scale Q_i) K_j^T = scale (Q_i K_j^T)
        qs = q[b, h, i0:i1] * scale
        qrs = q_rope[b, h, i0:i1] * scale if has_rope else q_rope[0, 0, 0:1]
        m = np.full(rows, -np.inf, dtype=o.dtype)
        l = np.zeros(rows, dtype=o.dtype)
        acc = np.zeros((rows, Dv), dtype=o.dtype)
        # one flat buffer for every tile of this q-block; a (rows, cols) reshape of its head
        # is C-contiguous, which the BLAS gemm calls need (a 2-D slice of a 2-D buffer is not)
        s_buf = np.empty(rows * block_k, dtype=o.dtype)
        done = 0
        bad = 0
        kb0, kb1 = kv_block_range(i0, i1, Sk, block_k, left, right)
        for kb in range(kb0, kb1):
            j0 = kb * block_k
            j1 = min(j0 + block_k, Sk)
            cls = tile_class(i0, i1, j0, j1, left, right)
            if cls == EMPTY:
                continue
            if has_mask and tile_fully_masked(mask2d, i0, i1, j0, j1, left, right):
                continue
            # a partial tile is computed on the box of its band-allowed entries only: rows
            # [ti0, ti1) x cols [tj0, tj1) (rows cut off keep m, l, O~ as they are, exactly
            # what their all -inf scores would do; the same bits). Measured, causal D=128
            # N=4096 B=1 H=8, 2 threads, 512 x 256 tiles, 7 rounds in turn: whole tiles 0.223 s,
            # boxes 0.214 s (4.5 % less; the box computes 1.06 of the allowed scores, whole
            # tiles 1.12)
            ti0, ti1, tj0, tj1 = band_box(i0, i1, j0, j1, left, right)
            r0, r1 = ti0 - i0, ti1 - i0
            s = s_buf[: (r1 - r0) * (tj1 - tj0)].reshape((r1 - r0, tj1 - tj0))
            kr = k_rope[b, h // group_r, tj0:tj1] if has_rope else k_rope[0, 0, 0:1]
            qrs_t = qrs[r0:r1] if has_rope else qrs
            # S = scale (Q_i K_j^T + Q^rope_i K^rope_j^T)
            score_tile(qs[r0:r1], k[b, hk, tj0:tj1], qrs_t, kr, has_rope, s)
            if check_overflow and not all_finite(s):
                bad = 1
            if has_bias or has_alibi:
                # S += bias_ij  (and the ALiBi term)
                if add_bias_tile(s, ti0, tj0, bias2d, has_bias, slope, has_alibi, alibi_offset,
                                 alibi_sqrt, check_overflow):
                    bad = 1
            if cls != FULL or has_mask:
                mask_tile(s, ti0, tj0, left, right, cls != FULL, mask2d, has_mask)
            # m, l, O~ rescaled to the new row max; s becomes P~ = e^{S - m_new}
            rescale_rows(s, m[r0:r1], l[r0:r1], acc[r0:r1])
            if dropout:
                # P~ <- Z o P~  (l above summed the undropped P~: dropout acts after the softmax)
                drop_tile(s, offset + ((b * H + h) * Sq + ti0) * Sk + tj0, Sk, seed,
                          drop_threshold)
            # O~ <- O~ + P~ V_j                  (gemm with beta = 1: accumulated in place)
            gemm_nn(s, v[b, hk, tj0:tj1], acc[r0:r1], 1.0, 1.0)
            done += 1
        finalize_rows(m, l, acc, o[b, h, i0:i1], lse[b, h, i0:i1])
        if dropout:
            # O = O~ / (l (1 - p))
            o[b, h, i0:i1] *= inv_keep
        row_max[b, h, i0:i1] = m
        tiles_done[(b * H + h) * n_qb + qb] = done
        overflow[(b * H + h) * n_qb + qb] = bad
