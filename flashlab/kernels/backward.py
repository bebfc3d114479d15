r"""Tiled FlashAttention backward: recompute $P$ tile by tile from the forward's LSE.

The forward keeps only $O$ and $\mathrm{LSE}_i = \log\sum_j e^{S_{ij}}$ per row, never the
$S_q \times S_k$ matrix $P$. The backward gets it back one tile at a time, exactly:

$$
P_{ij} = \frac{e^{S_{ij}}}{\sum_{j'} e^{S_{ij'}}} = e^{S_{ij} - \mathrm{LSE}_i},
$$

so a single pass over the tiles suffices (no running maximum, no rescaling). With
$D_i = \operatorname{rowsum}(dO_i \circ O_i)$ (which equals $\sum_j P_{ij}\, dP_{ij}$, the
softmax Jacobian's correction term, but costs $O(D_v)$ per row instead of $O(S_k)$), each
visited tile (query block $i$, key block $j$) does

$$
\begin{aligned}
S &= \text{scale}\,(Q_i K_j^\top + Q^{rope}_i {K^{rope}_j}^\top), \qquad P = e^{S - \mathrm{LSE}_i}\\
dV_j &\mathrel{+}= P^\top dO_i \\
dP &= dO_i V_j^\top \\
dS &= P \circ (dP - D_i) \\
dQ_i &\mathrel{+}= \text{scale}\; dS\, K_j \\
dK_j &\mathrel{+}= \text{scale}\; dS^\top Q_i \\
dQ^{rope}_i &\mathrel{+}= \text{scale}\; dS\, K^{rope}_j \\
dK^{rope}_j &\mathrel{+}= \text{scale}\; dS^\top Q^{rope}_i
\end{aligned}
$$

**FLOPs.** That is 5 matrix products per tile ($QK^\top$, $P^\top dO$, $dO V^\top$, $dS K$,
$dS^\top Q$) against the forward's 2 ($QK^\top$, $PV$): the backward costs about 2.5x the
forward, the well-known ratio. (The rope operands add 3 thin products of width $D_r$.)

**Parallel split and determinism.** The result must be the same bits on every run and for
every thread count, so no two threads may ever add into the same output element, and every
sum must be taken in an order fixed by the problem alone. Two classic designs:

* parallel over key blocks (each thread owns $dK_j, dV_j$) and a *second pass* over query
  blocks for $dQ$: deterministic, but the second pass recomputes $S$ and $dP$, 7 products
  per tile instead of 5 (+40 %);
* atomics into $dQ$ (FlashAttention-2's default): 5 products, but the summation order
  depends on thread timing — not deterministic.

This kernel keeps 5 products *and* determinism. The parallel work item is
``(b, h, c)``: query head ``h`` of batch ``b`` and a chunk ``c`` of that head's query blocks
(``n_split`` chunks, query block ``qb`` belongs to chunk ``qb % n_split``; interleaving
balances causal masks, where late blocks see more keys). The item owns the $dQ$ rows of its
query blocks outright, and adds $dK_j, dV_j$ (and $dK^{rope}_j$) into its **own partial
buffer** ``part[b, h, c]`` of shape ``(Sk, D)``, visiting tiles in a fixed order. A second,
cheap kernel (:func:`sum_partials`) then adds the partials of the heads that share a kv
head (GQA) and of the chunks, in a fixed order: $O(H\,S_k\,D)$ additions against the
$O(H\,S_q\,S_k\,D)$ of the tiles. ``n_split`` is chosen from the shape only
(:func:`flashlab.tiling.q_splits`: 1 when ``B*H >= 4``), never from the thread count, so one thread and
many threads produce the same bits. The price is memory: the partial buffers hold
``B*H*n_split*Sk*(Dqk+Dv+Dr)`` numbers — what FlashAttention-2 also allocates for GQA
(``dk_expanded``) — and none at all for plain multi-head attention with ``n_split = 1``,
where ``part`` *is* the output (see :func:`flashlab.api.flash_attention_backward`).

**Tile skipping** is the forward's, by construction: the same
:func:`flashlab.masks.kv_block_range` and :func:`flashlab.masks.tile_visit_class` decide
which tiles are visited,
:func:`flashlab.masks.band_box` which rows and columns of a partial tile are computed, and the
forward's scores stage :func:`~flashlab.kernels.tile.tile_scores` recomputes $S$ — so $P$ is
recomputed from the very scores the forward normalised.

**The scores stage.** With a logit soft-cap $c > 0$ the scores are
$S = c \tanh(S_0 / c) + \text{bias}$, $S_0 = \text{scale}\,Q K^\top$; the chain rule multiplies
$dS$ by $\partial S / \partial S_0 = 1 - \tanh^2(S_0 / c)$, which the scores stage
(:mod:`flashlab.kernels.scorestep`) hands back for the tile, before $dQ$ and $dK$ take it (the
bias gradient is $dS$ before that factor).

**Bias and dropout.** $S$ is recomputed with the forward's bias
(:func:`~flashlab.kernels.tile.add_bias_tile`), and
its gradient is $dS$ itself (the bias is added after scaling): with ``dbias_part`` the kernel
adds $dS$ into a buffer of the bias's own broadcast shape per work item. With dropout
$O = (Z \circ P / k) V$ ($k$ the keep probability), so $dV = (Z \circ P / k)^\top dO$ and
$dP \leftarrow Z \circ dP / k$ before $dS = P \circ (dP - D)$; $D = \operatorname{rowsum}(dO
\circ O)$ still equals $\sum_j P_{ij}\, dP_{ij}$. $Z$ is recomputed from the same counters as
the forward (:mod:`flashlab.dropout`).

**Exact zeros.** A row with exactly one allowed key has $P = 1$ there, so $D_i = dP_{ij}$ and
$dS = 0$: its softmax does not depend on the scores at all. Computed, $dP_{ij}$ and $D_i$ are
the same dot product rounded in two orders; :func:`zero_one_key_rows` writes the exact 0, so
such a row gives $dQ = 0$ and adds nothing to $dK$, as the reference does.

**Rows with no allowed key** have $\mathrm{LSE} = -\infty$; their $P$ row is set to 0
(never $e^{-\infty + \infty}$ = NaN), so they contribute nothing to any gradient.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from flashlab.dropout import inv_keep_probability
from flashlab.kernels.blas import gemm_nn, gemm_nt, gemm_tn  # (importing blas pins it to 1 thread)
from flashlab.kernels.tile import (
    drop_tile,
    exp_shifted,
    head_operands,
    scores_chain,
    store_scaled,
    tile_scores,
)
from flashlab.masks import EMPTY, FULL, band_box, cdiv_jit, kv_block_range, mask_at, tile_visit_class
from flashlab.numba_cache import CACHE, serial_twin

__all__ = ["row_dot", "probs_from_lse", "first_foreign_row", "ds_from_dp", "one_allowed_key", "one_key_probs",
           "zero_one_key_rows", "add_pt_do", "scale_kept", "scale_by", "add_dbias", "flash_backward_kernel",
           "sum_partials", "flash_backward_serial", "sum_partials_serial"]

@njit(cache=CACHE)
def row_dot(do_blk, o_blk, dsum):
    """D_i = rowsum(dO_i * O_i) into ``dsum`` (rows,); do_blk, o_blk (rows, Dv)."""
    for r in range(do_blk.shape[0]):
        acc = 0.0
        for d in range(do_blk.shape[1]):
            acc += do_blk[r, d] * o_blk[r, d]
        dsum[r] = acc


@njit(cache=CACHE)
def probs_from_lse(s, lse_blk, psum=None):
    """Overwrite the score tile ``s`` (rows, cols) with P = e^{S - LSE}.

    ``lse_blk`` (rows,). A row with LSE = -inf (no allowed key) gets P = 0; masked entries
    (S = -inf) give e^{-inf} = 0. Uses the forward's vectorised :func:`flashlab.kernels.tile.exp_shifted`
    (LSE >= rowmax(S), so every exponent is <= 0 as it requires). With ``psum`` (rows,), adds
    each row's sum of P into it, and for a row with LSE = -inf its count of allowed (finite)
    scores, which must be 0 (:func:`first_foreign_row`).
    """
    rows, cols = s.shape
    for r in range(rows):
        m = lse_blk[r]
        if m == -np.inf:
            for c in range(cols):
                if psum is not None and s[r, c] != -np.inf:
                    psum[r] += 1.0
                s[r, c] = 0.0
            continue
        # P_ij = exp(S_ij - LSE_i)   (exp_shifted returns the row's sum, kept with psum)
        total = exp_shifted(s[r], m)
        if psum is not None:
            psum[r] += total


@njit(cache=CACHE)
def first_foreign_row(psum, lse_blk, tol):
    r"""The first row whose P did not sum to 1, or -1: ``lse_blk`` is then not its forward's.

    ``psum`` (rows,) the sums :func:`probs_from_lse` kept over every visited tile (all of a
    row's allowed keys). The forward's LSE gives :math:`\sum_j P_{ij} = 1` up to rounding:
    :math:`\lvert \sum_j P_{ij} - 1 \rvert \le \mathrm{tol} \cdot \max(1, \lvert \mathrm{LSE}_i \rvert)`
    (the LSE's own rounding grows with its size); a row with LSE = -inf has no allowed key, so
    its sum is exactly 0.
    NaN fails the comparison.
    """
    for r in range(psum.shape[0]):
        m = lse_blk[r]
        if m == -np.inf:
            if psum[r] != 0.0:
                return r
        elif not abs(psum[r] - 1.0) <= tol * max(1.0, abs(m)):
            return r
    return -1


@njit(cache=CACHE)
def ds_from_dp(p, dp, dsum):
    """Overwrite ``dp`` (rows, cols) with $dS = P \\circ (dP - D)$; ``dsum`` (rows,) is $D$."""
    rows, cols = p.shape
    for r in range(rows):
        for c in range(cols):
            # dS_ij = P_ij (dP_ij - D_i)
            dp[r, c] = p[r, c] * (dp[r, c] - dsum[r])


@njit(cache=CACHE)
def one_allowed_key(i, sk, left, right, mask2d, has_mask, bias2d, has_bias):
    """True when row ``i`` has exactly one allowed key (band, dense mask and ``-inf`` bias).

    The band gives the candidates ``[i - left, i + right]``; with a mask or bias they are read
    until a second allowed key turns up (so a row with many keys costs two reads).
    """
    j_lo = max(0, i - left)
    j_hi = min(sk - 1, i + right)
    if j_hi < j_lo:
        return False
    if not has_mask and not has_bias:
        return j_hi == j_lo
    n = 0
    for j in range(j_lo, j_hi + 1):
        if has_mask and mask_at(mask2d, i, j):
            continue
        if has_bias and mask_at(bias2d, i, j) == -np.inf:
            continue
        n += 1
        if n > 1:
            return False
    return n == 1


@njit(cache=CACHE)
def one_key_probs(p, one_key):
    """P = 1 exactly on the allowed key of the rows with one allowed key (``one_key`` (rows,)).

    Such a row's softmax is 1 on its key whatever its score, and the forward's O is exactly
    that key's value row. Recomputed, $e^{S - \\mathrm{LSE}}$ is 1 only when the backward's
    score has the bits of the one the forward's LSE was taken from; a gemm of another shape
    (the decode kernel stacks a kv group's rows, the backward takes one head's band box) may
    round it differently: up to 2.4e-7 apart (issue 22: Sq=1, Sk=239 causal, dV error 1.7e-6).
    The allowed entry is the row's only non-zero P (masked entries are $e^{-\\infty} = 0$).
    """
    for r in range(p.shape[0]):
        if one_key[r]:
            for c in range(p.shape[1]):
                if p[r, c] != 0.0:
                    # P_ij = 1: the softmax of a single key
                    p[r, c] = 1.0


@njit(cache=CACHE)
def zero_one_key_rows(ds, one_key):
    """dS = 0 on the rows with one allowed key (``one_key`` (rows,) bool).

    Such a row has P = 1 on its key and 0 elsewhere, so dS = P (dP - D) = dP - dP = 0 exactly;
    computed, $dP_{ij}$ (a gemm) and $D_i$ (:func:`row_dot`) are the same dot product summed
    in different orders and leave a rounding residue that would reach dQ and dK.
    """
    for r in range(ds.shape[0]):
        if one_key[r]:
            for c in range(ds.shape[1]):
                ds[r, c] = 0.0


@njit(cache=CACHE)
def add_pt_do(p, do_t, dv_blk, alpha, slice_rows):
    """``dv_blk += alpha * p^T @ do_t``, one gemm per ``slice_rows`` query rows, in row order.

    p (rows, cols) the tile's P (or Z o P); do_t (rows, Dv); dv_blk (cols, Dv). A gemm sums
    its ``rows`` products per entry in one register before adding them to ``dv_blk``: with
    the 512-row tile that is a chain of 512 float32 additions. In slices of 64 the chain is
    64 long plus one addition per slice, the error of a 64-row tile (issue 22: varlen 511 x 1,
    32/8 heads, D=64: dV error 7.8e-5 in one gemm, 2.5e-5 in slices of 64).
    """
    rows = p.shape[0]
    for r0 in range(0, rows, slice_rows):
        r1 = min(r0 + slice_rows, rows)
        # dV_j += alpha P[r0:r1]^T dO[r0:r1]
        gemm_tn(p[r0:r1], do_t[r0:r1], dv_blk, alpha, 1.0)


@njit(cache=CACHE)
def scale_kept(dp, p_drop, inv_keep):
    """dP <- Z o dP / k: keep ``dp`` where ``p_drop`` (the dropped P, 0 where Z = 0) survived."""
    rows, cols = dp.shape
    for r in range(rows):
        for c in range(cols):
            # dP_ij <- Z_ij dP_ij / k
            dp[r, c] = dp[r, c] * inv_keep if p_drop[r, c] != 0.0 else 0.0


@njit(cache=CACHE)
def scale_by(x, f):
    """``x <- x o f`` element-wise, for 2-D arrays of one shape."""
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            x[r, c] *= f[r, c]


@njit(cache=CACHE)
def add_dbias(ds, i0, j0, dbias2d):
    """dbias[i, j] += dS_ij, summing over the axes that dbias2d (Sq or 1, Sk or 1) broadcasts."""
    rows, cols = ds.shape
    for r in range(rows):
        i = i0 + r if dbias2d.shape[0] > 1 else 0
        for c in range(cols):
            j = j0 + c if dbias2d.shape[1] > 1 else 0
            dbias2d[i, j] += ds[r, c]


@njit(parallel=True, cache=CACHE)
def flash_backward_kernel(do, q, k, v, o, lse, n_split, dq, dk_part, dv_part, dq_rope,
                          dkr_part, dbias_part, tiles_done, overflow, lse_tol, lse_row,
                          lse_sum, dv_rows, options):
    """Tiled recomputation backward, in place into ``dq``, the partials and ``dq_rope``.

    Inputs (C-contiguous, accumulation dtype float32 or float64 unless said):
    do (B, H, Sq, Dv); q (B, H, Sq, Dqk); k (B, Hkv, Sk, Dqk); v (B, Hkv, Sk, Dv);
    o (B, H, Sq, Dv); lse (B, H, Sq); ``options`` the
    :class:`~flashlab.kernels.options.TileOptions` given to
    :func:`flashlab.kernels.forward.flash_forward_kernel` (RoPE operands, mask, bias, ALiBi,
    scale, soft-cap, band, tiles, dropout, ``check_overflow``), with ``want_dbias``;
    ``n_split`` query-block chunks per head.

    Outputs: dq (B, H, Sq, Dqk); dq_rope (B, H, Sq, Dr) (untouched without rope);
    dk_part (B, H, n_split, Sk, Dqk), dv_part (B, H, n_split, Sk, Dv),
    dkr_part (B, H, n_split, Sk, Dr) zero-initialised partial sums, one per work item
    (reduce them with :func:`sum_partials`); with ``options.want_dbias``, dbias_part
    (B, H, n_split or 1, Sqb, Skb) zero-initialised: work item (b, h, c) adds dS into
    ``dbias_part[b, h, c]`` when the bias broadcasts over the rows (Sqb = 1) and into
    ``dbias_part[b, h, 0]`` otherwise (its rows are its own); tiles_done and overflow
    (B * H * n_qblocks,) int64 as in the forward. ``lse_tol``: the tolerance of
    :func:`first_foreign_row`; lse_row (B * H * n_qblocks,) int64 gets the first query row of
    each q-block whose P does not sum to 1 (-1 when none: the LSE is its forward's) and
    lse_sum (B * H * n_qblocks,) float64 that row's sum. ``dv_rows``: the query rows per dV gemm
    (:func:`add_pt_do`; :data:`flashlab.tiling.DV_SLICE_ROWS`).
    """
    B, H, Sq, Dqk = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale, left, right = options.scale, options.left, options.right
    block_q, block_k = options.block_q, options.block_k
    has_rope, has_mask, has_bias = options.has_rope, options.has_mask, options.has_bias
    q_rope, k_rope = options.q_rope, options.k_rope
    drop_threshold, want_dbias = options.drop_threshold, options.want_dbias
    # the scores are a nonlinear function of the scaled products (the soft-cap): chain dS
    chain = scores_chain(options)
    Dr = q_rope.shape[3]
    group = H // Hkv              # GQA: query head h reads kv head h // group
    group_r = H // k_rope.shape[1]
    n_qb = cdiv_jit(Sq, block_q)
    dt = dq.dtype
    dropout = drop_threshold > 0
    inv_keep = inv_keep_probability(drop_threshold)
    # work item (b, h, c): head h of batch b, query blocks qb with qb % n_split == c
    for t in prange(B * H * n_split):
        b = t // (H * n_split)
        h = (t // n_split) % H
        c = t % n_split
        hk = h // group
        hr = h // group_r
        mask2d, bias2d, slope = head_operands(options, b, h)
        dbias2d = dbias_part[b, h, c if dbias_part.shape[2] > 1 else 0]
        dk_acc, dv_acc, dkr_acc = dk_part[b, h, c], dv_part[b, h, c], dkr_part[b, h, c]
        # flat scratch buffers: a (rows, cols) reshape of a head is C-contiguous (BLAS needs it)
        s_buf = np.empty(block_q * block_k, dtype=dt)
        dp_buf = np.empty(block_q * block_k, dtype=dt)
        pd_buf = np.empty(block_q * block_k if dropout else 1, dtype=dt)
        # the scores stage's derivative dS/ds of each score of the tile (scorestep.slope)
        dc_buf = np.empty(block_q * block_k if chain else 1, dtype=dt)
        dsum = np.empty(block_q, dtype=dt)
        psum = np.empty(block_q, dtype=np.float64)
        one_key = np.empty(block_q, dtype=np.bool_)
        for qb in range(c, n_qb, n_split):
            i0 = qb * block_q
            i1 = min(i0 + block_q, Sq)
            rows = i1 - i0
            # scale Q_i once per q-block: S = (scale Q_i) K_j^T, as in the forward, and
            # scale dS^T Q_i = dS^T (scale Q_i)
            qs = q[b, h, i0:i1] * scale
            qrs = q_rope[b, h, i0:i1] * scale if has_rope else q_rope[0, 0, 0:1]
            do_blk = do[b, h, i0:i1]
            lse_blk = lse[b, h, i0:i1]
            # D_i = rowsum(dO_i * O_i)
            row_dot(do_blk, o[b, h, i0:i1], dsum[:rows])
            for r in range(rows):
                one_key[r] = one_allowed_key(i0 + r, Sk, left, right, mask2d, has_mask,
                                             bias2d, has_bias)
            dq_acc = np.zeros((rows, Dqk), dtype=dt)
            dqr_acc = np.zeros((rows, Dr), dtype=dt)
            psum[:rows] = 0.0
            done = 0
            bad = 0
            # the forward's tile loop: same kv-block range, same skips
            kb0, kb1 = kv_block_range(i0, i1, Sk, block_k, left, right)
            for kb in range(kb0, kb1):
                j0 = kb * block_k
                j1 = min(j0 + block_k, Sk)
                cls = tile_visit_class(i0, i1, j0, j1, left, right, mask2d, has_mask)
                if cls == EMPTY:
                    continue
                # the forward's box: rows [ti0, ti1) x cols [tj0, tj1) of a partial tile hold
                # all its allowed entries; the rest has P = 0 and adds 0 to every gradient
                ti0, ti1, tj0, tj1 = band_box(i0, i1, j0, j1, left, right)
                r0, r1 = ti0 - i0, ti1 - i0
                rows_t, cols = r1 - r0, tj1 - tj0
                k_blk = k[b, hk, tj0:tj1]
                v_blk = v[b, hk, tj0:tj1]
                kr_blk = k_rope[b, hr, tj0:tj1] if has_rope else k_rope[0, 0, 0:1]
                qs_t = qs[r0:r1]
                qrs_t = qrs[r0:r1] if has_rope else qrs
                do_t = do_blk[r0:r1]
                s = s_buf[: rows_t * cols].reshape((rows_t, cols))
                dp = dp_buf[: rows_t * cols].reshape((rows_t, cols))
                dc = dc_buf[: rows_t * cols].reshape((rows_t, cols)) if chain else dc_buf.reshape((1, 1))
                # S = score(scale (Q_i K_j^T + Q^rope_i K^rope_j^T)) + bias, masked entries
                # -inf: the forward's scores stage (dc gets dS/ds where the stage transforms)
                if tile_scores(s, qs_t, k_blk, qrs_t, kr_blk, ti0, tj0, cls != FULL, mask2d,
                               bias2d, slope, dc, chain, options):
                    bad = 1
                # P = exp(S - LSE_i)   (s now holds P; psum_i += sum_j P_ij)
                probs_from_lse(s, lse_blk[r0:r1], psum[r0:r1])
                # P = 1 exactly on the key of a row with one allowed key
                one_key_probs(s, one_key[r0:r1])
                # dP = dO_i V_j^T
                gemm_nt(do_t, v_blk, dp, 1.0, 0.0)
                if dropout:
                    pd = pd_buf[: rows_t * cols].reshape((rows_t, cols))
                    store_scaled(pd, s, 1.0)        # pd = P
                    # Z o P: the forward's dropped entries, from the same counters
                    drop_tile(pd, options.offset + ((b * H + h) * Sq + ti0) * Sk + tj0, Sk,
                              options.seed, drop_threshold)
                    # dV_j += (Z o P / k)^T dO_i
                    add_pt_do(pd, do_t, dv_acc[tj0:tj1], inv_keep, dv_rows)
                    # dP <- Z o dP / k
                    scale_kept(dp, pd, inv_keep)
                else:
                    # dV_j += P^T dO_i            (gemms with beta = 1: accumulated in place)
                    add_pt_do(s, do_t, dv_acc[tj0:tj1], 1.0, dv_rows)
                # dS = P * (dP - D_i)   (dp now holds dS)
                ds_from_dp(s, dp, dsum[r0:r1])
                # dS = 0 exactly on rows with a single allowed key
                zero_one_key_rows(dp, one_key[r0:r1])
                if want_dbias:
                    # dbias += dS   (the bias is added after scaling)
                    add_dbias(dp, ti0, tj0, dbias2d)
                if chain:
                    # dS <- dS o dS/d(scaled product)   (1 - tanh^2(s / c) for a soft-cap c)
                    # (the bias is added after the transform: dbias above took dS before it)
                    scale_by(dp, dc)
                # dQ_i += dS K_j   (the factor scale is applied once, after the last tile)
                gemm_nn(dp, k_blk, dq_acc[r0:r1], 1.0, 1.0)
                # dK_j += scale dS^T Q_i = dS^T (scale Q_i)
                gemm_tn(dp, qs_t, dk_acc[tj0:tj1], 1.0, 1.0)
                if has_rope:
                    # dQ^rope_i += dS K^rope_j   (times scale after the last tile)
                    gemm_nn(dp, kr_blk, dqr_acc[r0:r1], 1.0, 1.0)
                    # dK^rope_j += scale dS^T Q^rope_i = dS^T (scale Q^rope_i)
                    gemm_tn(dp, qrs_t, dkr_acc[tj0:tj1], 1.0, 1.0)
                done += 1
            # dQ_i = scale * sum_j dS K_j
            store_scaled(dq[b, h, i0:i1], dq_acc, scale)
            if has_rope:
                # dQ^rope_i = scale * sum_j dS K^rope_j
                store_scaled(dq_rope[b, h, i0:i1], dqr_acc, scale)
            tiles_done[(b * H + h) * n_qb + qb] = done
            overflow[(b * H + h) * n_qb + qb] = bad
            # sum_j P_ij = 1 for every row (0 without keys): else lse is not this forward's
            r = first_foreign_row(psum[:rows], lse_blk, lse_tol)
            lse_row[(b * H + h) * n_qb + qb] = -1 if r < 0 else i0 + r
            lse_sum[(b * H + h) * n_qb + qb] = 0.0 if r < 0 else psum[r]


@njit(parallel=True, cache=CACHE)
def sum_partials(part, out):
    """out[b, g] = sum over the heads h of group g, then over chunks c, of part[b, h, c].

    part (B, H, n_split, Sk, D); out (B, G, Sk, D) with ``H % G == 0`` (G = Hkv for dK, dV;
    Hr for dK^rope); head ``h`` belongs to group ``h // (H // G)``. Each output row is summed
    by one thread in the fixed order (h, c): the same bits for any thread count.
    """
    B, H, n_split, Sk, D = part.shape
    G = out.shape[1]
    per = H // G
    for t in prange(B * G * Sk):
        b = t // (G * Sk)
        g = (t // Sk) % G
        j = t % Sk
        for d in range(D):
            out[b, g, j, d] = 0.0
        for h in range(g * per, (g + 1) * per):
            for c in range(n_split):
                for d in range(D):
                    # dK_g = sum_{h in group g} sum_c dK_{h, c}
                    out[b, g, j, d] += part[b, h, c, j, d]


#: :func:`flash_backward_kernel` and :func:`sum_partials` built without ``parallel``
#: (:func:`~flashlab.numba_cache.serial_twin`), for problems too small to wake the thread pool
flash_backward_serial = serial_twin(flash_backward_kernel)
sum_partials_serial = serial_twin(sum_partials)
