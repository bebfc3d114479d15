"""The varlen layout TND: sequences packed along T, read from cumulative ends.

:func:`sequences` turns ``actual_seq_qlen``/``actual_seq_kvlen`` (cumulative ends, trailing
zeros for unused batches) into token ranges; :func:`take_rows`/:func:`put_rows` move one
sequence between the packed arrays and the kernels' (1, N, s, D) operands.
"""
from __future__ import annotations

import numpy as np

from flashlab.cann.layouts import Dims
from flashlab.validation import packed_sequences

__all__ = ["sequences", "take_rows", "take_lse", "put_rows"]


def sequences(actual_seq_qlen, actual_seq_kvlen, dims: Dims) -> list[tuple[int, int, int, int]]:
    """``(q0, q1, k0, k1)`` token ranges of every sequence of a TND batch (trailing unused
    batches as empty ranges after the last). A sequence may have queries and no key: its rows
    have no allowed key.

    The last ends may lie below T_q, T_kv: the device's tiling refuses only ``T < sum of the
    lengths`` (ops-transformer ``flash_attention_score`` tiling, ``AnalyzeTndLayout``:
    "OP_CHECK_IF(t1Size < accumS1 || t2Size < accumS2, ... Query T(%ld) and key T(%ld) need
    larger than respectively sum of seqLen(%ld) and sekvLen(%ld)."). The rows after the last
    end belong to no sequence: no kernel call reads or writes them.
    """
    return packed_sequences(("actual_seq_qlen", "actual_seq_kvlen"), actual_seq_qlen,
                            actual_seq_kvlen, (dims.Sq, dims.Sk), leading_zero=False,
                            example="[2, 4, 6]", within=True)


def take_rows(x: np.ndarray, rows: slice, varlen: bool) -> np.ndarray:
    """Rows of a canonical array as a (B', N, s, D) kernel operand (TND: one sequence, B' = 1)."""
    return x[rows].transpose(1, 0, 2)[None] if varlen else x[rows]


def take_lse(lse: np.ndarray, rows: slice, varlen: bool) -> np.ndarray:
    """(B, N, Sq) or TND (T, N) LSE rows -> (B', N, s)."""
    return lse[rows].T[None] if varlen else lse[rows]


def put_rows(dst: np.ndarray, rows: slice, varlen: bool, val: np.ndarray) -> None:
    """Inverse of :func:`take_rows` for results: (1, N, s, ...) back into TND rows (s, N, ...)."""
    dst[rows] = np.moveaxis(val[0], 0, 1) if varlen else val
