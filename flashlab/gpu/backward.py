r"""The fused backward on CUDA: :mod:`flashlab.kernels.backward`'s tile math on a GPU.

The same recomputation as on the CPU: $P$ is never stored; each visited tile gets it back
from the forward's LSE, $P_{ij} = e^{S_{ij} - \mathrm{LSE}_i}$, and with
$D_i = \operatorname{rowsum}(dO_i \circ O_i)$

$$
dV_j \mathrel{+}= P^\top dO_i,\quad dP = dO_i V_j^\top,\quad dS = P \circ (dP - D_i),\quad
dQ_i \mathrel{+}= \text{scale}\; dS\, K_j,\quad dK_j \mathrel{+}= \text{scale}\; dS^\top Q_i .
$$

**Mapping.** As in the forward (:mod:`flashlab.gpu.forward`): one thread block per
(batch, head, query block), one thread per query row, the same tile skipping
(:func:`flashlab.masks.kv_block_range`, on the host). The block stages $Q_i$ and $dO_i$ in
shared memory once; each thread reads its row of $O$ and its LSE into registers and keeps
its row of $dQ_i$ in a local array, written once at the end. Per key block the threads load
$K_j$, $V_j$ into shared memory, each computes its row of $P$ and $dS$ into shared tiles,
and then all threads together reduce over the block's rows: element ``(c, d)`` of this
block's share of $dK_j$ (and $dV_j$) is one sum over rows, added into global memory with one
**atomic add**, because the blocks of all query blocks (and, with GQA, of all query heads of
a kv head) add into the same $dK_j$, $dV_j$.

**Determinism.** The CPU kernel keeps its sums in a fixed order (partial buffers, then a
fixed-order sum). Atomics make the order of the additions into $dK$, $dV$ depend on block
timing, as in FlashAttention-2's default backward: float32 results can differ in the last
bits from run to run on a GPU. The tests compare against the float64 reference with a
tolerance, never bit for bit.

**Exact zeros.** A row with exactly one allowed key (causal row 0) has $P = 1$ there and
$dS = 0$ exactly; as :func:`flashlab.kernels.backward.zero_one_key_rows` does, its $dS$ is
written as 0 (computed, $dP - D$ would be a rounding difference).

**Counting** as in the forward: a second build with ``count=True`` adds every global load
and store (an atomic add counts as a 4-byte store) into ``counter``. The zero-filled dK and
dV the atomics add into are prepared by the host before the launch and not counted.
"""
from __future__ import annotations

import math
from functools import lru_cache

from numba import float32

from flashlab.gpu.target import cuda as _select_target
from flashlab.gpu.tiles import add_product_tile, block_heads, flush, query_rows, stage, store_row

cuda = _select_target()   # the kernels name `cuda` as a module global (the simulator swaps it)

__all__ = ["backward_kernel", "backward_shared_bytes"]


def backward_shared_bytes(block_q: int, block_k: int, d_qk: int, d_v: int) -> int:
    """Shared memory of one backward block: Q_i, dO_i, K_j, V_j, P and dS tiles in float32."""
    return 4 * (block_q * (d_qk + d_v) + block_k * (d_qk + d_v) + 2 * block_q * block_k)


@lru_cache(maxsize=None)
def backward_kernel(block_q: int, block_k: int, d_qk: int, d_v: int, count: bool):
    """The backward kernel for one tiling and head dims (compile-time constants), counting or not.

    Launch: grid ``(B * H, ceil(Sq / block_q))``, ``block_q`` threads. Arguments: do, o
    (B, H, Sq, Dv), q (B, H, Sq, Dqk), k (B, Hkv, Sk, Dqk), v (B, Hkv, Sk, Dv), lse (B, H, Sq)
    float32; kv_blocks (n_qblocks, 2) int64; scale float32; left, right the band; outputs dq
    (B, H, Sq, Dqk), dk (B, Hkv, Sk, Dqk), dv (B, Hkv, Sk, Dv) float32, dk and dv zero-filled;
    counter (2,) int64 (read, write bytes), added to only when ``count``.
    """
    BQ, BK, DQK, DV, COUNT = block_q, block_k, d_qk, d_v, count

    @cuda.jit
    def flash_backward_gpu(do, q, k, v, o, lse, kv_blocks, scale, left, right, dq, dk, dv,
                           counter):
        H, Sq = q.shape[1], q.shape[2]
        Sk = k.shape[2]
        b, h, hk = block_heads(H, k.shape[1])   # GQA: query head h adds into kv head h // group
        qb, t, i0, rows, i = query_rows(BQ, Sq)   # thread t owns query row i of block qb
        reads = writes = 0   # bytes this thread moves (flushed by the counting build only)
        qs = cuda.shared.array((BQ, DQK), float32)
        dos = cuda.shared.array((BQ, DV), float32)
        ks = cuda.shared.array((BK, DQK), float32)
        vs = cuda.shared.array((BK, DV), float32)
        ps = cuda.shared.array((BQ, BK), float32)     # P tile
        dss = cuda.shared.array((BQ, BK), float32)    # dS tile
        dq_acc = cuda.local.array(DQK, float32)       # this thread's row of dQ_i
        # its rows of Q_i, dO_i and dS, in registers / local memory: read from the shared tiles
        # in the loops below, [t, d] would put the block's threads a row apart, on one bank
        qrow = cuda.local.array(DQK, float32)
        dorow = cuda.local.array(DV, float32)
        dsrow = cuda.local.array(BK, float32)
        reads += stage(qs, q, b, h, i0, rows, t, BQ)     # Q tile -> shared
        reads += stage(dos, do, b, h, i0, rows, t, BQ)   # dO tile -> shared
        cuda.syncthreads()
        lse_i = float32(-math.inf)
        d_i = float32(0.0)
        one_key = False
        for d in range(DQK):
            dq_acc[d] = float32(0.0)
        if t < rows:
            lse_i = lse[b, h, i]
            for d in range(DQK):
                qrow[d] = qs[t, d]
            for d in range(DV):
                dorow[d] = dos[t, d]
                # D_i = rowsum(dO_i o O_i)
                d_i += dorow[d] * o[b, h, i, d]
            reads += 4 * (DV + 1)
            # allowed keys of row i: [max(0, i - left), min(Sk - 1, i + right)]
            one_key = min(Sk - 1, i + right) == max(0, i - left)
        for kb in range(kv_blocks[qb, 0], kv_blocks[qb, 1]):
            j0 = kb * BK
            cols = min(BK, Sk - j0)
            cuda.syncthreads()               # the previous tile's K, V, P, dS are consumed
            reads += stage(ks, k, b, hk, j0, cols, t, BQ)   # K tile -> shared
            reads += stage(vs, v, b, hk, j0, cols, t, BQ)   # V tile -> shared
            cuda.syncthreads()
            if t < rows:
                for c in range(cols):
                    j = j0 + c
                    p = float32(0.0)
                    if lse_i != -math.inf and j >= i - left and j <= i + right:
                        x = float32(0.0)
                        for d in range(DQK):
                            x += qrow[d] * ks[c, d]
                        # P_ij = exp(scale Q_i . K_j - LSE_i)   (recomputed, never stored)
                        p = math.exp(x * scale - lse_i)
                    dp = float32(0.0)
                    for d in range(DV):
                        # dP_ij = dO_i . V_j
                        dp += dorow[d] * vs[c, d]
                    # dS_ij = P_ij (dP_ij - D_i);  exactly 0 for a row with one allowed key
                    ds = float32(0.0) if one_key else p * (dp - d_i)
                    ps[t, c] = p
                    dss[t, c] = ds
                    dsrow[c] = ds
                for d in range(DQK):
                    x = float32(0.0)
                    for c in range(cols):
                        x += dsrow[c] * ks[c, d]
                    # dQ_i += scale dS K_j
                    dq_acc[d] += x * scale
            cuda.syncthreads()               # the whole P and dS tiles are written
            # dK_j += scale dS^T Q_i   (this block's share, one atomic add per element)
            writes += add_product_tile(dk, b, hk, j0, cols, dss, qs, rows, scale, t, BQ)
            # dV_j += P^T dO_i
            writes += add_product_tile(dv, b, hk, j0, cols, ps, dos, rows, float32(1.0), t, BQ)
        if t < rows:
            writes += store_row(dq, b, h, i, dq_acc)
        if COUNT:
            flush(counter, reads, writes)

    return flash_backward_gpu
