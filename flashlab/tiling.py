"""Tile defaults: one source for the tile sizes and the backward's work split.

Pure Python (no Numba, no NumPy), so the kernels, the API, the cost model and the
benchmark all import the same numbers without importing each other.

- :data:`FORWARD_BLOCK`, :data:`BACKWARD_BLOCK`: the default ``(block_q, block_k)`` tiles;
- :func:`q_splits` with :data:`MIN_WORK_ITEMS`: how many chunks of query blocks each head of
  the backward is cut into, from the shape alone.
"""
from __future__ import annotations

__all__ = ["FORWARD_BLOCK", "BACKWARD_BLOCK", "MIN_WORK_ITEMS", "q_splits", "cdiv"]

#: The forward's default tile sizes ``(block_q, block_k)``. Chosen by measurement on a 2-core
#: machine (B=1, H=8, fp32, speed relative to torch SDPA in the same run): D=128, N=4096:
#: 64x64 0.77x, 128x128 0.85x, 256x64 0.86-0.92x, 256x128 0.95x; QK 192 / V 128, N=8192:
#: 64x64 2.1x, 128x128 2.6x, 256x128 2.85x. A taller q-block re-reads K/V from memory fewer
#: times (once per 256 query rows instead of 64) and gives BLAS larger gemms; 256x128 float32
#: tiles (128 KiB score tile + 128 KiB accumulator) still fit a core's 1 MiB L2.
FORWARD_BLOCK: tuple[int, int] = (256, 128)

#: The backward's default tile sizes ``(block_q, block_k)``. Against 128x128, in CPU seconds
#: (the process time of both threads, which a busy shared machine disturbs far less than wall
#: time), alternating the two: D=128 N=2048 0.91, N=4096 0.90, QK 192 / V 128 N=2048 0.91;
#: causal 0.99 (256x128: 0.93-0.97 non-causal). A profile of the 128x128 backward spent 27% of
#: its BLAS time packing operands (``sgemm_*copy``): a larger tile packs each operand once for
#: more FLOPs. The S and dP tiles (256 KiB each) no longer fit a core's 1 MiB L2 with the rest,
#: and the tile is still faster. (The forward's 512x128 measured 0.93-0.96 non-causal but 1.02
#: causal, which would also raise the causal/non-causal ratio: the forward keeps 256x128.)
BACKWARD_BLOCK: tuple[int, int] = (256, 256)

#: :func:`q_splits` splits the query blocks of each head until there are at least this many
#: parallel work items (a constant, never the thread count: the bits must not depend on it).
MIN_WORK_ITEMS = 4


def cdiv(a: int, b: int) -> int:
    """Ceiling division ``ceil(a / b)`` for ints: the number of ``b``-sized blocks covering ``a``."""
    return -(-a // b)


def q_splits(batch: int, heads: int, n_qblocks: int) -> int:
    """Number of query-block chunks per head: the smallest giving ``>= MIN_WORK_ITEMS`` items.

    $n_{split} = \\max(1, \\min(n_{qb}, \\lceil W / (B H) \\rceil))$ with $W$ = MIN_WORK_ITEMS.

    >>> q_splits(1, 8, 32), q_splits(1, 1, 32), q_splits(1, 2, 32), q_splits(1, 1, 3)
    (1, 4, 2, 3)
    """
    want = cdiv(MIN_WORK_ITEMS, batch * heads)
    return max(1, min(n_qblocks, want))
