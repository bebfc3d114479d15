"""The operator's input layouts (BSH, SBH, BSND, BNSD, TND) and the canonical (B, N, S, D) view.

:func:`canonical` checks query, key and value against ``input_layout`` and ``head_num`` and
returns them as (B, N, S, D) arrays (TND: as given, (T, N, D)) with their :class:`Dims`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from flashlab.cann.attributes import FLOAT_NAMES, LAYOUTS, MAX_HEAD_DIM, MAX_HEADS, int64

__all__ = ["Dims", "to_bnsd", "from_bnsd", "layout_shape", "operand_array", "split_hidden", "canonical"]


def to_bnsd(x: np.ndarray, layout: str, heads: int) -> np.ndarray:
    """View ``x`` in layout BSH/SBH/BSND/BNSD as ``(B, N, S, D)`` (``heads`` = N, used by BSH/SBH)."""
    if layout == "BSH":
        B, S, H = x.shape
        return x.reshape(B, S, heads, H // heads).transpose(0, 2, 1, 3)
    if layout == "SBH":
        S, B, H = x.shape
        return x.reshape(S, B, heads, H // heads).transpose(1, 2, 0, 3)
    if layout == "BSND":
        return x.transpose(0, 2, 1, 3)
    if layout == "BNSD":
        return x
    raise ValueError(f"input_layout must be one of BSH, SBH, BSND, BNSD here; got {layout!r}")


def from_bnsd(x: np.ndarray, layout: str) -> np.ndarray:
    """``(B, N, S, D)`` -> layout BSH/SBH/BSND/BNSD (C-contiguous)."""
    B, N, S, D = x.shape
    if layout == "BSH":
        out = x.transpose(0, 2, 1, 3).reshape(B, S, N * D)
    elif layout == "SBH":
        out = x.transpose(2, 0, 1, 3).reshape(S, B, N * D)
    elif layout == "BSND":
        out = x.transpose(0, 2, 1, 3)
    elif layout == "BNSD":
        out = x
    else:
        raise ValueError(f"input_layout must be one of BSH, SBH, BSND, BNSD here; got {layout!r}")
    return np.ascontiguousarray(out)


def layout_shape(layout: str, b: int, n: int, s: int, d: int) -> tuple[int, ...]:
    """Shape of a (b, n, s, d) tensor in ``layout`` BSH/SBH/BSND/BNSD."""
    return {"BSH": (b, s, n * d), "SBH": (s, b, n * d), "BSND": (b, s, n, d),
            "BNSD": (b, n, s, d)}[layout]


@dataclass
class Dims:
    """Sizes read from the operands. In TND, ``B`` is the number of sequences and Sq, Sk the
    token counts T_q, T_k."""

    B: int
    N1: int   # query heads (head_num)
    N2: int   # key/value heads
    Sq: int
    Sk: int
    D: int    # Q and K head dim
    Dv: int   # V head dim (<= D)


def operand_array(name: str, x, ndim: int, shape: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of shape {shape}; got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape} ({ndim} dims); got shape {x.shape}")
    return x


def split_hidden(name: str, hidden: int, heads: int | None, d: int | None, what: str) -> int:
    """For BSH/SBH: ``hidden = heads * d``; return the unknown one, with a clear error."""
    known = cast(int, heads if heads is not None else d)   # the caller passes one of them
    if hidden % known != 0:
        raise ValueError(f"{name}'s hidden size H={hidden} must be a multiple of {what}={known}")
    return hidden // known


def canonical(query, key, value, head_num, layout) -> tuple[np.ndarray, np.ndarray, np.ndarray, Dims]:
    """Check the operands against ``layout`` and return them as (B, N, S, D) arrays (TND: as given)."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"input_layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    N1 = int64("head_num", head_num)
    if not 1 <= N1 <= MAX_HEADS:
        raise ValueError(f"head_num must be in 1..{MAX_HEADS} (FlashAttentionScore: "
                         f"\"Nq取值范围1~256\"); got {N1}")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if isinstance(x, np.ndarray) and x.dtype.name not in FLOAT_NAMES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64; got {x.dtype}")
    if all(isinstance(x, np.ndarray) for x in (query, key, value)):
        for name, x in (("key", key), ("value", value)):
            if x.dtype != query.dtype:
                raise TypeError(f"{name} must have the query's dtype {query.dtype} (\"输入query、key、"
                                f"value、pse的数据类型必须一致\"); got {x.dtype}")
    if layout in ("BSH", "SBH"):
        dims = "[B, S, N*D]" if layout == "BSH" else "[S, B, N*D]"
        q = operand_array("query", query, 3, dims)
        k = operand_array("key", key, 3, dims)
        v = operand_array("value", value, 3, dims)
        D = split_hidden("query", q.shape[2], N1, None, "head_num")
        N2 = split_hidden("key", k.shape[2], None, D, "D = H_q / head_num")
        Dv = split_hidden("value", v.shape[2], N2, None, "key's head count N_kv")
        q, k, v = to_bnsd(q, layout, N1), to_bnsd(k, layout, N2), to_bnsd(v, layout, N2)
    elif layout in ("BSND", "BNSD"):
        dims = f"[{', '.join(layout)}]"
        q = operand_array("query", query, 4, dims)
        k = operand_array("key", key, 4, dims)
        v = operand_array("value", value, 4, dims)
        q, k, v = (to_bnsd(x, layout, 0) for x in (q, k, v))
    else:  # TND
        q = operand_array("query", query, 3, "[T, N, D]")
        k = operand_array("key", key, 3, "[T, N, D]")
        v = operand_array("value", value, 3, "[T, N, D]")
    # from here on: (B, N, S, D), or (T, N, D) for TND: the heads are axis 1 in both
    if q.shape[1] != N1:
        raise ValueError(f"query has {q.shape[1]} heads in layout {layout} but head_num={N1}")
    D, N2, Dv = q.shape[-1], k.shape[1], v.shape[-1]
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"query's head dim D must be in 1..{MAX_HEAD_DIM} (FlashAttentionScore: "
                         f"\"D：取值范围为1~768\"); got {D}")
    if k.shape[-1] != D:
        raise ValueError(f"key's head dim must equal query's D={D}; got {k.shape[-1]}")
    if Dv > D:
        raise ValueError(f"value's head dim must be <= D={D} of query/key (the operator needs "
                         f"D_q = D_k >= D_v); got {Dv}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"key and value must agree in every axis but the last (layout {layout}); "
                         f"got key {tuple(k.shape)} and value {tuple(v.shape)} after reading the layout")
    if N1 % N2 != 0:
        raise ValueError(f"head_num={N1} must be a multiple of key's head count N_kv={N2} (GQA)")
    if layout == "TND":
        return q, k, v, Dims(0, N1, N2, q.shape[0], k.shape[0], D, Dv)
    B = q.shape[0]
    if k.shape[0] != B:
        raise ValueError(f"query and key must have the same batch B={B}; got {k.shape[0]}")
    return q, k, v, Dims(B, N1, N2, q.shape[2], k.shape[2], D, Dv)
