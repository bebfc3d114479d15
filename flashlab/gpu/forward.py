r"""The fused forward on CUDA: :mod:`flashlab.kernels.forward`'s tile loop in FlashAttention-2's work split.

**Mapping.** The grid has one thread block per (batch, head, query block): block
``(bh, qb)`` owns rows ``[i0, i1)`` of head ``bh`` and nothing else, so blocks never talk to
each other (the CPU kernel's ``prange`` work item). Inside the block, as in FlashAttention-2,
**warps own query rows**: warp ``w`` owns ``WR = 4 TM`` consecutive rows of the block, and its
32 lanes form a 4 x 8 grid (:mod:`flashlab.gpu.tiles`): lane ``(ty, tx)`` holds a **register
micro-tile** of the score tile S (its ``TM`` rows x the ``TN = BK / 8`` columns ``tx, tx + 8,
...``) and of the output O~ (the same rows x the ``TD = Dv / 8`` columns ``tx, tx + 8, ...``).
Every loop over a micro-tile has a compile-time trip count, so the compiler unrolls it and the
tiles live in registers (``python -m flashlab.gpu.inspect`` checks: no local memory). The block

1. stages $Q_i$ (pre-multiplied by ``scale``) in shared memory, rows padded so that the warp's
   reads hit 32 different banks (:func:`flashlab.gpu.tiles.conflict_free_pad`);
2. for each key block $j$ that :func:`flashlab.masks.kv_block_range` lets through (computed
   on the host, one ``(kb0, kb1)`` pair per query block), loads $K_j$ and $V_j$ into shared
   memory (``syncthreads`` before and after);
3. computes its micro-tiles of $S = (\text{scale}\,Q_i) K_j^\top$
   (:func:`flashlab.gpu.tiles.product_abt`), masks them, and folds them into each row's
   online-softmax state $m, \ell, \tilde O$: the row max and row sum are reduced over the 8
   lanes that share a row through a small shared array, and the per-row update of $m$, $\alpha$
   and $\ell$ is :func:`flashlab.kernels.rowstep.online_row_step`, the CPU kernels' own source
   compiled as a device function (``flashlab.gpu.tiles.online_row_step``); $\tilde P$ goes
   through a shared tile (each lane needs whole rows of it for $\tilde P V_j$, :func:`flashlab.gpu.tiles.product_ab`);
4. writes $O_i = \tilde O / \ell$ and $\mathrm{LSE}_i = m + \log \ell$ once.

Masking is the band test ``i - left <= j <= i + right`` (``causal``: ``right = 0``) on every
entry of a visited tile; GQA reads kv head ``h // (H // Hkv)``; ``Dqk`` and ``Dv`` are
independent (192 / 128). A block has :func:`forward_threads` threads (a multiple of 32).

**Counting.** :func:`forward_kernel` compiles the same Python function twice: with
``count=True`` every thread adds the bytes it loads from and stores to global memory (its
global-memory requests, whether L2 or DRAM serves them) into
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
from flashlab.gpu.tiles import (
    LANE_COLS,
    LANE_ROWS,
    WARP,
    block_heads,
    conflict_free_pad,
    flush,
    lane_tile,
    online_row_step,
    product_ab,
    product_abt,
    score_step,
    stage,
    stage_transforms,
)

cuda = _select_target()   # the kernels name `cuda` as a module global (the simulator swaps it)

__all__ = ["forward_kernel", "forward_shared_bytes", "forward_threads", "warp_tiling"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def warp_tiling(block_q: int, block_k: int, d_v: int) -> tuple[int, int, int, int]:
    """``(warps, TM, TN, TD)``: warps per block, and one lane's micro-tile: ``TM`` query rows,
    ``TN`` key columns of S, ``TD`` columns of O (4 x 4 and 4 x 8 at 64 x 32 tiles, Dv = 64)."""
    tm = 4 if block_q >= 4 * LANE_ROWS else _cdiv(block_q, LANE_ROWS)
    return _cdiv(block_q, LANE_ROWS * tm), tm, _cdiv(block_k, LANE_COLS), _cdiv(d_v, LANE_COLS)


def forward_threads(block_q: int, block_k: int, d_v: int) -> int:
    """Threads per forward block: 32 per warp, each warp owning 4 TM query rows."""
    return WARP * warp_tiling(block_q, block_k, d_v)[0]


def _shapes(block_q: int, block_k: int, d_qk: int, d_v: int) -> dict[str, tuple[int, int]]:
    """The forward block's shared tiles (rows, padded width), float32."""
    nw, tm, tn, td = warp_tiling(block_q, block_k, d_v)
    rq, rk = nw * LANE_ROWS * tm, LANE_COLS * tn     # rows the lanes address (>= block_q, block_k)
    return {"q": (rq, d_qk + conflict_free_pad(d_qk, tm)),
            "k": (rk, d_qk + conflict_free_pad(d_qk, tm)),
            "v": (rk, LANE_COLS * td),
            "p": (rq, rk + conflict_free_pad(rk, tm)),
            "red": (rq, 2 * LANE_COLS)}


def forward_shared_bytes(block_q: int, block_k: int, d_qk: int, d_v: int) -> int:
    """Shared memory of one forward block: Q_i, K_j, V_j, P~ tiles (padded) and the row reductions."""
    return 4 * sum(r * c for r, c in _shapes(block_q, block_k, d_qk, d_v).values())


@lru_cache(maxsize=None)
def forward_kernel(block_q: int, block_k: int, d_qk: int, d_v: int, count: bool):
    """The forward kernel for one tiling and head dims (compile-time constants), counting or not.

    Launch: grid ``(B * H, ceil(Sq / block_q))``, :func:`forward_threads` threads. Arguments:
    q (B, H, Sq, Dqk), k (B, Hkv, Sk, Dqk), v (B, Hkv, Sk, Dv) float32; kv_blocks
    (n_qblocks, 2) int64 key-block range per query block; scale float32; left, right the band;
    scores, the scores stage's options (:class:`~flashlab.kernels.options.ScoresStage` of
    float32, applied after scaling, before the mask);
    outputs o (B, H, Sq, Dv), lse (B, H, Sq) float32; counter (2,) int64 (read, write bytes),
    added to only when ``count``.
    """
    BQ, BK, DQK, DV, COUNT = block_q, block_k, d_qk, d_v, count
    NW, TM, TN, TD = warp_tiling(block_q, block_k, d_v)
    NT = WARP * NW
    SH = _shapes(block_q, block_k, d_qk, d_v)
    QS, KS, VS, PS, RED = SH["q"], SH["k"], SH["v"], SH["p"], SH["red"]
    KROWS, VCOLS = KS[0], VS[1]
    LX = LANE_COLS
    qk = product_abt(TM, TN, DQK, fresh=True)   # S micro-tile = Q_i K_j^T
    pv = product_ab(TM, TD, KROWS)    # O~ micro-tile += P~ V_j

    @cuda.jit
    def flash_forward_gpu(q, k, v, kv_blocks, scale, left, right, scores, o, lse, counter):
        H, Sq = q.shape[1], q.shape[2]
        Sk = k.shape[2]
        b, h, hk = block_heads(H, k.shape[1])   # GQA: query head h reads kv head h // group
        qb = cuda.blockIdx.y
        t = cuda.threadIdx.x
        i0 = qb * BQ
        rows = min(BQ, Sq - i0)
        tx, r0 = lane_tile(t, TM)   # rows r0 .. r0 + TM - 1 of the block, columns tx + 8 c
        reads = writes = 0   # bytes this thread moves (flushed by the counting build only)
        qs = cuda.shared.array(QS, float32)
        ks = cuda.shared.array(KS, float32)
        vs = cuda.shared.array(VS, float32)
        ps = cuda.shared.array(PS, float32)
        red = cuda.shared.array(RED, float32)    # per row: 8 lanes' partial max, then sum
        s = cuda.local.array((TM, TN), float32)      # registers: the lane's S / P~ micro-tile
        acc = cuda.local.array((TM, TD), float32)    # registers: the lane's O~ micro-tile
        m = cuda.local.array(TM, float32)            # running row max of its rows
        l = cuda.local.array(TM, float32)            # running denominator
        # Q_i -> shared, pre-scaled: (scale Q_i) K_j^T = scale (Q_i K_j^T); rows past the block's
        # end are zero (their lanes compute and never store)
        for e in range(t, QS[0] * DQK, NT):
            r, d = e // DQK, e % DQK
            x = float32(0.0)
            if r < rows:
                x = q[b, h, i0 + r, d] * scale
                reads += 4
            qs[r, d] = x
        # V_j's padding columns (past Dv, read into unused registers): zero once
        for e in range(t, KROWS * VCOLS, NT):
            vs[e // VCOLS, e % VCOLS] = 0.0
        for r in range(TM):
            m[r] = -math.inf
            l[r] = 0.0
            for e in range(TD):
                acc[r, e] = 0.0
        for kb in range(kv_blocks[qb, 0], kv_blocks[qb, 1]):
            j0 = kb * BK
            cols = min(BK, Sk - j0)
            cuda.syncthreads()               # every thread is done with the previous K_j, V_j, P~
            reads += stage(ks, k, b, hk, j0, cols, t, NT)   # K tile -> shared
            reads += stage(vs, v, b, hk, j0, cols, t, NT)   # V tile -> shared
            # rows past the tile's end: zero (P~ is 0 there, and 0 * garbage could be NaN)
            for e in range(cols * VCOLS + t, KROWS * VCOLS, NT):
                vs[e // VCOLS, e % VCOLS] = 0.0
            cuda.syncthreads()               # K_j, V_j complete before anyone reads them
            # S = (scale Q_i) K_j^T   (this lane's TM x TN micro-tile)
            qk(s, qs, r0, ks, tx)
            for r in range(TM):
                i = i0 + r0 + r
                mx = float32(-math.inf)
                for c in range(TN):
                    j = j0 + tx + LX * c
                    if stage_transforms(scores):
                        # S <- score(S)   (the scores stage, the CPU's source; before the mask)
                        s[r, c] = score_step(s[r, c], scores)
                    # masked (outside the band, or past the tile): -inf
                    if tx + LX * c >= cols or j < i - left or j > i + right:
                        s[r, c] = -math.inf
                    mx = max(mx, s[r, c])
                red[r0 + r, tx] = mx
            cuda.syncthreads()               # the 8 lanes of each row have their partial max
            for r in range(TM):
                # rowmax(S) of row r0 + r: the max over the 8 lanes that hold it
                tile_max = float32(-math.inf)
                for x in range(LX):
                    tile_max = max(tile_max, red[r0 + r, x])
                # m' = max(m, rowmax S), alpha = e^{m - m'}, l <- alpha l: the per-row update the
                # CPU kernels run (flashlab.kernels.rowstep, compiled for the device)
                m_new, alpha, l_scaled = online_row_step(m[r], l[r], tile_max)
                part = float32(0.0)
                for c in range(TN):
                    p = float32(0.0)
                    if m_new != -math.inf:
                        # P~ = e^{S - m_new};  masked entries: e^{-inf} = 0
                        p = math.exp(s[r, c] - m_new)
                    part += p
                    ps[r0 + r, tx + LX * c] = p
                red[r0 + r, LX + tx] = part
                for e in range(TD):
                    # O~ <- alpha O~   (the P~ V_j term is added below)
                    acc[r, e] *= alpha
                l[r] = l_scaled
                m[r] = m_new
            cuda.syncthreads()               # P~ and the partial row sums are complete
            for r in range(TM):
                # l <- alpha l + rowsum(P~)
                for x in range(LX):
                    l[r] += red[r0 + r, LX + x]
            # O~ <- alpha O~ + P~ V_j   (this lane's TM x TD micro-tile)
            pv(acc, ps, r0, vs, tx)
        for r in range(TM):
            i = i0 + r0 + r
            if r0 + r < rows:
                if l[r] == 0.0:
                    # no allowed key: O = 0, LSE = -inf (never NaN)
                    if tx == 0:
                        lse[b, h, i] = -math.inf
                        writes += 4
                    for e in range(TD):
                        if tx + LX * e < DV:
                            o[b, h, i, tx + LX * e] = 0.0
                            writes += 4
                else:
                    if tx == 0:
                        # LSE = m + log(l)
                        lse[b, h, i] = m[r] + math.log(l[r])
                        writes += 4
                    inv = float32(1.0) / l[r]
                    for e in range(TD):
                        if tx + LX * e < DV:
                            # O = O~ / l
                            o[b, h, i, tx + LX * e] = acc[r, e] * inv
                            writes += 4
        if COUNT:
            flush(counter, reads, writes)

    return flash_forward_gpu
