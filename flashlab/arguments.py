"""One rule per kind of scalar argument: ints, reals and bools, checked the same way everywhere.

A wrong *type* (a float where an int is expected, a string, a bool posing as a number) raises
``TypeError``; a right type with a wrong *value* (out of range, not finite) raises
``ValueError``. Both messages name the argument and say what was expected and what was given,
e.g. ``block_q must be an int >= 1; got 4.0 (float)``. NumPy scalars are accepted (``np.int64``
where an int is expected); Python ints of any size are accepted and range-checked.

This module imports nothing of flashlab, so every layer can use it.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["as_int", "as_real", "as_bool"]


def as_int(name: str, x, *, lo: int | None = None, hi: int | None = None,
           what: str = "an int") -> int:
    """``x`` as a Python int: an ``int`` or NumPy integer (never a bool, float or str).

    ``TypeError`` for a wrong type, ``ValueError`` outside ``[lo, hi]``; both name ``name``.
    """
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be {what}; got {x!r} ({type(x).__name__})")
    x = int(x)
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        bounds = (f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
        raise ValueError(f"{name} must be {bounds}; got {x}")
    return x


def as_real(name: str, x, *, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False, hi_open: bool = False, what: str = "a real number") -> float:
    """``x`` as a finite Python float (ints and NumPy scalars accepted; bools, str rejected)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be {what}; got {x!r} ({type(x).__name__})")
    x = float(x)
    # a comparison, not math.isfinite: under torch.compile(dynamic=True) x may be a SymFloat,
    # on which a comparison is a guard Dynamo traces and math.isfinite is an untraceable call
    # (NaN fails both comparisons, as it fails isfinite)
    if not -math.inf < x < math.inf:
        raise ValueError(f"{name} must be finite; got {x}")
    if hi is None and lo is not None and (x <= lo if lo_open else x < lo):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}; got {x}")
    if hi is not None and ((lo is not None and (x <= lo if lo_open else x < lo))
                           or (x >= hi if hi_open else x > hi)):
        raise ValueError(f"{name} must lie in {'(' if lo_open else '['}{lo}, {hi}"
                         f"{')' if hi_open else ']'}; got {x}")
    return x


def as_bool(name: str, x) -> bool:
    """``x`` as a Python bool: a ``bool`` or ``numpy.bool_`` only (never 0/1, never None)."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {x!r} ({type(x).__name__})")
    return bool(x)
