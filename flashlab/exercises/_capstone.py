r"""The capstone checker: the whole FlashAttention forward and backward tile loop, in NumPy.

:func:`check_flash_tile_loop` checks the reader's
``fn(q, k, v, do, block_q, block_k, causal) -> (o, lse, dq, dk, dv)`` for one head
(q (Sq, d), k (Sk, d), v (Sk, dv), do (Sq, dv), scale $1/\sqrt d$, causal top-left: key
$j \le i$) against the float64 reference (:func:`flashlab.attention_reference` for O and the
LSE, the dense chain rule on its $P$ for the gradients), on lengths that are not multiples of
the tiles, with and without the causal mask.

The classic mistakes of a tile loop are planted in :func:`tile_loop`, a plain NumPy tile loop
with one switch per mistake; the checker compares the reader's answer with each:

- ``"no_rescale"``: $\ell$ and $\tilde O$ not rescaled by $e^{m - m'}$ when the row max grows;
- ``"delta_from_p"``: $D_i$ taken from the current tile, $\operatorname{rowsum}(P_{ij} \circ dP_{ij})$,
  instead of $\operatorname{rowsum}(dO_i \circ O_i)$ over the whole row;
- ``"causal_skip_off_by_one"``: a tile skipped when its first key equals its last query
  (``j0 >= i1 - 1``), which drops the diagonal entry that tile holds;
- ``"lse_not_stored"``: the backward recomputes $P = e^{S - m}$ from the row max alone (the
  running sum $\ell$ was not folded into the stored LSE $= m + \log \ell$).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlab.exercises._core import Feedback, Mistake, call_quietly, judge
from flashlab.reference import attention_reference

__all__ = ["check_flash_tile_loop", "tile_loop", "TILE_LOOP_MISTAKES"]

#: (Sq, Sk, d, dv, block_q, block_k, causal): lengths that no tile divides, Sq < Sk, Sq > Sk,
#: tiles where the causal diagonal enters a key tile at its first column (j0 = i1 - 1)
_CASES = ((7, 11, 5, 3, 3, 4, False), (10, 10, 5, 3, 4, 3, True), (9, 6, 4, 4, 4, 3, True))

#: the switch of :func:`tile_loop` that plants each mistake
TILE_LOOP_MISTAKES = ("no_rescale", "delta_from_p", "causal_skip_off_by_one", "lse_not_stored")


def tile_loop(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, block_q: int, block_k: int,
              causal: bool, mistake: str | None = None) -> tuple[np.ndarray, ...]:
    """A NumPy FlashAttention forward + backward tile loop, one head, with an optional ``mistake``.

    q (Sq, d), k (Sk, d), v (Sk, dv), do (Sq, dv) -> ``(o, lse, dq, dk, dv)``, float64.
    ``mistake=None`` is a correct loop (the exercise's solution); otherwise one of
    ``TILE_LOOP_MISTAKES``.
    """
    if mistake not in (None, *TILE_LOOP_MISTAKES):
        raise ValueError(f"mistake must be None or one of {TILE_LOOP_MISTAKES}; got {mistake!r}")
    sq, d = q.shape
    sk, dv = v.shape
    scale = 1.0 / math.sqrt(d)
    o, lse, m_rows = np.zeros((sq, dv)), np.full(sq, -np.inf), np.full(sq, -np.inf)

    def skip(i0: int, i1: int, j0: int) -> bool:
        # a causal tile is empty when its first key is past its last query: j0 > i1 - 1
        last = i1 - 2 if mistake == "causal_skip_off_by_one" else i1 - 1
        return causal and j0 > last

    def scores(i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        s = scale * q[i0:i1] @ k[j0:j1].T                     # S = scale Q_i K_j^T
        if causal:
            rows, cols = np.arange(i0, i1)[:, None], np.arange(j0, j1)[None, :]
            s = np.where(cols <= rows, s, -np.inf)           # key j allowed iff j <= i
        return s

    for i0 in range(0, sq, block_q):                         # forward: q-block outer loop
        i1 = min(i0 + block_q, sq)
        m, l, acc = np.full(i1 - i0, -np.inf), np.zeros(i1 - i0), np.zeros((i1 - i0, dv))
        for j0 in range(0, sk, block_k):
            j1 = min(j0 + block_k, sk)
            if skip(i0, i1, j0):
                continue
            s = scores(i0, i1, j0, j1)
            m_new = np.maximum(m, s.max(axis=1))             # m' = max(m, rowmax S)
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - safe[:, None])                    # P~ = e^(S - m')
            alpha = 1.0 if mistake == "no_rescale" else np.exp(m - safe)   # e^(m - m')
            l = alpha * l + p.sum(axis=1)                    # l' = e^(m-m') l + rowsum P~
            acc = (alpha * acc.T).T + p @ v[j0:j1]           # O~' = e^(m-m') O~ + P~ V_j
            m = m_new
        with np.errstate(divide="ignore", invalid="ignore"):
            o[i0:i1] = np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1.0)[:, None], 0.0)
            lse[i0:i1] = m + np.log(l)                       # LSE = m + log l
        m_rows[i0:i1] = m
    stored = m_rows if mistake == "lse_not_stored" else lse
    delta = (do * o).sum(axis=1)                             # D = rowsum(dO o O)
    dq, dk, dv_ = np.zeros_like(q, dtype=np.float64), np.zeros((sk, d)), np.zeros((sk, dv))
    for j0 in range(0, sk, block_k):                         # backward: kv-block outer loop
        j1 = min(j0 + block_k, sk)
        for i0 in range(0, sq, block_q):
            i1 = min(i0 + block_q, sq)
            if skip(i0, i1, j0):
                continue
            s = scores(i0, i1, j0, j1)
            with np.errstate(invalid="ignore"):
                p = np.where(np.isneginf(s), 0.0, np.exp(s - stored[i0:i1, None]))   # P = e^(S - LSE)
            dv_[j0:j1] += p.T @ do[i0:i1]                    # dV_j += P^T dO_i
            dp = do[i0:i1] @ v[j0:j1].T                      # dP = dO_i V_j^T
            d_i = (p * dp).sum(axis=1) if mistake == "delta_from_p" else delta[i0:i1]
            ds = p * (dp - d_i[:, None])                     # dS = P o (dP - D)
            dq[i0:i1] += scale * ds @ k[j0:j1]               # dQ_i += scale dS K_j
            dk[j0:j1] += scale * ds.T @ q[i0:i1]             # dK_j += scale dS^T Q_i
    return o, lse, dq, dk, dv_


def _truth(q, k, v, do, causal) -> tuple[np.ndarray, ...]:
    """(o, lse, dq, dk, dv) from the float64 reference: its P and the dense chain rule."""
    o, lse, p = attention_reference(q[None, None], k[None, None], v[None, None], causal=causal,
                                    return_probs=True)
    o, lse, p = o[0, 0], lse[0, 0], p[0, 0]
    scale = 1.0 / math.sqrt(q.shape[1])
    dp = do @ v.T                                            # dP = dO V^T
    ds = p * (dp - (do * o).sum(axis=1, keepdims=True))      # dS = P o (dP - rowsum(dO o O))
    return o, lse, scale * ds @ k, scale * ds.T @ q, p.T @ do


_HINTS = {
    "no_rescale": "O and the LSE are wrong in the rows whose max grows after the first key tile: when "
                  "m' = max(m, rowmax S) exceeds m, the running l and O~ were computed against the old "
                  "max and must be rescaled, alpha = exp(m - m'), l' = alpha l + rowsum(P~), "
                  "O~' = alpha O~ + P~ V_j. (The gradients inherit the error through O and the LSE.)",
    "delta_from_p": "O, the LSE and dV are right, dQ and dK are not: D_i was summed over the current key "
                    "tile only, rowsum(P_ij * dP_ij). D_i = sum over ALL keys of P_ij dP_ij, which is "
                    "rowsum(dO_i * O_i): compute it once per row from dO and O before the tile loop.",
    "causal_skip_off_by_one": "your causal tile skip is off by one: a tile with rows [i0, i1) and keys "
                              "[j0, j1) is empty only when j0 > i1 - 1 (its first key is past its last "
                              "query). You also skip the tile whose first key j0 = i1 - 1, which holds "
                              "the diagonal entry (i1 - 1, j0) that row attends.",
    "lse_not_stored": "O is right, but the gradients are not: your backward recomputes P = exp(S - m) from "
                      "the row max alone, which is not normalised. Store LSE = m + log(l) in the forward "
                      "and recompute P = exp(S - LSE) (and return that LSE).",
}


def check_flash_tile_loop(fn: Callable[..., Any]) -> Feedback:
    r"""Check ``fn(q, k, v, do, block_q, block_k, causal) -> (o, lse, dq, dk, dv)``: the tile loop.

    One head, float64 inputs, scale $1/\sqrt d$, causal top-left (key $j \le i$). The three
    cases: Sq = 7, Sk = 11 (tiles 3 x 4, no mask); Sq = Sk = 10 (tiles 4 x 3, causal); Sq = 9,
    Sk = 6 (tiles 4 x 3, causal, rows past the last key). Judged to float32 precision, whatever
    the dtype returned. Mistakes it names: ``TILE_LOOP_MISTAKES``.
    """
    ex = "flash tile loop"
    rng = np.random.default_rng(23)
    parts, inputs = [], []
    for sq, sk, d, dv, bq, bk, causal in _CASES:
        q, k = rng.standard_normal((sq, d)), rng.standard_normal((sk, d))
        # a growing ramp on the keys makes later tiles raise the row max (the rescale shows)
        q[:, 0] += 2.0
        k[:, 0] += np.linspace(0.0, 3.0, sk)
        v, do = rng.standard_normal((sk, dv)), rng.standard_normal((sq, dv))
        inputs.append((q, k, v, do, bq, bk, causal))
    for case, (q, k, v, do, bq, bk, causal) in zip(_CASES, inputs):
        got, fail = call_quietly(ex, fn, q.copy(), k.copy(), v.copy(), do.copy(), bq, bk, causal)
        where = f"Sq={case[0]}, Sk={case[1]}, block_q={bq}, block_k={bk}, causal={causal}"
        if fail is not None:
            return Feedback(ex, False, f"for {where}, {fail.message}", fail.mistake)
        if not isinstance(got, (tuple, list)) or len(got) != 5:
            return Feedback(ex, False, "your function should return the tuple (o, lse, dq, dk, dv); "
                            f"for {where} it returned a {type(got).__name__}.", "not_a_tuple")
        truth = _truth(q, k, v, do, causal)
        parts += [(f"{name} ({where})", g, t) for name, g, t in zip(("o", "lse", "dq", "dk", "dv"), got, truth)]
    mistakes = []
    for name in TILE_LOOP_MISTAKES:
        with np.errstate(all="ignore"):
            answer = [a for x in inputs for a in tile_loop(*x, mistake=name)]
        mistakes.append(Mistake(name, answer, _HINTS[name]))
    return judge(ex, parts, mistakes,
                 success="O, the LSE, dQ, dK and dV match the float64 reference in all three cases "
                         "(ragged tiles, causal with Sq = Sk and Sq > Sk).")
