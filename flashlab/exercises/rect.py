r"""Checkers for the coding exercises of the RECT-FA chapters (MLA, RoPE split, pipeline,
RECT-FA end to end, performance).

Each checker builds small seeded inputs, calls the reader's function through
:func:`~flashlab.exercises.call_student`, computes the right answer with ``flashlab``'s
own code (the kernel's ``score_tile``, :func:`flashlab.rope.apply_rope`, the pipeline
simulator, :mod:`flashlab.flops`, :mod:`flashlab.ledgers`), computes what each *known mistake*
gives on the same inputs, and returns a :class:`~flashlab.exercises._core.Feedback` whose message names the mistake.

The inputs are chosen so that every mistake gives a different answer from the right one and
from the other mistakes (the tests check each one): RoPE positions that do not start at 0, a
pipeline case where the copy is the slower stage and one where the computation is, head dims
that are not equal, causal problems with $S_q \ne S_k$.

The checkers, the reader's function each one expects, and the chapter that uses it:

- :func:`check_mla_scores` — ``fn(q_nope, k_nope, q_rope, k_rope) -> S`` (MLA);
- :func:`check_rope` — ``fn(x, positions) -> x_rotated``, rotate-half (RoPE split);
- :func:`check_pipeline_time` — ``fn(n_tiles, t_load, t_compute, buffers) -> time`` (pipeline);
- :func:`check_concat_bytes` — ``fn(batch, heads, seq, d_nope, d_rope, elem) -> bytes`` (RECT-FA);
- :func:`check_attention_flops` — ``fn(b, h, sq, sk, d_qk, d_v, causal) -> FLOPs`` (performance).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlab import flops, ledgers
from flashlab.dataflows import REMOVES, Idea
from flashlab.exercises._core import Feedback, Mistake, call_cases, call_student, diagnose, diagnose_cases
from flashlab.kernels.tile import score_tile
from flashlab.pipeline.simulate import simulate, two_stage_graph
from flashlab.rope import apply_rope, rope_frequencies

__all__ = ["check_mla_scores", "check_rope", "check_pipeline_time", "check_concat_bytes",
           "check_attention_flops"]


# -------------------------------------------------------------------------------- MLA scores
def _mla_scores(q_nope: np.ndarray, k_nope: np.ndarray, q_rope: np.ndarray, k_rope: np.ndarray, *,
                scale_nope: float, scale_rope: float, rope: bool = True) -> np.ndarray:
    """Scores (B, H, Sq, Sk) float32 from the kernel's own ``score_tile``, one head at a time.

    ``scale_nope`` multiplies the NoPE queries, ``scale_rope`` the RoPE queries (the kernel
    scales both by the same ``scale``; the mistakes scale them differently); ``rope=False``
    leaves the RoPE product out.
    """
    B, H, Sq, _ = q_nope.shape
    Sk = k_nope.shape[2]
    out = np.empty((B, H, Sq, Sk), dtype=np.float32)
    s = np.empty((Sq, Sk), dtype=np.float32)
    for b in range(B):
        for h in range(H):
            # S = (scale Q^C) K^C^T, then S += (scale Q^R) K^R^T into the same tile; K^R: the one shared head
            score_tile(q_nope[b, h] * np.float32(scale_nope), k_nope[b, h],
                       q_rope[b, h] * np.float32(scale_rope), k_rope[b, 0], rope, s)
            out[b, h] = s
    return out


def check_mla_scores(fn: Callable[..., Any]) -> Feedback:
    r"""Check ``fn(q_nope, k_nope, q_rope, k_rope) -> S``, the attention scores of MLA.

    The reader's function receives (float32, DeepSeek-V3's head dims $D_n = 128$, $D_r = 64$):

    - ``q_nope`` (B, H, Sq, Dn), ``k_nope`` (B, H, Sk, Dn): the NoPE parts, one per head;
    - ``q_rope`` (B, H, Sq, Dr): the RoPE part of every query head;
    - ``k_rope`` (B, 1, Sk, Dr): **one** RoPE key head, shared by all H heads;

    and must return ``S`` (B, H, Sq, Sk) with

    $$S_h = \frac{1}{\sqrt{D_n + D_r}}\big(Q^C_h {K^C_h}^\top + Q^R_h {K^R}^\top\big).$$

    Known mistakes: the RoPE product left out; the scale $1/\sqrt{D_n}$ (128) instead of
    $1/\sqrt{D_n + D_r}$ (192); the scale without its square root; the scale applied to the
    NoPE product only; no scale; ``k_rope`` indexed per query head (an ``IndexError``: it has
    one head).
    """
    ex = "MLA scores"
    rng = np.random.default_rng(7)
    B, H, Sq, Sk, Dn, Dr = 1, 3, 5, 7, 128, 64
    q_nope, k_nope, q_rope, k_rope = (rng.standard_normal(s).astype(np.float32) for s in
                                      ((B, H, Sq, Dn), (B, H, Sk, Dn), (B, H, Sq, Dr), (B, 1, Sk, Dr)))
    got, fb = call_student(ex, fn, q_nope.copy(), k_nope.copy(), q_rope.copy(), k_rope.copy())
    if fb is not None:
        if fb.message.startswith("your function raised IndexError"):
            return Feedback(ex, False, fb.message + ". `k_rope` has shape (B, 1, Sk, Dr): ONE RoPE key head "
                            "that every query head reads. Use `k_rope[:, 0]` (or let broadcasting "
                            "match its 1 head with the H heads of `q_rope`), not `k_rope[:, h]`.",
                            "k_rope_per_head")
        return fb
    args = (q_nope, k_nope, q_rope, k_rope)
    scale = 1.0 / math.sqrt(Dn + Dr)
    # S = scale (Q^C K^C^T + Q^R K^R^T), scale = 1 / sqrt(Dn + Dr)
    expected = _mla_scores(*args, scale_nope=scale, scale_rope=scale)
    mistakes = [
        Mistake("rope_forgotten", _mla_scores(*args, scale_nope=scale, scale_rope=scale, rope=False),
                "your scores are scale * q_nope k_nope^T alone: the RoPE product is missing. Each "
                "head's score is the sum of two products, S = scale (q_nope k_nope^T + q_rope "
                "k_rope^T): the position information lives only in the second one."),
        Mistake("scale_nope_dim", _mla_scores(*args, scale_nope=1 / math.sqrt(Dn), scale_rope=1 / math.sqrt(Dn)),
                f"your scale is 1/sqrt({Dn}), the NoPE dim. The query and key of a head have "
                f"Dn + Dr = {Dn + Dr} dims (the concatenation [q_nope, q_rope]), so the scale is "
                f"1/sqrt({Dn + Dr})."),
        Mistake("scale_without_sqrt", _mla_scores(*args, scale_nope=1 / (Dn + Dr), scale_rope=1 / (Dn + Dr)),
                f"your scale is 1/{Dn + Dr}: the square root is missing, scale = 1/sqrt({Dn + Dr})."),
        Mistake("scale_on_nope_only", _mla_scores(*args, scale_nope=scale, scale_rope=1.0),
                "only the NoPE product is scaled: the scale multiplies the whole sum, "
                "S = scale (q_nope k_nope^T + q_rope k_rope^T)."),
        Mistake("no_scale", _mla_scores(*args, scale_nope=1.0, scale_rope=1.0),
                f"your scores are not scaled: multiply the sum of the two products by "
                f"1/sqrt(Dn + Dr) = 1/sqrt({Dn + Dr})."),
    ]
    return diagnose(ex, got, expected, what="S", mistakes=mistakes, rtol=1e-4, atol=1e-5,
                    success="matches flashlab's score_tile: both products accumulated into one "
                            f"score tile, the shared k_rope head read by all {H} heads, scale "
                            f"1/sqrt({Dn + Dr}).")


# ------------------------------------------------------------------------------------- RoPE
def _rope_cos_sin_swapped(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The rotate-half rotation with cos and sin exchanged (a mistake's answer)."""
    half = x.shape[-1] // 2
    angle = pos[:, None] * rope_frequencies(x.shape[-1])
    a, b = x[:, :half], x[:, half:]
    return np.concatenate([a * np.sin(angle) - b * np.cos(angle),
                           a * np.cos(angle) + b * np.sin(angle)], axis=-1)


def check_rope(fn: Callable[..., Any]) -> Feedback:
    r"""Check ``fn(x, positions) -> x_rotated``, rotary position embedding in the rotate-half layout.

    The reader's function receives ``x`` (S, D) float64 (S = 6 tokens, D = 8 features) and
    ``positions`` (S,) int64, the token positions — here 5, 6, ..., 10, as in a decoding step
    that follows 5 cached tokens — and must return (S, D): feature pair
    $(x_i, x_{i + D/2})$ of token $m$ rotated by the angle $m\,\theta_i$,

    $$\theta_i = 10000^{-2i/D},\qquad a' = a\cos m\theta_i - b \sin m\theta_i,\qquad
    b' = a \sin m\theta_i + b \cos m\theta_i,$$

    as :func:`flashlab.rope.apply_rope` with its defaults computes.

    Known mistakes: the interleaved layout (pairs $(x_{2i}, x_{2i+1})$); the rotation's sign
    flipped; cos and sin swapped; the given positions ignored (``arange(S)``) or off by one;
    frequencies $10000^{-i/D}$ (the factor 2 of the exponent missing). Every answer is judged
    to float32 precision, whatever its dtype (one computed in float16 is ``"low_precision"``).
    """
    ex = "RoPE"
    rng = np.random.default_rng(11)
    S, D = 6, 8
    x = rng.standard_normal((S, D))
    pos = np.arange(5, 5 + S, dtype=np.int64)
    got, fb = call_student(ex, fn, x.copy(), pos.copy())
    if fb is not None:
        return fb
    expected = apply_rope(x, pos)
    mistakes = [
        Mistake("interleaved", apply_rope(x, pos, interleaved=True),
                "you rotated the neighbour pairs (x_0, x_1), (x_2, x_3), ...: that is the *interleaved* "
                "layout (GPT-J, RoFormer). Rotate-half pairs x_i with x_{i + D/2}: "
                "a = x[..., :D//2], b = x[..., D//2:]."),
        Mistake("rotation_sign", apply_rope(x, -pos),
                "you rotated by -m theta_i instead of +m theta_i: check the signs, a' = a cos - b sin, "
                "b' = a sin + b cos (in the rotate-half form, x cos + rotate_half(x) sin with "
                "rotate_half(x) = [-b, a])."),
        Mistake("positions_ignored", apply_rope(x),
                "you rotated token s by s theta_i (positions 0, 1, ..., S-1): use the `positions` "
                f"argument, here {pos.tolist()} (the tokens of a decoding step come after the cached ones)."),
        Mistake("positions_off_by_one", apply_rope(x, pos + 1),
                "your angles are (m + 1) theta_i: the positions are off by one (are you counting from 1?). "
                "Token m turns by exactly m theta_i."),
        Mistake("positions_off_by_one", apply_rope(x, pos - 1),
                "your angles are (m - 1) theta_i: the positions are off by one. Token m turns by exactly "
                "m theta_i."),
        Mistake("cos_sin_swapped", _rope_cos_sin_swapped(x, pos),
                "cos and sin are swapped: a' = a cos - b sin, b' = a sin + b cos (at angle 0 the "
                "rotation must leave x unchanged, so cos multiplies x itself)."),
        # base^{-i/D} = (base^{1/2})^{-2i/D}: the missing 2 is the same as base 100 in the right formula
        Mistake("frequency_exponent", apply_rope(x, pos, base=100.0),
                "your frequencies are 10000^(-i/D): the exponent is -2i/D (pair i holds features i and "
                "i + D/2, so i runs over D/2 pairs: theta = 10000 ** (-np.arange(0, D, 2) / D))."),
    ]
    return diagnose(ex, got, expected, what="the rotated x", mistakes=mistakes,
                    success="matches flashlab.rope.apply_rope (rotate-half, base 10000) at positions "
                            f"{pos[0]}..{pos[-1]}.")


# --------------------------------------------------------------------------------- pipeline
def check_pipeline_time(fn: Callable[..., Any]) -> Feedback:
    r"""Check ``fn(n_tiles, t_load, t_compute, buffers) -> total time``, a two-stage pipeline.

    ``n_tiles`` tiles each pass a copy stage (``t_load`` $= a$, into a buffer) and a compute
    stage (``t_compute`` $= b$, which frees the buffer), with ``buffers`` (1 or 2) buffers.
    The function must return the time from the first copy's start to the last computation's
    end, as the simulator :func:`flashlab.pipeline.simulate.simulate` gives it for
    :func:`~flashlab.pipeline.simulate.two_stage_graph`: $n(a + b)$ with one buffer,
    $a + b + (n - 1)\max(a, b)$ with two.

    Known mistakes: the stages summed instead of overlapped with two buffers; the fill and drain
    left out ($n \max(a, b)$); $a + n\max(a, b)$ (right only when the computation is the
    slower stage); $n$ steps after the first tile instead of $n - 1$; ``min`` for ``max``;
    overlap with one buffer.
    """
    ex = "pipeline time"
    cases = [(6, 3.0, 5.0, 1), (6, 3.0, 5.0, 2), (6, 5.0, 3.0, 2), (1, 2.0, 7.0, 2),
             (9, 0.5, 2.5, 2), (4, 4.0, 1.0, 1)]

    def describe(c):
        return f"n_tiles={c[0]}, t_load={c[1]:g}, t_compute={c[2]:g}, buffers={c[3]}"

    got, fb = call_cases(ex, fn, cases, describe, "the total time")
    if fb is not None:
        return fb
    assert got is not None      # no feedback: every case returned a number
    # the truth: the discrete-event simulator on the two-stage task graph
    expected = np.array([simulate(two_stage_graph(a, b, n, k)).makespan for n, a, b, k in cases])

    def formula(two: Callable[[int, float, float], float], one=lambda n, a, b: n * (a + b)) -> np.ndarray:
        return np.array([two(n, a, b) if k == 2 else one(n, a, b) for n, a, b, k in cases])

    overlap = lambda n, a, b: a + b + (n - 1) * max(a, b)   # noqa: E731
    mistakes = [
        Mistake("sum_instead_of_max", formula(lambda n, a, b: n * (a + b)),
                "with two buffers your time is n (a + b): nothing overlaps. While tile j is computed, "
                "the copy of tile j+1 fills the other buffer, so after the first tile each one costs "
                "only the slower stage, max(a, b), not a + b."),
        Mistake("fill_drain_forgotten", formula(lambda n, a, b: n * max(a, b)),
                "with two buffers your time is n max(a, b): the pipeline's fill and drain are missing. "
                "The first copy runs before any computation and the last computation after the last "
                "copy: the first tile pays both stages, a + b, and each further tile max(a, b)."),
        Mistake("drain_when_copy_slower", formula(lambda n, a, b: a + n * max(a, b)),
                "your two-buffer time is a + n max(a, b). That is right when the computation is the "
                "slower stage (b >= a), but when copies are slower (a > b) the computations wait for "
                "the copies and the last computation (b) comes after the n-th copy: "
                "a + b + (n - 1) max(a, b) covers both cases."),
        Mistake("one_step_too_many", formula(lambda n, a, b: a + b + n * max(a, b)),
                "your two-buffer time counts one step too many: the first tile pays a + b, and only the "
                "n - 1 tiles after it cost max(a, b) each."),
        Mistake("min_instead_of_max", formula(lambda n, a, b: a + b + (n - 1) * min(a, b)),
                "you used min(a, b): in steady state each tile costs the *slower* stage, max(a, b); the "
                "faster stage waits for it."),
        Mistake("one_buffer_overlaps", formula(overlap, one=overlap),
                "your one-buffer time overlaps the stages too. With one buffer the copy of tile j+1 "
                "must wait until the computation of tile j has freed the buffer, so nothing overlaps: "
                "n (a + b)."),
    ]
    return diagnose_cases(ex, got, expected, cases, describe, what="the total time", mistakes=mistakes,
                           success="matches the simulator in all "
                                   f"{len(cases)} cases: n (a + b) with one buffer, "
                                   "a + b + (n - 1) max(a, b) with two.")


# ---------------------------------------------------------------------------- RECT-FA bytes
def check_concat_bytes(fn: Callable[..., Any]) -> Feedback:
    r"""Check ``fn(batch, heads, seq, d_nope, d_rope, elem) -> bytes``: the HBM traffic (bytes
    read + bytes written) of the three operators that split RoPE removes from the forward.

    In the concat dataflow (query and key length ``seq``, ``elem`` bytes per element, $B$,
    $H$, $S$, $D_n$, $D_r$, $D = D_n + D_r$):

    - **expand k_rope**: read the shared $K^R$ (B, 1, S, Dr), write a copy per head (B, H, S, Dr);
    - **concat Q**: read $Q^C$ and $Q^R$, write $Q$ (B, H, S, D);
    - **concat K**: read $K^C$ and the expanded $K^R$, write $K$ (B, H, S, D).

    The answer is :func:`flashlab.ledgers.mla_forward_steps` summed over those steps
    (:data:`flashlab.dataflows.REMOVES`). Known mistakes: ``k_rope`` not expanded (no expand step,
    concat K reads the single head); the expand step left out; writes not counted; reads not
    counted; elements instead of bytes.
    """
    ex = "concat bytes"
    cases = [(1, 128, 4096, 128, 64, 2), (2, 8, 100, 16, 8, 4), (1, 3, 7, 5, 3, 2), (3, 1, 33, 12, 20, 2)]

    def describe(c):
        return "batch={}, heads={}, seq={}, d_nope={}, d_rope={}, elem={}".format(*c)

    got, fb = call_cases(ex, fn, cases, describe, "the bytes read plus the bytes written")
    if fb is not None:
        return fb
    assert got is not None      # no feedback: every case returned a number
    removed = REMOVES[Idea.SPLIT_ROPE]

    def truth(b, h, s, dn, dr, e):
        # the native_v forward's steps (V is not involved: d_v = d_nope), those split RoPE removes
        steps = ledgers.mla_forward_steps(b, h, s, dn, dr, dn, dataflow="native_v", elem=e)
        return sum(st.bytes_read + st.bytes_written for st in steps if st.name in removed)

    expected = np.array([truth(*c) for c in cases], dtype=np.float64)

    def per_case(rule) -> np.ndarray:
        # rule(nq, nr, dn, dr, e): nq = B H S rows of Q (and of K), nr = B S rows of the shared k_rope
        return np.array([rule(b * h * s, b * s, dn, dr, e) for b, h, s, dn, dr, e in cases], dtype=np.float64)

    mistakes = [
        Mistake("k_rope_not_expanded",
                per_case(lambda nq, nr, dn, dr, e: e * (2 * nq * (dn + dr) + nq * dn + nr * dr + nq * (dn + dr))),
                "you counted concat K as reading the single shared k_rope head, with no expand step. "
                "An operator that takes one K per head needs k_rope copied to every head first: the "
                "expand reads (B, 1, S, Dr) and writes (B, H, S, Dr), and concat K then reads that "
                "per-head copy."),
        Mistake("expand_not_counted", per_case(lambda nq, nr, dn, dr, e: e * 4 * nq * (dn + dr)),
                "your concat steps are right, but the expand step is missing: it reads the shared "
                "k_rope (B, 1, S, Dr) and writes a copy per head (B, H, S, Dr)."),
        Mistake("writes_not_counted", per_case(lambda nq, nr, dn, dr, e: e * (nr * dr + 2 * nq * (dn + dr))),
                "you counted only the bytes read. Each operator also writes its output to HBM (the "
                "expanded k_rope, Q and K of D = Dn + Dr columns), and those writes are half the "
                "traffic."),
        Mistake("reads_not_counted", per_case(lambda nq, nr, dn, dr, e: e * (nq * dr + 2 * nq * (dn + dr))),
                "you counted only the bytes written. Each operator first reads its inputs from HBM "
                "(k_rope; q_nope and q_rope; k_nope and the expanded k_rope)."),
        Mistake("elements_not_bytes", expected / np.array([c[-1] for c in cases]),
                "your count is in elements: multiply by `elem` (bytes per element: 2 for bf16) to get "
                "bytes."),
    ]
    return diagnose_cases(ex, got, expected, cases, describe, what="the byte count", mistakes=mistakes,
                           success="matches flashlab.ledgers.mla_forward_steps (expand k_rope + concat Q + "
                                   f"concat K) in all {len(cases)} cases.")


# ---------------------------------------------------------------------------- attention FLOPs
def check_attention_flops(fn: Callable[..., Any]) -> Feedback:
    r"""Check ``fn(b, h, sq, sk, d_qk, d_v, causal) -> FLOPs`` of the attention forward.

    Count the two matrix products only (the convention of the FlashAttention papers and of
    :func:`flashlab.flops.attention_flops`): 2 FLOPs per multiply-add, $2 P d_{qk}$ for
    $QK^\top$ and $2 P d_v$ for $PV$, where $P$ is the number of attended (query, key)
    pairs of all $b h$ heads. Without a mask $P = b\,h\,S_q S_k$; with ``causal`` (top-left
    aligned: query $i$ sees keys $j \le i$) row $i$ attends $\min(i + 1, S_k)$ keys
    (:func:`flashlab.ledgers.attended_pairs`).

    Known mistakes: the factor 2 forgotten; $d_v$ taken equal to $d_{qk}$ ($4 P d$);
    ``causal`` ignored; $S_q S_k / 2$ for causal (the diagonal missed); keys $j < i$ only
    (the mask off by one); $S_q(S_q + 1)/2$ when $S_q > S_k$ (rows past the last key).
    """
    ex = "attention FLOPs"
    cases = [(1, 8, 1024, 1024, 128, 128, False), (2, 4, 64, 64, 192, 128, True),
             (1, 1, 10, 6, 16, 8, True), (1, 2, 5, 12, 32, 16, True), (3, 1, 7, 9, 8, 24, False)]

    def describe(c):
        return "b={}, h={}, sq={}, sk={}, d_qk={}, d_v={}, causal={}".format(*c)

    got, fb = call_cases(ex, fn, cases, describe, "the forward's FLOPs")
    if fb is not None:
        return fb
    assert got is not None      # no feedback: every case returned a number

    def count(b, h, sq, sk, d_qk, d_v, causal, pairs=None):
        # 2 P (d_qk + d_v), P = b h * attended pairs of one head (or the pairs a mistake counts)
        p = ledgers.attended_pairs(sq, sk, causal) if pairs is None else pairs
        return flops.attention_flops(sq, sk, d_qk, d_v, batch=b, heads=h, tile_fraction=p / (sq * sk))

    expected = np.array([count(*c) for c in cases])
    n = [min(c[2], c[3]) for c in cases]
    mistakes = [
        Mistake("factor_2_forgotten", expected / 2,
                "your count is half the answer: a multiply-add is 2 FLOPs, so Q K^T costs 2 Sq Sk d_qk "
                "and P V 2 Sq Sk d_v per head."),
        Mistake("d_v_ignored", np.array([count(b, h, sq, sk, dq, dq, cz) for b, h, sq, sk, dq, dv, cz in cases]),
                "you counted P V with d_qk columns: the product P V has V's head dim d_v, which need not "
                "equal d_qk (MLA: 192 and 128). FLOPs = 2 P d_qk + 2 P d_v."),
        Mistake("causal_ignored", np.array([count(b, h, sq, sk, dq, dv, False) for b, h, sq, sk, dq, dv, _ in cases]),
                "with causal=True your count is that of the full Sq x Sk matrix: a causal query i attends "
                "only keys j <= i (about half of the pairs), and the kernel skips the tiles above the "
                "diagonal."),
        Mistake("causal_half_square",
                np.array([count(*c[:7], pairs=c[2] * c[3] / 2) if c[6] else count(*c) for c in cases]),
                "for causal you took Sq Sk / 2 pairs: that misses the diagonal (query i attends key i "
                "too). Row i attends i + 1 keys, so a square causal head has S (S + 1) / 2 pairs."),
        Mistake("causal_diagonal_excluded",
                np.array([count(*c[:7], pairs=ledgers.attended_pairs(c[2], c[3], True) - m) if c[6] else count(*c)
                          for c, m in zip(cases, n)]),
                "your causal mask is off by one: you counted keys j < i, but query i also attends key "
                "j = i (its own position). Row i attends i + 1 keys."),
        Mistake("causal_rows_past_keys",
                np.array([count(*c[:7], pairs=c[2] * (c[2] + 1) / 2) if c[6] else count(*c) for c in cases]),
                "for causal you took Sq (Sq + 1) / 2 pairs, which holds only while Sq <= Sk. Rows "
                "i >= Sk see all Sk keys, not i + 1: sum over rows of min(i + 1, Sk)."),
    ]
    return diagnose_cases(ex, got, expected, cases, describe, what="the FLOPs", mistakes=mistakes,
                           rtol=1e-9, atol=1e-6,
                           success=f"match flashlab.flops in all {len(cases)} cases: 2 P (d_qk + d_v) "
                                   "with P the attended (query, key) pairs.")
