r"""The fused forward on CUDA: :mod:`flashlab.kernels.forward`'s tile loop mapped onto a GPU.

**Mapping.** The grid has one thread block per (batch, head, query block): block
``(bh, qb)`` owns rows ``[i0, i1)`` of head ``bh`` and nothing else, so blocks never talk to
each other (the CPU kernel's ``prange`` work item). Inside the block there are ``block_q``
threads, **one per query row**. The block

1. stages $Q_i$ (``block_q x Dqk``, pre-multiplied by ``scale``) in shared memory;
2. for each key block $j$ that :func:`flashlab.masks.kv_block_range` lets through (the
   CPU kernel's tile skipping; computed on the host, one ``(kb0, kb1)`` pair per query block,
   from the same function), all its threads load $K_j$ and $V_j$ into shared memory together
   (``syncthreads`` before, so nobody overwrites a tile still in use, and after, so nobody
   reads a tile not yet loaded);
3. each thread folds its row of the score tile into its own online-softmax state
   $m, \ell, \tilde O$ (registers and a per-thread local array), exactly the update of
   :func:`flashlab.kernels.tile.rescale_rows` and ``online_softmax_update``;
4. writes $O_i = \tilde O / \ell$ and $\mathrm{LSE}_i = m + \log \ell$ once.

Masking is the band test ``i - left <= j <= i + right`` (``causal``: ``right = 0``) on every
entry of a visited tile; GQA reads kv head ``h // (H // Hkv)``; ``Dqk`` and ``Dv`` are
independent (192 / 128).

**Counting.** :func:`forward_kernel` compiles the same Python function twice: with
``count=True`` every thread adds the bytes it loads from and stores to global memory into
two local integers and, at the end, atomically into a global ``counter`` (read, write); with
``count=False`` those lines are removed at compile time. Loads of shared memory are not
global traffic and are not counted. The ``(kb0, kb1)`` table (8 bytes per query block) is
launch metadata like the kernel's arguments and is not counted either.
"""
from __future__ import annotations

import math
from functools import lru_cache

from numba import float32

from flashlab.gpu.target import cuda as _select_target
from flashlab.gpu.tiles import block_heads, flush, query_rows, stage

cuda = _select_target()   # the kernels name `cuda` as a module global (the simulator swaps it)

__all__ = ["forward_kernel", "forward_shared_bytes"]


def forward_shared_bytes(block_q: int, block_k: int, d_qk: int, d_v: int) -> int:
    """Shared memory of one forward block: Q_i, K_j, V_j tiles in float32."""
    return 4 * (block_q * d_qk + block_k * d_qk + block_k * d_v)


@lru_cache(maxsize=None)
def forward_kernel(block_q: int, block_k: int, d_qk: int, d_v: int, count: bool):
    """The forward kernel for one tiling and head dims (compile-time constants), counting or not.

    Launch: grid ``(B * H, ceil(Sq / block_q))``, ``block_q`` threads. Arguments:
    q (B, H, Sq, Dqk), k (B, Hkv, Sk, Dqk), v (B, Hkv, Sk, Dv) float32; kv_blocks
    (n_qblocks, 2) int64 key-block range per query block; scale float32; left, right the band;
    outputs o (B, H, Sq, Dv), lse (B, H, Sq) float32; counter (2,) int64 (read, write bytes),
    added to only when ``count``.
    """
    BQ, BK, DQK, DV, COUNT = block_q, block_k, d_qk, d_v, count

    @cuda.jit
    def flash_forward_gpu(q, k, v, kv_blocks, scale, left, right, o, lse, counter):
        H, Sq = q.shape[1], q.shape[2]
        Sk = k.shape[2]
        b, h, hk = block_heads(H, k.shape[1])   # GQA: query head h reads kv head h // group
        qb, t, i0, rows, i = query_rows(BQ, Sq)   # thread t owns query row i of block qb
        reads = writes = 0   # bytes this thread moves (flushed by the counting build only)
        # shared memory: the block's tiles (on-chip SRAM, seen by all its threads)
        qs = cuda.shared.array((BQ, DQK), float32)
        ks = cuda.shared.array((BK, DQK), float32)
        vs = cuda.shared.array((BK, DV), float32)
        # per thread: its row of Q_i, of the score tile and of the unnormalised output O~
        # (registers / local memory)
        qrow = cuda.local.array(DQK, float32)
        s = cuda.local.array(BK, float32)
        acc = cuda.local.array(DV, float32)
        # Q_i -> shared, pre-scaled: (scale Q_i) K_j^T = scale (Q_i K_j^T); threads stride, so
        # that neighbouring threads read neighbouring addresses (one coalesced read of the tile)
        for e in range(t, rows * DQK, BQ):
            qs[e // DQK, e % DQK] = q[b, h, i0 + e // DQK, e % DQK] * scale
            reads += 4
        cuda.syncthreads()
        # ... then each thread keeps its own row in registers: read from shared memory in the
        # score loop, qs[t, d] would put the block's threads DQK words apart, on the same bank
        # (a 32-way bank conflict on every read; measured 5x slower on an H200)
        if t < rows:
            for d in range(DQK):
                qrow[d] = qs[t, d]
        m = float32(-math.inf)               # running row max
        l = float32(0.0)                     # running denominator
        for d in range(DV):
            acc[d] = float32(0.0)
        for kb in range(kv_blocks[qb, 0], kv_blocks[qb, 1]):
            j0 = kb * BK
            cols = min(BK, Sk - j0)
            cuda.syncthreads()               # every thread is done with the previous K_j, V_j
            reads += stage(ks, k, b, hk, j0, cols, t, BQ)   # K tile -> shared
            reads += stage(vs, v, b, hk, j0, cols, t, BQ)   # V tile -> shared
            cuda.syncthreads()               # K_j, V_j complete before anyone reads them
            if t < rows:
                m_new = m
                for c in range(cols):
                    j = j0 + c
                    if j < i - left or j > i + right:
                        s[c] = float32(-math.inf)    # masked: outside the band
                    else:
                        x = float32(0.0)
                        for d in range(DQK):
                            # S_ic = (scale Q_i) . K_c
                            x += qrow[d] * ks[c, d]
                        s[c] = x
                    # m_new = max(m, rowmax(S))
                    m_new = max(m_new, s[c])
                if m_new != -math.inf:
                    # alpha = e^{m - m_new}   (0 when m was -inf: nothing accumulated yet)
                    alpha = math.exp(m - m_new)
                    rowsum = float32(0.0)
                    for c in range(cols):
                        # P~ = e^{S - m_new};  masked entries: e^{-inf} = 0
                        p = math.exp(s[c] - m_new)
                        s[c] = p
                        rowsum += p
                    # l <- alpha l + rowsum(P~)
                    l = alpha * l + rowsum
                    for d in range(DV):
                        # O~ <- alpha O~ + P~ V_j
                        x = acc[d] * alpha
                        for c in range(cols):
                            x += s[c] * vs[c, d]
                        acc[d] = x
                    m = m_new
        if t < rows:
            if l == 0.0:
                # no allowed key: O = 0, LSE = -inf (never NaN)
                lse[b, h, i] = -math.inf
                for d in range(DV):
                    o[b, h, i, d] = float32(0.0)
            else:
                # LSE = m + log(l)
                lse[b, h, i] = m + math.log(l)
                inv = float32(1.0) / l
                for d in range(DV):
                    # O = O~ / l
                    o[b, h, i, d] = acc[d] * inv
            writes += 4 * (DV + 1)
        if COUNT:
            flush(counter, reads, writes)

    return flash_forward_gpu
