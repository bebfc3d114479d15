"""Measure the peak memory a function allocates, with the standard library's ``tracemalloc``.

NumPy reports the data buffers of its arrays to ``tracemalloc`` (since NumPy 1.13), so the
peak seen here includes every array a NumPy computation creates, temporaries included.

What is *not* seen: memory Numba's runtime allocates inside ``@njit`` code (``np.empty`` in a
kernel, per-thread tile buffers), memory of BLAS libraries, and anything allocated outside
Python's allocators. For :func:`flashlab.flash_attention` the traced peak is therefore the
arrays created on the Python side (output, LSE), not the kernel's small per-tile workspaces;
those are O(block_q x block_k) per thread, independent of the sequence length.
"""
from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any


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
