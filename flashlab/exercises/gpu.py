"""Checkers for the exercises of the chapter "FlashAttention on a GPU" (book/gpu.ipynb).

- :func:`check_forward_read_bytes`: the reader predicts the global-memory bytes the fused
  forward reads for a tiling; the checker compares the prediction with the bytes the
  instrumented kernel *counts* when it runs (in Numba's CUDA simulator without a GPU).
- :func:`check_shared_memory_bytes`: the operand tiles one forward block stages in shared memory.

Self-contained: it uses only the public helpers of ``flashlab.exercises._core``.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from flashlab.exercises._core import Feedback, call_student

__all__ = ["check_forward_read_bytes", "check_shared_memory_bytes", "READ_CASES"]

#: the tilings (seq_q, seq_k, d_qk, d_v, block_q, block_k, causal) the read-bytes checker runs;
#: lengths that are not multiples of the blocks, Sq != Sk, Dqk != Dv and causal both ways, so
#: that each slip changes some answer
READ_CASES = ((12, 12, 4, 4, 4, 4, False), (13, 9, 4, 2, 4, 4, True), (10, 17, 8, 4, 4, 8, True))


@lru_cache(maxsize=None)
def counted_read_bytes(seq_q: int, seq_k: int, d_qk: int, d_v: int, block_q: int, block_k: int,
                       causal: bool) -> int:
    """Bytes the fused forward's instrumented build reads for one head (float32), by running it."""
    from flashlab.gpu import flash_attention_gpu
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, seq_q, d_qk)).astype(np.float32)
    k = rng.standard_normal((1, 1, seq_k, d_qk)).astype(np.float32)
    v = rng.standard_normal((1, 1, seq_k, d_v)).astype(np.float32)
    *_, traffic = flash_attention_gpu(q, k, v, causal=causal, block_q=block_q, block_k=block_k,
                                      count_traffic=True)
    return traffic.read


def _slips(sq, sk, dqk, dv, bq, bk, causal) -> dict[str, int]:
    """What each known slip predicts for one case (bytes, float32)."""
    n_qb = -(-sq // bq)
    rows_end = [min(sq, (i + 1) * bq) for i in range(n_qb)]
    whole = [min(sk, bk * -(-min(sk, i1) // bk)) if causal else sk for i1 in rows_end]
    exact = [min(sk, i1) if causal else sk for i1 in rows_end]
    kv = dqk + dv
    return {
        "kv_read_once": 4 * (sq * dqk + sk * kv),
        "no_causal_skip": 4 * (sq * dqk + n_qb * sk * kv),
        "allowed_keys_only": 4 * (sq * dqk + sum(exact) * kv),
        "q_not_counted": 4 * sum(whole) * kv,
        "elements_not_bytes": sq * dqk + sum(whole) * kv,
        "writes_included": 4 * (sq * dqk + sum(whole) * kv + sq * dv + sq),
    }


_HINTS = {
    "kv_read_once": "you read K and V once in all; each thread block (query block) loads every "
                    "K_j, V_j tile it visits itself, so K and V are read once per query block.",
    "no_causal_skip": "with causal=True a query block never loads the key blocks entirely above "
                      "the diagonal (tile skipping): only blocks up to the one holding key i1 - 1.",
    "allowed_keys_only": "a visited key block is loaded whole (all its block_k keys, cut at Sk), "
                         "even where the causal mask removes part of it.",
    "q_not_counted": "Q_i is read too: once per query block, so Sq x Dqk elements in all.",
    "elements_not_bytes": "you counted elements: the twin is float32, 4 bytes each.",
    "writes_included": "you added the writes (O and the LSE): the counter's bytes read "
                       "count loads only.",
}


def check_forward_read_bytes(fn: Callable[..., int]) -> Feedback:
    """Check ``fn(seq_q, seq_k, d_qk, d_v, block_q, block_k, causal) -> int`` against the counter.

    The answer for each case of :data:`READ_CASES` is the bytes ``read`` that
    :func:`flashlab.gpu.flash_attention_gpu` counts with ``count_traffic=True`` (one batch,
    one head, float32). Named slips: K and V read once, no causal skip, only the allowed keys
    counted, Q forgotten, elements instead of bytes, writes added.
    """
    ex = "forward read bytes"
    for case in READ_CASES:
        got, fail = call_student(ex, fn, *case)
        if fail is not None:
            return fail
        truth = counted_read_bytes(*case)
        if got == truth:
            continue
        try:
            got_int = int(got)
        except (TypeError, ValueError):
            return Feedback(ex, False, f"fn{case} returned {got!r}; expected an int of bytes")
        for name, value in _slips(*case).items():
            if value == got_int and value != truth:
                return Feedback(ex, False, f"for (Sq, Sk, Dqk, Dv, Br, Bc, causal) = {case} the "
                                f"counter read {truth} bytes, you predicted {got_int}: {_HINTS[name]}",
                                name)
        return Feedback(ex, False, f"for (Sq, Sk, Dqk, Dv, Br, Bc, causal) = {case} the counter "
                        f"read {truth} bytes, you predicted {got_int}")
    return Feedback(ex, True, "your predictions equal the bytes the instrumented kernel counted "
                    f"on all {len(READ_CASES)} tilings.")


_SHARED_CASES = ((64, 64, 64, 64), (32, 16, 192, 128), (16, 64, 8, 24))


def check_shared_memory_bytes(fn: Callable[[int, int, int, int], int]) -> Feedback:
    """Check ``fn(block_q, block_k, d_qk, d_v) -> int``: bytes of one forward block's operand tiles.

    The forward stages three float32 operand tiles in shared memory: Q_i (block_q x Dqk),
    K_j (block_k x Dqk) and V_j (block_k x Dv). The scores S and the accumulator O~ live in the
    lanes' register micro-tiles. (The kernel's full declaration,
    :func:`flashlab.gpu.forward.forward_shared_bytes`, adds the rows' padding, the P~ tile the
    lanes exchange and the row reductions.)
    """
    ex = "shared memory per block"
    got = []
    for case in _SHARED_CASES:
        g, fail = call_student(ex, fn, *case)
        if fail is not None:
            return fail
        got.append(g)
    truth = [4 * (bq * dqk + bk * dqk + bk * dv) for bq, bk, dqk, dv in _SHARED_CASES]
    if got == truth:
        return Feedback(ex, True, "Q_i, K_j and V_j in float32: 4 (Br Dqk + Bc Dqk + Bc Dv) "
                        f"bytes, right on all {len(_SHARED_CASES)} tilings.")
    # a slip is named only when it gives every case's answer (the cases tell them apart)
    slips = (
        ("score_tile_shared", lambda bq, bk, dqk, dv: 4 * (bq * dqk + bk * dqk + bk * dv + bq * bk),
         "the score tile is not an operand tile: S lives in the lanes' register micro-tiles (the "
         "P~ tile the kernel adds for the exchange between lanes is not asked for)."),
        ("accumulator_shared", lambda bq, bk, dqk, dv: 4 * (bq * dqk + bk * dqk + bk * dv + bq * dv),
         "the output accumulator O~ lives in the lanes' register micro-tiles, not in shared memory."),
        ("elements_not_bytes", lambda bq, bk, dqk, dv: bq * dqk + bk * dqk + bk * dv,
         "you counted elements: float32 tiles are 4 bytes per element."),
        ("v_with_dqk", lambda bq, bk, dqk, dv: 4 * (bq * dqk + 2 * bk * dqk),
         "V_j has Dv columns, not Dqk."),
        ("v_forgotten", lambda bq, bk, dqk, dv: 4 * (bq * dqk + bk * dqk),
         "you forgot V_j (block_k x Dv)."),
    )
    i = next(n for n, (g, t) in enumerate(zip(got, truth)) if g != t)
    msg = f"for (Br, Bc, Dqk, Dv) = {_SHARED_CASES[i]} the operand tiles take {truth[i]} bytes, you said {got[i]!r}"
    for name, slip, hint in slips:
        if got == [slip(*c) for c in _SHARED_CASES]:
            return Feedback(ex, False, f"{msg}: {hint}", name)
    return Feedback(ex, False, msg)
