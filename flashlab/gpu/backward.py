r"""The fused backward on CUDA: :mod:`flashlab.kernels.backward`'s tile math in FlashAttention-2's split.

The same recomputation as on the CPU: $P$ is never stored; each visited tile gets it back
from the forward's LSE, $P_{ij} = e^{\text{scale}\, Q_i K_j^\top - \mathrm{LSE}_i}$, and with
$D_i = \operatorname{rowsum}(dO_i \circ O_i)$

$$
dV_j \mathrel{+}= P^\top dO_i,\quad dP = dO_i V_j^\top,\quad dS = P \circ (dP - D_i),\quad
dQ_i \mathrel{+}= \text{scale}\; dS\, K_j,\quad dK_j \mathrel{+}= \text{scale}\; dS^\top Q_i .
$$

**Mapping (FlashAttention-2's backward).** The loop order is the transpose of the forward's:
one thread block per (batch, **kv head**, key block $j$). The block stages $K_j$ and $V_j$ in
shared memory once, then visits every query block $i$ whose tile the mask lets through (the
forward's tile skipping, :func:`flashlab.masks.kv_block_range`, transposed on the host:
:func:`flashlab.gpu.attention.q_blocks`), for every query head of the kv head's group (GQA).
Inside the block **warps own key rows**, as the forward's own query rows: lane ``(ty, tx)``
of warp ``w`` holds ``TM`` key rows ``r0 .. r0 + TM - 1`` and, in registers for the whole
loop, its micro-tiles of $dK_j$ and $dV_j$ (those rows x the columns ``tx, tx + 8, ...``).
Per visited query block:

1. $Q_i$ and $dO_i$ go to padded shared tiles, $\mathrm{LSE}_i$ and $D_i$ to shared vectors;
   $D = \operatorname{rowsum}(dO \circ O)$ was computed once before, as in FlashAttention-2, by
   a small preprocessing kernel (:func:`dot_kernel`: it streams $dO$ and $O$ once, where
   recomputing $D_i$ on every visit would re-read $O_i$ there);
2. each lane computes its ``TM x TN`` micro-tiles of $S^\top = K_j Q_i^\top$ and
   $dP^\top = V_j\, dO_i^\top$ (:func:`flashlab.gpu.tiles.product_abt`, keys x queries), and from
   them $P^\top$ and $dS^\top$ in registers, written to two padded shared tiles;
3. $dV_j \mathrel{+}= P^\top dO_i$ and $dK_j \mathrel{+}= dS^\top Q_i$ into the lane's register
   tiles (:func:`flashlab.gpu.tiles.product_ab`): no atomics, the block owns $K_j$'s rows;
4. $dQ_i \mathrel{+}= \text{scale}\; dS\, K_j$: the block's threads split $dQ_i$ into micro-tiles
   (:func:`flashlab.gpu.tiles.product_atb`, reading the $dS^\top$ tile transposed) and add them
   into global $dQ$ with **atomic adds**, because every key block adds into the same $dQ_i$.
   The atomics are on $dQ$ only, as in FlashAttention-2.

$dK_j$ and $dV_j$ are written once, at the end (GQA: summed over the group in registers).
Every loop over a micro-tile has a compile-time trip count: the tiles live in registers
(``python -m flashlab.gpu.inspect`` checks: no local memory, no spills).

**Determinism.** The atomic adds into $dQ$ happen in an order set by block timing, as in
FlashAttention-2's default backward: float32 $dQ$ can differ in the last bits from run to run
on a GPU. The tests compare against the float64 reference with a tolerance, never bit for bit.

**Exact zeros.** A row with exactly one allowed key (causal row 0) has $P = 1$ there and
$dS = 0$ exactly; as :func:`flashlab.kernels.backward.zero_one_key_rows` does, its $dS$ is
written as 0 (computed, $dP - D$ would be a rounding difference).

**Counting** as in the forward: a second build of both kernels with ``count=True`` adds every
global load and store (an atomic add counts as a 4-byte store) into ``counter``; the closed
form is :func:`flashlab.traffic.tiled_attention_traffic` with ``backward=True``. The zero-filled
$dQ$ the atomics add into is prepared by the host before the launch and not counted.
"""
from __future__ import annotations

import math
from functools import lru_cache

from numba import float32

from flashlab.gpu.forward import warp_tiling
from flashlab.gpu.target import cuda as _select_target
from flashlab.gpu.tiles import (
    LANE_COLS,
    LANE_ROWS,
    WARP,
    conflict_free_pad,
    flush,
    lane_tile,
    product_ab,
    product_abt,
    product_atb,
    score_slope,
    score_step,
    stage,
    stage_transforms,
    unroll_by,
)

cuda = _select_target()   # the kernels name `cuda` as a module global (the simulator swaps it)

__all__ = ["backward_kernel", "backward_shared_bytes", "backward_threads", "backward_tiling",
           "dot_kernel", "DOT_ROWS"]

#: query rows per block of :func:`dot_kernel` (8 lanes per row)
DOT_ROWS = 16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def backward_tiling(block_q: int, block_k: int, d_qk: int, d_v: int) -> dict[str, int]:
    """The backward block's work split (see the module docstring).

    ``warps``; ``tm`` key rows and ``tn`` query columns of a lane's $S^\\top$ micro-tile
    (:func:`flashlab.gpu.forward.warp_tiling` with keys in the rows); ``tdk`` / ``tdv`` columns
    of its $dK$ / $dV$ micro-tiles; ``tmq`` query rows of its $dQ$ micro-tile (columns
    ``tdk``, added ``chunk`` columns at a time).
    """
    nw, tm, tn, tdv = warp_tiling(block_k, block_q, d_v)
    tdk = _cdiv(d_qk, LANE_COLS)
    return {"warps": nw, "tm": tm, "tn": tn, "tdk": tdk, "tdv": tdv,
            "tmq": _cdiv(block_q, LANE_ROWS * nw), "chunk": unroll_by(tdk)}


def backward_threads(block_q: int, block_k: int, d_qk: int, d_v: int) -> int:
    """Threads per backward block: 32 per warp, each warp owning ``4 tm`` key rows."""
    return WARP * backward_tiling(block_q, block_k, d_qk, d_v)["warps"]


def _shapes(block_q: int, block_k: int, d_qk: int, d_v: int) -> dict[str, tuple[int, ...]]:
    """The backward block's shared tiles (rows, padded width) and vectors, float32."""
    t = backward_tiling(block_q, block_k, d_qk, d_v)
    tm = t["tm"]
    rq = LANE_COLS * t["tn"]                     # query rows the lanes address (>= block_q)
    rk = t["warps"] * LANE_ROWS * tm             # key rows (>= block_k)
    wk, wv = LANE_COLS * t["tdk"], LANE_COLS * t["tdv"]   # widths the dK / dV lanes address
    # dQ's lanes read the dS^T tile's columns up to 4 warps tmq (maybe past rq: never stored)
    wp = max(rq + conflict_free_pad(rq, tm), LANE_ROWS * t["warps"] * t["tmq"])
    return {"q": (rq, wk + conflict_free_pad(wk, tm)), "do": (rq, wv + conflict_free_pad(wv, tm)),
            "k": (rk, wk + conflict_free_pad(wk, tm)), "v": (rk, wv + conflict_free_pad(wv, tm)),
            "p": (rk, wp), "ds": (rk, wp), "lse": (rq,), "dd": (rq,)}


def backward_shared_bytes(block_q: int, block_k: int, d_qk: int, d_v: int) -> int:
    """Shared memory of one backward block: Q_i, dO_i, K_j, V_j, P^T, dS^T tiles (padded), LSE_i, D_i."""
    return 4 * sum(math.prod(s) for s in _shapes(block_q, block_k, d_qk, d_v).values())


@lru_cache(maxsize=None)
def dot_kernel(d_v: int, count: bool):
    """``D = rowsum(dO o O)``, the backward's preprocessing; grid (B*H, ceil(Sq/DOT_ROWS)),
    ``8 DOT_ROWS`` threads: 8 lanes per row, lane ``tx`` reading columns ``tx, tx + 8, ...``
    (neighbouring lanes, neighbouring words), the 8 partial sums combined through shared memory.

    do, o (B, H, Sq, Dv) float32; dd (B, H, Sq) float32 out; counter (2,) int64.
    """
    DV, COUNT, R = d_v, count, DOT_ROWS
    LX = LANE_COLS
    TD = _cdiv(d_v, LX)

    @cuda.jit
    def backward_dot_gpu(do, o, dd, counter):
        H, Sq = do.shape[1], do.shape[2]
        b, h = cuda.blockIdx.x // H, cuda.blockIdx.x % H
        t = cuda.threadIdx.x
        r, tx = t // LX, t % LX
        i = cuda.blockIdx.y * R + r
        reads = writes = 0
        red = cuda.shared.array((R, LANE_COLS), float32)   # the 8 lanes' partial sums per row
        x = float32(0.0)
        if i < Sq:
            for e in range(TD):
                d = tx + LX * e
                if d < DV:
                    # D_i = sum_d dO_id O_id   (this lane's columns)
                    x += do[b, h, i, d] * o[b, h, i, d]
                    reads += 8
        red[r, tx] = x
        cuda.syncthreads()
        if i < Sq and tx == 0:
            total = float32(0.0)
            for y in range(LX):
                total += red[r, y]
            dd[b, h, i] = total
            writes += 4
        if COUNT:
            flush(counter, reads, writes)

    return backward_dot_gpu


@lru_cache(maxsize=None)
def backward_kernel(block_q: int, block_k: int, d_qk: int, d_v: int, count: bool):
    """The backward kernel for one tiling and head dims (compile-time constants), counting or not.

    Launch: grid ``(B * Hkv, ceil(Sk / block_k))``, :func:`backward_threads` threads.
    Arguments: do (B, H, Sq, Dv), q (B, H, Sq, Dqk), k (B, Hkv, Sk, Dqk), v (B, Hkv, Sk, Dv),
    lse and dd (B, H, Sq) float32 (dd = rowsum(dO o O) from :func:`dot_kernel`); q_blocks
    (n_kblocks, 2) int64, the query-block range ``[qb0, qb1)`` each key block visits; scale
    float32; left, right the band; scores the forward's scores stage
    (:class:`~flashlab.kernels.options.ScoresStage` of float32); outputs
    dq (B, H, Sq, Dqk) **zero-filled** (atomic adds),
    dk (B, Hkv, Sk, Dqk), dv (B, Hkv, Sk, Dv) float32;
    counter (2,) int64 (read, write bytes), added to only when ``count``.
    """
    BQ, BK, DQK, DV, COUNT = block_q, block_k, d_qk, d_v, count
    T = backward_tiling(block_q, block_k, d_qk, d_v)
    NW, TM, TN, TDK, TDV, TMQ, CH = (T[x] for x in ("warps", "tm", "tn", "tdk", "tdv", "tmq", "chunk"))
    NT = WARP * NW
    SH = _shapes(block_q, block_k, d_qk, d_v)
    QS, DOS, KS, VS, PS, DSS, RQ = SH["q"], SH["do"], SH["k"], SH["v"], SH["p"], SH["ds"], SH["lse"]
    QROWS, KROWS = QS[0], KS[0]
    LX = LANE_COLS
    s_of = product_abt(TM, TN, DQK, fresh=True)   # S^T micro-tile  = K_j Q_i^T
    dp_of = product_abt(TM, TN, DV, fresh=True)    # dP^T micro-tile = V_j dO_i^T
    dv_of = product_ab(TM, TDV, QROWS)    # dV_j micro-tile += P^T dO_i
    dk_of = product_ab(TM, TDK, QROWS)    # dK_j micro-tile += dS^T Q_i
    dq_of = product_atb(TMQ, CH, KROWS, fresh=True)   # dQ_i micro-tile (CH columns) = dS K_j

    @cuda.jit
    def flash_backward_gpu(do, q, k, v, lse, dd, q_blocks, scale, left, right, scores, dq, dk,
                           dv, counter):
        H, Sq = q.shape[1], q.shape[2]
        Hkv, Sk = k.shape[1], k.shape[2]
        group = H // Hkv                     # GQA: query heads hk group .. (hk + 1) group - 1
        b, hk = cuda.blockIdx.x // Hkv, cuda.blockIdx.x % Hkv
        kb = cuda.blockIdx.y
        j0 = kb * BK
        cols = min(BK, Sk - j0)              # key rows of this block
        t = cuda.threadIdx.x
        # warp w, lane (ty, tx): key rows r0 .. r0 + TM - 1, query columns tx + 8 c;
        # for dQ: query rows a0 .. a0 + TMQ - 1, columns tx + 8 e
        tx, r0 = lane_tile(t, TM)
        a0 = lane_tile(t, TMQ)[1]
        reads = writes = 0   # bytes this thread moves (flushed by the counting build only)
        qs = cuda.shared.array(QS, float32)
        dos = cuda.shared.array(DOS, float32)
        ks = cuda.shared.array(KS, float32)
        vs = cuda.shared.array(VS, float32)
        pts = cuda.shared.array(PS, float32)     # P^T tile (keys x queries)
        dsts = cuda.shared.array(DSS, float32)   # dS^T tile
        lse_s = cuda.shared.array(RQ, float32)   # LSE_i
        dd_s = cuda.shared.array(RQ, float32)    # D_i = rowsum(dO_i o O_i)
        st = cuda.local.array((TM, TN), float32)      # registers: S^T, then P^T
        dpt = cuda.local.array((TM, TN), float32)     # registers: dP^T, then dS^T
        dk_acc = cuda.local.array((TM, TDK), float32)  # registers: the lane's dK_j / scale
        dv_acc = cuda.local.array((TM, TDV), float32)  # registers: the lane's dV_j
        dq_acc = cuda.local.array((TMQ, CH), float32)  # registers: CH columns of its dQ_i / scale
        # the padding columns of Q_i, dO_i (read into lane columns past D, never stored): zero once
        for e in range(t, QROWS * QS[1], NT):
            qs[e // QS[1], e % QS[1]] = 0.0
        for e in range(t, QROWS * DOS[1], NT):
            dos[e // DOS[1], e % DOS[1]] = 0.0
        cuda.syncthreads()
        # K_j, V_j -> shared, once; rows past the block's end zero (dQ = dS K sums over them)
        reads += stage(ks, k, b, hk, j0, cols, t, NT)
        reads += stage(vs, v, b, hk, j0, cols, t, NT)
        for e in range(t, KROWS * KS[1], NT):
            if e // KS[1] >= cols or e % KS[1] >= DQK:
                ks[e // KS[1], e % KS[1]] = 0.0      # and the padding columns
        for e in range(t, KROWS * VS[1], NT):
            if e // VS[1] >= cols or e % VS[1] >= DV:
                vs[e // VS[1], e % VS[1]] = 0.0
        for r in range(TM):
            for e in range(TDK):
                dk_acc[r, e] = 0.0
            for e in range(TDV):
                dv_acc[r, e] = 0.0
        for g in range(group):
            h = hk * group + g
            for qb in range(q_blocks[kb, 0], q_blocks[kb, 1]):
                i0 = qb * BQ
                rows = min(BQ, Sq - i0)
                cuda.syncthreads()           # every thread is done with the previous Q_i, dO_i, P^T, dS^T
                reads += stage(qs, q, b, h, i0, rows, t, NT)     # Q_i -> shared
                reads += stage(dos, do, b, h, i0, rows, t, NT)   # dO_i -> shared
                # rows past the block's end: zero (P^T, dS^T are 0 there, and 0 * garbage could be NaN)
                for e in range(rows * QS[1] + t, QROWS * QS[1], NT):
                    qs[e // QS[1], e % QS[1]] = 0.0
                for e in range(rows * DOS[1] + t, QROWS * DOS[1], NT):
                    dos[e // DOS[1], e % DOS[1]] = 0.0
                cuda.syncthreads()           # Q_i, dO_i complete
                # LSE_i, D_i -> shared (-inf, 0 past the block's end: P = 0 there)
                for r in range(t, QROWS, NT):
                    m = float32(-math.inf)
                    x = float32(0.0)
                    if r < rows:
                        m = lse[b, h, i0 + r]
                        x = dd[b, h, i0 + r]
                        reads += 8
                    lse_s[r] = m
                    dd_s[r] = x
                # S^T = K_j Q_i^T   (this lane's TM x TN micro-tile: keys x queries)
                s_of(st, ks, r0, qs, tx)
                # dP^T = V_j dO_i^T
                dp_of(dpt, vs, r0, dos, tx)
                cuda.syncthreads()           # LSE_i, D_i complete
                for r in range(TM):
                    j = j0 + r0 + r
                    for c in range(TN):
                        col = tx + LX * c
                        i = i0 + col
                        m = lse_s[col]
                        p = float32(0.0)
                        ds = float32(0.0)
                        if r0 + r < cols and m != -math.inf and j >= i - left and j <= i + right:
                            sc = st[r, c] * scale
                            dcap = float32(1.0)
                            if stage_transforms(scores):
                                # S = score(s); dS picks up dS/ds = slope(S) (the CPU's source)
                                sc = score_step(sc, scores)
                                dcap = score_slope(sc, scores)
                            # P_ij = exp(scale Q_i . K_j - LSE_i)   (recomputed, never stored)
                            p = math.exp(sc - m)
                            # dS_ij = P_ij (dP_ij - D_i);  exactly 0 for a row with one allowed key
                            if min(Sk - 1, i + right) != max(0, i - left):
                                ds = p * (dpt[r, c] - dd_s[col]) * dcap
                        pts[r0 + r, col] = p
                        dsts[r0 + r, col] = ds
                cuda.syncthreads()           # P^T, dS^T complete
                # dV_j += P^T dO_i   (this lane's TM x TDV micro-tile)
                dv_of(dv_acc, pts, r0, dos, tx)
                # dK_j += dS^T Q_i   (times scale at the end)
                dk_of(dk_acc, dsts, r0, qs, tx)
                # dQ_i += scale dS K_j: CH columns tx + 8 e at a time, added atomically
                for e0 in range(0, TDK, CH):
                    dq_of(dq_acc, dsts, a0, ks, tx + LX * e0)
                    for r in range(TMQ):
                        if a0 + r < rows:
                            for e in range(CH):
                                if tx + LX * (e0 + e) < DQK:
                                    cuda.atomic.add(dq, (b, h, i0 + a0 + r, tx + LX * (e0 + e)),
                                                    dq_acc[r, e] * scale)
                                    writes += 4
        # dK_j = scale sum dS^T Q,  dV_j = sum P^T dO: written once, no atomics
        for r in range(TM):
            if r0 + r < cols:
                for e in range(TDK):
                    if tx + LX * e < DQK:
                        dk[b, hk, j0 + r0 + r, tx + LX * e] = dk_acc[r, e] * scale
                        writes += 4
                for e in range(TDV):
                    if tx + LX * e < DV:
                        dv[b, hk, j0 + r0 + r, tx + LX * e] = dv_acc[r, e]
                        writes += 4
        if COUNT:
            flush(counter, reads, writes)

    return flash_backward_gpu
