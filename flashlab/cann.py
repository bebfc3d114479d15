r"""The Ascend CANN operator's interface, ``FlashAttentionScore`` and its grad, on flashlab's kernels.

What the operator computes (CANN ops-transformer docs, *FlashAttentionScore* and
*FlashAttentionScoreV2*; the same operator is ``torch_npu.npu_fusion_attention``):

$$
\text{attention\_out} = \operatorname{Dropout}\big(\operatorname{Softmax}(
\operatorname{Mask}(\text{scale}\,(\text{pse} + Q K^\top), \text{atten\_mask})), \text{keep\_prob}\big)\,V
\quad(\text{pse\_type} = 1,\ \text{the default}),
$$

and ``scale * Q K^T + pse`` for ``pse_type`` 0, 2, 3 ("先mul再add", *FlashAttentionScoreV2*).

This module is a CPU reference of that interface: it reads the operator's arguments (layouts,
``head_num``, ``sparse_mode``, ``pre_tokens``/``next_tokens``, ``prefix``, the cumulative
``actual_seq_qlen``/``actual_seq_kvlen`` of the varlen layout TND, ``pse``/``pse_type``,
``keep_prob``/``seed``/``offset``), turns the mask arguments into flashlab's mask model (a band
``[i - left, i + right]`` plus, only where a rule needs one, a dense mask; see
:mod:`flashlab.masks`) and runs the ``flashlab.kernels`` on each piece. The band is what lets
the kernel skip whole tiles, as the operator's block-sparse scheduling does.

**Layouts** (``input_layout``): ``BSH`` [B, S, N*D], ``SBH`` [S, B, N*D], ``BSND``, ``BNSD``,
``TND`` [T, N, D]. In TND the sequences are packed along T; ``actual_seq_qlen`` and
``actual_seq_kvlen`` give the *cumulative* ends (lengths 2, 2, 2 -> ``[2, 4, 6]``), a length may be
0, and trailing zeros mark unused batches (``[2, 5, 9, 0, 0]``). Every sequence attends only
within itself; no padding is computed: the kernel runs on each sequence's own slice. A sequence
with queries but no key (``Sq > 0``, ``Skv = 0``) gets the outputs of a row with no allowed key.

**Heads and dims**: ``head_num`` is the query's N, ``1 <= N <= 256``; the key's N is read from
its shape (for BSH/SBH ``N_kv = H_kv / D``) and ``N_q % N_kv == 0`` (GQA; ``N_kv = 1`` is MQA).
``D_q = D_k >= D_v`` and ``D <= 768`` (*FlashAttentionScore* constraints: "N：取值范围为1~256",
"D：取值范围为1~768", "D：Head-Dim必须满足(qD == kD && kD >= vD)").

**Dtypes**: float16, float32, float64 and bfloat16 (``ml_dtypes.bfloat16`` arrays; computed in
float32, returned in bfloat16). query, key, value and a tensor ``pse`` share one dtype
("输入query、key、value、pse的数据类型必须一致").

**Masks**: ``sparse_mode`` 0..8 as listed in :data:`flashlab.masks.SPARSE_MODES` and drawn by
:mod:`flashlab.viz.sparse_modes`. Modes 2, 3, 4, 7, 8 take the *compressed* ``atten_mask``
(the ``2048 x 2048`` strict upper triangle) and mode 6 the ``3072 x 2048`` one: the operator
uses it only as a stamp for diagonal tiles and derives the mask from the rule, so this module
checks the stamp's shape and content and builds the real mask from the rule. **Without an
atten_mask the operator computes full attention** (*torch_npu.npu_fusion_attention*: "当
atten_mask输入为None时，sparse_mode，pre_tockens，next_tockens参数不生效，固定为全计算"), and so
does this module. ``prefix`` is read by modes 5 and 6 only (the docs' own example passes
``prefix = {0}`` with ``sparseMode = 0``).

**RoPE operands** (the MLA variant of the operator, ``query_rope``/``key_rope``):

$$
\text{scores} = \text{scale}\,(Q K^\top + Q^{rope} {K^{rope}}^\top),
$$

``query_rope`` in the query's layout with ``head_num`` heads and its own head dim ``D_r``
(a multiple of 8, ``D_r <= D``), ``key_rope`` in the key's layout. Here ``key_rope`` may have any
head count dividing ``head_num``; MLA's is 1 (one RoPE key per token, shared by every head),
which the kernel reads as it is, never copied per head. The grad then also returns
``dq_rope`` and ``dk_rope`` (summed over the heads sharing a ``key_rope`` head).

**pse** (``pse_type``, *FlashAttentionScoreV2*): 0 = ``scale * QK^T + pse``, 1 = ``scale *
(QK^T + pse)``, 2 = the bias ``-slope * |j - i - q_start_idx + kv_start_idx|`` generated from
the ALiBi slopes ``pse`` ([B, N] or [N], float32), 3 = the same with ``sqrt`` of the distance
(the vendor's test golden, ops-transformer ``tests/pytest/test_utils.py`` ``generate_pse``).
Tensor shapes: [B,N,Sq,Skv], [B,N,1,Skv], [1,N,Sq,Skv] and the ALiBi-compressed
[B,N,1024,Skv]/[1,N,1024,Skv] (the last 1024 rows of a Toeplitz ALiBi pse, Sq > 1024); in TND
[B,N,1024,maxSkv]/[1,N,1024,maxSkv] and the flat [pseTotalLen] of per-sequence [N, Sq_i, Skv_i]
blocks (*FlashAttentionVarLenScoreV4*).

**Dropout** (``keep_prob < 1``): P is multiplied by a keep mask and divided by ``keep_prob``;
the mask is :func:`flashlab.dropout.keep_mask` of ``seed``, with entry ``(b, h, i, j)`` of a
B/N/S/D layout at counter ``offset + ((b N + h) Sq + i) Skv + j`` and entry ``(h, i, j)`` of TND
sequence ``s`` at ``offset + N sum_{t<s} Sq_t Skv_t + (h Sq_s + i) Skv_s + j`` (the vendor's own
order: its TND drop mask is the per-sequence [N, Sq_i, Skv_i] blocks one after the other). The
grad takes the same ``seed``/``offset`` and regenerates the same mask. The bits are flashlab's
SplitMix64 generator, not the device's Philox: same contract, other numbers.

**Outputs**: ``softmax_max`` and ``softmax_sum`` are float32 ``[B, N, Sq, 8]`` (TND:
``[T, N, 8]``), each value repeated 8 times (32-byte alignment on the device).
``softmax_max`` is the row max of the scaled, biased, masked scores and ``softmax_sum`` the row
sum of ``exp(score - max)``, so the log-sum-exp is

$$
\mathrm{LSE} = \text{softmax\_max} + \log(\text{softmax\_sum}).
$$

In TND the default order of those ``T * N * 8`` values is NTD, sequence by sequence: for each
sequence ``i`` a block ``[N, Sq_i, 8]``, the blocks one after the other (*FlashAttentionVarLenScoreV4*:
"原FlashAttentionVarLenScore接口中的softmax相关输出的数据排布为NTD"; the vendor golden concatenates
each sequence's flattened ``[1, N, Sq_i, 8]``); ``softmax_layout="TND"`` gives token-major
``[T, N, 8]`` (*torch_npu.npu_fusion_attention*: "默认情况下，softmax的输出排布为NTD排布；传入TND时，
softmax的输出排布为TND排布").

A row with **no allowed key** (e.g. mode 3 with Sq > Sk, a band that misses a row, a TND
sequence without keys) returns ``attention_out = 0``, ``softmax_max = -3.4028235e38`` and
``softmax_sum = 3.4028235e38`` (float32 lowest and max), as the device's invalid-row path and
its golden write them (ops-transformer ``tests/pytest/cpu_impl.py``, ``skip_invalid_row``:
``x_max = torch.finfo(torch.float).min``, ``x_sum = torch.finfo(torch.float).max``). Such a
row gets zero gradients.

**Where this reference is stricter than the device.** A wrong compressed mask raises
``ValueError`` (the device computes wrong results), so do the documented ranges: mode 0 with
negative ``pre_tokens``/``next_tokens``, the TND rules of modes 3, 7, 8, an all-masked row in a
TND ``atten_mask``, pse with modes 7/8 or with an empty TND sequence. ``padding_mask`` (reserved,
"暂不支持该传参") raises ``NotImplementedError``.

Sources: CANN ops-transformer docs *FlashAttentionScore*, *FlashAttentionScoreV2*,
*FlashAttentionScoreGrad*, *FlashAttentionVarLenScoreV4* and *sparse_mode参数说明*
(github.com/hicann/ops-transformer, ``attention/flash_attention_score/docs/``) with the
operator's test golden (``attention/flash_attention_score/tests/pytest/cpu_impl.py``,
``test_utils.py``); Ascend op-plugin docs *torch_npu.npu_fusion_attention*
(github.com/Ascend/op-plugin, ``docs/context/torch_npu-npu_fusion_attention.md``); MindSpeed
*fusion attention 对外接口* (``pse_type``, ``q_start_idx``, ``kv_start_idx``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from flashlab import api
from flashlab.validation import prepare
from flashlab.masks import (NO_LIMIT, SPARSE_MODES, allowed, compressed_mask, prefix_mask,
                            sparse_mode_band, varlen_sequence_mode)

#: the input layouts the operator accepts
LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")

#: the operator's default ``pre_tokens``/``next_tokens`` (INT32_MAX: unbounded)
INT32_MAX = 2147483647

#: the range of the operator's int64 attributes
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

#: softmax_max / softmax_sum repeat each row's value this many times (32 bytes of float32)
SOFTMAX_REPEAT = 8

#: softmax_max / softmax_sum of a row with no allowed key: float32 lowest and max
EMPTY_ROW_MAX = float(np.finfo(np.float32).min)
EMPTY_ROW_SUM = float(np.finfo(np.float32).max)

#: the documented limits "N：取值范围为1~256" and "D：取值范围为1~768"
MAX_HEADS = 256
MAX_HEAD_DIM = 768

#: rows of the ALiBi-compressed pse ("只需要输入原始PSE最后1024行")
ALIBI_ROWS = 1024

#: ``softmax_layout`` values: "" (the default, NTD in TND) and "TND"
SOFTMAX_LAYOUTS = ("", "TND")

_FLOAT_NAMES = ("float16", "float32", "float64", "bfloat16")


def _is_bf16(dtype: np.dtype) -> bool:
    """bfloat16 arrays exist only once ``ml_dtypes`` is imported; recognised by name."""
    return np.dtype(dtype).name == "bfloat16"


def _compute(x: np.ndarray) -> np.ndarray:
    """bfloat16 -> float32 (the kernels' dtype for it); other dtypes unchanged."""
    return x.astype(np.float32) if _is_bf16(x.dtype) else x


# ------------------------------------------------------------------------------ integers
def _int(name: str, x) -> int:
    """An int64 attribute: Python or numpy integer, not bool, in [-2**63, 2**63 - 1]."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int (Python or numpy integer); got {x!r} "
                        f"of type {type(x).__name__}")
    v = int(x)
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"{name} must fit in int64 (the operator's attribute type, "
                         f"[-2**63, 2**63 - 1]); got {v}")
    return v


def _int_list(name: str, x) -> list[int]:
    """An int64 list attribute (list, tuple or integer numpy array)."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers; got a numpy array of dtype {x.dtype}")
        items = x.reshape(-1).tolist()
    elif isinstance(x, (list, tuple)):
        items = list(x)
    else:
        raise TypeError(f"{name} must be a list of ints; got {x!r} of type {type(x).__name__}")
    return [_int(f"{name}[{i}]", v) for i, v in enumerate(items)]


def _clamp(x: int) -> int:
    """pre/next tokens beyond any length act as unbounded: clamp into [-NO_LIMIT, NO_LIMIT]."""
    return max(-NO_LIMIT, min(NO_LIMIT, x))


# ------------------------------------------------------------------------------ layouts
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


def _array(name: str, x, ndim: int, shape: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of shape {shape}; got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape} ({ndim} dims); got shape {x.shape}")
    return x


def _split_hidden(name: str, hidden: int, heads: int | None, d: int | None, what: str) -> int:
    """For BSH/SBH: ``hidden = heads * d``; return the unknown one, with a clear error."""
    known = heads if heads is not None else d
    if hidden % known != 0:
        raise ValueError(f"{name}'s hidden size H={hidden} must be a multiple of {what}={known}")
    return hidden // known


def _canonical(query, key, value, head_num, layout) -> tuple[np.ndarray, np.ndarray, np.ndarray, Dims]:
    """Check the operands against ``layout`` and return them as (B, N, S, D) arrays (TND: as given)."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"input_layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    N1 = _int("head_num", head_num)
    if not 1 <= N1 <= MAX_HEADS:
        raise ValueError(f"head_num must be in 1..{MAX_HEADS} (FlashAttentionScore: "
                         f"\"Nq取值范围1~256\"); got {N1}")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if isinstance(x, np.ndarray) and x.dtype.name not in _FLOAT_NAMES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64; got {x.dtype}")
    if all(isinstance(x, np.ndarray) for x in (query, key, value)):
        for name, x in (("key", key), ("value", value)):
            if x.dtype != query.dtype:
                raise TypeError(f"{name} must have the query's dtype {query.dtype} (\"输入query、key、"
                                f"value、pse的数据类型必须一致\"); got {x.dtype}")
    if layout in ("BSH", "SBH"):
        dims = "[B, S, N*D]" if layout == "BSH" else "[S, B, N*D]"
        q = _array("query", query, 3, dims)
        k = _array("key", key, 3, dims)
        v = _array("value", value, 3, dims)
        D = _split_hidden("query", q.shape[2], N1, None, "head_num")
        N2 = _split_hidden("key", k.shape[2], None, D, "D = H_q / head_num")
        Dv = _split_hidden("value", v.shape[2], N2, None, "key's head count N_kv")
        q, k, v = to_bnsd(q, layout, N1), to_bnsd(k, layout, N2), to_bnsd(v, layout, N2)
    elif layout in ("BSND", "BNSD"):
        dims = f"[{', '.join(layout)}]"
        q = _array("query", query, 4, dims)
        k = _array("key", key, 4, dims)
        v = _array("value", value, 4, dims)
        q, k, v = (to_bnsd(x, layout, 0) for x in (q, k, v))
    else:  # TND
        q = _array("query", query, 3, "[T, N, D]")
        k = _array("key", key, 3, "[T, N, D]")
        v = _array("value", value, 3, "[T, N, D]")
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


# -------------------------------------------------------------------------- varlen lists
def _seq_ends(name: str, cum, total: int) -> list[int]:
    """Cumulative ends -> ends of each sequence, trailing zeros (unused batches) kept as repeats."""
    if cum is None:
        raise ValueError(f"input_layout TND needs {name} (cumulative sequence ends, e.g. [2, 4, 6])")
    ends = _int_list(name, cum)
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


def _sequences(actual_seq_qlen, actual_seq_kvlen, dims: Dims) -> list[tuple[int, int, int, int]]:
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


# ------------------------------------------------------------------------------- masks
@dataclass
class _Call:
    """One kernel call: rows of the canonical arrays and the mask that applies there.

    ``q_rows``/``kv_rows`` slice the batch axis of (B, N, S, D) arrays, or the token axis of
    TND arrays (one sequence); band ``[i - left, i + right]``; ``mask`` (Bm, 1 or N, sq, sk)
    bool (True = masked out) or None; ``seq`` the TND sequence index (None otherwise).
    """

    q_rows: slice
    kv_rows: slice
    left: int
    right: int
    mask: np.ndarray | None
    seq: int | None = None


def _as_bool_mask(atten_mask) -> np.ndarray:
    if not isinstance(atten_mask, np.ndarray):
        raise TypeError(f"atten_mask must be a numpy bool or uint8 array (1/True = masked out); "
                        f"got {type(atten_mask).__name__}")
    if atten_mask.dtype == np.bool_:
        return atten_mask
    if atten_mask.dtype == np.uint8:
        return atten_mask != 0
    raise TypeError(f"atten_mask must have dtype bool or uint8 (1 = masked out); got {atten_mask.dtype}")


def _check_compressed(mask: np.ndarray, mode: int) -> None:
    expected = compressed_mask(mode)
    if mask.shape != expected.shape:
        raise ValueError(f"sparse_mode={mode} takes the compressed atten_mask of shape "
                         f"{expected.shape}; got {mask.shape}")
    if not np.array_equal(mask, expected):
        what = ("np.triu(np.ones((2048, 2048)), k=1)" if mode != 6 else
                "np.triu(ones((2048, 2048)), 1) over 1024 rows [1024 zeros | 1024 ones]")
        raise ValueError(f"sparse_mode={mode} takes the compressed atten_mask {what}; the one given "
                         f"differs (the device would compute wrong results)")


def _full_mask(mask: np.ndarray, dims: Dims, varlen: bool, max_q: int, max_k: int, mode: int) -> np.ndarray:
    """Check a full (non-compressed) mask of mode 0/1 and return it 4-D (Bm, Hm, Sq, Sk)."""
    if varlen:
        if mask.shape != (max_q, max_k):
            raise ValueError(f"with input_layout TND, atten_mask (sparse_mode={mode}) must have shape "
                             f"[maxSq, maxSkv] = ({max_q}, {max_k}); got {mask.shape}")
        full_rows = np.flatnonzero(mask.all(axis=1))
        if full_rows.size:
            raise ValueError(f"with input_layout TND, atten_mask must not mask a whole row "
                             f"(torch_npu.npu_fusion_attention: \"atten_mask输入不支持补pad，即atten_mask"
                             f"中不能存在某一行全1的场景\"); row {full_rows[0]} is all 1")
        return mask[None, None]
    B, N, Sq, Sk = dims.B, dims.N1, dims.Sq, dims.Sk
    ok = {(Sq, Sk), (1, 1, Sq, Sk), (B, 1, Sq, Sk), (B, N, Sq, Sk)}
    if mask.shape not in ok:
        raise ValueError(f"atten_mask (sparse_mode={mode}) must have shape [Sq,Sk], [1,1,Sq,Sk], "
                         f"[B,1,Sq,Sk] or [B,N,Sq,Sk] with B={B}, N={N}, Sq={Sq}, Sk={Sk}; "
                         f"got {mask.shape}")
    return mask.reshape((1, 1) + mask.shape) if mask.ndim == 2 else mask


def _prefix_list(prefix, n: int, lengths: list[tuple[int, int]], where: str) -> list[int]:
    if prefix is None:
        raise ValueError("sparse_mode 5 and 6 need prefix: the number of keys every query sees, "
                         "one int per batch")
    values = _int_list("prefix", prefix)
    if len(values) != n:
        raise ValueError(f"prefix must have one value per {where} ({n}); got {len(values)}")
    for b, (p, (sq, sk)) in enumerate(zip(values, lengths)):
        if sq == 0:
            continue
        lo = 0 if sq > sk else sk - sq
        if not lo <= p <= sk:
            raise ValueError(f"prefix[{b}]={p} out of range: with Sq={sq}, Sk={sk} it must lie in "
                             f"[{lo}, {sk}] ([0, Sk] when Sq > Sk, else [Sk - Sq, Sk])")
    return values


def _check_mode0_range(pre: int, nxt: int, lengths: list[tuple[int, int]]) -> None:
    """sparse_mode 0's documented ranges for negative offsets (*sparse_mode参数说明*)."""
    for sq, sk in lengths:
        if sq == 0:
            continue
        if nxt < 0 and -nxt >= sk:
            raise ValueError(f"sparse_mode=0: next_tokens={nxt} is negative, so its absolute value "
                             f"must be < Skv={sk} (\"next_tockens为负数时，pre_tockens取值必须大于等于"
                             f"next_tockens的绝对值，且next_tockens的绝对值小于Skv\")")
        if pre < 0 and -pre >= sq:
            raise ValueError(f"sparse_mode=0: pre_tokens={pre} is negative, so its absolute value "
                             f"must be < Sq={sq} (\"pre_tockens为负数时，next_tockens取值必须大于等于"
                             f"pre_tockens的绝对值，且pre_tockens的绝对值小于Sq\")")


def plan(dims: Dims, *, sparse_mode=0, atten_mask=None, pre_tokens=INT32_MAX,
         next_tokens=INT32_MAX, prefix=None, seqs=None) -> list[_Call]:
    """Turn the operator's mask arguments into kernel calls, checking every one of them.

    ``seqs`` is None for the B, N, S, D layouts and the TND sequences ``(q0, q1, k0, k1)``
    otherwise. Returns the ``_Call`` list that :func:`flash_attention_score`, its grad
    and :func:`sparse_mode_mask` all run through, so what is drawn is what is computed.
    Without ``atten_mask`` every mode is full attention (the operator ignores ``sparse_mode``,
    ``pre_tokens``, ``next_tokens`` then).
    """
    mode = _int("sparse_mode", sparse_mode)
    if not 0 <= mode <= 8:
        raise ValueError(f"sparse_mode must be in 0..8; got {mode}")
    pre = _int("pre_tokens", pre_tokens)
    nxt = _int("next_tokens", next_tokens)
    varlen = seqs is not None
    name = SPARSE_MODES[mode].name
    if varlen and mode == 5:
        raise ValueError("sparse_mode=5 (prefix, full mask) is not supported with input_layout TND; "
                         "use sparse_mode=6 (prefix, compressed mask)")
    if not varlen and mode in (7, 8):
        raise ValueError(f"sparse_mode={mode} ({name}) is only for input_layout TND")
    if prefix is not None and mode not in (5, 6):
        _int_list("prefix", prefix)   # read by modes 5 and 6 only; still an int list

    # (sq, sk) of every batch / sequence
    if varlen:
        lengths = [(q1 - q0, k1 - k0) for q0, q1, k0, k1 in seqs]
    else:
        lengths = [(dims.Sq, dims.Sk)] * dims.B
    max_q = max(sq for sq, _ in lengths)
    max_k = max(sk for _, sk in lengths)

    if atten_mask is None:
        # full attention, one call over every batch or one per TND sequence
        if not varlen:
            return [_Call(slice(0, dims.B), slice(0, dims.B), NO_LIMIT, NO_LIMIT, None)]
        return [_Call(slice(q0, q1), slice(k0, k1), NO_LIMIT, NO_LIMIT, None, s)
                for s, (q0, q1, k0, k1) in enumerate(seqs) if q1 > q0 and k1 > k0]

    if mode in (0, 4, 7, 8) and pre + nxt < 0:
        raise ValueError(f"pre_tokens and next_tokens must overlap (pre_tokens + next_tokens >= 0, "
                         f"\"band场景，preTokens和nextTokens之间必须要有交集\"); got {pre} and {nxt}")
    if mode == 0:
        _check_mode0_range(pre, nxt, lengths)
    mask = _as_bool_mask(atten_mask)
    full = None
    if mode in (0, 1):
        full = _full_mask(mask, dims, varlen, max_q, max_k, mode)
    elif mode == 5:
        ok = {(dims.B, dims.N1, dims.Sq, dims.Sk), (dims.B, 1, dims.Sq, dims.Sk)}
        if mask.shape not in ok:
            raise ValueError(f"sparse_mode=5 takes the full prefix atten_mask [B,N,Sq,Sk] or "
                             f"[B,1,Sq,Sk] = {sorted(ok)}; got {mask.shape}")
        full = mask
    else:
        _check_compressed(mask, mode)

    if mode in (5, 6):
        where = "sequence (len(actual_seq_qlen))" if varlen else "batch (B)"
        prefixes = _prefix_list(prefix, len(lengths), lengths, where)
        if mode == 5:
            for b, p in enumerate(prefixes):
                rule = prefix_mask(dims.Sq, dims.Sk, p)
                if not (full[b] == rule).all():
                    raise ValueError(f"sparse_mode=5: atten_mask[{b}] must be the prefix mask of "
                                     f"prefix[{b}]={p} (rightDownCausal plus the first {p} keys)")

    # the band sequence of the varlen split modes (vendor golden cpu_impl.py: mode 7 the last
    # sequence with Sq != 0, mode 8 the first with Skv != 0)
    with_q = [s for s, (sq, _) in enumerate(lengths) if sq > 0]
    with_k = [s for s, (_, sk) in enumerate(lengths) if sk > 0]
    if varlen and mode == 3:
        for s, (sq, sk) in enumerate(lengths):
            if sq > sk:
                raise ValueError(f"sparse_mode=3 with input_layout TND needs Sq <= Skv in every "
                                 f"sequence (FlashAttentionVarLenScore: \"配置为3时，不支持无效行计算，"
                                 f"需要满足每个batch的Sq<=Skv\"); sequence {s} has Sq={sq}, Skv={sk}")
    if mode == 7 and with_q:
        last_sk = lengths[with_q[-1]][1]
        if pre < last_sk or nxt > 0:
            raise ValueError(f"sparse_mode=7 needs pre_tokens >= the last sequence's Skv={last_sk} and "
                             f"next_tokens <= 0 (\"pre_tockens >= last_Skv\", \"next_tockens <= 0\"); "
                             f"got {pre}, {nxt}")
    if mode == 8 and with_k:
        first_sk = lengths[with_k[0]][1]
        if pre < first_sk:
            raise ValueError(f"sparse_mode=8 needs pre_tokens >= the first sequence's Skv={first_sk} "
                             f"(\"pre_tockens >= first_Skv\"); got {pre}")

    pre, nxt = _clamp(pre), _clamp(nxt)
    if not varlen and mode <= 4:
        # one rule for every batch: a single call over all of them
        left, right = sparse_mode_band(mode, dims.Sq, dims.Sk, pre, nxt)
        calls = [_Call(slice(0, dims.B), slice(0, dims.B), left, right, full)]
    else:
        first = with_k[0] if with_k else 0
        last = with_q[-1] if with_q else 0
        calls = _sequence_calls(mode, lengths, first, last, seqs, pre, nxt, full,
                                prefixes if mode in (5, 6) else None)
    if mode == 0:
        _check_consistent(calls)
    return calls


def _check_consistent(calls: list[_Call]) -> None:
    """Mode 0: atten_mask must mask every entry outside the pre/next band.

    The operator skips blocks by pre/next and masks inside the blocks it computes by
    atten_mask alone, so an entry outside the band that the mask keeps would be computed or
    not depending on the block it falls in ("sparse_mode配置为0、4时，需保证atten_mask与
    pre_tockens、next_tockens的范围一致").
    """
    for c in calls:
        sq, sk = c.mask.shape[2:]
        outside = ~allowed(sq, sk, c.left, c.right)
        kept = outside & ~c.mask
        if kept.any():
            b, h, i, j = np.argwhere(kept)[0]
            raise ValueError(f"sparse_mode=0: atten_mask must mask every entry outside pre_tokens="
                             f"{c.left}/next_tokens={c.right} (the operator skips blocks by them and "
                             f"masks inside blocks by atten_mask only); it keeps (i={i}, j={j})")


def _sequence_calls(mode, lengths, first, last, seqs, pre, nxt, full, prefixes) -> list[_Call]:
    """One call per batch (modes 5, 6) or TND sequence with queries and keys, each with its rule."""
    varlen = seqs is not None
    calls = []
    for s, (sq, sk) in enumerate(lengths):
        if sq == 0 or sk == 0:
            continue
        m = varlen_sequence_mode(mode, s, first, last)
        p = prefixes[s] if mode in (5, 6) else None
        left, right = sparse_mode_band(m, sq, sk, pre, nxt, p)
        dense = None
        if m in (0, 1) and full is not None:
            dense = full[:, :, :sq, :sk]           # TND: the top-left of [maxSq, maxSkv]
        elif m in (5, 6) and p - 1 > sk - sq:
            # the prefix columns stick out of the causal band: mask the rest densely
            dense = prefix_mask(sq, sk, p)[None, None]
        if varlen:
            q0, q1, k0, k1 = seqs[s]
            calls.append(_Call(slice(q0, q1), slice(k0, k1), left, right, dense, s))
        else:
            calls.append(_Call(slice(s, s + 1), slice(s, s + 1), left, right, dense))
    return calls


def sparse_mode_mask(sq: int, sk: int, sparse_mode: int, *, atten_mask=None,
                     pre_tokens=INT32_MAX, next_tokens=INT32_MAX, prefix=None,
                     actual_seq_qlen=None, actual_seq_kvlen=None) -> np.ndarray:
    """The mask the operator applies, as a ``(sq, sk)`` bool array (True = allowed).

    One batch and one head; with ``actual_seq_qlen``/``actual_seq_kvlen`` (TND) ``sq``/``sk``
    are the token counts and the result is block-diagonal over the sequences. Built by
    :func:`plan`, the same code the operator runs, from band and dense mask of each call.
    Without ``atten_mask`` it is all True (full attention, whatever ``sparse_mode``).
    """
    dims = Dims(1, 1, 1, sq, sk, 1, 1)
    seqs = None
    if actual_seq_qlen is not None or actual_seq_kvlen is not None:
        dims.B = 0
        seqs = _sequences(actual_seq_qlen, actual_seq_kvlen, dims)
    out = np.zeros((sq, sk), dtype=np.bool_)
    for c in plan(dims, sparse_mode=sparse_mode, atten_mask=atten_mask, pre_tokens=pre_tokens,
                  next_tokens=next_tokens, prefix=prefix, seqs=seqs):
        rows = c.q_rows if seqs is not None else slice(0, sq)
        cols = c.kv_rows if seqs is not None else slice(0, sk)
        n_q, n_k = rows.stop - rows.start, cols.stop - cols.start
        ok = allowed(n_q, n_k, c.left, c.right)
        if c.mask is not None:
            ok = ok & ~c.mask[0, 0]
        out[rows, cols] = ok
    return out


# ------------------------------------------------------------------------------------ pse
def _alibi_expand(c: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The ALiBi-compressed pse ``(Bp, N, 1024, Sk)`` (the last 1024 rows) as ``rows`` rows.

    ALiBi depends on ``j - i`` only, so row ``r`` of the full pse is its last row shifted by
    ``rows - 1 - r``: ``full[r, j] = c[1023, j + rows - 1 - r]``. Entries past the last column
    are not in the compressed tensor (the strict upper triangle when Sq = Sk); they are 0 here
    and returned as True in the ``(rows, Sk)`` map, which the mask must cover.
    """
    bp, n, r_c, sk = c.shape
    full = np.zeros((bp, n, rows, sk), dtype=c.dtype)
    unknown = np.zeros((rows, sk), dtype=np.bool_)
    top = rows - r_c
    full[:, :, top:] = c
    j = np.arange(sk)
    for r in range(top):
        src = j + (rows - 1 - r)
        ok = src < sk
        full[:, :, r, ok] = c[:, :, r_c - 1, src[ok]]
        unknown[r, ~ok] = True
    return full, unknown


def _alibi_fold(dfull: np.ndarray, r_c: int) -> np.ndarray:
    """Adjoint of :func:`_alibi_expand`: the gradient of the full pse onto the compressed one."""
    rows, sk = dfull.shape[2:]
    top = rows - r_c
    dc = dfull[:, :, top:].copy()
    j = np.arange(sk)
    for r in range(top):
        src = j + (rows - 1 - r)
        ok = src < sk
        dc[:, :, r_c - 1, src[ok]] += dfull[:, :, r, ok]
    return dc


@dataclass
class _Pse:
    """A checked ``pse``: a tensor (pse_type 0/1) or ALiBi slopes (pse_type 2/3).

    ``bias`` is the tensor in the compute dtype, already multiplied by ``mult`` (``scale``
    for pse_type 1, else 1), laid out as ``full`` for the calls to slice: (Bp, N, Sq or 1, Sk),
    TND (Bp, N, F, maxSkv) for the compressed form or the flat [pseTotalLen]. ``compressed``
    is the row count of the compressed form (0 otherwise), ``unknown`` its map of entries
    the compressed tensor does not give.
    """

    pse_type: int
    shape: tuple
    dtype: np.dtype
    bias: np.ndarray | None = None
    mult: float = 1.0
    compressed: int = 0
    unknown: np.ndarray | None = None
    slopes: np.ndarray | None = None
    alibi_offset: int = 0
    offsets: list = field(default_factory=list)   # TND flat form: start of each sequence


def _start_idx(name: str, x) -> int:
    if x is None:
        return 0
    values = [_int(name, x)] if isinstance(x, numbers.Integral) else _int_list(name, x)
    if len(values) != 1:
        raise ValueError(f"{name} must hold one int (the start index of this block of the "
                         f"sequence); got {values}")
    return values[0]


def _pse_setup(pse, pse_type, q_start_idx, kv_start_idx, st: "_Setup", scale: float) -> _Pse | None:
    """Check ``pse`` against ``pse_type`` and the layout (*FlashAttentionScoreV2* and
    *FlashAttentionVarLenScoreV4* realShiftOptional rules)."""
    ptype = _int("pse_type", pse_type)
    if ptype not in (0, 1, 2, 3):
        raise ValueError(f"pse_type must be 0, 1, 2 or 3 (0: scale*QK^T + pse, 1: scale*(QK^T + pse), "
                         f"2/3: ALiBi generated from slopes); got {ptype}")
    q_start, kv_start = _start_idx("q_start_idx", q_start_idx), _start_idx("kv_start_idx", kv_start_idx)
    if pse is None:
        return None
    if not isinstance(pse, np.ndarray):
        raise TypeError(f"pse must be a numpy.ndarray; got {type(pse).__name__}")
    d, varlen = st.dims, st.varlen
    if st.mode in (7, 8) and st.masked:
        raise ValueError(f"pse is not supported with sparse_mode={st.mode} (torch_npu.npu_fusion_attention: "
                         f"\"sparse_mode配置为7或者8时，不支持可选参数pse\")")
    if varlen and any(q1 == q0 or k1 == k0 for q0, q1, k0, k1 in st.seqs_used):
        raise ValueError("pse is not supported when a TND sequence has length 0 (\"如果存在S为0的情况，"
                         "不支持pse输入\")")
    if ptype in (2, 3):
        if pse.dtype != np.float32:
            raise TypeError(f"pse (ALiBi slopes, pse_type={ptype}) must be float32 (\"如果pseType为2或3的"
                            f"时候，数据类型需为FLOAT32\"); got {pse.dtype}")
        if pse.shape not in {(d.B, d.N1), (d.N1,)}:
            raise ValueError(f"pse (ALiBi slopes, pse_type={ptype}) must have shape [B,N] = "
                             f"({d.B}, {d.N1}) or [N] = ({d.N1},); got {pse.shape}")
        lengths = ([(q1 - q0, k1 - k0) for q0, q1, k0, k1 in st.seqs_used] if varlen
                   else [(d.Sq, d.Sk)])
        for sq, sk in lengths:
            if sq != sk:
                raise ValueError(f"pse_type={ptype} needs Sq == Skv (\"pseType为2或3的时候，当前只支持Sq和"
                                 f"Skv等长\"); got Sq={sq}, Skv={sk}")
        if not np.isfinite(pse).all():
            raise ValueError("pse (ALiBi slopes) contains NaN or inf")
        # golden: alibi_base = -|j - i - q_start_idx + kv_start_idx|
        return _Pse(ptype, pse.shape, pse.dtype, slopes=pse.astype(np.float64 if st.ct == np.float64
                                                                   else np.float32),
                    alibi_offset=q_start - kv_start)
    if pse.dtype != st.io_dtype:
        raise TypeError(f"pse must have the query's dtype {st.io_dtype} (\"输入query、key、value、pse的"
                        f"数据类型必须一致\"); got {pse.dtype}")
    x = _compute(pse).astype(st.ct, copy=False)
    if not np.isfinite(x).all():
        raise ValueError("pse contains NaN or inf")
    mult = scale if ptype == 1 else 1.0
    out = _Pse(ptype, pse.shape, pse.dtype, mult=mult)
    if varlen:
        lens = [(q1 - q0, k1 - k0) for q0, q1, k0, k1 in st.seqs_used]
        total = sum(d.N1 * sq * sk for sq, sk in lens)
        max_q = max(sq for sq, _ in lens)
        max_k = max(sk for _, sk in lens)
        if pse.shape == (total,):
            starts = np.cumsum([0] + [d.N1 * sq * sk for sq, sk in lens]).tolist()
            out.offsets = starts
            out.bias = mult * x
            return out
        if pse.shape not in {(d.B, d.N1, ALIBI_ROWS, max_k), (1, d.N1, ALIBI_ROWS, max_k)}:
            raise ValueError(f"with input_layout TND, pse must have shape [pseTotalLen] = ({total},) "
                             f"(the per-sequence [N, Sq_i, Skv_i] blocks flattened), or [B,N,1024,maxSkv] "
                             f"= ({d.B}, {d.N1}, {ALIBI_ROWS}, {max_k}) or [1,N,1024,maxSkv]; got {pse.shape}")
        rows = max(ALIBI_ROWS, max_q)
        out.compressed = ALIBI_ROWS
        full, out.unknown = _alibi_expand(x, rows)
        out.bias = mult * full
        return out
    B, N, Sq, Sk = d.B, d.N1, d.Sq, d.Sk
    if pse.shape in {(B, N, Sq, Sk), (B, N, 1, Sk), (1, N, Sq, Sk)}:
        out.bias = mult * x
        return out
    if Sq > ALIBI_ROWS and pse.shape in {(B, N, ALIBI_ROWS, Sk), (1, N, ALIBI_ROWS, Sk)}:
        if Sq != Sk:
            raise ValueError(f"the ALiBi-compressed pse [B,N,1024,Skv] needs Sq == Skv (\"realShiftOptional"
                             f"中的Sq在大于1024场景下，且此时shape取值为BNHS或1NHS时，需要满足Sq和Skv等长\"); "
                             f"got Sq={Sq}, Skv={Sk}")
        out.compressed = ALIBI_ROWS
        full, out.unknown = _alibi_expand(x, Sq)
        out.bias = mult * full
        return out
    raise ValueError(f"pse must have shape [B,N,Sq,Skv] = ({B}, {N}, {Sq}, {Sk}), [B,N,1,Skv], "
                     f"[1,N,Sq,Skv], or when Sq > 1024 the ALiBi-compressed [B,N,1024,Skv] / "
                     f"[1,N,1024,Skv]; got {pse.shape}")


def _pse_slice(p: _Pse, full: np.ndarray, c: _Call, st: "_Setup") -> np.ndarray:
    """The part of ``full`` (``p.bias`` or its gradient) that call ``c`` reads: a view."""
    if not st.varlen:
        return full[c.q_rows] if full.shape[0] == st.dims.B else full
    sq, sk = c.q_rows.stop - c.q_rows.start, c.kv_rows.stop - c.kv_rows.start
    if full.ndim == 1:
        a = p.offsets[c.seq]
        return full[a:a + st.dims.N1 * sq * sk].reshape(1, st.dims.N1, sq, sk)
    b = slice(c.seq, c.seq + 1) if full.shape[0] == st.dims.B else slice(0, 1)
    # the sequence's [Sq_i, Skv_i] is the bottom-right corner (vendor golden: pse[i, :, F - sq:F,
    # maxSkv - sk:maxSkv])
    rows, cols = full.shape[2:]
    return full[b, :, rows - sq:, cols - sk:]


def _check_alibi_cover(p: _Pse, c: _Call, st: "_Setup") -> None:
    """Every entry the compressed pse does not give must be masked for call ``c``."""
    unknown = p.unknown
    if st.varlen:
        sq, sk = c.q_rows.stop - c.q_rows.start, c.kv_rows.stop - c.kv_rows.start
        rows, cols = unknown.shape
        unknown = unknown[rows - sq:, cols - sk:]
    if not unknown.any():
        return
    sq, sk = unknown.shape
    ok = allowed(sq, sk, c.left, c.right)
    if c.mask is not None:
        ok = ok & ~c.mask.all(axis=(0, 1))
    if (ok & unknown).any():
        i, j = np.argwhere(ok & unknown)[0]
        raise ValueError(f"the ALiBi-compressed pse (last 1024 rows) gives only the lower triangle of "
                         f"the rows above them (\"下三角掩码场景\", sparse_mode 0, 2, 3 with Sq == Skv); "
                         f"the mask keeps (i={i}, j={j}), which it does not give")


# ------------------------------------------------------------------------- the operator
def _check_options(padding_mask, keep_prob, inner_precise, scale, seed, offset) -> float:
    """Check the scalar options; return the dropout probability ``1 - keep_prob``."""
    if padding_mask is not None:
        raise NotImplementedError("padding_mask is not supported (torch_npu.npu_fusion_attention: "
                                  "\"暂不支持该传参\"; reserved and unused in CANN)")
    if isinstance(keep_prob, (bool, np.bool_)) or not isinstance(keep_prob, numbers.Real):
        raise TypeError(f"keep_prob must be a real number in (0, 1]; got {keep_prob!r}")
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"keep_prob must lie in (0, 1] (\"取值范围为(0, 1]\"); got {keep_prob}")
    ip = _int("inner_precise", inner_precise)
    if ip not in (0, 1, 2):
        raise ValueError(f"inner_precise must be 0, 1 or 2 (0, 1 reserved; 2 invalid-row "
                         f"computation); got {ip}")
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite real number (the operator's default is 1.0; "
                        f"pass 1/sqrt(D) for the usual attention); got {scale!r}")
    if not 0 <= _int("seed", seed) <= (1 << 64) - 1:
        raise ValueError(f"seed must lie in [0, 2**64 - 1]; got {seed}")
    if not 0 <= _int("offset", offset):
        raise ValueError(f"offset must be >= 0; got {offset}")
    return 1.0 - float(keep_prob)


@dataclass
class _Setup:
    layout: str
    q: np.ndarray     # (B, N1, Sq, D) or TND (T, N1, D), compute dtype (bfloat16 read as float32)
    k: np.ndarray
    v: np.ndarray
    dims: Dims
    calls: list
    varlen: bool
    io_dtype: np.dtype
    ct: type          # the kernels' compute dtype
    mode: int
    masked: bool      # whether an atten_mask was given (the mask arguments take effect)
    seqs_used: list   # TND: the sequences without the trailing unused batches
    seqs: list | None
    dropout_p: float
    seed: int
    offset: int
    softmax_layout: str
    pse: _Pse | None = None


def _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
           keep_prob, pre_tokens, next_tokens, inner_precise, prefix, actual_seq_qlen,
           actual_seq_kvlen, sparse_mode, pse_type, q_start_idx, kv_start_idx, seed, offset,
           softmax_layout) -> _Setup:
    dropout_p = _check_options(padding_mask, keep_prob, inner_precise, scale, seed, offset)
    q, k, v, dims = _canonical(query, key, value, head_num, input_layout)
    if not isinstance(softmax_layout, str) or softmax_layout not in SOFTMAX_LAYOUTS:
        raise ValueError(f"softmax_layout must be \"\" (the default: NTD in TND) or \"TND\"; got "
                         f"{softmax_layout!r}")
    varlen = input_layout == "TND"
    if softmax_layout == "TND" and not varlen:
        raise ValueError(f"softmax_layout=\"TND\" is for input_layout TND only (\"当前仅在input_layout="
                         f"“TND”时进行配置\"); got input_layout {input_layout!r}")
    seqs = None
    if varlen:
        seqs = _sequences(actual_seq_qlen, actual_seq_kvlen, dims)
        dims.B = len(seqs)
    elif actual_seq_qlen is not None or actual_seq_kvlen is not None:
        raise ValueError(f"actual_seq_qlen/actual_seq_kvlen are for input_layout TND only; "
                         f"got input_layout {input_layout!r}")
    calls = plan(dims, sparse_mode=sparse_mode, atten_mask=atten_mask, pre_tokens=pre_tokens,
                 next_tokens=next_tokens, prefix=prefix, seqs=seqs)
    seqs_used = list(seqs) if varlen else []
    if varlen:
        # the trailing unused batches repeat the last end: drop them (not the empty ones inside)
        ends = _int_list("actual_seq_qlen", actual_seq_qlen)
        n = len(ends)
        while n > 1 and ends[n - 1] == 0:
            n -= 1
        seqs_used = seqs[:n]
    q, k, v = _compute(q), _compute(k), _compute(v)
    st = _Setup(input_layout, q, k, v, dims, calls, varlen, query.dtype, api.compute_dtype(q.dtype),
                int(sparse_mode), atten_mask is not None, seqs_used, seqs, dropout_p, int(seed),
                int(offset), softmax_layout)
    st.pse = _pse_setup(pse, pse_type, q_start_idx, kv_start_idx, st, float(scale))
    if st.pse is not None and st.pse.compressed:
        for c in calls:
            _check_alibi_cover(st.pse, c, st)
    return st


def _rope_operands(query_rope, key_rope, st: _Setup) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Check ``query_rope``/``key_rope`` against the layout; return them canonical or ``(None, None)``.

    Canonical: (B, N1, Sq, Dr) and (B, Nr, Sk, Dr), or TND (T_q, N1, Dr) and (T_k, Nr, Dr),
    with ``N1 % Nr == 0``, ``Dr % 8 == 0`` and ``Dr <= D``. For BSH/SBH, ``Dr = H_qr / head_num``
    and ``Nr = H_kr / Dr``.
    """
    if query_rope is None and key_rope is None:
        return None, None
    if query_rope is None or key_rope is None:
        raise ValueError("query_rope and key_rope must be given together (or neither)")
    layout, N1 = st.layout, st.dims.N1
    if layout in ("BSH", "SBH"):
        dims = "[B, S, N*Dr]" if layout == "BSH" else "[S, B, N*Dr]"
        qr = _array("query_rope", query_rope, 3, dims)
        kr = _array("key_rope", key_rope, 3, dims)
        dr = _split_hidden("query_rope", qr.shape[2], N1, None, "head_num")
        nr = _split_hidden("key_rope", kr.shape[2], None, dr, "query_rope's Dr = H_qr / head_num")
        qr, kr = to_bnsd(qr, layout, N1), to_bnsd(kr, layout, nr)
    elif layout in ("BSND", "BNSD"):
        dims = f"[{', '.join(layout)}]"
        qr = to_bnsd(_array("query_rope", query_rope, 4, dims), layout, 0)
        kr = to_bnsd(_array("key_rope", key_rope, 4, dims), layout, 0)
    else:  # TND
        qr = _array("query_rope", query_rope, 3, "[T, N, Dr]")
        kr = _array("key_rope", key_rope, 3, "[T, N, Dr]")
    for name, x in (("query_rope", qr), ("key_rope", kr)):
        if x.dtype != st.io_dtype:
            raise TypeError(f"{name} must have the query's dtype {st.io_dtype}; got {x.dtype}")
    # heads are axis 1 in (B, N, S, D) and in (T, N, D); compare every other axis but the last
    if qr.shape[:-1] != st.q.shape[:-1]:
        raise ValueError(f"query_rope must match query in every axis but the last (layout {layout}): "
                         f"{tuple(st.q.shape[:-1])} after reading the layout; got {tuple(qr.shape[:-1])}")
    others = (kr.shape[:1] + kr.shape[2:-1], st.k.shape[:1] + st.k.shape[2:-1])
    if others[0] != others[1] or kr.shape[-1] != qr.shape[-1]:
        raise ValueError(f"key_rope must match key in every axis but the heads and the last, and have "
                         f"query_rope's Dr={qr.shape[-1]} (layout {layout}); got key_rope "
                         f"{tuple(kr.shape)} for key {tuple(st.k.shape)} after reading the layout")
    dr, d = qr.shape[-1], st.dims.D
    if dr % 8 != 0 or dr > d:
        raise ValueError(f"query_rope's head dim Dr must be a multiple of 8 and <= D={d} "
                         f"(the rope operands' rule); got Dr={dr}")
    if N1 % kr.shape[1] != 0:
        raise ValueError(f"head_num={N1} must be a multiple of key_rope's head count {kr.shape[1]} "
                         f"(MLA: 1, one key_rope shared by all heads)")
    return _compute(qr), _compute(kr)


def _take(x: np.ndarray, rows: slice, varlen: bool) -> np.ndarray:
    """Rows of a canonical array as a (B', N, s, D) kernel operand (TND: one sequence, B' = 1)."""
    return x[rows].transpose(1, 0, 2)[None] if varlen else x[rows]


def _take_lse(lse: np.ndarray, rows: slice, varlen: bool) -> np.ndarray:
    """(B, N, Sq) or TND (T, N) LSE rows -> (B', N, s)."""
    return lse[rows].T[None] if varlen else lse[rows]


def _put(dst: np.ndarray, rows: slice, varlen: bool, val: np.ndarray) -> None:
    """Inverse of :func:`_take` for results: (1, N, s, ...) back into TND rows (s, N, ...)."""
    dst[rows] = np.moveaxis(val[0], 0, 1) if varlen else val


def _window(c: _Call) -> tuple:
    return (None if c.left >= NO_LIMIT else c.left, None if c.right >= NO_LIMIT else c.right)


def _to_layout(x: np.ndarray, st: _Setup) -> np.ndarray:
    out = np.ascontiguousarray(x) if st.varlen else from_bnsd(x, st.layout)
    return out.astype(st.io_dtype, copy=False)


def _counter_start(c: _Call, st: _Setup) -> int:
    """First dropout counter of call ``c`` (see the module docstring)."""
    d = st.dims
    if not st.varlen:
        # a call over batches [b0, b1): the kernel counts from its own b = 0
        return st.offset + c.q_rows.start * d.N1 * d.Sq * d.Sk
    before = sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in st.seqs[:c.seq])
    return st.offset + d.N1 * before


def _options(c: _Call, st: _Setup) -> dict:
    """pse and dropout keyword arguments of the kernel call for ``c`` (empty when unused)."""
    kw = {}
    p = st.pse
    if p is not None and p.slopes is not None:
        slopes = p.slopes
        if slopes.ndim == 2:
            slopes = slopes[c.q_rows] if not st.varlen else slopes[c.seq:c.seq + 1]
        kw.update(alibi_slopes=slopes, alibi_offset=p.alibi_offset, alibi_sqrt=p.pse_type == 3)
    elif p is not None:
        kw["bias"] = _pse_slice(p, p.bias, c, st)
    if st.dropout_p > 0.0:
        kw.update(dropout_p=st.dropout_p, seed=st.seed, offset=_counter_start(c, st))
    return kw


def _stats_out(x: np.ndarray, st: _Setup) -> np.ndarray:
    """Row values (B, N, Sq) or TND (T, N) -> float32 [..., 8] in ``softmax_layout``."""
    if st.varlen and st.softmax_layout == "":
        # NTD: sequence by sequence, a block [N, Sq_i] of each
        x = np.concatenate([x[q0:q1].T.reshape(-1) for q0, q1, _, _ in st.seqs]).reshape(x.shape)
    return np.ascontiguousarray(np.repeat(x[..., None], SOFTMAX_REPEAT, axis=-1), dtype=np.float32)


def _stats_in(x: np.ndarray, st: _Setup) -> np.ndarray:
    """Inverse of :func:`_stats_out` (first of the 8 copies), as float64."""
    rows = x[..., 0].astype(np.float64)
    if not (st.varlen and st.softmax_layout == ""):
        return rows
    flat, out, pos, n = rows.reshape(-1), np.empty(rows.shape), 0, st.dims.N1
    for q0, q1, _, _ in st.seqs:
        out[q0:q1] = flat[pos:pos + n * (q1 - q0)].reshape(n, q1 - q0).T
        pos += n * (q1 - q0)
    return out


def flash_attention_score(query, key, value, head_num, input_layout, *, pse=None,
                          padding_mask=None, atten_mask=None, scale=1.0, keep_prob=1.0,
                          pre_tokens=INT32_MAX, next_tokens=INT32_MAX, inner_precise=0,
                          prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                          sparse_mode=0, pse_type=1, q_start_idx=None, kv_start_idx=None,
                          seed=0, offset=0, softmax_layout="", query_rope=None, key_rope=None,
                          block_q=api.FORWARD_BLOCK[0], block_k=api.FORWARD_BLOCK[1]):
    """``FlashAttentionScore`` (``torch_npu.npu_fusion_attention``) forward, on flashlab's kernel.

    Parameters
    ----------
    query, key, value : numpy float16/bfloat16/float32/float64 in ``input_layout``: BSH
        [B,S,N*D], SBH [S,B,N*D], BSND, BNSD or TND [T,N,D]. Key and value share every axis but
        the last; ``D_q = D_k >= D_v``, ``D <= 768``; one dtype for all three.
    head_num : the query's head count N, 1..256 (the key's is read from its shape; GQA allowed)
    pse : the positional bias, see ``pse_type`` and the module docstring for its shapes
    padding_mask : reserved by the operator; must be None
    atten_mask : bool/uint8, 1 = masked out; shape per ``sparse_mode`` (see
        :data:`flashlab.masks.SPARSE_MODES`). None: full attention, whatever ``sparse_mode``,
        ``pre_tokens``, ``next_tokens`` say.
    scale : multiplies ``Q K^T``; default 1.0 as the operator (pass ``1/sqrt(D)``)
    keep_prob : dropout keep probability in (0, 1]; with ``seed``/``offset`` (ints >= 0) the
        counter-based mask of the module docstring
    pre_tokens, next_tokens : band offsets (mode 0 from the top-left; 4, 7, 8 from the
        bottom-right), int64; values beyond the lengths act as unbounded
    inner_precise : 0, 1 (reserved) or 2 (the device's invalid-row computation, "2为使能无效行
        计算"; the device also switches it on when it can tell, e.g. mode 3 with Sq > Skv). It
        changes nothing here except that other values raise: every row with no allowed key
        takes the invalid-row path (out 0, max float32 lowest, sum float32 max). With 0/1 in a
        case the device does not detect, its golden fills masked scores with -40000, so an
        all-masked row would average V; that is not reproduced.
    prefix : modes 5/6, one int per batch (TND: per sequence); ignored by other modes
    actual_seq_qlen, actual_seq_kvlen : TND only, cumulative sequence ends
    sparse_mode : 0..8
    pse_type : 0 ``scale*QK^T + pse``, 1 ``scale*(QK^T + pse)`` (default), 2/3 ALiBi from the
        slopes ``pse`` ([B,N] or [N] float32, Sq == Skv), ``-slope*|j - i - q_start_idx +
        kv_start_idx|`` (3: ``sqrt`` of the distance)
    q_start_idx, kv_start_idx : pse_type 2/3, one int each (default 0): where this block of
        the query/key sequence starts in the whole one
    softmax_layout : TND only: "" (default) NTD, per-sequence [N, Sq_i, 8] blocks; "TND"
        token-major
    query_rope, key_rope : optional RoPE operands (MLA): query_rope in the query's layout with
        head_num heads and head dim Dr (a multiple of 8, <= D), key_rope in the key's layout
        with Nr heads, ``head_num % Nr == 0`` (MLA: Nr = 1); their product is added to
        ``Q K^T`` before ``scale`` (pass ``scale = 1/sqrt(D + Dr)``)
    block_q, block_k : flashlab's tile sizes (not operator arguments)

    Returns
    -------
    attention_out : query's layout with V's D, query's dtype
    softmax_max, softmax_sum : float32 [B, N, Sq, 8] (TND: [T, N, 8], in ``softmax_layout``);
        LSE = max + log(sum). A row with no allowed key: out 0, max -3.4028235e38 (float32
        lowest), sum 3.4028235e38 (float32 max).

    The operator's fourth output ``softmax_out`` is reserved and never written ("预留参数，暂未
    使用，接口不写入该输出"), and its seed/offset/numels outputs describe the device's Philox
    stream: none of them is returned here.
    """
    st = _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
                keep_prob, pre_tokens, next_tokens, inner_precise, prefix, actual_seq_qlen,
                actual_seq_kvlen, sparse_mode, pse_type, q_start_idx, kv_start_idx, seed, offset,
                softmax_layout)
    qr, kr = _rope_operands(query_rope, key_rope, st)
    d = st.dims
    rows = (d.Sq, d.N1) if st.varlen else (d.B, d.N1, d.Sq)
    out = np.zeros(rows + (d.Dv,), dtype=st.q.dtype)
    lse = np.full(rows, -np.inf)
    row_max = np.full(rows, -np.inf)
    for c in st.calls:
        p = prepare(_take(st.q, c.q_rows, st.varlen), _take(st.k, c.kv_rows, st.varlen),
                    _take(st.v, c.kv_rows, st.varlen), scale=scale, window=_window(c), mask=c.mask,
                    q_rope=None if qr is None else _take(qr, c.q_rows, st.varlen),
                    k_rope=None if kr is None else _take(kr, c.kv_rows, st.varlen),
                    block_q=block_q, block_k=block_k, **_options(c, st))
        o, l, m, _ = api.forward_with_stats(p)
        _put(out, c.q_rows, st.varlen, o)
        _put(lse, c.q_rows, st.varlen, l)
        _put(row_max, c.q_rows, st.varlen, m)
    empty = np.isneginf(lse)
    # softmax_sum = sum_j exp(s_ij - max_i) = exp(LSE - max)
    softmax_sum = np.exp(np.where(empty, 0.0, lse - np.where(empty, 0.0, row_max)))
    # a row with no allowed key: the invalid-row values float32 lowest / max
    softmax_max = np.where(empty, EMPTY_ROW_MAX, row_max)
    softmax_sum = np.where(empty, EMPTY_ROW_SUM, softmax_sum)
    return _to_layout(out, st), _stats_out(softmax_max, st), _stats_out(softmax_sum, st)


def _grad_operand(name: str, x, st: _Setup, dim: int) -> np.ndarray:
    """dy / attention_in in the query's layout -> canonical (B, N1, Sq, Dv) or (T, N1, Dv)."""
    d = st.dims
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray in the query's layout; got {type(x).__name__}")
    if x.dtype != st.io_dtype:
        raise TypeError(f"{name} must have the query's dtype {st.io_dtype}; got {x.dtype}")
    expected = (d.Sq, d.N1, dim) if st.varlen else layout_shape(st.layout, d.B, d.N1, d.Sq, dim)
    if x.shape != expected:
        raise ValueError(f"{name} must have the attention_out shape {expected} "
                         f"(layout {st.layout}); got {x.shape}")
    return _compute(x if st.varlen else to_bnsd(x, st.layout, d.N1))


def _softmax_operand(name: str, x, st: _Setup) -> np.ndarray:
    d = st.dims
    expected = (d.Sq, d.N1, SOFTMAX_REPEAT) if st.varlen else (d.B, d.N1, d.Sq, SOFTMAX_REPEAT)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy float32 array of shape {expected}; got {type(x).__name__}")
    if x.shape != expected:
        raise ValueError(f"{name} must have shape {expected} (the forward's); got {x.shape}")
    return _stats_in(x, st)


def _lse_from_stats(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    """LSE = max + log(sum); -inf for a row with no allowed key.

    Such a row is written (float32 lowest, float32 max) by the forward and the device; the
    convention (-inf, 0) of earlier flashlab versions is read the same way.
    """
    empty = (m <= EMPTY_ROW_MAX) | (s == 0.0)
    bad = ~empty & ~(np.isfinite(m) & np.isfinite(s) & (s > 0.0))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"softmax_max/softmax_sum at row {idx} = ({m[idx]}, {s[idx]}): a row must "
                         f"have a finite max and a sum > 0, or be a row with no allowed key "
                         f"(max -3.4028235e38 and sum 3.4028235e38, or -inf and 0)")
    with np.errstate(divide="ignore"):
        return np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, s)))


def flash_attention_score_grad(query, key, value, dy, head_num, input_layout, *, softmax_max,
                               softmax_sum, attention_in, pse=None, padding_mask=None,
                               atten_mask=None, softmax_in=None, scale=1.0, keep_prob=1.0,
                               pre_tokens=INT32_MAX, next_tokens=INT32_MAX, inner_precise=0,
                               prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                               sparse_mode=0, pse_type=1, q_start_idx=None, kv_start_idx=None,
                               seed=0, offset=0, softmax_layout="", query_rope=None,
                               key_rope=None, block_q=api.BACKWARD_BLOCK[0],
                               block_k=api.BACKWARD_BLOCK[1]):
    """``FlashAttentionScoreGrad``: ``(dq, dk, dv)`` in the input layout, from the forward's outputs.

    The backward recomputes P from the saved statistics (CANN docs, *FlashAttentionScoreGrad*);
    with the keep mask Z of ``seed``/``offset`` and ``k = keep_prob``:

    $$
    P = e^{S - \\text{max}} / \\text{sum},\\quad dV = (Z \\circ P / k)^\\top dY,\\quad
    dP = Z \\circ (dY\\,V^\\top) / k,\\quad
    dS = P \\circ (dP - \\operatorname{rowsum}(dY \\circ O)),\\quad
    dQ = \\text{scale}\\, dS\\, K,\\quad dK = \\text{scale}\\, dS^\\top Q
    $$

    with ``LSE = softmax_max + log(softmax_sum)`` handed to
    :func:`flashlab.api.flash_attention_backward`. Arguments as :func:`flash_attention_score`
    (they must be the forward's, ``seed``, ``offset`` and ``softmax_layout`` included), plus
    ``dy`` and ``attention_in`` (the forward's ``attention_out``) in the query's layout and
    ``softmax_max``/``softmax_sum`` as returned by the forward. A row with no allowed key
    (max -3.4028235e38 and sum 3.4028235e38 as the forward writes it, or -inf and 0) contributes
    nothing. ``softmax_in`` is the operator's reserved input: accepted and unused. dk, dv are
    summed over the query heads sharing a kv head (GQA).

    Returns ``(dq, dk, dv)``; with ``query_rope``/``key_rope`` (as given to the forward)
    ``dq_rope = scale dS K_rope`` and ``dk_rope = scale dS^T Q_rope`` follow, summed over the
    heads sharing a key_rope head, in the layouts of query_rope and key_rope; with a tensor
    ``pse`` (pse_type 0/1) ``dpse`` comes last, in the pse's shape and dtype: ``dS`` summed
    over the axes the pse broadcasts (``scale * dS`` for pse_type 1, where the pse is added
    before scaling; for the ALiBi-compressed form, summed onto the entries each one stands for).
    The generated pse of pse_type 2/3 has no gradient here.
    """
    st = _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
                keep_prob, pre_tokens, next_tokens, inner_precise, prefix, actual_seq_qlen,
                actual_seq_kvlen, sparse_mode, pse_type, q_start_idx, kv_start_idx, seed, offset,
                softmax_layout)
    if softmax_in is not None and not isinstance(softmax_in, np.ndarray):
        raise TypeError(f"softmax_in (reserved) must be None or a numpy.ndarray; got "
                        f"{type(softmax_in).__name__}")
    qr, kr = _rope_operands(query_rope, key_rope, st)
    d = st.dims
    do = _grad_operand("dy", dy, st, d.Dv)
    o = _grad_operand("attention_in", attention_in, st, d.Dv)
    lse = _lse_from_stats(_softmax_operand("softmax_max", softmax_max, st),
                          _softmax_operand("softmax_sum", softmax_sum, st))
    ct = st.q.dtype
    dq, dk, dv = (np.zeros(x.shape, dtype=ct) for x in (st.q, st.k, st.v))
    rope = qr is not None
    dq_rope = np.zeros(qr.shape, dtype=ct) if rope else None
    dk_rope = np.zeros(kr.shape, dtype=ct) if rope else None
    with_dbias = st.pse is not None and st.pse.bias is not None
    dfull = np.zeros(st.pse.bias.shape, dtype=st.ct) if with_dbias else None
    for c in st.calls:
        grads = api.flash_attention_backward(
            _take(do, c.q_rows, st.varlen), _take(st.q, c.q_rows, st.varlen),
            _take(st.k, c.kv_rows, st.varlen), _take(st.v, c.kv_rows, st.varlen),
            _take(o, c.q_rows, st.varlen), np.ascontiguousarray(_take_lse(lse, c.q_rows, st.varlen)),
            scale=scale, window=_window(c), mask=c.mask,
            q_rope=_take(qr, c.q_rows, st.varlen) if rope else None,
            k_rope=_take(kr, c.kv_rows, st.varlen) if rope else None,
            block_q=block_q, block_k=block_k, **_options(c, st),
            **({"return_dbias": True} if with_dbias else {}))
        _put(dq, c.q_rows, st.varlen, grads[0])
        _put(dk, c.kv_rows, st.varlen, grads[1])
        _put(dv, c.kv_rows, st.varlen, grads[2])
        if rope:
            _put(dq_rope, c.q_rows, st.varlen, grads[3])
            _put(dk_rope, c.kv_rows, st.varlen, grads[4])
        if with_dbias:
            # the kernel's dbias is reduced to the shape of the bias it was handed
            _pse_slice(st.pse, dfull, c, st)[...] += grads[-1]
    out = (dq, dk, dv) + ((dq_rope, dk_rope) if rope else ())
    out = tuple(_to_layout(g, st) for g in out)
    if with_dbias:
        # bias = mult * pse (mult = scale for pse_type 1): dpse = mult * dbias
        dpse = st.pse.mult * (_alibi_fold(dfull, st.pse.compressed) if st.pse.compressed else dfull)
        out += (dpse.astype(st.pse.dtype),)
    return out
