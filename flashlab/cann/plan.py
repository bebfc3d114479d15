"""The mask arguments turned into kernel calls: :func:`plan`, and the mask it applies.

:func:`plan` reads ``sparse_mode``, ``atten_mask``, ``pre_tokens``/``next_tokens`` and
``prefix``, checks every documented rule and returns the :class:`Call` list the operator,
its grad and :func:`sparse_mode_mask` all run through: what is drawn is what is computed.
:class:`Setup` is everything the operator read from its arguments.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flashlab.cann.attributes import INT32_MAX, clamp_tokens, int64, int64_list
from flashlab.cann.layouts import Dims
from flashlab.cann.sparse_modes import (
    SPARSE_MODES,
    compressed_mask,
    prefix_mask,
    sparse_mode_band,
    varlen_sequence_mode,
)
from flashlab.cann.varlen import sequences
from flashlab.masks import NO_LIMIT, allowed

__all__ = ["Call", "Setup", "plan", "sparse_mode_mask"]


@dataclass
class Call:
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

    @property
    def window(self) -> tuple[int | None, int | None]:
        """The band as flash_attention's ``window`` (``None`` for an unbounded side)."""
        return (None if self.left >= NO_LIMIT else self.left,
                None if self.right >= NO_LIMIT else self.right)

    @property
    def tnd_seq(self) -> int:
        """``seq`` of a call planned for a TND batch (the planner sets it on every such call)."""
        if self.seq is None:
            raise ValueError("this call has no TND sequence index (seq is None): it was not "
                             "planned for input_layout TND")
        return self.seq


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
    values = int64_list("prefix", prefix)
    if len(values) != n:
        raise ValueError(f"prefix must have one value per {where} ({n}); got {len(values)}")
    for b, (p, (sq, sk)) in enumerate(zip(values, lengths)):
        # the device checks every sequence, one with Sq = 0 too (TND: range [Skv, Skv]):
        # ops-transformer attention/flash_attention_score/op_host/arch32/
        # flash_attention_score_tiling_general.cpp@bfbbec8 lines 4179-4196
        # (VarLenGetPrefixNList: "if (actualSeqLenData[i] > actualSeqLenKvData[i])" [0, Skv],
        # else [Skv - Sq, Skv], OP_LOGE and return false); B, N, S, D: lines 1422-1430
        # (GetPrefixNList, nMin = max(S2 - S1, 0), one Sq for every batch)
        lo = 0 if sq > sk else sk - sq
        if not lo <= p <= sk:
            raise ValueError(f"prefix[{b}]={p} out of range: with Sq={sq}, Sk={sk} it must lie in "
                             f"[{lo}, {sk}] ([0, Sk] when Sq > Sk, else [Sk - Sq, Sk])")
    return values


def _prefix_fallback(prefix, batch: int, sq: int, sk: int) -> str | None:
    """Why the device's GetPrefixNList would give up on ``prefix`` (B, N, S, D layouts), or None.

    ops-transformer attention/flash_attention_score/op_host/arch32/
    flash_attention_score_tiling_general.cpp@bfbbec8 lines 1391-1438: a missing prefix, one of
    another length than B, or a value outside [max(Sk - Sq, 0), Sk] is an ``OP_LOGW`` and
    ``return SparseEnum::ALL``; lines 784-790 make that an error for sparse_mode 6 only, so
    sparse_mode 5 then runs on its full atten_mask alone.
    """
    if prefix is None:
        return "prefixN is null pointer while sparse mode is prefix"
    values = int64_list("prefix", prefix)
    if len(values) != batch:
        return (f"prefixN is invalid, it should be the same size as bSize[{batch}], but it is "
                f"{len(values)}")
    lo = max(sk - sq, 0)
    for b, p in enumerate(values):
        if not lo <= p <= sk:
            return f"batch[{b}] prefixN={p} is invalid, should be in range of [{lo}, {sk}]"
    return None




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
         next_tokens=INT32_MAX, prefix=None, seqs=None) -> list[Call]:
    """Turn the operator's mask arguments into kernel calls, checking every one of them.

    ``seqs`` is None for the B, N, S, D layouts and the TND sequences ``(q0, q1, k0, k1)``
    otherwise. Returns the ``Call`` list that :func:`~flashlab.cann.operator.flash_attention_score`, its grad
    and :func:`sparse_mode_mask` all run through, so what is drawn is what is computed.
    Without ``atten_mask`` every mode is full attention (the operator ignores ``sparse_mode``,
    ``pre_tokens``, ``next_tokens`` then).
    """
    mode = int64("sparse_mode", sparse_mode)
    if not 0 <= mode <= 8:
        raise ValueError(f"sparse_mode must be in 0..8; got {mode}")
    pre = int64("pre_tokens", pre_tokens)
    nxt = int64("next_tokens", next_tokens)
    varlen = seqs is not None
    _check_mode_for_layout(mode, varlen, prefix)
    # (sq, sk) of every batch / sequence
    if varlen:
        lengths = [(q1 - q0, k1 - k0) for q0, q1, k0, k1 in seqs]
    else:
        lengths = [(dims.Sq, dims.Sk)] * dims.B
    max_q = max(sq for sq, _ in lengths)
    max_k = max(sk for _, sk in lengths)
    if atten_mask is None:
        return _full_attention_calls(dims, seqs)
    _check_prefix_batch(mode, len(lengths))
    _check_band_tokens(mode, pre, nxt, lengths)
    # sparse_mode 5 (B, N, S, D) with a prefix the device's GetPrefixNList gives up on: it warns and
    # computes every block with the full atten_mask as given (sparse type ALL; pre/next reset to
    # INT32_MAX, lines 645-655 of the tiling source cited in _prefix_fallback)
    fallback = _prefix_fallback(prefix, dims.B, dims.Sq, dims.Sk) if mode == 5 and not varlen else None
    full, prefixes = _checked_mask(atten_mask, dims, mode, varlen, lengths, (max_q, max_k),
                                   prefix if fallback is None else None)
    if fallback is not None:
        warnings.warn(f"sparse_mode=5: {fallback}; the device warns and falls back to the full "
                      f"atten_mask without the prefix rule (GetPrefixNList)", stacklevel=3)
        return [Call(slice(0, dims.B), slice(0, dims.B), NO_LIMIT, NO_LIMIT, full)]
    _check_split_modes(mode, varlen, lengths, pre, nxt)
    if varlen:
        _check_tnd_ranges(mode, lengths, pre, nxt, (max_q, max_k))

    pre, nxt = clamp_tokens(pre), clamp_tokens(nxt)
    if not varlen and mode <= 4:
        # one rule for every batch: a single call over all of them
        left, right = sparse_mode_band(mode, dims.Sq, dims.Sk, pre, nxt)
        calls = [Call(slice(0, dims.B), slice(0, dims.B), left, right, full)]
    else:
        first, last = _split_ends(lengths)
        calls = _sequence_calls(mode, lengths, first, last, seqs, pre, nxt, full, prefixes)
    if mode == 0:
        _check_consistent(calls)
    return calls


#: the most batches (TND: sequences) of the prefix modes 5 and 6
MAX_PREFIX_BATCH = 32


def _check_prefix_batch(mode: int, batch: int) -> None:
    """Modes 5 and 6 (with an atten_mask: without one every mode is full attention) take at
    most 32 batches (*torch_npu.npu_fusion_attention*, 约束说明: "prefix稀疏计算场景B不大于32";
    the same sentence in MindSpeed's *fusion attention 对外接口*). TND counts the entries of
    actual_seq_qlen, trailing unused batches included."""
    if mode in (5, 6) and batch > MAX_PREFIX_BATCH:
        raise ValueError(f"sparse_mode={mode} (prefix) supports at most B={MAX_PREFIX_BATCH} batches "
                         f"(\"prefix稀疏计算场景B不大于32\"); got B={batch}")


def _check_mode_for_layout(mode: int, varlen: bool, prefix) -> None:
    """The modes a layout allows (5 not with TND, 7 and 8 only with it); ``prefix`` an int list."""
    name = SPARSE_MODES[mode].name
    if varlen and mode == 5:
        raise ValueError("sparse_mode=5 (prefix, full mask) is not supported with input_layout TND; "
                         "use sparse_mode=6 (prefix, compressed mask)")
    if not varlen and mode in (7, 8):
        raise ValueError(f"sparse_mode={mode} ({name}) is only for input_layout TND")
    if prefix is not None and mode not in (5, 6):
        int64_list("prefix", prefix)   # read by modes 5 and 6 only; still an int list


def _full_attention_calls(dims: Dims, seqs) -> list[Call]:
    """Without ``atten_mask``: one call over every batch, or one per non-empty TND sequence."""
    if seqs is None:
        return [Call(slice(0, dims.B), slice(0, dims.B), NO_LIMIT, NO_LIMIT, None)]
    return [Call(slice(q0, q1), slice(k0, k1), NO_LIMIT, NO_LIMIT, None, s)
            for s, (q0, q1, k0, k1) in enumerate(seqs) if q1 > q0 and k1 > k0]


def _check_band_tokens(mode: int, pre: int, nxt: int, lengths: list[tuple[int, int]]) -> None:
    """The band modes' pre/next tokens overlap; mode 0's lie in range."""
    if mode in (0, 4, 7, 8) and pre + nxt < 0:
        raise ValueError(f"pre_tokens and next_tokens must overlap (pre_tokens + next_tokens >= 0, "
                         f"\"band场景，preTokens和nextTokens之间必须要有交集\"); got {pre} and {nxt}")
    if mode == 0:
        _check_mode0_range(pre, nxt, lengths)


def _checked_mask(atten_mask, dims: Dims, mode: int, varlen: bool, lengths: list[tuple[int, int]],
                  longest: tuple[int, int], prefix) -> tuple[np.ndarray | None, list[int] | None]:
    """``atten_mask`` checked against the mode: ``(full, prefixes)``, the full mask of modes 0, 1
    and 5 (else None) and the prefix of each batch or sequence of modes 5 and 6 (else None);
    ``longest`` is the largest ``(sq, sk)``."""
    max_q, max_k = longest
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
    prefixes = None
    if mode == 6 or (mode == 5 and prefix is not None):   # mode 5 without a usable prefix fell back
        where = "sequence (len(actual_seq_qlen))" if varlen else "batch (B)"
        prefixes = _prefix_list(prefix, len(lengths), lengths, where)
        if mode == 5:
            for b, p in enumerate(prefixes):
                rule = prefix_mask(dims.Sq, dims.Sk, p)
                if not (mask[b] == rule).all():
                    raise ValueError(f"sparse_mode=5: atten_mask[{b}] must be the prefix mask of "
                                     f"prefix[{b}]={p} (rightDownCausal plus the first {p} keys)")
    return full, prefixes


def _split_ends(lengths: list[tuple[int, int]]) -> tuple[int, int]:
    """The band sequences of the varlen split modes: mode 8 the first, mode 7 the last sequence
    whose *query* length is not 0; 0 and the last sequence when no sequence has queries.

    The device's tiling picks firstValidIndex / lastValidIndex (ops-transformer
    attention/flash_attention_score/op_host/arch32/flash_attention_score_tiling_general.cpp@bfbbec8,
    lines 1242-1255: "if (actualSeqLenData[i] != 0)", their initial values 0 and the last index;
    line 1277 mode 7 set_bandIndex(lastValidIndex), line 1281 mode 8 set_bandIndex(firstValidIndex)).
    A sequence with queries but no keys is still the band sequence (it computes nothing).
    """
    with_q = [s for s, (sq, _) in enumerate(lengths) if sq > 0]
    return (with_q[0] if with_q else 0), (with_q[-1] if with_q else len(lengths) - 1)


def _check_split_modes(mode: int, varlen: bool, lengths: list[tuple[int, int]], pre: int,
                       nxt: int) -> None:
    """TND's mode 3 needs Sq <= Skv in every sequence; modes 7 and 8 bound pre/next tokens by the
    Skv of their band sequence (:func:`_split_ends`), as FlashAttentionVarLenScoreTiling's
    CheckPretokenAndNexttoken does (the tiling source of :func:`_split_ends`, lines 4061-4097)."""
    if varlen and mode == 3:
        for s, (sq, sk) in enumerate(lengths):
            if sq > sk:
                raise ValueError(f"sparse_mode=3 with input_layout TND needs Sq <= Skv in every "
                                 f"sequence (FlashAttentionVarLenScore: \"配置为3时，不支持无效行计算，"
                                 f"需要满足每个batch的Sq<=Skv\"); sequence {s} has Sq={sq}, Skv={sk}")
    first, last = _split_ends(lengths)
    if varlen and mode == 7:
        last_sk = lengths[last][1]
        # lines 4061-4068
        if pre < last_sk or nxt > 0:
            raise ValueError(f"sparse_mode=7 needs pre_tokens >= the last sequence's Skv={last_sk} and "
                             f"next_tokens <= 0 (\"pre_tockens >= last_Skv\", \"next_tockens <= 0\"); "
                             f"got {pre}, {nxt}")
        for s, (sq, sk) in enumerate(lengths):
            if sq == 0 or sk == 0:
                continue                # lines 4070-4072
            if sq > sk:
                # lines 4074-4078: "s1[%ld] is larger than s2[%ld]"
                raise ValueError(f"sparse_mode=7 needs Sq <= Skv in every sequence with queries and "
                                 f"keys (device tiling: \"Batch[{s}] s1[{sq}] is larger than "
                                 f"s2[{sk}]\"); sequence {s} has Sq={sq}, Skv={sk}")
            if s == last and sq - nxt > sk:
                # lines 4079-4083: "has invalid row"
                raise ValueError(f"sparse_mode=7: the last sequence needs Sq - next_tokens <= Skv "
                                 f"(device tiling: \"Batch[{s}], s1[{sq}], s2[{sk}], next_tokens"
                                 f"[{nxt}], has invalid row\")")
    if varlen and mode == 8:
        first_sq, first_sk = lengths[first]
        # lines 4087-4091 (checked before pre_tokens, over the band sequence only)
        if first_sq - nxt > first_sk:
            raise ValueError(f"sparse_mode=8: the first sequence with queries needs Sq - next_tokens "
                             f"<= Skv (device tiling: \"Batch[{first}], s1[{first_sq}], "
                             f"s2[{first_sk}], next_tokens[{nxt}], has invalid row\")")
        # lines 4092-4097
        if pre < first_sk:
            raise ValueError(f"sparse_mode=8 needs pre_tokens >= the first sequence's Skv={first_sk} "
                             f"(\"pre_tockens >= first_Skv\", the first sequence with queries); "
                             f"got {pre}")


def _check_tnd_ranges(mode: int, lengths: list[tuple[int, int]], pre: int, nxt: int,
                      longest: tuple[int, int]) -> None:
    """TND's band (mode 4) and given-mask (mode 0) ranges of the device tiling (the source of
    :func:`_split_ends`); ``longest`` is the largest ``(sq, sk)``."""
    max_q, max_k = longest
    if mode == 4:
        # lines 4035-4052 (BAND in the varlen tiling)
        if pre < 0:
            raise ValueError(f"sparse_mode=4 with input_layout TND needs pre_tokens >= 0 (device "
                             f"tiling: \"pre_tokens[{pre}] config error, has invalid data block\")")
        for s, (sq, sk) in enumerate(lengths):
            if sq and sk and sq - nxt > sk:
                raise ValueError(f"sparse_mode=4 with input_layout TND needs Sq - next_tokens <= Skv "
                                 f"in every sequence with queries and keys (device tiling: "
                                 f"\"Batch[{s}], s1[{sq}], s2[{sk}], next_tokens[{nxt}], has invalid "
                                 f"row\")")
    if mode == 0 and not (pre >= max_q and (nxt == 0 or nxt >= max_k)):
        # GetSparseInfo lines 4224-4250 (4235: NO_MASK) and SparseNoMaskModeCheck lines
        # 4103-4146: with the mask given and neither causal (pre >= maxSq, next = 0) nor full
        if nxt < 0:
            raise ValueError(f"sparse_mode=0 with input_layout TND needs next_tokens >= 0 (device "
                             f"tiling: \"nextTokens[{nxt}] config error, there is no valid data "
                             f"block\")")
        for s, (sq, sk) in enumerate(lengths):
            if sq and sk and sk + pre < sq:
                raise ValueError(f"sparse_mode=0 with input_layout TND needs Skv + pre_tokens >= Sq "
                                 f"in every sequence with queries and keys (device tiling: "
                                 f"\"Batch[{s}] s1[{sq}] s2[{sk}] has invalid row\")")
        if pre < 0 and nxt < -pre:
            raise ValueError(f"sparse_mode=0 with input_layout TND and pre_tokens < 0 needs "
                             f"next_tokens >= |pre_tokens| (device tiling, lines 4131-4143); got "
                             f"{pre}, {nxt}")


def _check_consistent(calls: list[Call]) -> None:
    """Mode 0: atten_mask must mask every entry outside the pre/next band.

    The operator skips blocks by pre/next and masks inside the blocks it computes by
    atten_mask alone, so an entry outside the band that the mask keeps would be computed or
    not depending on the block it falls in ("sparse_mode配置为0、4时，需保证atten_mask与
    pre_tockens、next_tockens的范围一致").
    """
    for c in calls:
        if c.mask is None:   # (mode 0 with an atten_mask: every call carries it)
            continue
        sq, sk = c.mask.shape[2:]
        outside = ~allowed(sq, sk, c.left, c.right)
        kept = outside & ~c.mask
        if kept.any():
            b, h, i, j = np.argwhere(kept)[0]
            raise ValueError(f"sparse_mode=0: atten_mask must mask every entry outside pre_tokens="
                             f"{c.left}/next_tokens={c.right} (the operator skips blocks by them and "
                             f"masks inside blocks by atten_mask only); it keeps (i={i}, j={j})")


def _sequence_calls(mode, lengths, first, last, seqs, pre, nxt, full, prefixes) -> list[Call]:
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
        elif m in (5, 6) and p is not None and p - 1 > sk - sq:
            # the prefix columns stick out of the causal band: mask the rest densely
            dense = prefix_mask(sq, sk, p)[None, None]
        if varlen:
            q0, q1, k0, k1 = seqs[s]
            calls.append(Call(slice(q0, q1), slice(k0, k1), left, right, dense, s))
        else:
            calls.append(Call(slice(s, s + 1), slice(s, s + 1), left, right, dense))
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
        seqs = sequences(actual_seq_qlen, actual_seq_kvlen, dims)
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



@dataclass
class Setup:
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
    seqs: Any         # TND: the (q0, q1, k0, k1) of every sequence; None for the B, N, S, D layouts
    dropout_p: float
    seed: int
    offset: int
    softmax_layout: str
    pse: Any = None   # the checked pse (flashlab.cann.pse.Pse, which imports this module), set after planning
    #: q, k, v, q_rope, k_rope of the whole call as the kernels read them, set after planning
    #: ((B, N1, S, D), or in TND the (1, N1, T, D) view of the tokens the sequences cover; the
    #: rope pair None when not given)
    operands: tuple = ()
    #: each planned call as a ``flashlab.validation.Part`` of ``operands``, set after planning
    parts: list = field(default_factory=list)
