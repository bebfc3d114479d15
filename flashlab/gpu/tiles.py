"""Device helpers every CUDA kernel of the twin shares: where a block sits, tiles in and out, counts.

``stage`` is the one copy from global to shared memory in :mod:`flashlab.gpu.forward`,
:mod:`flashlab.gpu.backward` and :mod:`flashlab.gpu.standard`: the block's threads stride over
the tile's elements (thread ``t`` copies elements ``t, t + threads, ...``, so neighbouring threads
read neighbouring addresses). Every helper that touches global memory returns the bytes this
thread moved; a kernel adds them into its thread-local ``reads`` / ``writes`` and only the
instrumented build (``count=True``) hands them to ``flush``, which adds them to the kernel's global
``counter`` (read, write) once, at the end. In the plain build the local sums are never used and
the compiler drops them.

``online_row_step`` is :func:`flashlab.kernels.rowstep.online_row_step`, the online softmax's
per-row update, compiled as a device function from the same source the CPU kernels compile with
``njit``: a GPU kernel reduces a row's maximum across its lanes itself and hands the scalar
update to it.
"""
from __future__ import annotations

from functools import lru_cache

from numba import float32, uint64

from flashlab.gpu.target import _simulating
from flashlab.gpu.target import cuda as _select_target
from flashlab.kernels.rowstep import online_row_step as _online_row_step

cuda = _select_target()   # the helpers name `cuda` as a module global (the simulator swaps it)
# the micro-tile products are inlined into the kernel (their register tiles must not go to
# local memory through a call); the simulator's jit takes no such option
_INLINE = {} if _simulating(cuda) else {"forceinline": True, "opt": True}

__all__ = ["online_row_step", "stage", "next_tile", "flush", "block_heads", "LANE_ROWS", "LANE_COLS", "WARP",
           "conflict_free_pad", "product_abt", "product_ab", "product_atb", "UNROLL", "unroll_by"]


#: ``(m_new, alpha, l_scaled) = online_row_step(m, l, tile_max)`` on the device: the CPU kernels'
#: source (:mod:`flashlab.kernels.rowstep`); with float32 arguments every result is float32.
online_row_step = cuda.jit(device=True)(_online_row_step)


@cuda.jit(device=True)
def stage(dst, src, b, h, r0, rows, t, threads):
    """dst[:rows, :n] <- src[b, h, r0:r0 + rows] (float32, n = src.shape[3]; ``dst`` may be wider:
    a padded tile); returns the bytes thread ``t`` read."""
    n = src.shape[3]
    nbytes = 0
    for e in range(t, rows * n, threads):
        dst[e // n, e % n] = src[b, h, r0 + e // n, e % n]
        nbytes += 4
    return nbytes


@cuda.jit(device=True)
def next_tile(dst, src, b, h, r0, rows, t, threads):
    """One turn of a one-tile loop: wait until every thread is done with ``dst``, stage the next
    tile (as :func:`stage`), wait until it is complete; returns the bytes thread ``t`` read."""
    cuda.syncthreads()
    nbytes = stage(dst, src, b, h, r0, rows, t, threads)
    cuda.syncthreads()
    return nbytes


@cuda.jit(device=True)
def flush(counter, reads, writes):
    """counter[0] += reads; counter[1] += writes (atomically: every thread of every block adds)."""
    cuda.atomic.add(counter, 0, reads)
    cuda.atomic.add(counter, 1, writes)


@cuda.jit(device=True)
def block_heads(H, Hkv):
    """(b, h, hk) of this block: grid axis x runs over batch * H + h; with GQA query head h reads
    kv head h // (H / Hkv)."""
    bh = cuda.blockIdx.x
    h = bh % H
    return bh // H, h, h // (H // Hkv)


# --- FlashAttention-2's work split: a warp owns query rows, a lane a register micro-tile -------
#
# The 32 lanes of a warp form a LANE_ROWS x LANE_COLS grid: lane (ty, tx) = (lane // 8, lane % 8).
# Of the warp's rows it holds rows ty*TM .. ty*TM + TM - 1 (TM rows per lane); of a tile's
# columns it holds tx, tx + 8, tx + 16, ... (strided, so that the 8 lanes of a row group read 8
# neighbouring rows of a K tile or 8 neighbouring words of a V row: different banks).

#: lanes of a warp along the rows and along the columns of a micro-tiled product
LANE_ROWS, LANE_COLS = 4, 8
WARP = LANE_ROWS * LANE_COLS
BANKS = 32


def _conflicts(addresses) -> int:
    """Bank-conflict degree of one warp access: the most distinct word addresses on one bank."""
    per_bank: dict[int, set[int]] = {}
    for a in addresses:
        per_bank.setdefault(a % BANKS, set()).add(a)
    return max(len(a) for a in per_bank.values())


def conflict_free_pad(width: int, rows_per_lane: int) -> int:
    """Padding ``p`` of a shared ``(rows, width + p)`` float32 tile for the micro-tiled warp
    accesses: 8 lanes reading rows ``tx`` (a K tile in ``S = Q K^T``), and the 4 x 8 lanes
    reading or writing rows ``ty * rows_per_lane``, columns ``tx`` (Q, P tiles). Words of one
    bank are broadcast when their addresses are equal, so only distinct addresses conflict.
    The smallest ``p`` with the lowest worst conflict degree (1, conflict-free, for the
    widths that are multiples of 32 with 4 rows per lane; small test tiles may keep some).
    """
    def cost(p: int) -> int:
        s = width + p
        return max(_conflicts(tx * s for tx in range(LANE_COLS)),
                   _conflicts(ty * rows_per_lane * s + tx
                              for ty in range(LANE_ROWS) for tx in range(LANE_COLS)))
    return min(range(BANKS), key=lambda p: (cost(p), p))


#: steps of a product loop unrolled by hand (the compiler's unroller leaves them rolled)
UNROLL = 4


def unroll_by(n: int) -> int:
    """The largest power of two <= :data:`UNROLL` dividing ``n``: a product loop's unroll factor."""
    u = UNROLL
    while n % u:
        u //= 2
    return u


@lru_cache(maxsize=None)
def product_abt(tm: int, tn: int, n: int):
    """Device function ``f(acc, a, a0, b, b0)``: acc[r, c] += sum_{d < n} a[a0 + r, d] b[b0 + 8 c, d].

    One lane's ``(tm, tn)`` register micro-tile of ``A B^T`` (``S = Q K^T``, ``dP = dO V^T``);
    ``a`` and ``b`` are shared tiles. ``tm``, ``tn`` and ``n`` are compile-time constants, so
    every loop has a constant trip count: the compiler unrolls them and ``acc`` stays in
    registers. Per step ``d`` the lane loads ``tm + tn`` words and issues ``tm tn`` FFMAs.
    """
    TM, TN, N, U = tm, tn, n, unroll_by(n)

    @cuda.jit(device=True, **_INLINE)
    def abt(acc, a, a0, b, b0):
        x = cuda.local.array(TM, float32)
        y = cuda.local.array(TN, float32)
        # unsigned indices: no negative-index wraparound code in the loop
        ua, ub = uint64(a0), uint64(b0)
        for d0 in range(0, N, U):
            for u in range(U):      # U steps unrolled: constant shared-memory offsets, one branch
                d = uint64(d0 + u)
                for r in range(TM):
                    x[r] = a[ua + uint64(r), d]
                for c in range(TN):
                    y[c] = b[ub + uint64(LANE_COLS * c), d]
                for r in range(TM):
                    for c in range(TN):
                        # acc_rc += A_rd B_cd
                        acc[r, c] += x[r] * y[c]

    return abt


@lru_cache(maxsize=None)
def product_ab(tm: int, tn: int, n: int):
    """Device function ``f(acc, a, a0, b, b0)``: acc[r, e] += sum_{c < n} a[a0 + r, c] b[c, b0 + 8 e].

    One lane's ``(tm, tn)`` register micro-tile of ``A B`` (``O = P V``, ``dQ = dS K``), the
    same loop structure as :func:`product_abt`, with B read along its rows.
    """
    TM, TN, N, U = tm, tn, n, unroll_by(n)

    @cuda.jit(device=True, **_INLINE)
    def ab(acc, a, a0, b, b0):
        x = cuda.local.array(TM, float32)
        y = cuda.local.array(TN, float32)
        ua, ub = uint64(a0), uint64(b0)
        for c0 in range(0, N, U):
            for u in range(U):      # U steps unrolled, as in product_abt
                c = uint64(c0 + u)
                for r in range(TM):
                    x[r] = a[ua + uint64(r), c]
                for e in range(TN):
                    y[e] = b[c, ub + uint64(LANE_COLS * e)]
                for r in range(TM):
                    for e in range(TN):
                        # acc_re += A_rc B_ce
                        acc[r, e] += x[r] * y[e]

    return ab


@lru_cache(maxsize=None)
def product_atb(tm: int, tn: int, n: int):
    """Device function ``f(acc, a, a0, b, b0)``: acc[r, e] += sum_{c < n} a[c, a0 + r] b[c, b0 + 8 e].

    One lane's ``(tm, tn)`` register micro-tile of ``A^T B`` with ``A`` stored transposed
    (``dQ = dS K`` from the backward's ``dS^T`` tile): the same loop structure as
    :func:`product_ab`. The lanes of a warp read ``a[c, a0 + r]`` in one row (4 distinct words,
    broadcast to the 8 lanes that share them) and ``b[c, b0 + 8 e]`` in one row: no bank conflict
    whatever the padding.
    """
    TM, TN, N, U = tm, tn, n, unroll_by(n)

    @cuda.jit(device=True, **_INLINE)
    def atb(acc, a, a0, b, b0):
        x = cuda.local.array(TM, float32)
        y = cuda.local.array(TN, float32)
        ua, ub = uint64(a0), uint64(b0)
        for c0 in range(0, N, U):
            for u in range(U):      # U steps unrolled, as in product_abt
                c = uint64(c0 + u)
                for r in range(TM):
                    x[r] = a[c, ua + uint64(r)]
                for e in range(TN):
                    y[e] = b[c, ub + uint64(LANE_COLS * e)]
                for r in range(TM):
                    for e in range(TN):
                        # acc_re += A^T_rc B_ce = A_cr B_ce
                        acc[r, e] += x[r] * y[e]

    return atb
