"""What every exercise checker shares: calling the reader's function, one closeness predicate,
and the diagnosis of a wrong answer.

A checker runs the reader's function on inputs it builds, compares the result with the
answer computed by ``flashlab`` (or the float64 reference), and, when they differ, compares
the result with what each *known mistake* would have produced. A match names the mistake,
so the message can say what to fix ("l was not rescaled when the max changed") instead of
only "wrong". Shapes, NaN/inf and exceptions are checked first, each with its own message.

**Precision, not dtype.** A checker asks for a *precision* (``rtol``/``atol``; the default,
:data:`FLOAT32_PRECISION`, is what a float32 computation reaches) and judges every answer by
it, whatever dtype the answer comes back in: a correct float32 answer that numpy promoted to
float64 passes, and an answer computed in float16 (or whose running state was kept in float16)
is rejected with a message saying so (``"low_precision"``), even when it is returned as
float16 -- its own rounding is no excuse for an error 100x the float32 one.
"""
from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Feedback", "Mistake", "call_student", "call_quietly", "with_hint", "close",
           "close_elements", "diagnose", "judge", "call_cases", "diagnose_cases", "fmt",
           "FLOAT32_PRECISION", "FLOAT16_PRECISION", "STRUCTURAL"]

#: ``(rtol, atol)`` a correct float32 computation meets against the float64 truth (its
#: rounding is ~6e-8 per operation; the checkers' sums have at most a few hundred terms)
FLOAT32_PRECISION = (1e-5, 1e-6)
#: ``(rtol, atol)`` a float16 computation meets (unit roundoff 2^-11 = 4.9e-4): an answer within
#: this but not within the checker's own precision was computed (or kept) in half precision
FLOAT16_PRECISION = (2e-2, 2e-3)

#: failures of :func:`diagnose` that no known mistake can explain: reported as they are
STRUCTURAL = ("returned_none", "not_an_array")


@dataclass(frozen=True)
class Feedback:
    """The outcome of one check.

    ``passed`` is the verdict; ``mistake`` names the diagnosed mistake (``None`` when the
    answer is right or wrong in an unrecognised way); ``message`` is what the reader reads.
    ``bool(feedback)`` is ``passed``, so ``assert check_x(fn)`` works in a test.
    """

    exercise: str
    passed: bool
    message: str
    mistake: str | None = None

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        mark = "Correct" if self.passed else "Not yet"
        return f"[{self.exercise}] {mark}: {self.message}"

    def _repr_pretty_(self, p, cycle) -> None:     # IPython's plain-text display
        p.text(str(self))

    def _repr_markdown_(self) -> str:
        mark = "✓ **Correct**" if self.passed else "✗ **Not yet**"   # in every font, unlike emoji
        return f"{mark} ({self.exercise}): {self.message}"


@dataclass(frozen=True)
class Mistake:
    """A known mistake: its name, the answer it produces on the checker's inputs, the hint."""

    name: str
    answer: Any
    hint: str


# ------------------------------------------------------------------------- calling the reader
def call_student(exercise: str, fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, Feedback | None]:
    """Call ``fn(*args, **kwargs)``; return ``(result, None)``, or ``(None, feedback)`` if it raised.

    Raises ``TypeError`` (a checker's own misuse, not the reader's) if ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"the function to check must be callable; got {type(fn).__name__}")
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:                      # the reader's code: report, don't crash
        where = traceback.extract_tb(exc.__traceback__)[-1]
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return None, Feedback(exercise, False,
                              f"your function raised {what} "
                              f"(line {where.lineno}: `{(where.line or '').strip()}`)", "raised")


def call_quietly(exercise: str, fn: Callable[..., Any], *args) -> tuple[Any, Feedback | None]:
    """:func:`call_student` with float warnings silenced (the feedback explains overflows)."""
    with np.errstate(all="ignore"):
        return call_student(exercise, fn, *args)


def with_hint(feedback: Feedback, hints: Sequence[tuple[str, str]]) -> Feedback:
    """Append the first hint whose regex matches a 'raised' message (e.g. a broadcast error)."""
    for pattern, hint in hints:
        if re.search(pattern, feedback.message):
            return Feedback(feedback.exercise, False, f"{feedback.message}. Hint: {hint}", feedback.mistake)
    return feedback


def fmt(x: float) -> str:
    """A number for a message: integers with thousands separators, others to 6 digits."""
    if np.isfinite(x) and float(x).is_integer() and abs(x) < 1e18:
        return f"{int(x):,}"
    return f"{x:.6g}"


# ------------------------------------------------------------------ the closeness predicate
def close_elements(got: Any, answer: Any, rtol: float, atol: float) -> np.ndarray | None:
    """Element-wise ``|got - answer| <= atol + rtol |answer|``, with NaN == NaN and inf == inf
    (``np.isclose`` would compute inf - inf = nan); ``None`` if the two are not numeric arrays
    of one shape. The one closeness predicate of every checker."""
    if answer is None or got is None:
        return None
    try:
        a = np.asarray(got, dtype=np.float64)
        b = np.asarray(answer, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if a.shape != b.shape:
        return None
    fin = np.isfinite(a) & np.isfinite(b)
    with np.errstate(invalid="ignore"):
        near = np.abs(np.where(fin, a - b, 0.0)) <= atol + rtol * np.abs(np.where(fin, b, 0.0))
    same_special = (a == b) | (np.isnan(a) & np.isnan(b))
    return np.where(fin, near, same_special)


def close(got: Any, answer: Any, rtol: float, atol: float) -> bool:
    """True when ``got`` equals ``answer`` within ``rtol``/``atol`` everywhere (:func:`close_elements`)."""
    ok = close_elements(got, answer, rtol, atol)
    return ok is not None and bool(ok.all())


def _dtype_of(got: Any) -> np.dtype | None:
    dtype = getattr(got, "dtype", None)
    if dtype is None and isinstance(got, (list, tuple)) and got:
        dtype = getattr(got[0], "dtype", None)
    return None if dtype is None else np.dtype(dtype)


def _low_precision(exercise: str, what: str, rtol: float, parts: Sequence[tuple[Any, Any]]) -> Feedback | None:
    """The ``"low_precision"`` feedback when every part is right to float16 precision but one is
    not right to the checker's (finer) precision: the answer was computed in half precision."""
    # only for a checker that asks for float precision (counts are judged to 1e-9: no excuse)
    if 1e-6 <= rtol < FLOAT16_PRECISION[0] / 10 and all(close(g, e, *FLOAT16_PRECISION) for g, e in parts):
        f16 = any(_dtype_of(g) == np.float16 for g, _ in parts)
        how = ("it is float16" if f16 else
               "it has the error of a float16 computation (was an input, a product or the running "
               "state kept in float16?)")
        return Feedback(exercise, False,
                        f"{what} is right only to float16 precision: {how}. The checker asks for "
                        f"the precision of float32 (relative error <= {rtol:g}); float16 has a unit "
                        "roundoff of 2^-11 = 4.9e-4, and a sum or an exponential of many such terms "
                        "drifts further. Compute (and keep m, l, acc) in float32 or float64, and "
                        "convert only the result.", "low_precision")
    return None


def diagnose(exercise: str, got: Any, expected: np.ndarray, *, what: str,
             mistakes: Sequence[Mistake] = (), rtol: float = FLOAT32_PRECISION[0],
             atol: float = FLOAT32_PRECISION[1], success: str = "matches the reference.") -> Feedback:
    """Compare the reader's ``got`` with ``expected`` and explain a difference.

    Order of the checks: type, shape, NaN/inf where the expected value is finite, the value
    (within ``rtol``/``atol``, whatever ``got``'s dtype), then each known mistake in turn (the
    first whose answer matches ``got`` names the problem), then half precision
    (``"low_precision"``), and last a generic message giving the largest error and where it is.
    ``what`` names the quantity in messages ("o", "the row maxima m").
    """
    if got is None:
        return Feedback(exercise, False, f"your function returned None; it should return {what}.", "returned_none")
    raw = got
    try:
        got = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return Feedback(exercise, False, f"{what} should be an array of numbers; got {type(got).__name__}.",
                        "not_an_array")
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return Feedback(exercise, False, f"{what} has shape {got.shape}; expected {expected.shape}.", "shape")
    bad = ~np.isfinite(got) & np.isfinite(expected)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return Feedback(exercise, False, f"{what} has a non-finite value ({got[idx]}) at index {idx}, "
                        f"where the answer is {expected[idx]:.6g}.", "non_finite")
    if close(got, expected, rtol, atol):
        return Feedback(exercise, True, f"{what} {success}")
    for m in mistakes:
        if close(got, m.answer, rtol, atol):
            return Feedback(exercise, False, m.hint, m.name)
    low = _low_precision(exercise, what, rtol, [(raw, expected)])
    if low is not None:
        return low
    err = np.abs(np.where(np.isfinite(expected), got - expected, 0.0))
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))
    return Feedback(exercise, False, f"{what} is not the answer, nor one of the slips this checker knows: "
                    f"the largest error is {err[idx]:.3g} at index {idx} (got {got[idx]:.10g}, "
                    f"expected {expected[idx]:.10g}).", "wrong_value")


def judge(exercise: str, parts: Sequence[tuple[str, Any, Any]], mistakes: Sequence[Mistake], *,
          success: str, rtol: float = FLOAT32_PRECISION[0], atol: float = FLOAT32_PRECISION[1]) -> Feedback:
    """Judge a result made of several ``parts`` = ``(what, got, expected)``.

    A part is one element of a returned tuple, or the result for one of several inputs.
    Each mistake's ``answer`` is a sequence with one answer per part; it is recognised only
    when *every* part matches it, so the inputs must be chosen to tell the mistakes apart.
    Mistakes are tried before the shape and NaN checks of :func:`diagnose`, so a mistake
    whose answer has another shape (a sum over the wrong axis) or overflows (a softmax
    without the max subtracted) is still named. A result right only to half precision is
    ``"low_precision"``.
    """
    verdicts = [diagnose(exercise, got, expected, what=what, rtol=rtol, atol=atol)
                for what, got, expected in parts]
    if all(v.passed for v in verdicts):
        return Feedback(exercise, True, success)
    first = next(v for v in verdicts if not v.passed)
    if first.mistake in STRUCTURAL:
        return first
    for m in mistakes:
        if all(close(got, answer, rtol, atol) for (_, got, _), answer in zip(parts, m.answer)):
            return Feedback(exercise, False, m.hint, m.name)
    names = ", ".join(what for what, _, _ in parts)
    low = _low_precision(exercise, names, rtol, [(g, e) for _, g, e in parts])
    return low if low is not None else first


# ---------------------------------------------------------- one number per case (counts, times)
def call_cases(exercise: str, fn: Callable[..., Any], cases: Sequence[tuple],
               describe: Callable[[tuple], str], what: str) -> tuple[np.ndarray | None, Feedback | None]:
    """Call ``fn(*case)`` for every case; each call must return one number.

    Returns ``(answers, None)`` (a float64 array, one entry per case) or ``(None, feedback)``
    for the first case whose call raised or did not return a number, naming that case.
    """
    out = np.empty(len(cases))
    for i, case in enumerate(cases):
        result, fb = call_student(exercise, fn, *case)
        if fb is not None:
            return None, Feedback(exercise, False, f"for {describe(case)}, {fb.message}", fb.mistake)
        if result is None:
            return None, Feedback(exercise, False, f"for {describe(case)} your function returned None; "
                                  f"it should return {what}.", "returned_none")
        value = np.asarray(result)
        if value.ndim != 0 or not np.issubdtype(value.dtype, np.number):
            return None, Feedback(exercise, False, f"for {describe(case)} your function returned "
                                  f"{type(result).__name__} {result!r:.60}; it should return one number, "
                                  f"{what}.", "not_a_number")
        out[i] = float(value)
    return out, None


def diagnose_cases(exercise: str, got: np.ndarray, expected: np.ndarray, cases: Sequence[tuple],
                   describe: Callable[[tuple], str], *, what: str, mistakes: Sequence[Mistake],
                   rtol: float = 1e-9, atol: float = 1e-9, success: str) -> Feedback:
    """:func:`diagnose` over one answer per case; an unrecognised wrong answer is reported for
    the first case it is wrong in (with its inputs), not by an array index."""
    fb = diagnose(exercise, got, expected, what=what, mistakes=mistakes, rtol=rtol, atol=atol,
                  success=success)
    if fb.mistake not in ("wrong_value", "non_finite", "low_precision"):
        return fb
    close = close_elements(got, expected, rtol, atol)
    assert close is not None, "a wrong value means numeric arrays of one shape"
    wrong = ~close
    i = int(np.argmax(wrong))
    return Feedback(exercise, False, f"for {describe(cases[i])} your function returned {fmt(got[i])}; the "
                    f"answer is {fmt(expected[i])} ({int((~wrong).sum())} of {len(cases)} cases are "
                    "right).", fb.mistake)
