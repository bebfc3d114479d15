r"""Checkers for the coding exercises of the Foundations chapters.

One or two per chapter. Each takes the reader's function, runs it on small seeded inputs
built so that every known mistake gives a *different* answer, and returns a ``Feedback``
that names the mistake. The function each one checks, and the truth it compares with:

- memory hierarchy: ``check_arithmetic_intensity``, ``fn(m, n, k, bytes_per_element) -> float``
  (the definition F / Q of the roofline);
- standard attention: ``check_softmax``, ``fn(s) -> p``, and ``check_attention``,
  ``fn(q, k, v) -> o`` (``flashlab.attention_reference``);
- tiling and online softmax: ``check_online_softmax``,
  ``fn(m, l, acc, s, v) -> (m_new, l_new, acc_new)`` (the forward kernel's
  ``online_softmax_update``);
- backward: ``check_backward_delta``, ``fn(do, o) -> d``, and ``check_softmax_grad``,
  ``fn(p, dp) -> ds`` (the backward kernel's ``row_dot`` and ``ds_from_dp``);
- masks: ``check_band_mask``, ``fn(sq, sk, left, right) -> mask``
  (``flashlab.masks.allowed``), and ``check_tile_class``,
  ``fn(i0, i1, j0, j1, left, right) -> int`` (``flashlab.masks.tile_class``).

The right answer always comes from ``flashlab`` itself (the one source of truth); the
mistakes are written out below as the small wrong formulas a reader is likely to write,
evaluated on the same inputs. ``tests/test_exercises_foundations.py`` plants each of them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flashlab.exercises._core import Feedback, Mistake, call_quietly, judge, with_hint
from flashlab.kernels import backward as _backward
from flashlab.kernels import tile as _tile
from flashlab.masks import EMPTY, FULL, NO_LIMIT, PARTIAL, TILE_CLASS_NAMES, allowed, classify_tiles
from flashlab.reference import attention_reference

__all__ = ["check_arithmetic_intensity", "check_softmax", "check_attention",
           "check_online_softmax", "check_backward_delta", "check_softmax_grad",
           "check_band_mask", "check_tile_class", "check_flash_attn_window"]

def _softmax_rows(s: np.ndarray) -> np.ndarray:
    """Row softmax of ``s`` (rows, cols) from :func:`flashlab.attention_reference`.

    With ``q = s``, ``k = I`` and ``scale = 1`` the reference's scores are ``s`` itself, so its
    probabilities are the row softmax, computed by the book's float64 truth.
    """
    cols = s.shape[1]
    eye = np.eye(cols)[None, None]
    _, _, p = attention_reference(s[None, None], eye, eye, scale=1.0, return_probs=True)
    return p[0, 0]


def _naive_softmax(s: np.ndarray, axis: int = -1, shift: Any = "row", normalise: bool = True) -> np.ndarray:
    """The softmax *variants* the mistakes produce (not the truth: see :func:`_softmax_rows`)."""
    with np.errstate(all="ignore"):
        if shift == "row":
            m = s.max(axis=axis, keepdims=True)
        elif shift == "global":
            m = s.max()
        else:
            m = 0.0
        e = np.exp(s - m)
        return e / e.sum(axis=axis, keepdims=True) if normalise else e


# ------------------------------------------------------------------------- memory hierarchy
#: (m, n, k, bytes_per_element): none of the intensities is an integer, so ``//`` shows
_GEMM_CASES = ((64, 96, 200, 2), (1000, 10, 37, 4), (1, 4096, 4096, 2), (300, 300, 64, 8))


def check_arithmetic_intensity(fn: Callable[[int, int, int, int], float]) -> Feedback:
    r"""Check ``fn(m, n, k, bytes_per_element) -> float``, the FLOP/byte of ``C = A @ B``.

    ``A`` is ``(m, k)``, ``B`` is ``(k, n)``, ``C`` is ``(m, n)``; the kernel reads ``A`` and
    ``B`` from main memory once and writes ``C`` once, each element ``bytes_per_element``
    bytes. The answer is $I = 2mnk \,/\, \big(e\,(mk + kn + mn)\big)$: one multiply and one add
    per term of each of the $mn$ dot products of length $k$.

    Mistakes it names: FLOPs without the factor 2, ``C``'s write not counted, ``C`` counted
    twice (read and written), elements instead of bytes, integer division, bytes per FLOP.
    """
    ex = "arithmetic intensity"
    parts: list = []
    answers: dict[str, list] = {name: [] for name in ("no_factor_2", "c_not_counted", "c_counted_twice",
                                                "elements_not_bytes", "integer_division", "inverted")}
    for m, n, k, e in _GEMM_CASES:
        got, fail = call_quietly(ex, fn, m, n, k, e)
        if fail is not None:
            return fail
        flops = 2 * m * n * k
        elems = m * k + k * n + m * n
        # I = F / Q = 2mnk / (e (mk + kn + mn))
        parts.append((f"the intensity for (m, n, k, bytes) = {(m, n, k, e)}", got, flops / (e * elems)))
        answers["no_factor_2"].append(m * n * k / (e * elems))
        answers["c_not_counted"].append(flops / (e * (m * k + k * n)))
        answers["c_counted_twice"].append(flops / (e * (elems + m * n)))
        answers["elements_not_bytes"].append(flops / elems)
        answers["integer_division"].append(flops // (e * elems))
        answers["inverted"].append(e * elems / flops)
    mistakes = [
        Mistake("no_factor_2", answers["no_factor_2"],
                "your intensities are half the answer: a multiply-add is 2 FLOPs, so C = A @ B "
                "does 2mnk FLOPs (each of the mn outputs is a dot product of length k)."),
        Mistake("c_not_counted", answers["c_not_counted"],
                "you counted the bytes of A and B but not of C: the result (m x n) is written to "
                "main memory too, so the bytes are e (mk + kn + mn)."),
        Mistake("c_counted_twice", answers["c_counted_twice"],
                "you counted C twice (read and written); C = A @ B only writes C, so the bytes "
                "are e (mk + kn + mn)."),
        Mistake("elements_not_bytes", answers["elements_not_bytes"],
                "your intensities are FLOPs per *element*: multiply the element count "
                "mk + kn + mn by bytes_per_element to get bytes."),
        Mistake("integer_division", answers["integer_division"],
                "your intensities are rounded down to whole numbers: use / (true division), "
                "not //."),
        Mistake("inverted", answers["inverted"],
                "you returned bytes per FLOP: the intensity is FLOPs per byte, F / Q, so that a "
                "large value means much arithmetic per byte moved."),
    ]
    return judge(ex, parts, mistakes,
                  success="matches 2mnk / (bytes_per_element (mk + kn + mn)) on all four shapes.")


# ----------------------------------------------------------------------- standard attention
def _softmax_input() -> np.ndarray:
    """(4, 6) scores: an ordinary row, a row near +1000, a row near -1000, a mixed row."""
    rng = np.random.default_rng(11)
    s = rng.standard_normal((4, 6)) * 2.0
    # e^{1000} overflows (float64 overflows above ~709): a softmax without the max gives NaN
    s[1] += 1000.0
    # e^{-1000 - 1000} underflows to 0: subtracting the *global* max gives 0 / 0
    s[2] -= 1000.0
    s[3, 2] += 8.0
    return s


def check_softmax(fn: Callable[[np.ndarray], np.ndarray]) -> Feedback:
    r"""Check ``fn(s) -> p``: the row-wise softmax of ``s`` (rows, cols), stable for any scores.

    $P_{ij} = e^{S_{ij} - m_i} / \sum_k e^{S_{ik} - m_i}$ with $m_i = \max_k S_{ik}$; ``p`` has
    ``s``'s shape and each row sums to 1. The input has rows near $+1000$ and $-1000$.

    Mistakes it names: no max subtracted (overflow), the global max subtracted (underflow),
    softmax over the wrong axis, no normalisation, normalised by the sum of the whole matrix.
    """
    ex = "softmax"
    s = _softmax_input()
    got, fail = call_quietly(ex, fn, s.copy())
    if fail is not None:
        return with_hint(fail, [(r"broadcast", "reduce with keepdims=True (s.max(axis=-1, "
                                                "keepdims=True) has shape (rows, 1)) so it broadcasts "
                                                "against s.")])
    mistakes = [
        Mistake("no_max_subtraction", [_naive_softmax(s, shift=None)],
                "your result has NaN in the row of scores near 1000: e^1000 overflows to inf "
                "(float64 overflows above ~709) and inf / inf is NaN. Subtract each row's maximum "
                "first: softmax(s) = e^(s - m) / sum e^(s - m) with m = rowmax(s); the result "
                "is unchanged and every exponent is <= 0."),
        Mistake("global_max", [_naive_softmax(s, shift="global")],
                "you subtracted the maximum of the whole matrix: rows whose scores lie far below "
                "it underflow to 0 / 0 = NaN. Subtract each row's own maximum, "
                "s.max(axis=-1, keepdims=True)."),
        Mistake("wrong_axis", [_naive_softmax(s, axis=0)],
                "your softmax normalises each column; attention normalises each row (one query "
                "over all keys): reduce over the last axis, axis=-1, with keepdims=True."),
        Mistake("not_normalised", [_naive_softmax(s, normalise=False)],
                "you computed e^(s - m) but did not divide by the row sum: each row of P must "
                "sum to 1."),
        Mistake("normalised_globally", [_naive_softmax(s, normalise=False)
                                        / _naive_softmax(s, normalise=False).sum()],
                "you divided by the sum of the whole matrix: each row is its own softmax, so "
                "divide by the row sums, e.sum(axis=-1, keepdims=True); each row of P sums to 1."),
    ]
    return judge(ex, [("p", got, _softmax_rows(s))], mistakes,
                  success="matches the reference softmax, also on the rows near +1000 and -1000.")


def _attention_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (5, 4), k (7, 4), v (7, 3); the last query is long enough that its scores overflow e^x."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal((5, 4))
    k = rng.standard_normal((7, 4))
    v = rng.standard_normal((7, 3))
    # the last query points along key 2, with its score q.k / sqrt(d) = 1000: e^S overflows
    q[4] = 1000.0 * np.sqrt(q.shape[1]) * k[2] / (k[2] @ k[2])
    return q, k, v


def check_attention(fn: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> Feedback:
    r"""Check ``fn(q, k, v) -> o``: standard attention of one head, $O = \mathrm{softmax}(QK^\top/\sqrt d)\,V$.

    q (Sq, d), k (Sk, d), v (Sk, dv) -> o (Sq, dv); the softmax is over each row (over the
    keys) and must be stable (one query's largest score is 1000). Here Sq = 5, Sk = 7,
    d = 4, dv = 3.

    Mistakes it names: no $1/\sqrt d$ scale, $1/d$ instead, softmax over the queries, no max
    subtracted, returning $P$ instead of $PV$, the scale applied after the softmax; for ``q @ k``
    (K not transposed) the error
    message gets a hint.
    """
    ex = "attention"
    q, k, v = _attention_inputs()
    got, fail = call_quietly(ex, fn, q.copy(), k.copy(), v.copy())
    if fail is not None:
        return with_hint(fail, [
            (r"matmul|not aligned", "the scores are Q K^T: q is (Sq, d) and k is (Sk, d), so "
                                    "write q @ k.T, an (Sq, Sk) matrix."),
            (r"broadcast", "reduce with keepdims=True so the row max and row sum have shape "
                           "(Sq, 1) and broadcast against the (Sq, Sk) scores.")])
    d = q.shape[1]
    o = attention_reference(q[None, None], k[None, None], v[None, None])[0][0, 0]
    s = q @ k.T
    mistakes = [
        Mistake("no_scale", [_naive_softmax(s) @ v],
                "you left out the scale: the scores are Q K^T / sqrt(d) (d = 4 here), which keeps "
                "their spread independent of the head dim."),
        Mistake("scale_by_d", [_naive_softmax(s / d) @ v],
                "you divided the scores by d; the scale is 1 / sqrt(d)."),
        Mistake("wrong_axis", [_naive_softmax(s / np.sqrt(d), axis=0) @ v],
                "your softmax normalises over the queries (axis 0); each query's row of scores "
                "must be normalised over the keys: axis=-1."),
        Mistake("no_max_subtraction", [_naive_softmax(s / np.sqrt(d), shift=None) @ v],
                "your output has NaN in the last row, whose scores are near 1000: e^S overflowed. "
                "Subtract each row's maximum before exp (the softmax does not change)."),
        Mistake("returned_p", [_naive_softmax(s / np.sqrt(d))],
                "you returned the probabilities P (Sq x Sk); the output is O = P V (Sq x dv)."),
        Mistake("scale_after_softmax", [_naive_softmax(s) @ v / np.sqrt(d)],
                "you applied 1 / sqrt(d) after the softmax (or to the output): the scale belongs "
                "inside, softmax(Q K^T / sqrt(d)); it changes how peaked each row of P is, not "
                "just the size of O."),
    ]
    return judge(ex, [("o", got, o)], mistakes,
                  success="matches the float64 reference, also on the row whose largest score is 1000.")


# --------------------------------------------------------------------- tiling: online softmax
def _online_inputs() -> dict[str, np.ndarray]:
    """State of 5 rows before one key block of 5 keys (dv = 3), chosen so every mistake shows.

    row 0: first block (m = -inf, l = 0, acc = 0); row 1: the block raises the max (1 -> ~4);
    row 2: the block's max (~1) stays below the old max 3; row 3: raises the max (0.5 -> 2.5)
    and one key is masked (-inf); row 4: every key masked so far, this block's too (m = -inf
    and s = -inf: the state must stay m = -inf, l = 0, acc = 0, as in the kernel).
    """
    rng = np.random.default_rng(13)
    s = rng.standard_normal((5, 5)) * 0.5
    s[1] += 4.0 - s[1].max()
    s[2] += 1.0 - s[2].max()
    s[3] += 2.5 - s[3].max()
    s[3, 1] = -np.inf
    s[4] = -np.inf
    return {
        "m": np.array([-np.inf, 1.0, 3.0, 0.5, -np.inf]),
        "l": np.array([0.0, 2.5, 1.8, 1.2, 0.0]),
        "acc": np.vstack([np.zeros(3), rng.standard_normal((3, 3)), np.zeros(3)]),
        "s": s,
        "v": rng.standard_normal((5, 3)),
    }


def _online_variant(m, l, acc, s, v, *, m_new=None, inverted=False, rescale_l=True,
                    rescale_acc=True, p_max=None, guard=True):
    """One online-softmax step with optional *mistakes* plugged in (the checker's wrong answers).

    ``guard``: keep a row with no allowed key yet (``m_new = -inf``) at ``l = 0, acc = 0``
    (False: compute it as written, which gives NaN there); ``p_max``: the max that P~ is
    taken against (default ``m_new``).
    """
    with np.errstate(all="ignore"):
        if m_new is None:
            m_new = np.maximum(m, s.max(axis=1))
        shift = m_new if p_max is None else p_max
        if guard:
            shift = np.where(np.isneginf(shift), 0.0, shift)
        p = np.exp(s - shift[:, None])
        m_ref = np.where(np.isneginf(m_new), 0.0, m_new) if guard else m_new
        alpha = np.exp(m_ref - m) if inverted else np.exp(m - m_ref)
        l_new = (alpha * l if rescale_l else l) + p.sum(axis=1)
        acc_new = (alpha[:, None] * acc if rescale_acc else acc) + p @ v
    return m_new, l_new, acc_new


#: the hint for a NaN in the fully masked row (row 4 of :func:`_online_inputs`)
_NAN_ROW_HINT = ("row 4 has no allowed key yet (m = -inf and every score of the block is -inf), "
                 "and your l_new and acc_new are NaN there: exp(m - m_new) = exp(-inf - (-inf)) "
                 "= exp(nan). Such a row must keep m = -inf, l = 0, acc = 0 (the kernel skips it); "
                 "e.g. subtract m_safe = np.where(m_new == -np.inf, 0, m_new) instead of m_new in "
                 "both exponentials. A causal or windowed row meets this case whenever its first "
                 "key block is masked whole.")


def check_online_softmax(fn: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]) -> Feedback:
    r"""Check ``fn(m, l, acc, s, v) -> (m_new, l_new, acc_new)``: one step of the online softmax.

    m, l (rows,) running max and sum; acc (rows, dv) the unnormalised output $\tilde O$;
    s (rows, cols) the scores of one key block (``-inf`` = masked key); v (cols, dv). The step
    (the forward kernel's ``online_softmax_update``, the truth here):

    $m' = \max(m, \operatorname{rowmax} S)$, $\tilde P = e^{S - m'}$,
    $\ell' = e^{m - m'}\ell + \operatorname{rowsum}\tilde P$,
    $\tilde O' = e^{m - m'}\tilde O + \tilde P V$.

    The rows cover the first block (``m = -inf``), a block that raises the max, a block that
    does not, a masked key, and a row whose keys are all masked so far (it must stay
    ``m = -inf, l = 0, acc = 0``, not NaN). Mistakes it names: ``l`` not rescaled, ``acc`` not
    rescaled, neither, ``m'`` = the block's max only, $e^{m' - m}$ instead of $e^{m - m'}$,
    $\tilde P$ against the old max, ``m`` not updated, ``acc`` divided by ``l``, NaN in the
    fully masked row (alone or with any of the others).
    """
    ex = "online softmax"
    x = _online_inputs()
    got, fail = call_quietly(ex, fn, *(x[name].copy() for name in ("m", "l", "acc", "s", "v")))
    if fail is not None:
        return with_hint(fail, [(r"broadcast", "m and l have shape (rows,); use m_new[:, None] "
                                                "to broadcast them against (rows, cols) or "
                                                "(rows, dv) arrays.")])
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        what = f"a {type(got).__name__}" + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "")
        return Feedback(ex, False, f"your function should return the tuple (m_new, l_new, acc_new); "
                        f"it returned {what}.", "not_a_tuple")
    # the truth: the kernel's own helper, on copies (it updates m, l, acc and s in place)
    m, l, acc = x["m"].copy(), x["l"].copy(), x["acc"].copy()
    _tile.online_softmax_update(x["s"].copy(), x["v"], m, l, acc)
    names = ("m_new", "l_new", "acc_new")
    parts = [(name, g, e) for name, g, e in zip(names, got, (m, l, acc))]
    args = (x["m"], x["l"], x["acc"], x["s"], x["v"])
    block_max = x["s"].max(axis=1)
    slips = [   # (name, the variant's keywords or a function of guard giving the answer, hint)
        ("l_not_rescaled", dict(rescale_l=False),
         "l_new is wrong in the rows where this block raises the max: l must be rescaled "
         "too, l_new = exp(m - m_new) * l + rowsum(P~). Its old terms were computed "
         "against the old max."),
        ("acc_not_rescaled", dict(rescale_acc=False),
         "acc_new is wrong in the rows where this block raises the max: rescale the old "
         "accumulator, acc_new = exp(m - m_new)[:, None] * acc + P~ @ v."),
        ("no_rescale", dict(rescale_l=False, rescale_acc=False),
         "neither l nor acc was rescaled when the max grew: multiply both by "
         "alpha = exp(m - m_new) before adding the new block's terms."),
        ("block_max_only", dict(m_new=block_max),
         "m_new is the max of this block only: it must be the running max, "
         "m_new = max(m, rowmax(s)), or a block whose scores are lower than an earlier "
         "block's rescales the state upwards (row 2 here)."),
        ("alpha_inverted", dict(inverted=True),
         "the rescale factor is inverted: use alpha = exp(m - m_new), which is <= 1 (the "
         "old terms shrink when the max grows), not exp(m_new - m)."),
        ("p_old_max", dict(p_max=x["m"]),
         "P~ is taken against the old max, exp(s - m): take it against the new one, "
         "P~ = exp(s - m_new[:, None]), so that its terms share the reference point of the "
         "rescaled l and acc (and e^(s - m) cannot overflow: s <= m_new)."),
        ("m_not_updated", lambda guard: (x["m"], *_online_variant(*args, guard=guard)[1:]),
         "l_new and acc_new are right, but m_new is still the old m: return the new "
         "running max max(m, rowmax(s))."),
        ("acc_divided_by_l", lambda guard: (lambda r: (r[0], r[1], r[2] / r[1][:, None]))(
            _online_variant(*args, guard=guard)),
         "acc_new is divided by l_new: keep the accumulator unnormalised (O~) and divide "
         "by l only once, after the last block."),
    ]

    def answer(how, guard):
        return how(guard) if callable(how) else _online_variant(*args, **how, guard=guard)

    # rows with no allowed key yet (m_new = -inf): a reader may guard them afterwards instead,
    # computing as written and then setting l = 0, acc = 0 there; each slip is named either way
    dead = np.isneginf(np.maximum(x["m"], block_max))

    def post_guarded(r):
        return r[0], np.where(dead, 0.0, r[1]), np.where(dead[:, None], 0.0, r[2])

    with np.errstate(all="ignore"):
        mistakes = [Mistake("nan_fully_masked_row", _online_variant(*args, guard=False), _NAN_ROW_HINT)]
        for name, how, hint in slips:
            mistakes.append(Mistake(name, answer(how, True), hint))
            mistakes.append(Mistake(name, post_guarded(answer(how, False)), hint))
            mistakes.append(Mistake(name, answer(how, False),
                                    hint + " Also: " + _NAN_ROW_HINT[0].lower() + _NAN_ROW_HINT[1:]))
    feedback = judge(ex, parts, mistakes,
                      success="m_new, l_new and acc_new match the kernel's online_softmax_update on "
                              "every row (first block, raised max, unchanged max, masked key, and "
                              "a row with every key masked).")
    if not feedback.passed and feedback.mistake == "non_finite" and _nan_only_in_masked_row(got):
        # NaN in the fully masked row, together with a slip no variant above reproduces
        return Feedback(ex, False, _NAN_ROW_HINT, "nan_fully_masked_row")
    return feedback


def _nan_only_in_masked_row(got: Sequence[Any]) -> bool:
    """True when l_new or acc_new is NaN in row 4 (every key masked) and rows 0-3 are finite."""
    try:
        parts = [np.asarray(g, dtype=np.float64) for g in got[1:]]
    except (TypeError, ValueError):
        return False
    if any(p.shape[:1] != (5,) for p in parts):
        return False
    return (any(np.isnan(p[4]).any() for p in parts)
            and all(np.isfinite(p[:4]).all() for p in parts))


# --------------------------------------------------------------------------------- backward
def _backward_inputs() -> dict[str, np.ndarray]:
    """A small head: p (4, 6) from the reference, dp (4, 6), o (4, 3), do (4, 3)."""
    rng = np.random.default_rng(14)
    q, k = rng.standard_normal((4, 5)), rng.standard_normal((6, 5))
    v = rng.standard_normal((6, 3))
    o, _, p = attention_reference(q[None, None], k[None, None], v[None, None], return_probs=True)
    do = rng.standard_normal((4, 3))
    return {"p": p[0, 0], "o": o[0, 0], "do": do, "dp": do @ v.T}


def check_backward_delta(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Feedback:
    r"""Check ``fn(do, o) -> d``: $D_i = \operatorname{rowsum}(dO_i \circ O_i)$, shape (rows,).

    do, o (rows, dv) with rows = 4, dv = 3. The truth is the backward kernel's ``row_dot``.
    Mistakes it names: sum over the wrong axis, kept dims, a sum over everything,
    ``rowsum(dO) * rowsum(O)``, the matrix product ``dO @ O.T``.
    """
    ex = "D = rowsum(dO * O)"
    x = _backward_inputs()
    got, fail = call_quietly(ex, fn, x["do"].copy(), x["o"].copy())
    if fail is not None:
        return fail
    d = np.empty(x["do"].shape[0])
    _backward.row_dot(x["do"], x["o"], d)
    prod = x["do"] * x["o"]
    mistakes = [
        Mistake("wrong_axis", [prod.sum(axis=0)],
                "you summed over the rows (axis 0), giving one value per feature; D has one "
                "value per query row: sum over the last axis, axis=-1."),
        Mistake("kept_dims", [prod.sum(axis=1, keepdims=True)],
                "the values are right but the shape is (rows, 1); return the 1-D array of shape "
                "(rows,) (drop keepdims=True)."),
        Mistake("sum_all", [prod.sum()],
                "you summed over everything; D has one value per query row: "
                "(do * o).sum(axis=-1)."),
        Mistake("product_of_sums", [x["do"].sum(axis=1) * x["o"].sum(axis=1)],
                "you multiplied the row sums; D is the sum of the element-wise products, "
                "sum_c dO_ic O_ic."),
        Mistake("matrix_product", [x["do"] @ x["o"].T],
                "do @ o.T pairs every row with every other row (rows x rows); D needs only the "
                "diagonal, rowsum(dO * O) (element-wise product, then sum)."),
    ]
    return judge(ex, [("D", got, d)], mistakes,
                  success="matches rowsum(dO * O), the backward kernel's row_dot.")


def check_softmax_grad(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Feedback:
    r"""Check ``fn(p, dp) -> ds``: the softmax backward $dS = P \circ (dP - D)$ with
    $D = \operatorname{rowsum}(P \circ dP)$.

    p (rows, cols) row-stochastic, dp (rows, cols) = $dO\,V^\top$; rows = 4, cols = 6. The
    truth is the backward kernel's ``row_dot`` and ``ds_from_dp``. Mistakes it names: D not
    subtracted, D = rowsum(dP), D = rowsum(P) (= 1), D summed over the wrong axis, the sign
    flipped, the factor P left out; a broadcast error (D without keepdims) gets a hint.
    """
    ex = "softmax backward"
    x = _backward_inputs()
    p, dp = x["p"], x["dp"]
    got, fail = call_quietly(ex, fn, p.copy(), dp.copy())
    if fail is not None:
        return with_hint(fail, [(r"broadcast", "D has one value per row: keep the summed axis "
                                                "((p * dp).sum(axis=-1, keepdims=True) has shape "
                                                "(rows, 1)) so it broadcasts against dp.")])
    # the truth: D = rowsum(P * dP), then dS = P * (dP - D), with the kernel's helpers
    d = np.empty(p.shape[0])
    _backward.row_dot(p, dp, d)
    ds = dp.copy()
    _backward.ds_from_dp(p, ds, d)
    dcol = d[:, None]
    mistakes = [
        Mistake("d_not_subtracted", [p * dp],
                "you returned P * dP: the softmax couples the entries of a row, so subtract "
                "D_i = rowsum(P_i * dP_i) first: dS = P * (dP - D)."),
        Mistake("d_from_rowsum_dp", [p * (dp - dp.sum(axis=1, keepdims=True))],
                "your D is rowsum(dP); it must be weighted by P: D = rowsum(P * dP) (the "
                "Jacobian's - p p^T term)."),
        Mistake("d_wrong_axis", [p * (dp - (p * dp).sum(axis=0, keepdims=True))],
                "your D is summed over the rows (axis 0), one value per key; D has one value "
                "per query row: (p * dp).sum(axis=-1, keepdims=True)."),
        Mistake("sign_flipped", [p * (dcol - dp)],
                "the sign is flipped: dS = P * (dP - D), not P * (D - dP)."),
        Mistake("d_from_rowsum_p", [p * (dp - p.sum(axis=1, keepdims=True))],
                "your D is rowsum(P), which is 1 for every row: D weights dP by P, "
                "D = rowsum(P * dP)."),
        Mistake("missing_p", [dp - dcol],
                "you left out the factor P: dS = P * (dP - D) (the Jacobian diag(p) - p p^T "
                "multiplies by p)."),
    ]
    return judge(ex, [("dS", got, ds)], mistakes,
                  success="matches P * (dP - rowsum(P * dP)), the backward kernel's ds_from_dp.")


# ------------------------------------------------------------------------------------ masks
#: (sq, sk, left, right): causal (left unbounded), a band, a wide-left band, a negative side
_BAND_CASES = ((6, 6, 6, 0), (5, 8, 2, 1), (7, 5, 1, 3), (6, 9, 4, -1))


def _band_variant(sq, sk, lo, hi, *, shift=0, transpose=False):
    """Masked (True) where NOT lo(i) <= j - shift <= hi(i): the mistakes' masks.

    ``lo``/``hi`` are functions of the row index array giving the inclusive bounds.
    """
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    if transpose:
        i, j = np.arange(sq)[None, :], np.arange(sk)[:, None]
    return ~((j - shift >= lo(i)) & (j - shift <= hi(i)))


def check_band_mask(fn: Callable[[int, int, int, int], np.ndarray]) -> Feedback:
    r"""Check ``fn(sq, sk, left, right) -> mask``: the band mask, bool (sq, sk), True = masked out.

    Key ``j`` is allowed for query row ``i`` iff $i - \text{left} \le j \le i + \text{right}$
    (top-left aligned, both edges included; ``left``/``right`` may be negative; a side as
    large as the sequence is unbounded). Causal is ``left = sq, right = 0``. The truth is
    ``~flashlab.masks.allowed``. Cases: (6, 6, 6, 0), (5, 8, 2, 1), (7, 5, 1, 3), (6, 9, 4, -1).

    Mistakes it names: True meaning allowed, an edge off by one (either side, excluded or one
    too many; with causal the diagonal masked), the sides swapped, the band aligned to the
    bottom-right corner, the mask transposed, and a non-bool result.
    """
    ex = "band mask"
    gots = []
    for sq, sk, left, right in _BAND_CASES:
        got, fail = call_quietly(ex, fn, sq, sk, left, right)
        if fail is not None:
            return fail
        gots.append(got)
    variants = {
        "inverted": lambda sq, sk, L, R: ~_band_variant(sq, sk, lambda i: i - L, lambda i: i + R),
        "right_edge_excluded": lambda sq, sk, L, R: _band_variant(sq, sk, lambda i: i - L, lambda i: i + R - 1),
        "left_edge_excluded": lambda sq, sk, L, R: _band_variant(sq, sk, lambda i: i - L + 1, lambda i: i + R),
        "both_edges_excluded": lambda sq, sk, L, R: _band_variant(sq, sk, lambda i: i - L + 1, lambda i: i + R - 1),
        "right_edge_extra": lambda sq, sk, L, R: _band_variant(sq, sk, lambda i: i - L, lambda i: i + R + 1),
        "left_edge_extra": lambda sq, sk, L, R: _band_variant(sq, sk, lambda i: i - L - 1, lambda i: i + R),
        "sides_swapped": lambda sq, sk, L, R: _band_variant(sq, sk, lambda i: i - R, lambda i: i + L),
        "bottom_right": lambda sq, sk, L, R: _band_variant(sq, sk, lambda i: i - L, lambda i: i + R, shift=sk - sq),
        "transposed": lambda sq, sk, L, R: _band_variant(sq, sk, lambda i: i - L, lambda i: i + R, transpose=True),
    }
    hints = {
        "inverted": "your mask is True where a key is *allowed*; here (as in CANN's atten_mask) "
                    "True means masked out: return the complement (~allowed).",
        "right_edge_excluded": "off by one at the right edge: the band includes j = i + right "
                               "(use <=, not <). With causal (right = 0) your mask hides the "
                               "diagonal, so a query cannot see its own key.",
        "left_edge_excluded": "off by one at the left edge: the band includes j = i - left "
                              "(use >=, not >).",
        "both_edges_excluded": "off by one at both edges: the band is inclusive, "
                               "i - left <= j <= i + right (use <= and >=, not < and >).",
        "right_edge_extra": "off by one at the right edge: your band lets row i see j = i + right "
                            "+ 1; the last allowed key is j = i + right.",
        "left_edge_extra": "off by one at the left edge: your band lets row i see j = i - left "
                           "- 1; the first allowed key is j = i - left.",
        "sides_swapped": "left and right are swapped: left counts keys *before* the query "
                         "(j >= i - left), right keys after it (j <= i + right).",
        "bottom_right": "your band is aligned to the bottom-right corner (j - (sk - sq) in the "
                        "band, CANN's rightDownCausal); this model is top-left aligned: "
                        "i - left <= j <= i + right with no offset.",
        "transposed": "your mask is transposed: rows are the sq queries i, columns the sk keys j; "
                      "the shape is (sq, sk).",
    }
    parts = [(f"the mask for (sq, sk, left, right) = {case}", got, ~allowed(*case))
             for case, got in zip(_BAND_CASES, gots)]
    mistakes = [Mistake(name, [f(*case) for case in _BAND_CASES], hints[name])
                for name, f in variants.items()]
    feedback = judge(ex, parts, mistakes, success="matches the band on all four cases "
                      "(causal, two-sided, sq > sk, a negative side).", rtol=0, atol=0)
    bad_dtype = next((np.asarray(g).dtype for g in gots if np.asarray(g).dtype != np.bool_), None)
    if feedback.passed and bad_dtype is not None:
        return Feedback(ex, False, f"the pattern is right, but the mask has dtype {bad_dtype}; "
                        f"return a bool array (a comparison such as j <= i gives one): on an "
                        f"integer array ~mask is -1 / -2, not the complement.", "not_bool")
    if feedback.mistake == "wrong_value":
        # name the first wrong entry in words rather than as 1.0 / 0.0
        for (_what, got, expected), case in zip(parts, _BAND_CASES):
            g = np.asarray(got, dtype=bool)
            if g.shape == expected.shape and (g != expected).any():
                i, j = (int(t) for t in np.argwhere(g != expected)[0])
                word = {True: "masked", False: "allowed"}
                return Feedback(ex, False, f"for (sq, sk, left, right) = {case}, entry (i={i}, j={j}) "
                                f"is {word[bool(g[i, j])]} in your mask but must be "
                                f"{word[bool(expected[i, j])]} (allowed iff i - left <= j <= i + right).",
                                "wrong_value")
    return feedback


#: tile grid (sq, sk, block_q, block_k) with a ragged last key block, and the bands to classify
_TILE_GRID = (24, 28, 8, 6)
_TILE_BANDS = ((1 << 20, 0), (1 << 20, 3), (3, 1 << 20), (5, 3), (10, -2), (-2, 9), (3, -5))
_CLASS_NAMES = {c: name.upper() for c, name in TILE_CLASS_NAMES.items()}


def tile_class_variant(i0, i1, j0, j1, left, right, mistake):
    """tile_class with one *mistake* plugged in (the checker's wrong answers)."""
    # empty: the tile lies right of the most permissive row's band, or left of it
    if mistake == "empty_exclusive_ends":
        empty = j0 > i1 + right or j1 < i0 - left
    elif mistake == "empty_wrong_corners":
        empty = j0 > i0 + right or j1 - 1 < i1 - 1 - left
    else:
        empty = j0 > i1 - 1 + right or j1 - 1 < i0 - left
    if mistake != "no_negative_band":
        empty = empty or left + right < 0
    if empty:
        return EMPTY
    # full: the strictest corners are inside the band
    if mistake == "full_exclusive_ends":
        full = j0 >= i1 - left and j1 <= i0 + right
    elif mistake == "full_wrong_corners":
        full = j0 >= i0 - left and j1 - 1 <= i1 - 1 + right
    else:
        full = j0 >= i1 - 1 - left and j1 - 1 <= i0 + right
    return FULL if full else PARTIAL


def _tiles(sq, sk, bq, bk):
    """Every tile of the grid as (a, b, i0, i1, j0, j1)."""
    for a in range(-(-sq // bq)):
        for b in range(-(-sk // bk)):
            yield a, b, a * bq, min(sq, (a + 1) * bq), b * bk, min(sk, (b + 1) * bk)


def _classify(tile_fn: Callable[..., int], band: tuple[int, int]) -> np.ndarray:
    """Classes of every tile of :data:`_TILE_GRID` by ``tile_fn(i0, i1, j0, j1, left, right)``."""
    sq, sk, bq, bk = _TILE_GRID
    out = np.empty((-(-sq // bq), -(-sk // bk)), dtype=np.int64)
    for a, b, i0, i1, j0, j1 in _tiles(sq, sk, bq, bk):
        out[a, b] = tile_fn(i0, i1, j0, j1, *band)
    return out


def check_tile_class(fn: Callable[[int, int, int, int, int, int], int]) -> Feedback:
    r"""Check ``fn(i0, i1, j0, j1, left, right) -> int``: the class of the tile rows ``[i0, i1)`` x cols ``[j0, j1)``.

    Returns ``flashlab.masks.EMPTY`` (0, no allowed entry), ``PARTIAL`` (1) or ``FULL`` (2,
    every entry allowed) under the band $i - \text{left} \le j \le i + \text{right}$; note
    the *exclusive* ends ``i1``, ``j1``. The checker classifies every tile of a 24 x 28 grid
    of 8 x 6 tiles under seven bands (some with an edge exactly on a tile corner) and
    compares with ``flashlab.masks.classify_tiles``.

    Mistakes it names: the exclusive ends used as inclusive in the empty test or in the full
    test, the wrong corners in either test, and a band with ``left + right < 0`` not treated
    as empty.
    """
    ex = "tile class"
    sq, sk, bq, bk = _TILE_GRID
    shape = (-(-sq // bq), -(-sk // bk))
    parts = []
    for left, right in _TILE_BANDS:
        got = np.full(shape, -1, dtype=np.int64)
        for a, b, i0, i1, j0, j1 in _tiles(sq, sk, bq, bk):
            c, fail = call_quietly(ex, fn, i0, i1, j0, j1, left, right)
            if fail is not None:
                return fail
            if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)) or c not in _CLASS_NAMES:
                return Feedback(ex, False, f"tile_class{(i0, i1, j0, j1, left, right)} returned {c!r}; "
                                f"it should return one of EMPTY (0), PARTIAL (1), FULL (2) from "
                                f"flashlab.masks.", "not_a_class")
            got[a, b] = c
        parts.append(((left, right), got, classify_tiles(sq, sk, bq, bk, left, right)))
    hints = {
        "empty_exclusive_ends": "off by one in the EMPTY test: i1 and j1 are exclusive, so the "
                                "last row is i1 - 1 and the last column j1 - 1; a tile is empty if "
                                "j0 > (i1 - 1) + right or (j1 - 1) < i0 - left.",
        "empty_wrong_corners": "your EMPTY test uses the strictest corners: a tile is empty only if "
                               "even its most permissive row misses it, j0 > (i1 - 1) + right or "
                               "(j1 - 1) < i0 - left. Yours skips tiles that hold allowed entries.",
        "full_exclusive_ends": "off by one in the FULL test: i1 and j1 are exclusive; a tile is "
                               "full if j0 >= (i1 - 1) - left and (j1 - 1) <= i0 + right.",
        "full_wrong_corners": "your FULL test uses the most permissive corners: a tile is full only "
                              "if its strictest corners are inside, j0 >= (i1 - 1) - left and "
                              "(j1 - 1) <= i0 + right. Yours skips the masking of tiles that "
                              "contain masked entries.",
        "no_negative_band": "with left + right < 0 no row allows any key (the interval "
                            "[i - left, i + right] is empty), so every tile is EMPTY; test that first.",
    }
    mistakes = [Mistake(name, [_classify(lambda i0, i1, j0, j1, left, right, name=name:
                                          tile_class_variant(i0, i1, j0, j1, left, right, name), band)
                               for band in _TILE_BANDS], hint)
                for name, hint in hints.items()]
    named = [(f"the classes for (left, right) = {band}", got, exp) for band, got, exp in parts]
    feedback = judge(ex, named, mistakes, rtol=0, atol=0,
                      success="every tile of the 24 x 28 grid (8 x 6 tiles) is classified as "
                              "flashlab.masks.tile_class does, under all seven bands.")
    if feedback.mistake == "wrong_value":
        for band, got, exp in parts:
            wrong = np.argwhere(got != exp)
            if len(wrong):
                a, b = (int(t) for t in wrong[0])
                i0, i1, j0, j1 = a * bq, min(sq, (a + 1) * bq), b * bk, min(sk, (b + 1) * bk)
                return Feedback(ex, False, f"under (left, right) = {band}, the tile of rows [{i0}, {i1}) "
                                f"x cols [{j0}, {j1}) is {_CLASS_NAMES[int(got[a, b])]} in your answer "
                                f"but {_CLASS_NAMES[int(exp[a, b])]} in flashlab.masks.tile_class.",
                                "wrong_value")
    return feedback


# ----------------------------------------------------------------- flash_attn's window, as a band
#: (sq, sk, causal, window_size): both length orders, causal alone, windows with and without it
_WINDOW_CASES = ((2, 5, True, (-1, -1)), (5, 2, True, (-1, -1)), (4, 10, False, (3, 0)),
                 (10, 4, False, (2, 1)), (6, 6, False, (-1, 2)), (3, 8, True, (2, -1)))


def _window_truth(sq: int, sk: int, causal: bool, window_size: tuple[int, int], *, shift: int | None = None,
                  literal_minus_one: bool = False, causal_drops_left: bool = False) -> np.ndarray:
    """flash_attn's rule (bottom-right), as an allowed (sq, sk) array, or a planted slip of it."""
    wl, wr = window_size
    if causal:
        wr = 0
        if causal_drops_left:
            wl = -1
    shift = sk - sq if shift is None else shift
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    ok = np.ones((sq, sk), dtype=bool)
    # query i sits at key position i + shift: it sees i + shift - wl <= j <= i + shift + wr
    if wl != -1 or literal_minus_one:
        ok &= j >= i + shift - wl
    if wr != -1 or literal_minus_one:
        ok &= j <= i + shift + wr
    return ok


def _as_allowed(band: Any, sq: int, sk: int) -> np.ndarray | None:
    """A reader's ``(left, right)`` (None = unbounded) as the allowed (sq, sk) array, or None."""
    if not isinstance(band, (tuple, list)) or len(band) != 2:
        return None
    left, right = (NO_LIMIT if side is None else side for side in band)
    if not all(isinstance(side, (int, np.integer)) and not isinstance(side, bool) for side in (left, right)):
        return None
    return allowed(sq, sk, int(left), int(right))


def check_flash_attn_window(fn: Callable[[int, int, bool, tuple[int, int]], tuple]) -> Feedback:
    r"""Check ``fn(sq, sk, causal, window_size) -> (left, right)``: flash_attn's mask as flashlab's band.

    flash_attn aligns ``causal`` and ``window_size = (wl, wr)`` to the bottom-right corner: query
    ``i`` sees keys $i + S_k - S_q - w_l \le j \le i + S_k - S_q + w_r$, ``-1`` unbounded,
    ``causal`` setting $w_r = 0$. The answer is flashlab's top-left band ``(left, right)`` (a side
    may be ``None`` = unbounded) with the same allowed set; it is judged as the allowed
    ``(sq, sk)`` array it gives, so any equivalent band passes (the truth:
    :func:`flashlab.compat.band_from_window`). Mistakes it names: no shift (flashlab's top-left
    causal), the shift with the wrong sign, ``-1`` taken as a window of -1 keys, ``causal``
    dropping the left window, the sides swapped, and a result that is not a pair of ints/None.
    """
    ex = "flash_attn window"
    gots = []
    for sq, sk, causal, window_size in _WINDOW_CASES:
        got, fail = call_quietly(ex, fn, sq, sk, causal, window_size)
        if fail is not None:
            return fail
        band = _as_allowed(got, sq, sk)
        if band is None:
            return Feedback(ex, False, f"for (sq, sk, causal, window_size) = {(sq, sk, causal, window_size)} "
                            f"you returned {got!r}; return a pair (left, right) of ints, None for an "
                            f"unbounded side.", "not_a_band")
        gots.append(band)

    variants = {
        "no_shift": lambda sq, sk, c, ws: _window_truth(sq, sk, c, ws, shift=0),
        "shift_sign": lambda sq, sk, c, ws: _window_truth(sq, sk, c, ws, shift=sq - sk),
        "minus_one_literal": lambda sq, sk, c, ws: _window_truth(sq, sk, c, ws, literal_minus_one=True),
        "causal_drops_left": lambda sq, sk, c, ws: _window_truth(sq, sk, c, ws, causal_drops_left=True),
        "sides_swapped": lambda sq, sk, c, ws: _window_truth(sq, sk, c, (ws[1], ws[0])),
    }
    hints = {
        "no_shift": "your band is aligned top-left (query i at key position i, flashlab's own "
                    "causal); flash_attn puts query i at key position i + sk - sq, so both sides "
                    "shift: left = wl - (sk - sq), right = wr + (sk - sq).",
        "shift_sign": "the shift has the wrong sign: the last query (i = sq - 1) must sit on the "
                      "last key (j = sk - 1), so the offset is sk - sq, not sq - sk.",
        "minus_one_literal": "-1 means unbounded in flash_attn, not 'one key on the other side': "
                             "map a side of -1 to None.",
        "causal_drops_left": "causal sets only the right side (wr = 0); a left window given with "
                             "it still limits how far back a query sees.",
        "sides_swapped": "the sides are swapped: window_size = (left, right) counts keys before "
                         "and after the query's position.",
    }
    parts = [(f"the allowed set for (sq, sk, causal, window_size) = {case}", got, _window_truth(*case))
             for case, got in zip(_WINDOW_CASES, gots)]
    mistakes = [Mistake(name, [f(*case) for case in _WINDOW_CASES], hints[name])
                for name, f in variants.items()]
    return judge(ex, parts, mistakes, success="the same allowed keys as flash_attn on all six cases "
                  "(both length orders, causal, windows with and without it).", rtol=0, atol=0)
