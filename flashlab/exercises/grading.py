"""Grading the coding exercises: the book's checkers, plus what a graded course needs.

The checkers of :mod:`flashlab.exercises` run a reader's function on inputs that are printed in
the book, and the book shows every solution. For marks, :func:`grade` adds two rules:

* **Write it yourself.** A function that calls flashlab's own code (``attention_reference``,
  ``flash_attention``, the kernels, ...) instead of computing the answer fails, with a message
  that names what it called. It is caught twice: statically (a name in the function, or in a
  function it defines, that is the ``flashlab`` package or one of its functions) and while it
  runs (a profiler sees every Python call that enters flashlab's source, the exercises' own
  solutions included, e.g. the capstone's ``flashlab.exercises._capstone.tile_loop``).
* **Inputs the students have not seen.** With ``reference`` (the instructor's solution) and
  ``seed`` (the instructor's number, kept in nbgrader's hidden tests), the function is also
  compared with the reference on ``trials`` inputs drawn from ``numpy.random.default_rng(seed)``
  by the exercise's generator (:data:`INPUTS`): shapes, lengths and values change with the seed.
  The comparison uses the precision the book states for the exercise (:data:`PRECISION`, the
  book's checker's own): a floating-point answer computed in float32 is accepted (relative
  error $10^{-5}$), counts are judged exactly, and an answer that is close but not close
  enough fails with a message that says it is a precision problem (``"low_precision"``).

For graded use each chapter exercise also has a harder *variant*, stated without its formula
(the instructor guide lists them); :func:`grade_variant` grades one against its reference on
example inputs, or on the instructor's seeded inputs, with the same two rules and precision.

``tools/assignments.py`` (``make assignments``) writes the nbgrader course whose autograded
cells call :func:`grade` and :func:`grade_variant` and print their feedback before asserting it.
"""
from __future__ import annotations

import dis
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import _capstone, foundations, gpu, rect
from ._core import FLOAT16_PRECISION, FLOAT32_PRECISION, Feedback, close
from ._variants import PUBLIC_SEED, VARIANTS

__all__ = ["CHECKERS", "INPUTS", "PRECISION", "grade", "grade_variant", "flashlab_calls"]

#: exercise name (the function the student writes) -> the book's checker
CHECKERS: dict[str, Callable[[Callable[..., Any]], Feedback]] = {
    "arithmetic_intensity": foundations.check_arithmetic_intensity,
    "attention": foundations.check_attention,
    "online_softmax_step": foundations.check_online_softmax,
    "softmax_grad": foundations.check_softmax_grad,
    "band_mask": foundations.check_band_mask,
    "window_band": foundations.check_flash_attn_window,
    "mla_scores": rect.check_mla_scores,
    "rope_rotate_half": rect.check_rope,
    "pipeline_time": rect.check_pipeline_time,
    "concat_bytes": rect.check_concat_bytes,
    "attention_flops": rect.check_attention_flops,
    "forward_read_bytes": gpu.check_forward_read_bytes,
    "shared_bytes": gpu.check_shared_memory_bytes,
    "flash_tile_loop": _capstone.check_flash_tile_loop,
}

_EXACT = (1e-9, 1e-9)
#: ``(rtol, atol)`` of the hidden comparison: the precision each book checker asks for (the
#: exercises page: floating-point answers to float32 precision, counts and masks exactly)
PRECISION: dict[str, tuple[float, float]] = {
    **dict.fromkeys(("attention", "online_softmax_step", "softmax_grad", "rope_rotate_half",
                     "flash_tile_loop"), FLOAT32_PRECISION),
    "mla_scores": (1e-4, 1e-5),                            # check_mla_scores' own (float32 at D = 192)
    **dict.fromkeys(("arithmetic_intensity", "band_mask", "window_band", "pipeline_time", "concat_bytes",
                     "attention_flops", "forward_read_bytes", "shared_bytes"), _EXACT),
}

_PACKAGE = Path(__file__).resolve().parent.parent          # flashlab/


# ------------------------------------------------------------------ seeded instructor inputs
def _softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _online_state(rng: np.random.Generator) -> tuple:
    """(m, l, acc, s, v): rows after one earlier block, half of them before any block."""
    rows, cols, dv = int(rng.integers(2, 7)), int(rng.integers(2, 7)), int(rng.integers(1, 5))
    s0 = rng.standard_normal((rows, cols)) * 3
    v0 = rng.standard_normal((cols, dv))
    m = s0.max(axis=1)                                   # m = rowmax(S0)
    p0 = np.exp(s0 - m[:, None])
    l, acc = p0.sum(axis=1), p0 @ v0                      # l = rowsum(P0), acc = P0 V0
    fresh = rng.random(rows) < 0.5                        # rows that see their first block now
    m[fresh], l[fresh], acc[fresh] = -np.inf, 0.0, 0.0
    s = rng.standard_normal((rows, cols)) * 3 + rng.choice([-4.0, 0.0, 4.0], size=(rows, 1))
    return m, l, acc, s, rng.standard_normal((cols, dv))


def _window(rng: np.random.Generator) -> tuple:
    sq, sk = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    side = lambda: -1 if rng.random() < 0.3 else int(rng.integers(0, 20))  # noqa: E731 (-1: unbounded)
    return sq, sk, bool(rng.random() < 0.4), (side(), side())


def _mla(rng: np.random.Generator) -> tuple:
    b, h, sq, sk = (int(x) for x in rng.integers(1, 4, size=4))
    dn, dr = int(rng.integers(2, 9)), int(rng.integers(1, 5))
    return (rng.standard_normal((b, h, sq, dn)), rng.standard_normal((b, h, sk, dn)),
            rng.standard_normal((b, h, sq, dr)), rng.standard_normal((b, 1, sk, dr)))


def _ints(rng: np.random.Generator, n: int, lo: int = 1, hi: int = 4096) -> list[int]:
    return [int(x) for x in rng.integers(lo, hi, size=n)]


def _tile_loop(rng: np.random.Generator) -> tuple:
    """(q, k, v, do, block_q, block_k, causal): one head, lengths no tile need divide."""
    sq, sk = (int(x) for x in rng.integers(1, 20, size=2))
    d, dv = (int(x) for x in rng.integers(1, 9, size=2))
    q, k = rng.standard_normal((sq, d)), rng.standard_normal((sk, d))
    k[:, 0] += np.linspace(0.0, 3.0, sk)                  # later key tiles raise the row max
    return (q, k, rng.standard_normal((sk, dv)), rng.standard_normal((sq, dv)),
            *(int(x) for x in rng.integers(1, 9, size=2)), bool(rng.random() < 0.5))


def _tiles(rng: np.random.Generator) -> list[int]:
    """block_q, block_k: powers of two from 8 to 128."""
    return [int(x) for x in rng.choice([8, 16, 32, 64, 128], size=2)]


#: exercise name -> a generator of one argument tuple from the instructor's random generator
INPUTS: dict[str, Callable[[np.random.Generator], tuple]] = {
    "forward_read_bytes": lambda r: (*_ints(r, 2, 1, 300), *_ints(r, 2, 1, 256), *_tiles(r), bool(r.integers(0, 2))),
    "shared_bytes": lambda r: (*_tiles(r), *_ints(r, 2, 1, 256)),
    "arithmetic_intensity": lambda r: (*_ints(r, 3), int(r.choice([1, 2, 4, 8]))),
    "attention": lambda r: (r.standard_normal((int(r.integers(1, 9)), d := int(r.integers(1, 9)))) * 4,
                            r.standard_normal((sk := int(r.integers(1, 9)), d)),
                            r.standard_normal((sk, int(r.integers(1, 6))))),
    "online_softmax_step": _online_state,
    "softmax_grad": lambda r: (_softmax_rows(r.standard_normal(shape := tuple(_ints(r, 2, 1, 9))) * 3),
                               r.standard_normal(shape)),
    "band_mask": lambda r: (*_ints(r, 2, 1, 40), *(int(x) for x in r.integers(-5, 45, size=2))),
    "window_band": _window,
    "mla_scores": _mla,
    "rope_rotate_half": lambda r: (r.standard_normal((s := int(r.integers(1, 12)), 2 * int(r.integers(1, 9)))),
                                   r.integers(0, 5000, size=s)),
    "pipeline_time": lambda r: (int(r.integers(1, 200)), float(r.uniform(0.1, 5)), float(r.uniform(0.1, 5)),
                                int(r.choice([1, 2]))),
    "concat_bytes": lambda r: (*_ints(r, 2, 1, 64), int(r.integers(1, 8192)), int(r.integers(16, 256)),
                               int(r.integers(8, 128)), int(r.choice([1, 2, 4]))),
    "attention_flops": lambda r: (*_ints(r, 2, 1, 32), *_ints(r, 2, 1, 3000), *_ints(r, 2, 8, 256),
                                  bool(r.random() < 0.5)),
    "flash_tile_loop": _tile_loop,
}


def _same(got: Any, want: Any, rtol: float, atol: float) -> bool:
    """``got`` equals ``want``: numbers within ``rtol``/``atol`` (whatever ``got``'s dtype), None
    and bools exactly, tuples element by element."""
    if isinstance(want, tuple):
        return (isinstance(got, (tuple, list)) and len(got) == len(want)
                and all(_same(g, w, rtol, atol) for g, w in zip(got, want)))
    if want is None:
        return got is None
    if isinstance(want, (bool, np.bool_)):
        return isinstance(got, (bool, np.bool_)) and bool(got) == bool(want)
    if got is None or isinstance(got, (str, bytes)):
        return False
    return close(got, want, rtol, atol)


def _describe(args: tuple) -> str:
    return ", ".join(f"array {a.shape}" if isinstance(a, np.ndarray) else repr(a) for a in args)


# ------------------------------------------------------------------------- write it yourself
def _is_flashlab(obj: Any) -> str | None:
    """The flashlab name of ``obj`` if it is flashlab's code, else None. The exercises' own
    modules count too: ``flashlab.exercises._capstone.tile_loop`` is the capstone's answer."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    else:
        obj = getattr(obj, "py_func", obj)                 # a Numba dispatcher: its Python function
        name = f"{getattr(obj, '__module__', '') or ''}.{getattr(obj, '__qualname__', '')}"
    if name == "flashlab" or name.startswith("flashlab."):
        return name.rstrip(".")
    return None


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def flashlab_calls(fn: Callable[..., Any]) -> list[str]:
    """The flashlab objects ``fn`` names (its globals, closure, nested functions), statically."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found = []
    scope = dict(getattr(fn, "__globals__", {}))
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            scope[name] = cell.cell_contents
        except ValueError:                               # an empty cell
            pass
    for c in _code_objects(code):
        ins = list(dis.get_instructions(c))
        for i, op in enumerate(ins):
            if op.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF") and isinstance(op.argval, str):
                hit = _is_flashlab(scope.get(op.argval)) if op.argval in scope else None
                if hit and isinstance(scope[op.argval], types.ModuleType):
                    # flashlab.attention_reference: name the attribute chain, not just the module
                    for nxt in ins[i + 1:]:
                        if nxt.opname not in ("LOAD_ATTR", "LOAD_METHOD"):
                            break
                        hit += f".{nxt.argval}"
                if hit and hit not in found:
                    found.append(hit)
    return found


class _CallsFlashlab(Exception):
    pass


def _guarded(fn: Callable[..., Any], seen: list[str]) -> Callable[..., Any]:
    """``fn``, run under a profiler that stops it when it enters flashlab's own source."""
    def hook(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            # the package's lazy face (flashlab._lazy) only looks a name up: the call it leads to is
            # the one to name
            # only the student's function runs under the hook (the checker calls it): any frame in
            # flashlab's source, the exercises' solutions included, is flashlab's answer
            if path.startswith(str(_PACKAGE)) and path != str(_PACKAGE / "_lazy.py"):
                where = Path(path).relative_to(_PACKAGE.parent).with_suffix("")
                seen.append(f"{'.'.join(where.parts)}.{frame.f_code.co_name}")
                sys.setprofile(None)
                raise _CallsFlashlab(seen[-1])

    def run(*args, **kwargs):
        previous = sys.getprofile()
        sys.setprofile(hook)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(previous)
    run.__name__ = getattr(fn, "__name__", "fn")
    return run


def _uses_flashlab(exercise: str, names: list[str]) -> Feedback:
    return Feedback(exercise, False,
                    f"your function uses flashlab's own code ({', '.join(names)}): graded answers "
                    "compute the result themselves, with numpy; flashlab is the answer key, not "
                    "a library to call here.", "calls_flashlab")


def _compare(exercise: str, fn: Callable[..., Any], reference: Callable[..., Any],
             inputs: Callable[[np.random.Generator], tuple], precision: tuple[float, float], seed: int,
             trials: int, whose: str, verdict: str) -> Feedback | None:
    """Compare ``fn`` with ``reference`` on ``trials`` inputs drawn by ``inputs`` from
    ``numpy.random.default_rng(seed)`` at ``precision``; the first failure's feedback, or None.
    ``whose`` names the inputs in messages ("the instructor's input"), ``verdict`` starts the
    message of a wrong value."""
    seen: list[str] = []
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        args = inputs(rng)
        want = reference(*args)
        where = f"{whose} #{trial + 1} ({_describe(args)})"
        try:
            with np.errstate(all="ignore"):              # an overflow shows in the comparison
                got = _guarded(fn, seen)(*args)
        except _CallsFlashlab:
            return _uses_flashlab(exercise, seen[:1])
        except Exception as exc:                         # the student's code: report, don't crash
            return Feedback(exercise, False, f"on {where} your function raised {type(exc).__name__}: {exc}",
                            "raised_hidden")
        if not _same(got, want, *precision):
            if precision != _EXACT and _same(got, want, *FLOAT16_PRECISION):
                return Feedback(exercise, False, f"on {where} your answer is close but only to about float16 "
                                f"precision: the book accepts a relative error of {precision[0]:g} (what "
                                "float32 reaches). A precision problem, not a wrong formula: keep the sums, "
                                "the exponentials and any running state in float32 or float64.", "low_precision")
            return Feedback(exercise, False, f"{verdict} {where}: check it beyond the examples "
                            "(other shapes, lengths and values).", "hidden_inputs")
    return None


def grade_variant(name: str, fn: Callable[..., Any], *, seed: int = PUBLIC_SEED, trials: int = 5) -> Feedback:
    """Grade ``fn``, the student's function for the graded variant ``name`` (the function a
    variant asks for, e.g. ``"merge_partials"``; the variants are listed in the instructor guide).

    Compares ``fn`` with the variant's reference on ``trials`` inputs drawn from
    ``numpy.random.default_rng(seed)``, at the variant's precision (float answers to float32
    precision, counts exactly), with ``fn`` forbidden to use flashlab's own code. The public
    check uses the default seed, nbgrader's hidden tests the instructor's.
    """
    variants = {v.name: v for v in VARIANTS.values()}
    if name not in variants:
        raise ValueError(f"name={name!r}: one of {', '.join(sorted(variants))}")
    if not callable(fn):
        raise TypeError(f"fn must be the function to grade; got {type(fn).__name__}")
    if names := flashlab_calls(fn):
        return _uses_flashlab(name, names)
    v = variants[name]
    whose = "the example input" if seed == PUBLIC_SEED else "the instructor's input"
    failed = _compare(name, fn, v.reference, v.inputs, v.precision, seed, trials, whose, "wrong on")
    if failed is not None:                   # (a failing Feedback is falsy: no `failed or ...`)
        return failed
    return Feedback(name, True, f"right on {trials} inputs ({whose.removeprefix('the ')}s).")


def grade(exercise: str, fn: Callable[..., Any], *, reference: Callable[..., Any] | None = None,
          seed: int | None = None, trials: int = 5) -> Feedback:
    """Grade ``fn``, the student's function for ``exercise`` (a key of :data:`CHECKERS`).

    Runs the book's checker (its feedback names the usual mistakes) with ``fn`` forbidden to
    use flashlab's own code; then, if ``reference`` and ``seed`` are given, compares ``fn``
    with ``reference`` on ``trials`` inputs drawn by ``INPUTS[exercise]`` from
    ``numpy.random.default_rng(seed)``. Returns the first failing :class:`~flashlab.exercises.Feedback`, else a
    passing one. Print it, then ``assert`` it (``bool(feedback)`` is the verdict).
    """
    if exercise not in CHECKERS:
        raise ValueError(f"exercise={exercise!r}: one of {', '.join(sorted(CHECKERS))}")
    if not callable(fn):
        raise TypeError(f"fn must be the function to grade; got {type(fn).__name__}")
    if (reference is None) != (seed is None):
        raise ValueError("reference and seed go together: the hidden tests give both, the public ones neither")
    if names := flashlab_calls(fn):
        return _uses_flashlab(exercise, names)
    seen: list[str] = []
    feedback = CHECKERS[exercise](_guarded(fn, seen))
    if seen:
        return _uses_flashlab(exercise, seen[:1])
    if not feedback.passed or reference is None or seed is None:
        return feedback
    failed = _compare(exercise, fn, reference, INPUTS[exercise], PRECISION[exercise], seed, trials,
                      "the instructor's input", "passes the book's checks but not")
    if failed is not None:
        return failed
    return Feedback(exercise, True, f"{feedback.message} Also right on {trials} inputs chosen by the instructor.")
