"""What every exercise checker shares: the feedback object and the diagnosis of a wrong answer.

A checker runs the reader's function on inputs it builds, compares the result with the
answer computed by ``flashlab`` (or the float64 reference), and, when they differ, compares
the result with what each *known mistake* would have produced. A match names the mistake,
so the message can say what to fix ("l was not rescaled when the max changed") instead of
only "wrong". Shapes, dtypes, NaN/inf and exceptions are checked first, each with its own
message.
"""
from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Feedback", "Mistake", "call_student", "tolerance", "diagnose"]


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


#: the smallest (rtol, atol) a checker accepts for an answer computed in a narrower float type:
#: a correct float32 (float16) answer differs from a float64 truth by its own rounding, so a
#: float64 tolerance would reject it ("got 0.949838, expected 0.949838")
DTYPE_TOLERANCE = {np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float16): (5e-3, 1e-3)}


def tolerance(got: Any, rtol: float, atol: float) -> tuple[float, float]:
    """``(rtol, atol)`` for judging ``got``: the checker's own, widened to the rounding of
    ``got``'s dtype when it is float32 or float16 (:data:`DTYPE_TOLERANCE`)."""
    dtype = getattr(got, "dtype", None)
    if dtype is None and isinstance(got, (list, tuple)) and got:
        dtype = getattr(got[0], "dtype", None)
    floor = DTYPE_TOLERANCE.get(np.dtype(dtype)) if dtype is not None else None
    if floor is None:
        return rtol, atol
    return max(rtol, floor[0]), max(atol, floor[1])


def _close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def diagnose(exercise: str, got: Any, expected: np.ndarray, *, what: str,
             mistakes: Sequence[Mistake] = (), rtol: float = 1e-5, atol: float = 1e-6,
             success: str = "matches the reference.") -> Feedback:
    """Compare the reader's ``got`` with ``expected`` and explain a difference.

    Order of the checks: type, shape, NaN/inf where the expected value is finite, the value
    (within ``rtol``/``atol``), then each known mistake in turn (the first whose answer
    matches ``got`` names the problem), and last a generic message giving the largest error
    and where it is. ``what`` names the quantity in messages ("o", "the row maxima m").
    A float32 or float16 ``got`` is judged within its own rounding (``tolerance``).
    """
    rtol, atol = tolerance(got, rtol, atol)
    if got is None:
        return Feedback(exercise, False, f"your function returned None; it should return {what}.", "returned_none")
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
    if _close(got, expected, rtol, atol):
        return Feedback(exercise, True, f"{what} {success}")
    for m in mistakes:
        if m.answer is not None and _close(got, m.answer, rtol, atol):
            return Feedback(exercise, False, m.hint, m.name)
    err = np.abs(np.where(np.isfinite(expected), got - expected, 0.0))
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))
    return Feedback(exercise, False, f"{what} is not the answer, nor one of the slips this checker knows: "
                    f"the largest error is {err[idx]:.3g} at index {idx} (got {got[idx]:.10g}, "
                    f"expected {expected[idx]:.10g}).", "wrong_value")
