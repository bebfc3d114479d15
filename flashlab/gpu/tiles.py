"""Device helpers every CUDA kernel of the twin shares: where a block sits, tiles in and out, counts.

``stage`` is the one copy from global to shared memory in :mod:`flashlab.gpu.forward`,
:mod:`flashlab.gpu.backward` and :mod:`flashlab.gpu.standard`: the block's threads stride over
the tile's elements (thread ``t`` copies elements ``t, t + threads, ...``, so neighbouring threads
read neighbouring addresses). Every helper that touches global memory returns the bytes this
thread moved; a kernel adds them into its thread-local ``reads`` / ``writes`` and only the
instrumented build (``count=True``) hands them to ``flush``, which adds them to the kernel's global
``counter`` (read, write) once, at the end. In the plain build the local sums are never used and
the compiler drops them.
"""
from __future__ import annotations

from numba import float32

from flashlab.gpu.target import cuda as _select_target

cuda = _select_target()   # the helpers name `cuda` as a module global (the simulator swaps it)

__all__ = ["stage", "next_tile", "flush", "block_heads", "query_rows", "store_row", "add_product_tile"]


@cuda.jit(device=True)
def stage(dst, src, b, h, r0, rows, t, threads):
    """dst[:rows] <- src[b, h, r0:r0 + rows] (float32); returns the bytes thread ``t`` read."""
    n = dst.shape[1]
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


@cuda.jit(device=True)
def query_rows(BQ, Sq):
    """(qb, t, i0, rows, i) of this thread: query block ``qb`` (grid axis y) starts at row
    ``i0 = qb BQ`` and holds ``rows`` rows (fewer in the last block); thread ``t`` owns row
    ``i = i0 + t`` (threads with ``t >= rows`` only help to stage tiles)."""
    qb = cuda.blockIdx.y
    t = cuda.threadIdx.x
    i0 = qb * BQ
    return qb, t, i0, min(BQ, Sq - i0), i0 + t


@cuda.jit(device=True)
def store_row(dst, b, h, i, row):
    """dst[b, h, i, :] <- row (float32, one thread's row); returns the bytes written."""
    n = dst.shape[3]
    for d in range(n):
        dst[b, h, i, d] = row[d]
    return 4 * n


@cuda.jit(device=True)
def add_product_tile(dst, b, h, j0, cols, a, x, rows, factor, t, threads):
    """dst[b, h, j0 + c, d] += factor * sum_r a[r, c] x[r, d] for c < cols, by atomic adds.

    ``a`` (rows x cols) and ``x`` (rows x n) are shared tiles; the block's threads stride over
    the ``cols x n`` elements, each a sum over the block's rows added with one atomic (blocks of
    other query blocks add into the same rows). Returns the bytes thread ``t`` wrote.
    """
    n = x.shape[1]
    nbytes = 0
    for e in range(t, cols * n, threads):
        c = e // n
        d = e % n
        acc = float32(0.0)
        for r in range(rows):
            acc += a[r, c] * x[r, d]
        cuda.atomic.add(dst, (b, h, j0 + c, d), acc * factor)
        nbytes += 4
    return nbytes
