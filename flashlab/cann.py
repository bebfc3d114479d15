r"""The Ascend CANN operator's interface, ``FlashAttentionScore`` and its grad, on flashlab's kernels.

What the operator computes (CANN ops-transformer docs, *FlashAttentionScore*; the same operator
is ``torch_npu.npu_fusion_attention``):

$$
\text{attention\_out} = \operatorname{Dropout}\big(\operatorname{Softmax}(
\operatorname{Mask}(\text{scale}\,(\text{pse} + Q K^\top), \text{atten\_mask})), \text{keep\_prob}\big)\,V
$$

This module is a CPU reference of that interface: it reads the operator's arguments (layouts,
``head_num``, ``sparse_mode``, ``pre_tokens``/``next_tokens``, ``prefix``, the cumulative
``actual_seq_qlen``/``actual_seq_kvlen`` of the varlen layout TND), turns the mask arguments into
flashlab's mask model (a band ``[i - left, i + right]`` plus, only where a rule needs one, a
dense mask; see :mod:`flashlab.masks`) and runs the ``flashlab.kernels`` on each piece. The band
is what lets the kernel skip whole tiles, as the operator's block-sparse scheduling does.

**Layouts** (``input_layout``): ``BSH`` [B, S, N*D], ``SBH`` [S, B, N*D], ``BSND``, ``BNSD``,
``TND`` [T, N, D]. In TND the sequences are packed along T; ``actual_seq_qlen`` and
``actual_seq_kvlen`` give the *cumulative* ends (lengths 2, 2, 2 -> ``[2, 4, 6]``), a length may be
0, and trailing zeros mark unused batches (``[2, 5, 9, 0, 0]``). Every sequence attends only
within itself; no padding is computed: the kernel runs on each sequence's own slice.

**Heads**: ``head_num`` is the query's N; the key's N is read from its shape (for BSH/SBH
``N_kv = H_kv / D``). ``N_q % N_kv == 0`` (GQA; ``N_kv = 1`` is MQA). Q and K share D, and V's D
may be smaller (``D_q = D_k >= D_v``, the operator's constraint).

**Masks**: ``sparse_mode`` 0..8 as listed in :data:`flashlab.masks.SPARSE_MODES` and drawn by
:mod:`flashlab.viz.sparse_modes`. Modes 2, 3, 4, 7, 8 take the *compressed* ``atten_mask``
(the ``2048 x 2048`` strict upper triangle) and mode 6 the ``3072 x 2048`` one: the operator
uses it only as a stamp for diagonal tiles and derives the mask from the rule, so this module
checks the stamp's shape and content and builds the real mask from the rule.

**RoPE operands** (the MLA variant of the operator, ``query_rope``/``key_rope``):

$$
\text{scores} = \text{scale}\,(Q K^\top + Q^{rope} {K^{rope}}^\top),
$$

``query_rope`` in the query's layout with ``head_num`` heads and its own head dim ``D_r``,
``key_rope`` in the key's layout. Here ``key_rope`` may have any head count dividing
``head_num``; MLA's is 1 (one RoPE key per token, shared by every head), which the kernel
reads as it is, never copied per head. The grad then also returns ``dq_rope`` and
``dk_rope`` (summed over the heads sharing a ``key_rope`` head).

**Outputs**: ``softmax_max`` and ``softmax_sum`` are float32 ``[B, N, Sq, 8]`` (TND:
``[T, N, 8]``), each value repeated 8 times (32-byte alignment on the device).
``softmax_max`` is the row max of the scaled, masked scores and ``softmax_sum`` the row sum of
``exp(score - max)``, so the log-sum-exp is

$$
\mathrm{LSE} = \text{softmax\_max} + \log(\text{softmax\_sum}).
$$

A row with **no allowed key** (e.g. mode 3 with Sq > Sk, or a band that misses a row) returns
``attention_out = 0``, ``softmax_max = -inf``, ``softmax_sum = 0`` (so LSE = -inf, flashlab's
convention) and gets zero gradients. The device's own values for such rows are not documented
(it switches on "invalid row" handling, ``inner_precise = 2``); do not compare them bitwise.

**Where this reference is stricter than the device.** The operator silently computes full
attention when ``atten_mask`` is None, whatever ``sparse_mode``, ``pre_tokens``, ``next_tokens``
say, and gives wrong results for a wrong compressed mask. Here both raise ``ValueError``:
modes 2..8 need their mask, and ``pre_tokens``/``next_tokens`` that would cut something need
one in mode 0. ``pse``, ``padding_mask`` (reserved, unused by CANN) and dropout
(``keep_prob < 1``) are not implemented and raise ``NotImplementedError``.

Sources: CANN ops-transformer docs *FlashAttentionScore*, *FlashAttentionScoreGrad*,
*FlashAttentionVarLenScore* and *sparse_mode参数说明* (mirrored in
github.com/yueliang13/cann-ops-adv-vllm, ``docs/``); Ascend op-plugin docs
*torch_npu.npu_fusion_attention* (github.com/Ascend/op-plugin,
``docs/context/torch_npu-npu_fusion_attention.md``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from flashlab import api
from flashlab.checks import prepare
from flashlab.masks import (NO_LIMIT, SPARSE_MODES, allowed, compressed_mask, prefix_mask,
                            sparse_mode_band, varlen_sequence_mode)

#: the input layouts the operator accepts
LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")

#: the operator's default ``pre_tokens``/``next_tokens`` (INT32_MAX: unbounded)
INT32_MAX = 2147483647

#: softmax_max / softmax_sum repeat each row's value this many times (32 bytes of float32)
SOFTMAX_REPEAT = 8


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
    if isinstance(head_num, bool) or not isinstance(head_num, numbers.Integral):
        raise TypeError(f"head_num must be an int (the query's head count N); got {head_num!r}")
    if head_num < 1:
        raise ValueError(f"head_num must be >= 1; got {head_num}")
    N1 = int(head_num)
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
    ends = [int(c) for c in np.asarray(cum).reshape(-1)]
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
    """``(q0, q1, k0, k1)`` token ranges of every sequence of a TND batch."""
    q_ends = _seq_ends("actual_seq_qlen", actual_seq_qlen, dims.Sq)
    k_ends = _seq_ends("actual_seq_kvlen", actual_seq_kvlen, dims.Sk)
    if len(q_ends) != len(k_ends):
        raise ValueError(f"actual_seq_qlen and actual_seq_kvlen must list the same number of "
                         f"sequences; got {len(q_ends)} and {len(k_ends)}")
    seqs = []
    for s, (q1, k1) in enumerate(zip(q_ends, k_ends)):
        q0 = q_ends[s - 1] if s else 0
        k0 = k_ends[s - 1] if s else 0
        if q1 > q0 and k1 == k0:
            raise ValueError(f"sequence {s} has {q1 - q0} queries but no key; the operator does not "
                             f"support Sq > 0 with Skv = 0")
        seqs.append((q0, q1, k0, k1))
    return seqs


# ------------------------------------------------------------------------------- masks
@dataclass
class _Call:
    """One kernel call: rows of the canonical arrays and the mask that applies there.

    ``q_rows``/``kv_rows`` slice the batch axis of (B, N, S, D) arrays, or the token axis of
    TND arrays (one sequence); band ``[i - left, i + right]``; ``mask`` (Bm, 1 or N, sq, sk)
    bool (True = masked out) or None.
    """

    q_rows: slice
    kv_rows: slice
    left: int
    right: int
    mask: np.ndarray | None


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
        return mask[None, None]
    B, N, Sq, Sk = dims.B, dims.N1, dims.Sq, dims.Sk
    ok = {(Sq, Sk), (1, 1, Sq, Sk), (B, 1, Sq, Sk), (B, N, Sq, Sk)}
    if mask.shape not in ok:
        raise ValueError(f"atten_mask (sparse_mode={mode}) must have shape [Sq,Sk], [1,1,Sq,Sk], "
                         f"[B,1,Sq,Sk] or [B,N,Sq,Sk] with B={B}, N={N}, Sq={Sq}, Sk={Sk}; "
                         f"got {mask.shape}")
    return mask.reshape((1, 1) + mask.shape) if mask.ndim == 2 else mask


def _int(name: str, x) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {x!r}")
    return int(x)


def _prefix_list(prefix, n: int, lengths: list[tuple[int, int]], where: str) -> list[int]:
    if prefix is None:
        raise ValueError("sparse_mode 5 and 6 need prefix: the number of keys every query sees, "
                         "one int per batch")
    values = [int(p) for p in np.asarray(prefix).reshape(-1)]
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


def plan(dims: Dims, *, sparse_mode=0, atten_mask=None, pre_tokens=INT32_MAX,
         next_tokens=INT32_MAX, prefix=None, seqs=None) -> list[_Call]:
    """Turn the operator's mask arguments into kernel calls, checking every one of them.

    ``seqs`` is None for the B, N, S, D layouts and the TND sequences ``(q0, q1, k0, k1)``
    otherwise. Returns the ``_Call`` list that :func:`flash_attention_score`, its grad
    and :func:`sparse_mode_mask` all run through, so what is drawn is what is computed.
    """
    if isinstance(sparse_mode, bool) or not isinstance(sparse_mode, numbers.Integral):
        raise TypeError(f"sparse_mode must be an int in 0..8; got {sparse_mode!r}")
    mode = int(sparse_mode)
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
        raise ValueError(f"prefix is used only by sparse_mode 5 and 6; got sparse_mode={mode}")
    if mode in (0, 4, 7, 8) and pre + nxt < 0:
        raise ValueError(f"pre_tokens and next_tokens must overlap (pre_tokens + next_tokens >= 0); "
                         f"got {pre} and {nxt}")

    # (sq, sk) of every batch / sequence
    if varlen:
        lengths = [(q1 - q0, k1 - k0) for q0, q1, k0, k1 in seqs]
    else:
        lengths = [(dims.Sq, dims.Sk)] * dims.B
    max_q = max(sq for sq, _ in lengths)
    max_k = max(sk for _, sk in lengths)
    nonempty = [s for s, (sq, _) in enumerate(lengths) if sq > 0]

    # ---- atten_mask: required by modes 2..8, optional in 0/1
    full = None
    if atten_mask is None:
        if mode >= 2:
            shape = "(3072, 2048)" if mode == 6 else ("[B,N,Sq,Sk]" if mode == 5 else "(2048, 2048)")
            raise ValueError(f"sparse_mode={mode} ({name}) needs its atten_mask {shape}; without one "
                             f"the operator ignores sparse_mode and computes full attention")
        if mode == 0 and (pre < max_q - 1 or nxt < max_k - 1):
            raise ValueError(f"pre_tokens={pre}, next_tokens={nxt} would mask keys but take effect only "
                             f"with an atten_mask (the operator ignores them without one); pass an "
                             f"atten_mask consistent with them")
    else:
        mask = _as_bool_mask(atten_mask)
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
        if mode == 5 and full is not None:
            for b, p in enumerate(prefixes):
                rule = prefix_mask(dims.Sq, dims.Sk, p)
                if not (full[b] == rule).all():
                    raise ValueError(f"sparse_mode=5: atten_mask[{b}] must be the prefix mask of "
                                     f"prefix[{b}]={p} (rightDownCausal plus the first {p} keys)")

    if mode == 7 and nonempty:
        last_sk = lengths[nonempty[-1]][1]
        if pre < last_sk or nxt > 0:
            raise ValueError(f"sparse_mode=7 needs pre_tokens >= the last sequence's Skv={last_sk} and "
                             f"next_tokens <= 0 (its band, from the bottom-right); got {pre}, {nxt}")
    if mode == 8 and nonempty:
        first_sk = lengths[nonempty[0]][1]
        if pre < first_sk:
            raise ValueError(f"sparse_mode=8 needs pre_tokens >= the first sequence's Skv={first_sk}; "
                             f"got {pre}")

    # ---- the calls
    if not varlen and mode <= 4:
        # one rule for every batch: a single call over all of them
        left, right = sparse_mode_band(mode, dims.Sq, dims.Sk, pre, nxt)
        calls = [_Call(slice(0, dims.B), slice(0, dims.B), left, right, full)]
    else:
        calls = _sequence_calls(mode, lengths, nonempty, seqs, pre, nxt, full,
                                prefixes if mode in (5, 6) else None)
    if mode == 0 and full is not None:
        _check_consistent(calls)
    return calls


def _check_consistent(calls: list[_Call]) -> None:
    """Mode 0: atten_mask must mask every entry outside the pre/next band.

    The operator skips blocks by pre/next and masks inside the blocks it computes by
    atten_mask alone, so an entry outside the band that the mask keeps would be computed or
    not depending on the block it falls in.
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


def _sequence_calls(mode, lengths, nonempty, seqs, pre, nxt, full, prefixes) -> list[_Call]:
    """One call per non-empty batch (modes 5, 6) or TND sequence, each with its own rule."""
    varlen = seqs is not None
    calls = []
    for s in nonempty:
        sq, sk = lengths[s]
        m = varlen_sequence_mode(mode, s, nonempty[0], nonempty[-1])
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
            calls.append(_Call(slice(q0, q1), slice(k0, k1), left, right, dense))
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


# ------------------------------------------------------------------------- the operator
def _check_unsupported(pse, padding_mask, keep_prob, inner_precise, scale) -> None:
    if pse is not None:
        raise NotImplementedError("pse (the positional bias added to Q K^T) is not implemented here")
    if padding_mask is not None:
        raise NotImplementedError("padding_mask is not implemented (it is reserved and unused in CANN)")
    if isinstance(keep_prob, bool) or not isinstance(keep_prob, numbers.Real):
        raise TypeError(f"keep_prob must be a real number in (0, 1]; got {keep_prob!r}")
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"keep_prob must lie in (0, 1]; got {keep_prob}")
    if keep_prob < 1.0:
        raise NotImplementedError(f"keep_prob={keep_prob} < 1 (dropout) is not implemented; use keep_prob=1")
    if isinstance(inner_precise, bool) or inner_precise not in (0, 1, 2):
        raise ValueError(f"inner_precise must be 0, 1 or 2; got {inner_precise!r}")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite real number (the operator's default is 1.0; "
                        f"pass 1/sqrt(D) for the usual attention); got {scale!r}")


@dataclass
class _Setup:
    layout: str
    q: np.ndarray     # (B, N1, Sq, D) or TND (T, N1, D)
    k: np.ndarray
    v: np.ndarray
    dims: Dims
    calls: list
    varlen: bool


def _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
           keep_prob, pre_tokens, next_tokens, inner_precise, prefix, actual_seq_qlen,
           actual_seq_kvlen, sparse_mode) -> _Setup:
    _check_unsupported(pse, padding_mask, keep_prob, inner_precise, scale)
    q, k, v, dims = _canonical(query, key, value, head_num, input_layout)
    varlen = input_layout == "TND"
    seqs = None
    if varlen:
        seqs = _sequences(actual_seq_qlen, actual_seq_kvlen, dims)
        dims.B = len(seqs)
    elif actual_seq_qlen is not None or actual_seq_kvlen is not None:
        raise ValueError(f"actual_seq_qlen/actual_seq_kvlen are for input_layout TND only; "
                         f"got input_layout {input_layout!r}")
    calls = plan(dims, sparse_mode=sparse_mode, atten_mask=atten_mask, pre_tokens=pre_tokens,
                 next_tokens=next_tokens, prefix=prefix, seqs=seqs)
    return _Setup(input_layout, q, k, v, dims, calls, varlen)


def _rope_operands(query_rope, key_rope, st: _Setup) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Check ``query_rope``/``key_rope`` against the layout; return them canonical or ``(None, None)``.

    Canonical: (B, N1, Sq, Dr) and (B, Nr, Sk, Dr), or TND (T_q, N1, Dr) and (T_k, Nr, Dr),
    with ``N1 % Nr == 0``. For BSH/SBH, ``Dr = H_qr / head_num`` and ``Nr = H_kr / Dr``.
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
        if x.dtype != st.q.dtype:
            raise TypeError(f"{name} must have the query's dtype {st.q.dtype}; got {x.dtype}")
    # heads are axis 1 in (B, N, S, D) and in (T, N, D); compare every other axis but the last
    if qr.shape[:-1] != st.q.shape[:-1]:
        raise ValueError(f"query_rope must match query in every axis but the last (layout {layout}): "
                         f"{tuple(st.q.shape[:-1])} after reading the layout; got {tuple(qr.shape[:-1])}")
    others = (kr.shape[:1] + kr.shape[2:-1], st.k.shape[:1] + st.k.shape[2:-1])
    if others[0] != others[1] or kr.shape[-1] != qr.shape[-1]:
        raise ValueError(f"key_rope must match key in every axis but the heads and the last, and have "
                         f"query_rope's Dr={qr.shape[-1]} (layout {layout}); got key_rope "
                         f"{tuple(kr.shape)} for key {tuple(st.k.shape)} after reading the layout")
    if N1 % kr.shape[1] != 0:
        raise ValueError(f"head_num={N1} must be a multiple of key_rope's head count {kr.shape[1]} "
                         f"(MLA: 1, one key_rope shared by all heads)")
    return qr, kr


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
    return np.ascontiguousarray(x) if st.varlen else from_bnsd(x, st.layout)


def _repeat8(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.repeat(x[..., None], SOFTMAX_REPEAT, axis=-1), dtype=np.float32)


def flash_attention_score(query, key, value, head_num, input_layout, *, pse=None,
                          padding_mask=None, atten_mask=None, scale=1.0, keep_prob=1.0,
                          pre_tokens=INT32_MAX, next_tokens=INT32_MAX, inner_precise=0,
                          prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                          sparse_mode=0, query_rope=None, key_rope=None,
                          block_q=api.FORWARD_BLOCK[0], block_k=api.FORWARD_BLOCK[1]):
    """``FlashAttentionScore`` (``torch_npu.npu_fusion_attention``) forward, on flashlab's kernel.

    Parameters
    ----------
    query, key, value : numpy float16/32/64 in ``input_layout``: BSH [B,S,N*D], SBH [S,B,N*D],
        BSND, BNSD or TND [T,N,D]. Key and value share every axis but the last;
        ``D_q = D_k >= D_v``.
    head_num : the query's head count N (the key's is read from its shape; GQA allowed)
    atten_mask : bool/uint8, 1 = masked out; shape per ``sparse_mode`` (see
        :data:`flashlab.masks.SPARSE_MODES`)
    scale : multiplies ``Q K^T``; default 1.0 as the operator (pass ``1/sqrt(D)``)
    pre_tokens, next_tokens : band offsets (mode 0 from the top-left; 4, 7, 8 from the bottom-right)
    prefix : modes 5/6, one int per batch (TND: per sequence)
    actual_seq_qlen, actual_seq_kvlen : TND only, cumulative sequence ends
    sparse_mode : 0..8
    query_rope, key_rope : optional RoPE operands (MLA): query_rope in the query's layout with
        head_num heads and head dim Dr, key_rope in the key's layout with Nr heads,
        ``head_num % Nr == 0`` (MLA: Nr = 1); their product is added to ``Q K^T`` before
        ``scale`` (pass ``scale = 1/sqrt(D + Dr)``)
    pse, padding_mask, keep_prob < 1 : raise ``NotImplementedError``; inner_precise 0/1/2 is
        accepted and changes nothing here (it selects device precision paths)
    block_q, block_k : flashlab's tile sizes (not operator arguments)

    Returns
    -------
    attention_out : query's layout with V's D, query's dtype
    softmax_max, softmax_sum : float32 [B, N, Sq, 8] (TND: [T, N, 8]); LSE = max + log(sum).
        A row with no allowed key: out 0, max -inf, sum 0.
    """
    st = _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
                keep_prob, pre_tokens, next_tokens, inner_precise, prefix, actual_seq_qlen,
                actual_seq_kvlen, sparse_mode)
    qr, kr = _rope_operands(query_rope, key_rope, st)
    d = st.dims
    rows = (d.Sq, d.N1) if st.varlen else (d.B, d.N1, d.Sq)
    out = np.zeros(rows + (d.Dv,), dtype=query.dtype)
    lse = np.full(rows, -np.inf, dtype=np.float32)
    row_max = np.full(rows, -np.inf, dtype=np.float32)
    for c in st.calls:
        p = prepare(_take(st.q, c.q_rows, st.varlen), _take(st.k, c.kv_rows, st.varlen),
                    _take(st.v, c.kv_rows, st.varlen), scale=scale, window=_window(c), mask=c.mask,
                    q_rope=None if qr is None else _take(qr, c.q_rows, st.varlen),
                    k_rope=None if kr is None else _take(kr, c.kv_rows, st.varlen),
                    block_q=block_q, block_k=block_k)
        o, l, m, _ = api.forward_with_stats(p)
        _put(out, c.q_rows, st.varlen, o)
        _put(lse, c.q_rows, st.varlen, l)
        _put(row_max, c.q_rows, st.varlen, m)
    empty = np.isneginf(lse)
    # softmax_sum = sum_j exp(s_ij - max_i) = exp(LSE - max); 0 for a row with no allowed key
    with np.errstate(invalid="ignore"):
        softmax_sum = np.where(empty, 0.0, np.exp(lse - np.where(empty, 0.0, row_max)))
    return _to_layout(out, st), _repeat8(row_max), _repeat8(softmax_sum)


def _grad_operand(name: str, x, st: _Setup, dtype, dim: int) -> np.ndarray:
    """dy / attention_in in the query's layout -> canonical (B, N1, Sq, Dv) or (T, N1, Dv)."""
    d = st.dims
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray in the query's layout; got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have the query's dtype {dtype}; got {x.dtype}")
    expected = (d.Sq, d.N1, dim) if st.varlen else layout_shape(st.layout, d.B, d.N1, d.Sq, dim)
    if x.shape != expected:
        raise ValueError(f"{name} must have the attention_out shape {expected} "
                         f"(layout {st.layout}); got {x.shape}")
    return x if st.varlen else to_bnsd(x, st.layout, d.N1)


def _softmax_operand(name: str, x, st: _Setup) -> np.ndarray:
    d = st.dims
    expected = (d.Sq, d.N1, SOFTMAX_REPEAT) if st.varlen else (d.B, d.N1, d.Sq, SOFTMAX_REPEAT)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy float32 array of shape {expected}; got {type(x).__name__}")
    if x.shape != expected:
        raise ValueError(f"{name} must have shape {expected} (the forward's); got {x.shape}")
    return x[..., 0].astype(np.float64)


def flash_attention_score_grad(query, key, value, dy, head_num, input_layout, *, softmax_max,
                               softmax_sum, attention_in, pse=None, padding_mask=None,
                               atten_mask=None, scale=1.0, keep_prob=1.0, pre_tokens=INT32_MAX,
                               next_tokens=INT32_MAX, inner_precise=0, prefix=None,
                               actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                               query_rope=None, key_rope=None, block_q=api.BACKWARD_BLOCK[0],
                               block_k=api.BACKWARD_BLOCK[1]):
    """``FlashAttentionScoreGrad``: ``(dq, dk, dv)`` in the input layout, from the forward's outputs.

    The backward recomputes P from the saved statistics (CANN docs, *FlashAttentionScoreGrad*):

    $$
    P = e^{S - \\text{max}} / \\text{sum},\\quad dV = P^\\top dY,\\quad dP = dY\\,V^\\top,\\quad
    dS = P \\circ (dP - \\operatorname{rowsum}(dY \\circ O)),\\quad
    dQ = \\text{scale}\\, dS\\, K,\\quad dK = \\text{scale}\\, dS^\\top Q
    $$

    with ``LSE = softmax_max + log(softmax_sum)`` handed to
    :func:`flashlab.api.flash_attention_backward`. Arguments as :func:`flash_attention_score`
    (they must be the forward's), plus ``dy`` and ``attention_in`` (the forward's
    ``attention_out``) in the query's layout and ``softmax_max``/``softmax_sum`` as returned
    by the forward. dk, dv are summed over the query heads sharing a kv head (GQA).

    With ``query_rope``/``key_rope`` (as given to the forward) it returns
    ``(dq, dk, dv, dq_rope, dk_rope)``: ``dq_rope = scale dS K_rope`` and
    ``dk_rope = scale dS^T Q_rope``, summed over the heads sharing a key_rope head, in the
    layouts of query_rope and key_rope.
    """
    st = _setup(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
                keep_prob, pre_tokens, next_tokens, inner_precise, prefix, actual_seq_qlen,
                actual_seq_kvlen, sparse_mode)
    qr, kr = _rope_operands(query_rope, key_rope, st)
    d = st.dims
    do = _grad_operand("dy", dy, st, query.dtype, d.Dv)
    o = _grad_operand("attention_in", attention_in, st, query.dtype, d.Dv)
    m = _softmax_operand("softmax_max", softmax_max, st)
    s = _softmax_operand("softmax_sum", softmax_sum, st)
    # LSE = max + log(sum); a row with sum 0 (no allowed key) has LSE = -inf
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(s > 0, m + np.log(np.where(s > 0, s, 1.0)), -np.inf)
    dq = np.zeros(st.q.shape, dtype=query.dtype)
    dk = np.zeros(st.k.shape, dtype=query.dtype)
    dv = np.zeros(st.v.shape, dtype=query.dtype)
    rope = qr is not None
    dq_rope = np.zeros(qr.shape, dtype=query.dtype) if rope else None
    dk_rope = np.zeros(kr.shape, dtype=query.dtype) if rope else None
    for c in st.calls:
        grads = api.flash_attention_backward(
            _take(do, c.q_rows, st.varlen), _take(st.q, c.q_rows, st.varlen),
            _take(st.k, c.kv_rows, st.varlen), _take(st.v, c.kv_rows, st.varlen),
            _take(o, c.q_rows, st.varlen), np.ascontiguousarray(_take_lse(lse, c.q_rows, st.varlen)),
            scale=scale, window=_window(c), mask=c.mask,
            q_rope=_take(qr, c.q_rows, st.varlen) if rope else None,
            k_rope=_take(kr, c.kv_rows, st.varlen) if rope else None,
            block_q=block_q, block_k=block_k)
        _put(dq, c.q_rows, st.varlen, grads[0])
        _put(dk, c.kv_rows, st.varlen, grads[1])
        _put(dv, c.kv_rows, st.varlen, grads[2])
        if rope:
            _put(dq_rope, c.q_rows, st.varlen, grads[3])
            _put(dk_rope, c.kv_rows, st.varlen, grads[4])
    grads = (dq, dk, dv) + ((dq_rope, dk_rope) if rope else ())
    if st.varlen:
        return grads
    return tuple(from_bnsd(g, st.layout) for g in grads)
