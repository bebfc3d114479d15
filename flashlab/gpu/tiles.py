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
update to it. ``stage_transforms``, ``score_step`` and ``score_slope`` are the scores stage's
scalar steps (:mod:`flashlab.kernels.scorestep`), compiled the same way: the kernels take the
stage's options as one argument, a :class:`~flashlab.kernels.options.ScoresStage` of float32.
"""
from __future__ import annotations

from functools import lru_cache

from numba import float32, uint64

from flashlab.gpu.target import _simulating
from flashlab.gpu.target import cuda as _select_target
from flashlab.kernels.rowstep import online_row_step as _online_row_step
from flashlab.kernels.scorestep import score as _score
from flashlab.kernels.scorestep import slope as _slope
from flashlab.kernels.scorestep import transforms as _transforms

cuda = _select_target()   # the helpers name `cuda` as a module global (the simulator swaps it)
# the micro-tile products are inlined into the kernel (their register tiles must not go to
# local memory through a call); the simulator's jit takes no such option
_INLINE = {} if _simulating(cuda) else {"forceinline": True, "opt": True}

__all__ = ["stage", "next_tile", "flush", "block_heads", "LANE_ROWS", "LANE_COLS", "WARP",
           "conflict_free_pad", "lane_tile", "micro_product", "product_abt", "product_ab", "product_atb", "UNROLL",
           "unroll_by"]


#: ``(m_new, alpha, l_scaled) = online_row_step(m, l, tile_max)`` on the device: the CPU kernels'
#: source (:mod:`flashlab.kernels.rowstep`, documented there, so not in ``__all__``); with float32
#: arguments every result is float32.
online_row_step = cuda.jit(device=True)(_online_row_step)
#: the scores stage's scalar steps on the device (:mod:`flashlab.kernels.scorestep`, the CPU
#: tile stage's source): whether it transforms, one score, its slope
stage_transforms = cuda.jit(device=True)(_transforms)
score_step = cuda.jit(device=True)(_score)
score_slope = cuda.jit(device=True)(_slope)


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


@cuda.jit(device=True)
def lane_tile(t, tm):
    """``(tx, r0)`` of thread ``t`` in a block of warps that own ``4 tm`` consecutive rows each:
    lane ``(ty, tx)`` of warp ``w`` holds rows ``r0 .. r0 + tm - 1`` of the block and the columns
    ``tx, tx + 8, ...`` of a tile."""
    # w = t // 32, (ty, tx) = (lane // 8, lane % 8);  r0 = (4 w + ty) tm
    return t % LANE_COLS, (t // WARP) * (LANE_ROWS * tm) + ((t % WARP) // LANE_COLS) * tm


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
def micro_product(tm: int, tn: int, n: int, a_transposed: bool, b_transposed: bool, fresh: bool):
    """Device function ``f(acc, a, a0, b, b0)``: one lane's ``(tm, tn)`` register micro-tile of a
    product of two shared tiles, ``acc[r, c] (+)= sum_{k < n} A[a0 + r, k] B[k, b0 + 8 c]``.

    ``A[i, k]`` is ``a[k, i]`` when ``a_transposed`` (else ``a[i, k]``), ``B[k, j]`` is ``b[j, k]``
    when ``b_transposed`` (else ``b[k, j]``); ``fresh``: ``acc`` is overwritten (zeroed first),
    else added to. The flags, ``tm``, ``tn`` and ``n`` are compile-time constants: the layout
    branches are resolved when the function is compiled, every loop has a constant trip count,
    the compiler unrolls them and ``acc`` stays in registers. Per step ``k`` the lane loads
    ``tm + tn`` words and issues ``tm tn`` FFMAs. :func:`product_abt`, :func:`product_ab` and
    :func:`product_atb` are its three layouts.
    """
    TM, TN, N, U = tm, tn, n, unroll_by(n)
    AT, BT, FRESH = a_transposed, b_transposed, fresh

    @cuda.jit(device=True, **_INLINE)
    def product(acc, a, a0, b, b0):
        x = cuda.local.array(TM, float32)
        y = cuda.local.array(TN, float32)
        if FRESH:
            for r in range(TM):
                for c in range(TN):
                    acc[r, c] = 0.0
        # unsigned indices: no negative-index wraparound code in the loop
        ua, ub = uint64(a0), uint64(b0)
        for k0 in range(0, N, U):
            for u in range(U):      # U steps unrolled: constant shared-memory offsets, one branch
                k = uint64(k0 + u)
                for r in range(TM):
                    # A[a0 + r, k]
                    x[r] = a[k, ua + uint64(r)] if AT else a[ua + uint64(r), k]
                for c in range(TN):
                    # B[k, b0 + 8 c]
                    y[c] = b[ub + uint64(LANE_COLS * c), k] if BT else b[k, ub + uint64(LANE_COLS * c)]
                for r in range(TM):
                    for c in range(TN):
                        # acc_rc += A_rk B_kc
                        acc[r, c] += x[r] * y[c]

    return product


def product_abt(tm: int, tn: int, n: int, fresh: bool = False):
    """:func:`micro_product` of ``A B^T``: acc[r, c] (+)= sum_{d < n} a[a0 + r, d] b[b0 + 8 c, d]
    (``S = Q K^T``, ``dP = dO V^T``; ``a`` and ``b`` are shared tiles)."""
    return micro_product(tm, tn, n, False, True, fresh)


def product_ab(tm: int, tn: int, n: int, fresh: bool = False):
    """:func:`micro_product` of ``A B``: acc[r, e] (+)= sum_{c < n} a[a0 + r, c] b[c, b0 + 8 e]
    (``O = P V``, ``dV = P^T dO``), B read along its rows."""
    return micro_product(tm, tn, n, False, False, fresh)


def product_atb(tm: int, tn: int, n: int, fresh: bool = False):
    """:func:`micro_product` of ``A^T B`` with ``A`` stored transposed:
    acc[r, e] (+)= sum_{c < n} a[c, a0 + r] b[c, b0 + 8 e] (``dQ = dS K`` from the backward's
    ``dS^T`` tile). The lanes of a warp read ``a[c, a0 + r]`` in one row (4 distinct words,
    broadcast to the 8 lanes that share them) and ``b[c, b0 + 8 e]`` in one row: no bank conflict
    whatever the padding."""
    return micro_product(tm, tn, n, True, False, fresh)
