r"""Standard attention on CUDA, three kernels: the honest baseline for the fused twin.

The textbook pipeline (Algorithm 0 of the FlashAttention paper) as three launches, each
reading its inputs from global memory (HBM) and writing its output back:

1. :func:`scores_kernel`: $S = \text{scale}\, Q K^\top$ (masked entries $-\infty$), the
   whole ``Sq x Sk`` matrix **written to global memory**;
2. :func:`softmax_kernel`: $P = \operatorname{softmax}(S)$ in place, **one warp per row**
   (its 32 lanes read neighbouring words: a pass for the row max and sum, combined across the
   lanes (each lane's running max and sum kept by the fused kernels' per-row update
   :func:`flashlab.kernels.rowstep.online_row_step`), and a pass writing $P$);
3. :func:`pv_kernel`: $O = P V$, reading $P$ back.

Kernels 1 and 3 run **the same matmul code as the fused forward**
(:func:`flashlab.gpu.tiles.product_abt`, :func:`flashlab.gpu.tiles.product_ab`) with the same
work split (:func:`flashlab.gpu.forward.warp_tiling`: warps own rows, each lane a register
micro-tile) and the same padded shared tiles, ``tile`` rows per block and ``tile`` keys per
shared K / V tile. The only difference between the two pipelines is where S and P live:
registers and shared memory in the fused kernel, global memory here. Nothing is skipped under
a causal mask: the masked scores are written and read like the others. Every byte is counted
as in the fused kernels (``count=True`` builds); the closed form is
:func:`flashlab.traffic.standard_attention_traffic`.
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
    block_heads,
    conflict_free_pad,
    flush,
    lane_tile,
    next_tile,
    online_row_step,
    product_ab,
    product_abt,
    stage,
)

cuda = _select_target()   # the kernels name `cuda` as a module global (the simulator swaps it)

__all__ = ["STANDARD_TILE", "SOFTMAX_WARPS", "scores_kernel", "softmax_kernel", "pv_kernel",
           "standard_threads", "standard_shared_bytes"]

#: rows per block and keys per shared-memory tile of the scores and PV kernels
STANDARD_TILE = 32
#: warps per block of the softmax kernel (one row per warp at a time)
SOFTMAX_WARPS = 4


def standard_threads(tile: int, d: int) -> int:
    """Threads per block of :func:`scores_kernel` / :func:`pv_kernel` (as the fused forward's)."""
    return WARP * warp_tiling(tile, tile, d)[0]


def _scores_tiles(tile: int, d_qk: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shared Q and K tiles (rows, padded width) of :func:`scores_kernel`."""
    nw, tm, tn, _ = warp_tiling(tile, tile, d_qk)
    width = d_qk + conflict_free_pad(d_qk, tm)
    return (nw * LANE_ROWS * tm, width), (LANE_COLS * tn, width)


def _pv_tiles(tile: int, d_v: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shared P and V tiles (rows, padded width) of :func:`pv_kernel`."""
    nw, tm, tn, td = warp_tiling(tile, tile, d_v)
    rq, rk = nw * LANE_ROWS * tm, LANE_COLS * tn
    return (rq, rk + conflict_free_pad(rk, tm)), (rk, LANE_COLS * td)


def standard_shared_bytes(tile: int, d_qk: int, d_v: int) -> int:
    """Shared memory of the larger of the scores and PV blocks, float32."""
    return 4 * max(sum(r * c for r, c in _scores_tiles(tile, d_qk)),
                   sum(r * c for r, c in _pv_tiles(tile, d_v)))


@lru_cache(maxsize=None)
def scores_kernel(tile: int, d_qk: int, count: bool):
    """``S = scale Q K^T`` with the band's masked entries ``-inf``; grid (B*H, ceil(Sq/tile)),
    :func:`standard_threads` threads.

    q (B, H, Sq, Dqk), k (B, Hkv, Sk, Dqk) float32; scale float32; left, right the band;
    s (B, H, Sq, Sk) float32 out; counter (2,) int64.
    """
    T, DQK, COUNT = tile, d_qk, count
    NW, TM, TN, _ = warp_tiling(tile, tile, d_qk)
    NT = WARP * NW
    QS, KS = _scores_tiles(tile, d_qk)
    LX = LANE_COLS
    qk = product_abt(TM, TN, DQK, fresh=True)   # the fused forward's S = Q K^T

    @cuda.jit
    def standard_scores_gpu(q, k, scale, left, right, s, counter):
        H, Sq = q.shape[1], q.shape[2]
        Sk = k.shape[2]
        b, h, hk = block_heads(H, k.shape[1])
        t = cuda.threadIdx.x
        i0 = cuda.blockIdx.y * T
        rows = min(T, Sq - i0)
        tx, r0 = lane_tile(t, TM)   # rows r0 .. r0 + TM - 1 of the block, columns tx + 8 c
        reads = writes = 0   # bytes this thread moves (flushed by the counting build only)
        qs = cuda.shared.array(QS, float32)
        ks = cuda.shared.array(KS, float32)
        acc = cuda.local.array((TM, TN), float32)
        # rows past the block's or the key tile's end (read by lanes whose results are never stored):
        # zero once, so that no garbage is multiplied
        for e in range(t, QS[0] * QS[1], NT):
            qs[e // QS[1], e % QS[1]] = 0.0
        for e in range(t, KS[0] * KS[1], NT):
            ks[e // KS[1], e % KS[1]] = 0.0
        cuda.syncthreads()
        reads += stage(qs, q, b, h, i0, rows, t, NT)     # Q tile -> shared (once)
        for j0 in range(0, Sk, T):
            cols = min(T, Sk - j0)
            reads += next_tile(ks, k, b, hk, j0, cols, t, NT)   # K tile -> shared
            # Q_i K_j^T   (this lane's micro-tile)
            qk(acc, qs, r0, ks, tx)
            for r in range(TM):
                i = i0 + r0 + r
                for c in range(TN):
                    j = j0 + tx + LX * c
                    if r0 + r < rows and tx + LX * c < cols:
                        x = float32(-math.inf)
                        if j >= i - left and j <= i + right:
                            # S_ij = scale Q_i . K_j
                            x = acc[r, c] * scale
                        s[b, h, i, j] = x              # the N x N matrix goes to global memory
                        writes += 4
        if COUNT:
            flush(counter, reads, writes)

    return standard_scores_gpu


@lru_cache(maxsize=None)
def softmax_kernel(tile: int, count: bool):
    """``P = softmax(S)`` in place, one warp per row; grid (B*H, ceil(Sq/tile)),
    ``32 SOFTMAX_WARPS`` threads, warp ``w`` taking rows ``w, w + SOFTMAX_WARPS, ...`` of the tile.

    s (B, H, Sq, Sk) float32 in/out; counter (2,) int64. A row with no allowed key gets P = 0.
    """
    T, COUNT, NWS = tile, count, SOFTMAX_WARPS

    @cuda.jit
    def standard_softmax_gpu(s, counter):
        H, Sq, Sk = s.shape[1], s.shape[2], s.shape[3]
        b, h, _ = block_heads(H, H)
        t = cuda.threadIdx.x
        w, lane = t // WARP, t % WARP
        reads = writes = 0
        # the 32 lanes' partial (max, sum) of the warp's current row
        red = cuda.shared.array((NWS, 2, WARP), float32)
        for rr in range(w, T, NWS):          # the same trip count in every warp (barriers below)
            i = cuda.blockIdx.y * T + rr
            # pass 1: this lane's m = max of S over its columns, l = sum e^{S - m}, online
            m = float32(-math.inf)
            l = float32(0.0)
            if i < Sq:
                for j in range(lane, Sk, WARP):
                    x = s[b, h, i, j]
                    # a one-key tile through the fused kernels' per-row update:
                    # m <- max(m, x), l <- e^{m_old - m} l
                    m, _, l = online_row_step(m, l, x)
                    if m != -math.inf:
                        # l <- e^{m_old - m} l + e^{x - m}
                        l += math.exp(x - m)
                    reads += 4
            red[w, 0, lane] = m
            red[w, 1, lane] = l
            cuda.syncthreads()
            # across the lanes: M = max_x m_x,  L = sum_x e^{m_x - M} l_x
            big = float32(-math.inf)
            for x in range(WARP):
                big = max(big, red[w, 0, x])
            total = float32(0.0)
            if big != -math.inf:
                for x in range(WARP):
                    total += math.exp(red[w, 0, x] - big) * red[w, 1, x]
            cuda.syncthreads()               # every lane has read red before the next row
            # pass 2: P = e^{S - M} / L (a second read, one write)
            if i < Sq:
                for j in range(lane, Sk, WARP):
                    p = float32(0.0)
                    if total > 0.0:
                        p = math.exp(s[b, h, i, j] - big) / total
                    s[b, h, i, j] = p
                    reads += 4
                    writes += 4
        if COUNT:
            flush(counter, reads, writes)

    return standard_softmax_gpu


@lru_cache(maxsize=None)
def pv_kernel(tile: int, d_v: int, count: bool):
    """``O = P V``; grid (B*H, ceil(Sq/tile)), :func:`standard_threads` threads; P and V staged
    ``tile`` keys at a time.

    p (B, H, Sq, Sk), v (B, Hkv, Sk, Dv) float32; o (B, H, Sq, Dv) float32 out; counter (2,).
    """
    T, DV, COUNT = tile, d_v, count
    NW, TM, TN, TD = warp_tiling(tile, tile, d_v)
    NT = WARP * NW
    PS, VS = _pv_tiles(tile, d_v)
    RQ, RK = PS[0], VS[0]
    VCOLS = VS[1]
    LX = LANE_COLS
    pv = product_ab(TM, TD, RK)       # the fused forward's O += P V

    @cuda.jit
    def standard_pv_gpu(p, v, o, counter):
        H, Sq, Sk = p.shape[1], p.shape[2], p.shape[3]
        b, h, hk = block_heads(H, v.shape[1])
        t = cuda.threadIdx.x
        i0 = cuda.blockIdx.y * T
        rows = min(T, Sq - i0)
        tx, r0 = lane_tile(t, TM)   # rows r0 .. r0 + TM - 1 of the block, columns tx + 8 c
        reads = writes = 0   # bytes this thread moves (flushed by the counting build only)
        ps = cuda.shared.array(PS, float32)
        vs = cuda.shared.array(VS, float32)
        acc = cuda.local.array((TM, TD), float32)
        for e in range(t, RK * VCOLS, NT):
            vs[e // VCOLS, e % VCOLS] = 0.0      # padding columns past Dv: zero once
        for r in range(TM):
            for e in range(TD):
                acc[r, e] = 0.0
        for j0 in range(0, Sk, T):
            cols = min(T, Sk - j0)
            cuda.syncthreads()               # everyone is done with the previous P, V tiles
            reads += stage(vs, v, b, hk, j0, cols, t, NT)   # V tile -> shared
            for e in range(cols * VCOLS + t, RK * VCOLS, NT):
                vs[e // VCOLS, e % VCOLS] = 0.0  # rows past the tile's end
            # P tile -> shared, read back from global memory (zero outside the matrix)
            for e in range(t, RQ * RK, NT):
                r, c = e // RK, e % RK
                x = float32(0.0)
                if r < rows and c < cols:
                    x = p[b, h, i0 + r, j0 + c]
                    reads += 4
                ps[r, c] = x
            cuda.syncthreads()
            # O_i += P_ij V_j   (this lane's micro-tile)
            pv(acc, ps, r0, vs, tx)
        for r in range(TM):
            if r0 + r < rows:
                for e in range(TD):
                    if tx + LX * e < DV:
                        o[b, h, i0 + r0 + r, tx + LX * e] = acc[r, e]
                        writes += 4
        if COUNT:
            flush(counter, reads, writes)

    return standard_pv_gpu
