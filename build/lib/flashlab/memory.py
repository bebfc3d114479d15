"""Measure the peak memory a function allocates, with the standard library's ``tracemalloc``.

NumPy reports the data buffers of its arrays to ``tracemalloc`` (since NumPy 1.13), so the
peak seen here includes every array a NumPy computation creates, temporaries included.

Numba's runtime (0.68) reports the arrays it allocates inside ``@njit`` code to
``tracemalloc`` too (checked: an 8 MB ``np.empty`` in a kernel shows up), so a kernel's
per-tile buffers are counted; they are O(block_q x block_k) per thread, independent of the
sequence length. What is *not* seen: memory of BLAS libraries and anything allocated outside
Python's and Numba's allocators. ``python -m flashlab.bench`` measures the resident set of a
fresh process instead, which sees everything.
"""
from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

__all__ = ["traced_peak"]


def traced_peak(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, int]:
    """Call ``fn(*args, **kwargs)`` and return ``(result, peak_bytes)``.

    ``peak_bytes`` is the largest amount of memory traced by ``tracemalloc`` at any moment of
    the call, counted from the memory already in use when the call starts, so inputs created
    before the call are not included but the returned result is. Run the function once before
    measuring if its first call compiles or loads caches (Numba), or that work is counted too.

    Raises ``TypeError`` if ``fn`` is not callable and ``RuntimeError`` if ``tracemalloc`` is
    already tracing (a nested measurement would reset the outer one's peak).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable; got {type(fn).__name__}")
    if tracemalloc.is_tracing():
        raise RuntimeError("tracemalloc is already tracing; traced_peak cannot be nested "
                           "or run under another tracemalloc session")
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        result = fn(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - start
