r"""Split-KV forward for decoding (Flash-Decoding): few query rows, a long key axis.

In decoding a model produces one token at a time: ``Sq = 1`` (or a few rows, with speculative
decoding) against a cache of ``Sk`` keys that may be 100k long. The tiled forward
(:mod:`flashlab.kernels.forward`) has one parallel work item per (batch, head, q-block): with
one q-block per head that is ``B * H`` items, each a single row streaming the whole of its
K and V. Two things go wrong:

* **GQA reads K/V once per query head.** The ``group = H / Hkv`` query heads of a kv group
  read the same K and V; the tiled forward streams them ``group`` times, and each gemm has
  ``Sq`` (= 1) rows, a matrix-vector product.
* **Too few work items.** With ``B * Hkv`` small (one sequence, MQA) a single core streams a
  head while the other idles.

This kernel fixes both. A work item is ``(b, hk, c)``: kv head ``hk`` of batch ``b`` and
**chunk** ``c`` of the key axis. It stacks the ``group * Sq`` query rows of the kv group into
one block (row ``g * Sq + i`` is query row ``i`` of head ``hk * group + g``), so K and V are
read once per group and each gemm has ``group * Sq`` rows; it runs the forward's online
softmax over the kv-blocks of its chunk only and leaves, per row, a partial state
$(m_c, \ell_c, \tilde O_c)$: running max, denominator and unnormalised output. A second
kernel (:func:`merge_splits`) combines the chunks of each row, in chunk order:

$$
\begin{aligned}
m &= \max_c m_c \\
\ell &= \textstyle\sum_c e^{m_c - m}\,\ell_c \\
O &= \textstyle\sum_c e^{m_c - m}\,\tilde O_c \,/\, \ell
\;=\; \sum_c e^{m_c - m}\,\ell_c\, O_c \,/\, \ell \qquad (O_c = \tilde O_c / \ell_c)\\
\mathrm{LSE} &= m + \log \ell
\end{aligned}
$$

which is the online softmax's own rescaling, applied once per chunk instead of once per
tile (the merge folds the chunks in one at a time with the forward's per-row update,
:func:`~flashlab.kernels.rowstep.online_row_step`, each chunk's $m_c$ standing for a tile's
row max): the result is $\operatorname{softmax}(S)\,V$ whatever the split (in exact
arithmetic).

**Determinism.** The number of chunks (:func:`kv_splits`) is a function of the shape only,
never of the thread count, and every sum is taken in a fixed order (tiles in key order within
a chunk, chunks in order in the merge): the same bits for any ``NUMBA_NUM_THREADS``.

**Same tiles, same masks.** The chunks split the kv-block range the band allows
(:func:`flashlab.masks.kv_block_range`) on ``block_k`` boundaries, and each tile goes
through the forward's helpers (:func:`~flashlab.kernels.tile.score_tile` and
:func:`~flashlab.kernels.tile.finish_scores`, the two halves of
:func:`~flashlab.kernels.tile.tile_scores`,
:func:`~flashlab.kernels.tile.rescale_rows`, :func:`~flashlab.kernels.tile.drop_tile`),
so masks, bias, ALiBi, dropout counters and the tiles counted per head are the forward's.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from flashlab.dropout import inv_keep_probability
from flashlab.kernels.blas import gemm_nn
from flashlab.kernels.tile import (
    all_finite,
    drop_tile,
    finish_scores,
    head_operands,
    online_row_step,
    rescale_rows,
    score_tile,
)
from flashlab.masks import EMPTY, FULL, cdiv_jit, kv_block_range, tile_class, tile_fully_masked
from flashlab.numba_cache import CACHE, serial_twin
from flashlab.tiling import DECODE_MAX_SQ, cdiv

__all__ = ["pv_few_rows", "kv_splits", "flash_decode_kernel", "merge_splits", "DECODE_MAX_SQ",
           "DECODE_MIN_ITEMS", "DECODE_MIN_CHUNK_BLOCKS", "GEMV_MAX_ROWS", "flash_decode_serial",
           "merge_splits_serial"]

# The tiled forward is replaced by this kernel when ``Sq <= DECODE_MAX_SQ`` (defined in
# flashlab.tiling, which validation reads; re-exported here), the query fitting one q-block and
# no RoPE operands.

#: :func:`kv_splits` splits the key axis until there are at least this many work items
#: ``B * Hkv * n_split``. A constant, never the thread count (the bits must not depend on it);
#: 16 leaves several items per core on machines with up to ~8 cores; splitting beyond the core
#: count costs next to nothing (the merge reads ``n_split * Sq * Dv`` numbers per row).
DECODE_MIN_ITEMS = 16
#: ... but never chunks shorter than this many kv-blocks (a chunk costs one merge term per row).
DECODE_MIN_CHUNK_BLOCKS = 4


#: With at most this many stacked rows (``group * Sq``) the tile's ``P~ V_j`` is a plain loop
#: (:func:`pv_few_rows`) instead of a BLAS gemm call. A gemm with 4 rows first copies
#: ("packs") the whole V tile, then multiplies; the loop reads each V row once. The scores
#: ``Q K_j^T`` stay with BLAS although a loop for them is faster: it is not the same rounding
#: as the BLAS gemm the backward recomputes the scores with, and the forward's LSE must match
#: the backward's scores (the figures of both choices are in the book's *Measurements behind
#: the defaults*).
GEMV_MAX_ROWS = 16


@njit(cache=CACHE, fastmath={"contract"})
def pv_few_rows(p, v_blk, acc):
    """``acc += p @ v_blk`` for a few rows: each value row ``V[c]`` is read once, for every row.

    Two value rows per step: each ``acc`` row is loaded and stored half as often.
    """
    rows, cols = p.shape
    c2 = cols - cols % 2
    for c in range(0, c2, 2):
        for r in range(rows):
            w0 = p[r, c]
            w1 = p[r, c + 1]
            # O~_r += P~_rc V_c + P~_r,c+1 V_c+1
            for d in range(v_blk.shape[1]):
                acc[r, d] += w0 * v_blk[c, d] + w1 * v_blk[c + 1, d]
    for c in range(c2, cols):
        for r in range(rows):
            w = p[r, c]
            for d in range(v_blk.shape[1]):
                acc[r, d] += w * v_blk[c, d]


def kv_splits(batch: int, kv_heads: int, n_kvblocks: int) -> int:
    """Number of chunks the key axis is split into: from the shape only.

    The smallest count giving ``>= DECODE_MIN_ITEMS`` work items ``batch * kv_heads * n``,
    limited so that every chunk has at least ``DECODE_MIN_CHUNK_BLOCKS`` kv-blocks.

    >>> kv_splits(1, 8, 1024), kv_splits(1, 1, 1024), kv_splits(1, 1, 8), kv_splits(16, 8, 1024)
    (2, 16, 2, 1)
    """
    want = cdiv(DECODE_MIN_ITEMS, batch * kv_heads)
    most = max(1, n_kvblocks // DECODE_MIN_CHUNK_BLOCKS)
    return max(1, min(want, most))


@njit(parallel=True, cache=CACHE)
def flash_decode_kernel(q, k, v, n_split, part_m, part_l, part_acc, part_tiles,
                        part_overflow, part_nonfinite, options):
    """Split-KV phase: one work item per (batch, kv head, key chunk), partial states out.

    q (B, H, Sq, Dqk); k (B, Hkv, Sk, Dqk); v (B, Hkv, Sk, Dv); ``options`` the
    :class:`~flashlab.kernels.options.TileOptions` of
    :func:`flashlab.kernels.forward.flash_forward_kernel` (no RoPE operands: never read here;
    ``block_k`` the tile's key count); ``n_split`` chunks of the band's kv-block range.

    Outputs, per work item ``(b, hk, c)`` and row ``r = g * Sq + i`` (head ``hk*group + g``):
    part_m, part_l (B, Hkv, n_split, group*Sq) the running max and denominator; part_acc
    (B, Hkv, n_split, group*Sq, Dv) the unnormalised output; part_tiles (B, Hkv, n_split,
    group) int64 tiles computed per head; part_overflow (B, Hkv, n_split) int64;
    part_nonfinite (B, Hkv, n_split) int64, 1 where a score of the group's tile was NaN or
    inf before any mask or the partial output is not finite: it tells the API whether K or V
    may hold NaN/inf, so that the API need not read K and V a second time to check them
    (:func:`flashlab.api.flash_attention`).
    """
    B, H, Sq, Dqk = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = H // Hkv
    rows = group * Sq
    scale, left, right, block_k = options.scale, options.left, options.right, options.block_k
    drop_threshold = options.drop_threshold
    dropout = drop_threshold > 0
    # the kv-blocks any row may see (the band is the same for every head)
    kb0, kb1 = kv_block_range(0, Sq, Sk, block_k, left, right)
    per = max(1, cdiv_jit(kb1 - kb0, n_split))     # kv-blocks per chunk, ceil
    for t in prange(B * Hkv * n_split):
        b = t // (Hkv * n_split)
        hk = (t // n_split) % Hkv
        c = t % n_split
        # the group's query rows stacked: (group, Sq, Dqk) -> (group*Sq, Dqk), pre-scaled
        qs = (q[b, hk * group:(hk + 1) * group] * scale).reshape((rows, Dqk))
        m = part_m[b, hk, c]
        l = part_l[b, hk, c]
        acc = part_acc[b, hk, c]
        m[:] = -np.inf
        l[:] = 0.0
        acc[:] = 0.0
        s_buf = np.empty(rows * block_k, dtype=acc.dtype)
        bad = 0
        # the group's rows at once: K_j and V_j are read once for all its query heads
        for kb in range(kb0 + c * per, min(kb0 + (c + 1) * per, kb1)):
            j0 = kb * block_k
            j1 = min(j0 + block_k, Sk)
            cls = tile_class(0, Sq, j0, j1, left, right)
            if cls == EMPTY:
                continue
            s = s_buf[: rows * (j1 - j0)].reshape((rows, j1 - j0))
            # S = (scale Q_group) K_j^T   (BLAS, as the backward recomputes it; the first
            # half of tile.tile_scores, for the whole group at once)
            score_tile(qs, k[b, hk, j0:j1], qs, qs, False, s)
            # a NaN or inf in K_j makes scores NaN/inf (inf * 0 = NaN): flagged here, checked
            # by the caller against K itself. One pass over the group's tile; each head's rows
            # are looked at again (for the overflow flag) only when it found something
            tile_finite = all_finite(s)
            if not tile_finite:
                part_nonfinite[b, hk, c] = 1
            for g in range(group):
                h = hk * group + g
                # this head's Sq rows of the tile (rows g*Sq .. g*Sq + Sq - 1)
                sg = s[g * Sq:(g + 1) * Sq]
                mask2d, bias2d, slope = head_operands(options, b, h)
                if options.has_mask and tile_fully_masked(mask2d, 0, Sq, j0, j1, left, right):
                    # the tiled forward skips this tile for this head: P~ = 0 on its rows
                    sg[:] = -np.inf
                    continue
                part_tiles[b, hk, c, g] += 1
                if options.check_overflow and not tile_finite and not all_finite(sg):
                    bad = 1
                # soft-cap, bias and mask: the second half of tile.tile_scores
                if finish_scores(sg, 0, j0, cls != FULL, mask2d, bias2d, slope, sg, False,
                                 options):
                    bad = 1
            # m, l, O~ rescaled to the new row max; s becomes P~ = e^{S - m_new}
            rescale_rows(s, m, l, acc)
            if dropout:
                for g in range(group):
                    h = hk * group + g
                    # P~ <- Z o P~, the counters of head h's rows (as in the tiled forward)
                    drop_tile(s[g * Sq:(g + 1) * Sq],
                              options.offset + ((b * H + h) * Sq) * Sk + j0, Sk, options.seed,
                              drop_threshold)
            # O~ <- O~ + P~ V_j     (V_j read once for the whole group)
            if rows <= GEMV_MAX_ROWS:
                pv_few_rows(s, v[b, hk, j0:j1], acc)
            else:
                gemm_nn(s, v[b, hk, j0:j1], acc, 1.0, 1.0)
        # a NaN or inf in V_j reaches O~ only (P~ = 0 times inf is NaN): flagged as K's are
        if not all_finite(acc):
            part_nonfinite[b, hk, c] = 1
        part_overflow[b, hk, c] = bad


@njit(parallel=True, cache=CACHE)
def merge_splits(part_m, part_l, part_acc, part_tiles, drop_threshold, o, lse, row_max,
                 tiles_done):
    """Combine the chunks' partial states into o, lse, row_max; in chunk order (deterministic).

    part_* as :func:`flash_decode_kernel` leaves them; o (B, H, Sq, Dv), lse and row_max
    (B, H, Sq) as the tiled forward returns them; tiles_done (B * H,) int64.
    """
    B, Hkv, n_split, rows = part_m.shape
    H, Sq = o.shape[1], o.shape[2]
    Dv = o.shape[3]
    group = H // Hkv
    inv_keep = inv_keep_probability(drop_threshold)
    for t in prange(B * H * Sq):
        b = t // (H * Sq)
        h = (t // Sq) % H
        i = t % Sq
        hk = h // group
        r = (h % group) * Sq + i
        # the chunks' states folded in, in chunk order, by the forward's per-row update with the
        # chunk's max m_c as the tile max: m' = max(m, m_c), alpha = e^{m - m'}, and then
        # l <- alpha l + e^{m_c - m'} l_c,  O~ <- alpha O~ + e^{m_c - m'} O~_c
        mx = -np.inf
        total = 0.0
        out = o[b, h, i]
        out[:] = 0.0
        for c in range(n_split):
            m_c = part_m[b, hk, c, r]
            if m_c == -np.inf:
                continue   # an empty chunk: l_c = 0, O~_c = 0
            mx, alpha, total = online_row_step(mx, total, m_c)
            # w_c = e^{m_c - m'}
            w = math.exp(m_c - mx)
            # l <- alpha l + w_c l_c
            total += w * part_l[b, hk, c, r]
            for d in range(Dv):
                # O~ <- alpha O~ + w_c O~_c
                out[d] = alpha * out[d] + w * part_acc[b, hk, c, r, d]
        # m = max_c m_c
        row_max[b, h, i] = mx
        if mx == -np.inf:
            # no allowed key in any chunk: O = 0, LSE = -inf (never e^{-inf + inf} = NaN)
            lse[b, h, i] = -np.inf
        else:
            # LSE = m + log(l)
            lse[b, h, i] = mx + math.log(total)
            # O = O~ / l   (and / (1 - p) with dropout: the survivors' scale)
            inv = inv_keep / total if drop_threshold > 0 else 1.0 / total
            for d in range(Dv):
                out[d] *= inv
        if i == 0:
            n = 0
            for c in range(n_split):
                n += part_tiles[b, hk, c, h % group]
            tiles_done[b * H + h] = n


#: :func:`flash_decode_kernel` and :func:`merge_splits` built without ``parallel``
#: (:func:`~flashlab.numba_cache.serial_twin`), for problems too small to wake the thread pool
flash_decode_serial = serial_twin(flash_decode_kernel)
merge_splits_serial = serial_twin(merge_splits)
