"""The varlen layout TND: sequences packed along T, read from cumulative ends.

:func:`sequences` turns ``actual_seq_qlen``/``actual_seq_kvlen`` (cumulative ends, trailing
zeros for unused batches) into token ranges; :func:`take_rows`/:func:`put_rows` move one
sequence between the packed arrays and the kernels' (1, N, s, D) operands.
"""
from __future__ import annotations

import numpy as np

from flashlab.cann.attributes import int64_list
from flashlab.cann.layouts import Dims

__all__ = ["sequences", "take_rows", "take_lse", "put_rows"]


def _seq_ends(name: str, cum, total: int) -> list[int]:
    """Cumulative ends -> ends of each sequence, trailing zeros (unused batches) kept as repeats."""
    if cum is None:
        raise ValueError(f"input_layout TND needs {name} (cumulative sequence ends, e.g. [2, 4, 6])")
    ends = int64_list(name, cum)
    if not ends:
        raise ValueError(f"{name} must list at least one sequence end; got {cum!r}")
    # trailing zeros mark batches that take no part ([2, 5, 9, 0, 0])
    n = len(ends)
    while n > 1 and ends[n - 1] == 0:
        n -= 1
    used = ends[:n]
    if used[0] < 0 or any(b < a for a, b in zip(used, used[1:])):
        raise ValueError(f"{name} must be non-decreasing cumulative ends >= 0 (lengths 2, 2, 2 -> "
                         f"[2, 4, 6]); got {ends}")
    if used[-1] != total:
        raise ValueError(f"{name} must end at the token count T={total} of the tensor; got {ends}")
    return used + [used[-1]] * (len(ends) - n)


def sequences(actual_seq_qlen, actual_seq_kvlen, dims: Dims) -> list[tuple[int, int, int, int]]:
    """``(q0, q1, k0, k1)`` token ranges of every sequence of a TND batch.

    A sequence may have queries and no key: its rows have no allowed key.
    """
    q_ends = _seq_ends("actual_seq_qlen", actual_seq_qlen, dims.Sq)
    k_ends = _seq_ends("actual_seq_kvlen", actual_seq_kvlen, dims.Sk)
    if len(q_ends) != len(k_ends):
        raise ValueError(f"actual_seq_qlen and actual_seq_kvlen must list the same number of "
                         f"sequences; got {len(q_ends)} and {len(k_ends)}")
    return [(q_ends[s - 1] if s else 0, q1, k_ends[s - 1] if s else 0, k1)
            for s, (q1, k1) in enumerate(zip(q_ends, k_ends))]


def take_rows(x: np.ndarray, rows: slice, varlen: bool) -> np.ndarray:
    """Rows of a canonical array as a (B', N, s, D) kernel operand (TND: one sequence, B' = 1)."""
    return x[rows].transpose(1, 0, 2)[None] if varlen else x[rows]


def take_lse(lse: np.ndarray, rows: slice, varlen: bool) -> np.ndarray:
    """(B, N, Sq) or TND (T, N) LSE rows -> (B', N, s)."""
    return lse[rows].T[None] if varlen else lse[rows]


def put_rows(dst: np.ndarray, rows: slice, varlen: bool, val: np.ndarray) -> None:
    """Inverse of :func:`take_rows` for results: (1, N, s, ...) back into TND rows (s, N, ...)."""
    dst[rows] = np.moveaxis(val[0], 0, 1) if varlen else val
