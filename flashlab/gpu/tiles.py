"""Device helpers every CUDA kernel of the twin shares: stage a tile in shared memory, flush counts.

``stage`` is the one copy from global to shared memory in :mod:`flashlab.gpu.forward`,
:mod:`flashlab.gpu.backward` and :mod:`flashlab.gpu.standard`: the block's threads stride over
the tile's elements (thread ``t`` copies elements ``t, t + threads, ...``, so neighbouring threads
read neighbouring addresses), and it returns the bytes this thread read, which the instrumented
build adds to its count and the plain build drops. ``flush`` adds a thread's counts to the
kernel's global ``counter`` (read, write) once, at the end.
"""
from __future__ import annotations

from flashlab.gpu.target import cuda as _select_target

cuda = _select_target()   # the helpers name `cuda` as a module global (the simulator swaps it)

__all__ = ["stage", "flush", "block_heads"]


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
