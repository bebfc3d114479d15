r"""Standard attention on CUDA, three kernels, for comparison with the fused twin.

The textbook pipeline (Algorithm 0 of the FlashAttention paper) as three launches, each
reading its inputs from global memory (HBM) and writing its output back:

1. :func:`scores_kernel`: $S = \text{scale}\, Q K^\top$ (masked entries $-\infty$), the
   whole ``Sq x Sk`` matrix **written to global memory**;
2. :func:`softmax_kernel`: $P = \operatorname{softmax}(S)$ row by row, in place (one thread
   per row: a pass reading $S$ for the row max and sum, a pass reading $S$ and writing $P$);
3. :func:`pv_kernel`: $O = P V$, reading $P$ back.

Kernels 1 and 3 use the same thread layout as the fused kernel: a block of ``tile`` threads,
one per query row, with K (or V) staged in shared memory ``tile`` keys at a time. Nothing
is skipped under a causal mask: the masked scores are written and read like the others.
Every byte is counted as in the fused kernels (``count=True`` builds); the closed form is
:func:`flashlab.cost.standard_attention_traffic`.
"""
from __future__ import annotations

import math
from functools import lru_cache

from numba import float32

from flashlab.gpu.target import cuda as _select_target
from flashlab.gpu.tiles import block_heads, flush, next_tile, query_rows, store_row

cuda = _select_target()   # the kernels name `cuda` as a module global (the simulator swaps it)

__all__ = ["STANDARD_TILE", "scores_kernel", "softmax_kernel", "pv_kernel"]

#: rows per block (one thread each) and keys per shared-memory tile, one warp
STANDARD_TILE = 32


@lru_cache(maxsize=None)
def scores_kernel(tile: int, d_qk: int, count: bool):
    """``S = scale Q K^T`` with the band's masked entries ``-inf``; grid (B*H, ceil(Sq/tile)).

    q (B, H, Sq, Dqk), k (B, Hkv, Sk, Dqk) float32; scale float32; left, right the band;
    s (B, H, Sq, Sk) float32 out; counter (2,) int64.
    """
    T, DQK, COUNT = tile, d_qk, count

    @cuda.jit
    def standard_scores_gpu(q, k, scale, left, right, s, counter):
        H, Sq = q.shape[1], q.shape[2]
        Sk = k.shape[2]
        b, h, hk = block_heads(H, k.shape[1])
        _, t, _, _, i = query_rows(T, Sq)   # thread t owns row i of row tile blockIdx.y
        reads = writes = 0   # bytes this thread moves (flushed by the counting build only)
        ks = cuda.shared.array((T, DQK), float32)
        qrow = cuda.local.array(DQK, float32)
        if i < Sq:
            for d in range(DQK):
                qrow[d] = q[b, h, i, d]
            reads += 4 * DQK
        for j0 in range(0, Sk, T):
            cols = min(T, Sk - j0)
            reads += next_tile(ks, k, b, hk, j0, cols, t, T)   # K tile -> shared
            if i < Sq:
                for c in range(cols):
                    j = j0 + c
                    x = float32(-math.inf)
                    if j >= i - left and j <= i + right:
                        x = float32(0.0)
                        for d in range(DQK):
                            x += qrow[d] * ks[c, d]
                        # S_ij = scale Q_i . K_j
                        x *= scale
                    s[b, h, i, j] = x              # the N x N matrix goes to global memory
                writes += 4 * cols
        if COUNT:
            flush(counter, reads, writes)

    return standard_scores_gpu


@lru_cache(maxsize=None)
def softmax_kernel(tile: int, count: bool):
    """``P = softmax(S)`` in place, one thread per row; grid (B*H, ceil(Sq/tile)), ``tile`` threads.

    s (B, H, Sq, Sk) float32 in/out; counter (2,) int64. A row with no allowed key gets P = 0.
    """
    T, COUNT = tile, count

    @cuda.jit
    def standard_softmax_gpu(s, counter):
        H, Sq, Sk = s.shape[1], s.shape[2], s.shape[3]
        b, h, _ = block_heads(H, H)
        i = cuda.blockIdx.y * T + cuda.threadIdx.x
        if i < Sq:
            # pass 1: m = rowmax(S), l = rowsum(e^{S - m}) online (one read of the row)
            m = float32(-math.inf)
            l = float32(0.0)
            for j in range(Sk):
                x = s[b, h, i, j]
                m_new = max(m, x)
                if m_new != -math.inf:
                    # l <- e^{m - m_new} l + e^{x - m_new}
                    l = l * math.exp(m - m_new) + math.exp(x - m_new)
                    m = m_new
            # pass 2: P = e^{S - m} / l (a second read, one write)
            for j in range(Sk):
                p = float32(0.0)
                if l > 0.0:
                    p = math.exp(s[b, h, i, j] - m) / l
                s[b, h, i, j] = p
            if COUNT:
                cuda.atomic.add(counter, 0, 8 * Sk)
                cuda.atomic.add(counter, 1, 4 * Sk)

    return standard_softmax_gpu


@lru_cache(maxsize=None)
def pv_kernel(tile: int, d_v: int, count: bool):
    """``O = P V``; grid (B*H, ceil(Sq/tile)), ``tile`` threads, V staged ``tile`` keys at a time.

    p (B, H, Sq, Sk), v (B, Hkv, Sk, Dv) float32; o (B, H, Sq, Dv) float32 out; counter (2,).
    """
    T, DV, COUNT = tile, d_v, count

    @cuda.jit
    def standard_pv_gpu(p, v, o, counter):
        H, Sq, Sk = p.shape[1], p.shape[2], p.shape[3]
        b, h, hk = block_heads(H, v.shape[1])
        _, t, _, _, i = query_rows(T, Sq)   # thread t owns row i of row tile blockIdx.y
        reads = writes = 0   # bytes this thread moves (flushed by the counting build only)
        vs = cuda.shared.array((T, DV), float32)
        acc = cuda.local.array(DV, float32)
        for d in range(DV):
            acc[d] = float32(0.0)
        for j0 in range(0, Sk, T):
            cols = min(T, Sk - j0)
            reads += next_tile(vs, v, b, hk, j0, cols, t, T)   # V tile -> shared
            if i < Sq:
                for c in range(cols):
                    pij = p[b, h, i, j0 + c]       # P read back from global memory
                    for d in range(DV):
                        # O_i += P_ij V_j
                        acc[d] += pij * vs[c, d]
                reads += 4 * cols
        if i < Sq:
            writes += store_row(o, b, h, i, acc)
        if COUNT:
            flush(counter, reads, writes)

    return standard_pv_gpu
