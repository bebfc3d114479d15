"""The operator's input layouts (BSH, SBH, BSND, BNSD, TND) and the canonical (B, N, S, D) view.

:func:`canonical` checks query, key and value against ``input_layout`` and ``head_num`` and
returns them as (B, N, S, D) arrays (TND: as given, (T, N, D)) with their :class:`Dims`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from flashlab.cann.attributes import LAYOUTS, MAX_HEAD_DIM, MAX_HEADS, int64
from flashlab.validation import Door, operands, rope_operands

__all__ = ["Dims", "DOORS", "to_bnsd", "from_bnsd", "layout_shape", "split_hidden", "canonical"]

#: the operator's names for the kernel API's arguments
_NAMES = (("q", "query"), ("k", "key"), ("v", "value"), ("q_rope", "query_rope"),
          ("k_rope", "key_rope"), ("do", "dy"), ("o", "attention_in"),
          ("lse", "softmax_max/softmax_sum"))
_SYMBOLS = (("H", "N"), ("Hkv", "N_kv"), ("Sk", "Skv"), ("Dqk", "D"), ("Hr", "N_r"))
_READ = " (read as [B, N, S, D] from layout {})"

#: each layout's table for :func:`flashlab.validation.operands`: the operator's names, its
#: shapes, and the axis order of (B, N, S, D) in the layout (BSH/SBH: shown as read)
DOORS = {
    "BSH": Door(names=_NAMES, shapes=("[B, S, N*D]", "[B, S, N_kv*D]", "[B, S, N_kv*Dv]"),
                rope_shapes=("[B, S, N*Dr]", "[B, S, N_r*Dr]"),
                order=(0, 1, 2, 3), ndim=3, symbols=_SYMBOLS, note=_READ.format("BSH")),
    "SBH": Door(names=_NAMES, shapes=("[S, B, N*D]", "[S, B, N_kv*D]", "[S, B, N_kv*Dv]"),
                rope_shapes=("[S, B, N*Dr]", "[S, B, N_r*Dr]"),
                order=(0, 1, 2, 3), ndim=3, symbols=_SYMBOLS, note=_READ.format("SBH")),
    "BSND": Door(names=_NAMES, shapes=("[B, Sq, N, D]", "[B, Skv, N_kv, D]", "[B, Skv, N_kv, Dv]"),
                 rope_shapes=("[B, Sq, N, Dr]", "[B, Skv, N_r, Dr]"),
                 order=(0, 2, 1, 3), symbols=_SYMBOLS),
    "BNSD": Door(names=_NAMES, shapes=("[B, N, Sq, D]", "[B, N_kv, Skv, D]", "[B, N_kv, Skv, Dv]"),
                 rope_shapes=("[B, N, Sq, Dr]", "[B, N_r, Skv, Dr]"),
                 symbols=_SYMBOLS),
    "TND": Door(names=_NAMES, shapes=("[T_q, N, D]", "[T_kv, N_kv, D]", "[T_kv, N_kv, Dv]"),
                rope_shapes=("[T_q, N, Dr]", "[T_kv, N_r, Dr]"),
                order=(2, 1, 3), packed=True,
                symbols=_SYMBOLS[:2] + (("Sq", "T_q"), ("Sk", "T_kv"), ("Dqk", "D"), ("Hr", "N_r"))),
}


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


def split_hidden(name: str, hidden: int, heads: int | None, d: int | None, what: str) -> int:
    """For BSH/SBH: ``hidden = heads * d``; return the unknown one, with a clear error."""
    known = cast(int, heads if heads is not None else d)   # the caller passes one of them
    if hidden % known != 0:
        raise ValueError(f"{name}'s hidden size H={hidden} must be a multiple of {what}={known}")
    return hidden // known


def layout_name(layout) -> str:
    """``input_layout`` in capitals, checked: any case is accepted, as the source does.

    op-plugin upper-cases the string before its check (``for (auto &c : input_layout_str)
    c = toupper(c);`` then "The input_layout should be BSH/SBH/BNSD/BSND/TND(case-insensitive)",
    ``npu_fusion_attention`` and its grad); the PTA documents list the names in capitals only.
    """
    if not isinstance(layout, str) or layout.upper() not in LAYOUTS:
        raise ValueError(f"input_layout must be one of {', '.join(LAYOUTS)} (any case); got {layout!r}")
    return layout.upper()


def canonical(query, key, value, head_num, layout, query_rope=None, key_rope=None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, Dims]:
    """Read the operands in ``layout``; return ``(q, k, v, q_rope, k_rope, dims)`` as (B, N, S, D)
    arrays (TND: as given), the rope pair ``(None, None)`` when not given.

    The operand checks are :func:`flashlab.validation.operands`' and
    :func:`~flashlab.validation.rope_operands`' (with the layout's :data:`DOORS` entry); the
    operator's ranges are checked here. The rope operands: query_rope in the query's layout with
    ``head_num`` heads, key_rope in the key's; for BSH/SBH ``Dr = H_qr / head_num`` and
    ``N_r = H_kr / Dr``.
    """
    layout = layout_name(layout)
    N1 = int64("head_num", head_num)
    if not 1 <= N1 <= MAX_HEADS:
        raise ValueError(f"head_num must be in 1..{MAX_HEADS} (FlashAttentionScore: "
                         f"\"Nq取值范围1~256\"); got {N1}")

    def read(q, k, v):
        # BSH/SBH: H = N * D; the query's D from head_num, the key's N_kv from that D
        D = split_hidden("query", q.shape[2], N1, None, "head_num")
        N2 = split_hidden("key", k.shape[2], None, D, "D = H_q / head_num")
        split_hidden("value", v.shape[2], N2, None, "key's head count N_kv")
        return to_bnsd(q, layout, N1), to_bnsd(k, layout, N2), to_bnsd(v, layout, N2)

    q4, k4, v4 = operands(DOORS[layout], query, key, value,
                          to_kernel=read if layout in ("BSH", "SBH") else None)
    # heads are axis 1 of (B, N, S, D)
    if q4.shape[1] != N1:
        raise ValueError(f"query has {q4.shape[1]} heads in layout {layout} but head_num={N1}")
    D, N2, Dv = q4.shape[3], k4.shape[1], v4.shape[3]
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"query's head dim D must be in 1..{MAX_HEAD_DIM} (FlashAttentionScore: "
                         f"\"D：取值范围为1~768\"); got {D}")
    if Dv > D:
        raise ValueError(f"value's head dim must be <= D={D} of query/key (the operator needs "
                         f"D_q = D_k >= D_v); got {Dv}")
    qr4, kr4 = rope_operands(DOORS[layout], q4, k4, query_rope, key_rope, _ROPE_SHAPES[layout],
                             to_kernel=None if layout == "TND" else _rope_reader(layout, N1))
    if layout == "TND":
        qr, kr = (None, None) if qr4 is None else (query_rope, key_rope)
        return query, key, value, qr, kr, Dims(0, N1, N2, query.shape[0], key.shape[0], D, Dv)
    B = q4.shape[0]
    return q4, k4, v4, qr4, kr4, Dims(B, N1, N2, q4.shape[2], k4.shape[2], D, Dv)


#: how the rope operands' messages describe them, per layout (query_rope's, key_rope's)
_ROPE_SHAPES = {"BSH": ("[B, S, N*Dr]",) * 2, "SBH": ("[S, B, N*Dr]",) * 2,
                "BSND": ("[B, S, N, D]",) * 2, "BNSD": ("[B, N, S, D]",) * 2, "TND": ("[T, N, Dr]",) * 2}


def _rope_reader(layout: str, N1: int):
    """The reader of the rope pair in layout BSH/SBH/BSND/BNSD as (B, N, S, Dr) views."""
    def read(qr: np.ndarray, kr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if layout not in ("BSH", "SBH"):
            return to_bnsd(qr, layout, 0), to_bnsd(kr, layout, 0)
        # H_qr = head_num * Dr; H_kr = N_r * Dr
        dr = split_hidden("query_rope", qr.shape[2], N1, None, "head_num")
        nr = split_hidden("key_rope", kr.shape[2], None, dr, "query_rope's Dr = H_qr / head_num")
        return to_bnsd(qr, layout, N1), to_bnsd(kr, layout, nr)
    return read
