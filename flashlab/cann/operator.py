r"""The Ascend CANN operator ``FlashAttentionScore`` and its grad, on flashlab's kernels.

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

**Masks**: ``sparse_mode`` 0..8 as listed in :data:`flashlab.cann.sparse_modes.SPARSE_MODES` and drawn by
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

**Outputs**: ``softmax_max`` and ``softmax_sum`` are float32 (float64 for float64 inputs)
``[B, N, Sq, 8]`` (TND: ``[T, N, 8]``), each value repeated 8 times (32-byte alignment on the
device).
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
"暂不支持该传参") raises ``NotImplementedError``. ``softmax_max``/``softmax_sum`` given to the grad
must have the dtype the forward wrote (float32; float64 for float64 inputs), and a row with a
finite max must have a sum > 0.

**Extensions: what this reference accepts and the device does not.** Deliberate, each for
teaching or testing on a CPU:

* float64 inputs (computed in float64, ``softmax_max``/``softmax_sum`` float64), so that
  gradients can be checked at float64 accuracy; the device takes float16, bfloat16, float32;
* ``key_rope`` with any head count dividing ``head_num`` (MLA's is 1);
* ``block_q``/``block_k`` keywords (the CPU kernels' tile sizes; the device picks its own);
* ``seed``/``offset`` drive flashlab's SplitMix64 keep mask, not the device's Philox bits.

Sources: CANN ops-transformer docs *FlashAttentionScore*, *FlashAttentionScoreV2*,
*FlashAttentionScoreGrad*, *FlashAttentionVarLenScoreV4* and *sparse_mode参数说明*
(github.com/hicann/ops-transformer, ``attention/flash_attention_score/docs/``) with the
operator's test golden (``attention/flash_attention_score/tests/pytest/cpu_impl.py``,
``test_utils.py``); Ascend op-plugin docs *torch_npu.npu_fusion_attention*
(github.com/Ascend/op-plugin, ``docs/context/torch_npu-npu_fusion_attention.md``); MindSpeed
*fusion attention 对外接口* (``pse_type``, ``q_start_idx``, ``kv_start_idx``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from flashlab import api
from flashlab.cann.attributes import (
    EMPTY_ROW_MAX,
    EMPTY_ROW_SUM,
    INT32_MAX,
    SOFTMAX_LAYOUTS,
    SOFTMAX_REPEAT,
    as_compute,
    int64,
)
from flashlab.cann.layouts import (
    DOORS,
    canonical,
    from_bnsd,
    layout_name,
    layout_shape,
    to_bnsd,
)
from flashlab.cann.plan import Call, Setup, plan
from flashlab.cann.pse import alibi_fold, check_alibi_cover, pse_setup, pse_slice
from flashlab.cann.varlen import put_rows, sequences, take_lse, take_rows
from flashlab.tiling import BACKWARD_BLOCK, FORWARD_BLOCK
from flashlab.validation import (
    Part,
    check_dropout,
    check_like,
    check_offset,
    check_scale,
    check_seed,
    prepare_parts,
)

__all__ = ["flash_attention_score", "flash_attention_score_grad", "lse_from_stats", "npu_fusion_attention",
           "dropout_mask_numels"]


def _check_options(padding_mask, keep_prob, inner_precise, scale, seed, offset) -> float:
    """Check the scalar options; return the dropout probability ``1 - keep_prob``."""
    if padding_mask is not None:
        raise NotImplementedError("padding_mask is not supported (torch_npu.npu_fusion_attention: "
                                  "\"暂不支持该传参\"; reserved and unused in CANN)")
    # "取值范围为(0, 1]"
    dropout_p = check_dropout("keep_prob", keep_prob, keep=True)
    ip = int64("inner_precise", inner_precise)
    if ip not in (0, 1, 2):
        raise ValueError(f"inner_precise must be 0, 1 or 2 (0, 1 reserved; 2 invalid-row "
                         f"computation); got {ip}")
    # the operator's default is 1.0; pass 1/sqrt(D) for the usual attention
    check_scale("scale", scale, optional=False)
    check_seed("seed", seed)
    check_offset("offset", offset)
    return dropout_p


def _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
           keep_prob, pre_tokens, next_tokens, inner_precise, prefix, actual_seq_qlen,
           actual_seq_kvlen, sparse_mode, pse_type, q_start_idx, kv_start_idx, seed, offset,
           softmax_layout, query_rope, key_rope
           ) -> tuple[Setup, np.ndarray | None, np.ndarray | None]:
    """Read and check every argument: the setup of the call and the canonical rope pair."""
    dropout_p = _check_options(padding_mask, keep_prob, inner_precise, scale, seed, offset)
    input_layout = layout_name(input_layout)
    q, k, v, qr, kr, dims = canonical(query, key, value, head_num, input_layout, query_rope, key_rope)
    if not isinstance(softmax_layout, str) or softmax_layout not in SOFTMAX_LAYOUTS:
        raise ValueError(f"softmax_layout must be \"\" (the default: NTD in TND) or \"TND\"; got "
                         f"{softmax_layout!r}")
    varlen = input_layout == "TND"
    if softmax_layout == "TND" and not varlen:
        raise ValueError(f"softmax_layout=\"TND\" is for input_layout TND only (\"当前仅在input_layout="
                         f"“TND”时进行配置\"); got input_layout {input_layout!r}")
    seqs: list[tuple[int, int, int, int]] | None = None   # set exactly when varlen
    if varlen:
        seqs = sequences(actual_seq_qlen, actual_seq_kvlen, dims)
        dims.B = len(seqs)
    elif actual_seq_qlen is not None or actual_seq_kvlen is not None:
        raise ValueError(f"actual_seq_qlen/actual_seq_kvlen are for input_layout TND only; "
                         f"got input_layout {input_layout!r}")
    calls = plan(dims, sparse_mode=sparse_mode, atten_mask=atten_mask, pre_tokens=pre_tokens,
                 next_tokens=next_tokens, prefix=prefix, seqs=seqs)
    seqs_used: list[tuple[int, int, int, int]] = []
    if seqs is not None:
        # the trailing unused batches repeat the last end: drop them (not the empty ones inside)
        ends = [int(e) for e in np.asarray(actual_seq_qlen).reshape(-1)]   # checked above
        n = len(ends)
        while n > 1 and ends[n - 1] == 0:
            n -= 1
        seqs_used = seqs[:n]
    q, k, v = as_compute(q), as_compute(k), as_compute(v)
    st = Setup(input_layout, q, k, v, dims, calls, varlen, query.dtype, api.compute_dtype(q.dtype),
                int(sparse_mode), atten_mask is not None, seqs_used, seqs, dropout_p, int(seed),
                int(offset), softmax_layout)
    st.pse = pse_setup(pse, pse_type, q_start_idx, kv_start_idx, st, float(scale))
    if st.pse is not None and st.pse.compressed:
        for c in calls:
            check_alibi_cover(st.pse, c, st)
    qr, kr = _rope_operands(qr, kr, st)
    st.operands, st.parts = _whole_call(st, qr, kr)
    return st, qr, kr


def _whole_call(st: Setup, qr: np.ndarray | None, kr: np.ndarray | None
                ) -> tuple[tuple, list[Part]]:
    """The operands of the whole call as (B, N1, S, D) kernel operands (TND: the (1, N1, T', D)
    view of the first T' tokens, up to the last that a call reads) and each planned call as a
    :class:`~flashlab.validation.Part` of them, for :func:`~flashlab.validation.prepare_parts`."""
    def rows(r: slice) -> tuple[slice, ...]:
        # a call's batches, or its sequence's tokens (axis 2 of the TND view)
        return (slice(None), slice(None), r) if st.varlen else (r,)

    q_end = max((c.q_rows.stop for c in st.calls), default=0)
    k_end = max((c.kv_rows.stop for c in st.calls), default=0)
    whole = tuple(None if x is None else take_rows(x, slice(0, end), st.varlen)
                  for x, end in ((st.q, q_end), (st.k, k_end), (st.v, k_end), (qr, q_end), (kr, k_end)))
    return whole, [Part(rows(c.q_rows), rows(c.kv_rows), window=c.window, mask=c.mask,
                        **_options(c, st)) for c in st.calls]


def _rope_operands(qr: np.ndarray | None, kr: np.ndarray | None, st: Setup
                   ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The operator's own rules on the rope pair read by :func:`~flashlab.cann.layouts.canonical`
    (checked there by validation's rule): ``Dr % 8 == 0``, ``Dr <= D`` and an ``atten_mask``.
    Returns them in the compute dtype (as ``st.q``, ``st.k``), or ``(None, None)``.

    Canonical: (B, N1, Sq, Dr) and (B, Nr, Sk, Dr), or TND (T_q, N1, Dr) and (T_k, Nr, Dr),
    with ``N1 % Nr == 0``.
    """
    if qr is None or kr is None:
        return None, None
    qr, kr = as_compute(qr), as_compute(kr)
    dr, d = qr.shape[-1], st.dims.D
    if dr % 8 != 0 or dr > d:
        raise ValueError(f"query_rope's head dim Dr must be a multiple of 8 and <= D={d} "
                         f"(the rope operands' rule); got Dr={dr}")
    if not st.masked:
        # the RoPE (MLA) form of the operator is documented with an atten_mask (PTA docs, as
        # issue 34 reports them): without one the mask arguments would be ignored
        raise ValueError("query_rope/key_rope need atten_mask (the operator's RoPE inputs are "
                         "documented with an atten_mask); for full attention pass an all-False "
                         "atten_mask ([Sq, Skv]; TND [maxSq, maxSkv]) with sparse_mode=0")
    return qr, kr


def _to_layout(x: np.ndarray, st: Setup) -> np.ndarray:
    out = np.ascontiguousarray(x) if st.varlen else from_bnsd(x, st.layout)
    return out.astype(st.io_dtype, copy=False)


def _counter_start(c: Call, st: Setup) -> int:
    """First dropout counter of call ``c`` (see the module docstring)."""
    d = st.dims
    if not st.varlen:
        # a call over batches [b0, b1): the kernel counts from its own b = 0
        return st.offset + c.q_rows.start * d.N1 * d.Sq * d.Sk
    before = sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in st.seqs[:c.seq])
    return st.offset + d.N1 * before


def _options(c: Call, st: Setup) -> dict:
    """pse and dropout counter of the kernel call for ``c`` (:class:`~flashlab.validation.Part`'s
    keyword arguments; empty when unused)."""
    kw: dict[str, Any] = {}
    p = st.pse
    if p is not None and p.slopes is not None:
        slopes = p.slopes
        if slopes.ndim == 2:
            slopes = slopes[c.q_rows] if not st.varlen else slopes[c.tnd_seq:c.tnd_seq + 1]
        kw.update(alibi_slopes=slopes, alibi_offset=p.alibi_offset, alibi_sqrt=p.pse_type == 3)
    elif p is not None:
        kw["bias"] = pse_slice(p, p.bias, c, st)
    if st.dropout_p > 0.0:
        kw["offset"] = _counter_start(c, st)
    return kw


def stats_dtype(st: Setup) -> type:
    """softmax_max/sum's dtype: float32 as on the device, float64 for float64 inputs (so that a
    float64 grad recomputes P from a float64 LSE)."""
    return np.float64 if st.ct == np.float64 else np.float32


def _row_blocks(st: Setup) -> list[tuple[int, int]]:
    """TND query rows ``[q0, q1)`` of each sequence, then those past the last one (T may exceed
    the last of ``actual_seq_qlen``: no sequence reads them, their output is 0)."""
    blocks = [(q0, q1) for q0, q1, _, _ in st.seqs or []]
    end = blocks[-1][1] if blocks else 0
    return blocks + ([(end, st.dims.Sq)] if end < st.dims.Sq else [])


def _stats_out(x: np.ndarray, st: Setup) -> np.ndarray:
    """Row values (B, N, Sq) or TND (T, N) -> [..., 8] in ``softmax_layout`` and :func:`stats_dtype`."""
    if st.varlen and st.softmax_layout == "":
        # NTD: sequence by sequence, a block [N, Sq_i] of each (then the rows past the last sequence)
        x = np.concatenate([x[q0:q1].T.reshape(-1) for q0, q1 in _row_blocks(st)]).reshape(x.shape)
    return np.ascontiguousarray(np.repeat(x[..., None], SOFTMAX_REPEAT, axis=-1),
                                dtype=stats_dtype(st))


def _stats_in(x: np.ndarray, st: Setup) -> np.ndarray:
    """Inverse of :func:`_stats_out` (first of the 8 copies), as float64."""
    rows = x[..., 0].astype(np.float64)
    if not (st.varlen and st.softmax_layout == ""):
        return rows
    flat, out, pos, n = rows.reshape(-1), np.empty(rows.shape), 0, st.dims.N1
    for q0, q1 in _row_blocks(st):
        out[q0:q1] = flat[pos:pos + n * (q1 - q0)].reshape(n, q1 - q0).T
        pos += n * (q1 - q0)
    return out


def flash_attention_score(query, key, value, head_num, input_layout, *, pse=None,
                          padding_mask=None, atten_mask=None, scale=1.0, keep_prob=1.0,
                          pre_tokens=INT32_MAX, next_tokens=INT32_MAX, inner_precise=0,
                          prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                          sparse_mode=0, pse_type=1, q_start_idx=None, kv_start_idx=None,
                          seed=0, offset=0, softmax_layout="", query_rope=None, key_rope=None,
                          block_q=FORWARD_BLOCK[0], block_k=FORWARD_BLOCK[1]):
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
        :data:`flashlab.cann.sparse_modes.SPARSE_MODES`). None: full attention, whatever ``sparse_mode``,
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
    actual_seq_qlen, actual_seq_kvlen : TND only, cumulative sequence ends; the last may be below
        T, as the tiling accepts (``t1Size >= accumS1``): rows past it belong to no sequence
        (output 0, the invalid-row statistics below, zero gradients)
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
    softmax_max, softmax_sum : [B, N, Sq, 8] (TND: [T, N, 8], in ``softmax_layout``), float32
        as the device writes them, float64 for float64 inputs; LSE = max + log(sum). A row with
        no allowed key: out 0, max -3.4028235e38 (float32 lowest), sum 3.4028235e38 (float32
        max), in either dtype.

    The operator's fourth output ``softmax_out`` is reserved and never written ("预留参数，暂未
    使用，接口不写入该输出"), and its seed/offset/numels outputs describe the dropout stream:
    :func:`npu_fusion_attention` returns all seven.

    **Extensions and deliberate differences.**

    * float64 inputs are accepted (computed in float64, ``softmax_max``/``softmax_sum``
      float64), so that gradients can be checked at float64 accuracy; the device takes
      float16, bfloat16 and float32. The other extensions are listed in the module docstring
      (``key_rope`` head counts, ``block_q``/``block_k``, SplitMix64 dropout bits).
    * For ``sparse_mode`` 1, 2 and 3 the device's tiling ignores ``pre_tokens``/``next_tokens``
      (mode 1: unbounded; 2: ``pre = Sq, next = 0``; 3: ``pre = Sq, next = Sk - Sq``) and logs
      an ``OP_LOGW`` warning when the values given differ from those. The same values are used
      here, **without a warning**: the defaults (``INT32_MAX``) differ from them, so the device's
      warning would fire on every default mode-2 call (causal attention, the most common one).
      Pinned by ``tests/test_door_checks.py::test_mode2_with_default_tokens_does_not_warn``.
    * Checks: the operands, ``keep_prob``, ``scale``, ``seed``, ``offset`` and the TND
      ``actual_seq_qlen``/``actual_seq_kvlen`` are checked by :mod:`flashlab.validation`'s
      rules (one rule for every entry point), with the operator's names in the messages
      (``query``, ``keep_prob``, ...); this module keeps only the operator's own ranges. The
      operands are checked once for the whole call (:func:`flashlab.validation.prepare_parts`,
      one NaN/inf scan of each); each kernel call runs on its piece cut from that check.
    """
    st, qr, kr = _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask,
                        scale, keep_prob, pre_tokens, next_tokens, inner_precise, prefix,
                        actual_seq_qlen, actual_seq_kvlen, sparse_mode, pse_type, q_start_idx,
                        kv_start_idx, seed, offset, softmax_layout, query_rope, key_rope)
    d = st.dims
    # the door's names depend on the layout alone
    door = DOORS[layout_name(input_layout)]
    rows = (d.Sq, d.N1) if st.varlen else (d.B, d.N1, d.Sq)
    out = np.zeros(rows + (d.Dv,), dtype=st.q.dtype)
    lse = np.full(rows, -np.inf)
    row_max = np.full(rows, -np.inf)
    # checked once: the whole call, then each planned call cut from it
    q, k, v, q_rope, k_rope = st.operands
    problems = prepare_parts(q, k, v, q_rope, k_rope, parts=st.parts, scale=scale,
                             dropout_p=st.dropout_p, seed=st.seed, block_q=block_q,
                             block_k=block_k, door=door)
    for c, p in zip(st.calls, problems):
        o, l, m, _ = api.flash_attention(problem=p, stats=True)
        put_rows(out, c.q_rows, st.varlen, o)
        put_rows(lse, c.q_rows, st.varlen, l)
        put_rows(row_max, c.q_rows, st.varlen, m)
    empty = np.isneginf(lse)
    # softmax_sum = sum_j exp(s_ij - max_i) = exp(LSE - max)
    softmax_sum = np.exp(np.where(empty, 0.0, lse - np.where(empty, 0.0, row_max)))
    # a row with no allowed key: the invalid-row values float32 lowest / max
    softmax_max = np.where(empty, EMPTY_ROW_MAX, row_max)
    softmax_sum = np.where(empty, EMPTY_ROW_SUM, softmax_sum)
    return _to_layout(out, st), _stats_out(softmax_max, st), _stats_out(softmax_sum, st)


def _grad_operand(name: str, x, st: Setup, dim: int) -> np.ndarray:
    """dy / attention_in in the query's layout -> canonical (B, N1, Sq, Dv) or (T, N1, Dv)."""
    d = st.dims
    expected = (d.Sq, d.N1, dim) if st.varlen else layout_shape(st.layout, d.B, d.N1, d.Sq, dim)
    # scanned for NaN/inf by the kernel API's backward, which names it as here
    check_like(name, x, expected, f"attention_out's (layout {st.layout})", st.io_dtype, "query",
               scan=False)
    return as_compute(x if st.varlen else to_bnsd(x, st.layout, d.N1))


def _softmax_operand(name: str, x, st: Setup) -> np.ndarray:
    d = st.dims
    expected = (d.Sq, d.N1, SOFTMAX_REPEAT) if st.varlen else (d.B, d.N1, d.Sq, SOFTMAX_REPEAT)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy float32/float64 array of shape {expected}; "
                        f"got {type(x).__name__}")
    if x.shape != expected:
        raise ValueError(f"{name} must have shape {expected} (the forward's); got {x.shape}")
    want = np.dtype(stats_dtype(st))
    if x.dtype != want:
        # the documented dtype is float32 (float64 is flashlab's extension for float64 inputs):
        # an int or float16 statistic is not one the forward wrote
        raise TypeError(f"{name} must have dtype {want.name} (the forward's softmax statistics "
                        f"for {np.dtype(st.io_dtype).name} inputs); got {x.dtype}")
    return _stats_in(x, st)


def lse_from_stats(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    r"""The log-sum-exp of each row from the operator's softmax statistics:
    $\mathrm{LSE} = m + \log s$, and $-\infty$ for a row with no allowed key.

    ``m`` and ``s`` are one copy of ``softmax_max`` and ``softmax_sum`` (any shape, e.g.
    ``softmax_max[..., 0]`` of the ``[..., 8]`` outputs). A row with no allowed key is written
    as (max, sum) = (-3.4028235e38, 3.4028235e38), float32's lowest and largest values, by
    :func:`flash_attention_score` and the device; a row given as (-inf, 0), the other usual
    way to write "no key", is read the same way. Raises ``ValueError`` for any other row
    without a finite max and a positive sum.
    """
    # a row with no allowed key is known by its max (float32's lowest, or -inf); a finite max
    # with a sum <= 0 is not a softmax row (the LSE would be -inf or NaN): refused below
    empty = m <= EMPTY_ROW_MAX
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
                               key_rope=None, block_q=BACKWARD_BLOCK[0],
                               block_k=BACKWARD_BLOCK[1]):
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
    st, qr, kr = _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask,
                        scale, keep_prob, pre_tokens, next_tokens, inner_precise, prefix,
                        actual_seq_qlen, actual_seq_kvlen, sparse_mode, pse_type, q_start_idx,
                        kv_start_idx, seed, offset, softmax_layout, query_rope, key_rope)
    if softmax_in is not None and not isinstance(softmax_in, np.ndarray):
        raise TypeError(f"softmax_in (reserved) must be None or a numpy.ndarray; got "
                        f"{type(softmax_in).__name__}")
    d = st.dims
    do = _grad_operand("dy", dy, st, d.Dv)
    o = _grad_operand("attention_in", attention_in, st, d.Dv)
    lse = lse_from_stats(_softmax_operand("softmax_max", softmax_max, st),
                          _softmax_operand("softmax_sum", softmax_sum, st))
    ct = st.q.dtype
    door = DOORS[layout_name(input_layout)]     # the door's names depend on the layout alone
    dq, dk, dv = (np.zeros(x.shape, dtype=ct) for x in (st.q, st.k, st.v))
    # _rope_operands gives both rope operands or neither; dfull: the dbias of a tensor pse
    dq_rope = None if qr is None else np.zeros(qr.shape, dtype=ct)
    dk_rope = None if kr is None else np.zeros(kr.shape, dtype=ct)
    p = st.pse
    dfull = None if p is None or p.bias is None else np.zeros(p.bias.shape, dtype=st.ct)
    # checked once, as in the forward: the whole call, then each planned call cut from it
    q, k, v, q_rope, k_rope = st.operands
    problems = prepare_parts(q, k, v, q_rope, k_rope, parts=st.parts, scale=scale,
                             dropout_p=st.dropout_p, seed=st.seed, block_q=block_q,
                             block_k=block_k, door=door)
    for c, problem in zip(st.calls, problems):
        # dy, attention_in and the LSE rows: checked by the kernel API's backward (its door names)
        grads = api.flash_attention_backward(
            take_rows(do, c.q_rows, st.varlen), o=take_rows(o, c.q_rows, st.varlen),
            lse=np.ascontiguousarray(take_lse(lse, c.q_rows, st.varlen)), problem=problem,
            block_q=block_q, block_k=block_k, door=door,
            **({"return_dbias": True} if dfull is not None else {}))
        put_rows(dq, c.q_rows, st.varlen, grads[0])
        put_rows(dk, c.kv_rows, st.varlen, grads[1])
        put_rows(dv, c.kv_rows, st.varlen, grads[2])
        if dq_rope is not None and dk_rope is not None:
            put_rows(dq_rope, c.q_rows, st.varlen, grads[3])
            put_rows(dk_rope, c.kv_rows, st.varlen, grads[4])
        if dfull is not None:
            # the kernel's dbias is reduced to the shape of the bias it was handed
            pse_slice(p, dfull, c, st)[...] += grads[-1]
    out = (dq, dk, dv) + (() if dq_rope is None or dk_rope is None else (dq_rope, dk_rope))
    out = tuple(_to_layout(g, st) for g in out)
    if dfull is not None:
        # bias = mult * pse (mult = scale for pse_type 1): dpse = mult * dbias
        dpse = p.mult * (alibi_fold(dfull, p.compressed) if p.compressed else dfull)
        out += (dpse.astype(p.dtype),)
    return out


def dropout_mask_numels(query, key, head_num, input_layout, actual_seq_qlen=None,
                        actual_seq_kvlen=None) -> int:
    """``numels``: the number of dropout-mask elements the operator generates, as op-plugin counts it.

    ``B * N * Sq * Skv`` for BSH, SBH, BSND and BNSD (N = ``head_num``); for TND
    ``N * sum_i(Sq_i * Skv_i)`` over the sequences of ``actual_seq_qlen``/``actual_seq_kvlen``
    (op-plugin's ``npu_fusion_attention``: ``numels = N`` times the sum of the products of the
    lengths). The device's mask holds ``ceil(numels / 128) * 128 / 8 + 32`` bytes.
    """
    layout = layout_name(input_layout)
    n = int(head_num)
    if layout == "TND":
        cq = [0] + [int(e) for e in np.asarray(actual_seq_qlen).reshape(-1)]
        ck = [0] + [int(e) for e in np.asarray(actual_seq_kvlen).reshape(-1)]
        # numels = N * sum_i (q_i+1 - q_i)(k_i+1 - k_i); trailing repeated ends add 0
        return n * sum((b - a) * (d - c) for a, b, c, d in zip(cq, cq[1:], ck, ck[1:]))
    qs, ks = np.shape(query), np.shape(key)
    # the batch and sequence axes of each layout: BSH/BSND (B, S, ...), SBH (S, B, ...), BNSD (B, N, S, D)
    b, sq, sk = {"BSH": (qs[0], qs[1], ks[1]), "BSND": (qs[0], qs[1], ks[1]),
                 "SBH": (qs[1], qs[0], ks[0]), "BNSD": (qs[0], qs[2], ks[2])}[layout]
    return int(b) * n * int(sq) * int(sk)


def npu_fusion_attention(query, key, value, head_num, input_layout, *, keep_prob=1.0, seed=0,
                         offset=0, actual_seq_qlen=None, actual_seq_kvlen=None, **options
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """``torch_npu.npu_fusion_attention``'s seven outputs, from :func:`flash_attention_score`.

    Returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)``:

    * the first three are :func:`flash_attention_score`'s (same arguments, same values);
    * ``softmax_out`` is reserved: an empty array of the query's dtype, as the operator
      allocates it (``at::empty({0})``) and never writes it;
    * ``seed``, ``offset``: the dropout stream's state. On the device they are the Philox
      generator's ``philox_engine_inputs`` taken when ``0 < keep_prob < 1``; here the mask is
      flashlab's counter-based stream, whose state *is* the caller's ``seed`` and ``offset``, so
      those are returned (pass them to :func:`flash_attention_score_grad` to regenerate the same
      mask). With ``keep_prob`` 0 or 1 no stream is drawn (op-plugin leaves the two integers
      unset): 0 and 0 are returned. The bits are not the device's Philox bits.
    * ``numels``: :func:`dropout_mask_numels`, computed whatever ``keep_prob``, as op-plugin does.
    """
    out, smax, ssum = flash_attention_score(query, key, value, head_num, input_layout,
                                            keep_prob=keep_prob, seed=seed, offset=offset,
                                            actual_seq_qlen=actual_seq_qlen,
                                            actual_seq_kvlen=actual_seq_kvlen, **options)
    drawn = 0.0 < float(keep_prob) < 1.0
    numels = dropout_mask_numels(query, key, head_num, input_layout, actual_seq_qlen, actual_seq_kvlen)
    softmax_out = np.empty(0, dtype=np.asarray(query).dtype)
    return (out, smax, ssum, softmax_out, int(seed) if drawn else 0, int(offset) if drawn else 0, numels)
