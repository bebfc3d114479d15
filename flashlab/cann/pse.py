"""``pse`` and ``pse_type``: a bias tensor (0/1) or ALiBi slopes (2/3), checked and sliced per call.

The ALiBi-compressed form (the last 1024 rows of a Toeplitz pse) is expanded by
:func:`alibi_expand`; :func:`alibi_fold` is its adjoint for the gradient.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from flashlab.cann.attributes import ALIBI_ROWS, as_compute, int64, int64_list
from flashlab.cann.plan import Call, Setup
from flashlab.masks import allowed

__all__ = ["Pse", "alibi_expand", "alibi_fold", "pse_setup", "pse_slice", "check_alibi_cover"]


def alibi_expand(c: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
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


def alibi_fold(dfull: np.ndarray, r_c: int) -> np.ndarray:
    """Adjoint of :func:`alibi_expand`: the gradient of the full pse onto the compressed one."""
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
class Pse:
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
    values = [int64(name, x)] if isinstance(x, numbers.Integral) else int64_list(name, x)
    if len(values) != 1:
        raise ValueError(f"{name} must hold one int (the start index of this block of the "
                         f"sequence); got {values}")
    return values[0]


def pse_setup(pse, pse_type, q_start_idx, kv_start_idx, st: Setup, scale: float) -> Pse | None:
    """Check ``pse`` against ``pse_type`` and the layout (*FlashAttentionScoreV2* and
    *FlashAttentionVarLenScoreV4* realShiftOptional rules)."""
    ptype = int64("pse_type", pse_type)
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
        return Pse(ptype, pse.shape, pse.dtype, slopes=pse.astype(np.float64 if st.ct == np.float64
                                                                   else np.float32),
                    alibi_offset=q_start - kv_start)
    if pse.dtype != st.io_dtype:
        raise TypeError(f"pse must have the query's dtype {st.io_dtype} (\"输入query、key、value、pse的"
                        f"数据类型必须一致\"); got {pse.dtype}")
    x: np.ndarray = as_compute(pse).astype(st.ct, copy=False)
    if not np.isfinite(x).all():
        raise ValueError("pse contains NaN or inf")
    mult = scale if ptype == 1 else 1.0
    out = Pse(ptype, pse.shape, pse.dtype, mult=mult)
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
        full, out.unknown = alibi_expand(x, rows)
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
        full, out.unknown = alibi_expand(x, Sq)
        out.bias = mult * full
        return out
    raise ValueError(f"pse must have shape [B,N,Sq,Skv] = ({B}, {N}, {Sq}, {Sk}), [B,N,1,Skv], "
                     f"[1,N,Sq,Skv], or when Sq > 1024 the ALiBi-compressed [B,N,1024,Skv] / "
                     f"[1,N,1024,Skv]; got {pse.shape}")


def pse_slice(p: Pse, full: np.ndarray, c: Call, st: Setup) -> np.ndarray:
    """The part of ``full`` (``p.bias`` or its gradient) that call ``c`` reads: a view."""
    if not st.varlen:
        return full[c.q_rows] if full.shape[0] == st.dims.B else full
    sq, sk = c.q_rows.stop - c.q_rows.start, c.kv_rows.stop - c.kv_rows.start
    if full.ndim == 1:
        a = p.offsets[c.tnd_seq]
        return full[a:a + st.dims.N1 * sq * sk].reshape(1, st.dims.N1, sq, sk)
    b = slice(c.tnd_seq, c.tnd_seq + 1) if full.shape[0] == st.dims.B else slice(0, 1)
    # the sequence's [Sq_i, Skv_i] is the bottom-right corner (vendor golden: pse[i, :, F - sq:F,
    # maxSkv - sk:maxSkv])
    rows, cols = full.shape[2:]
    return full[b, :, rows - sq:, cols - sk:]


def check_alibi_cover(p: Pse, c: Call, st: Setup) -> None:
    """Every entry the compressed pse does not give must be masked for call ``c``."""
    unknown = p.unknown
    if unknown is None:
        raise ValueError("check_alibi_cover needs the ALiBi-compressed pse (pse_setup sets its "
                         "unknown map); got a pse with compressed=0")
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
