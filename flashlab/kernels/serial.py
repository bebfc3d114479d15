"""Serial twins of the parallel kernels: the same Python function compiled without ``parallel``.

A ``@njit(parallel=True)`` kernel starts Numba's thread pool on every call, even with
``numba.set_num_threads(1)``: the ``prange`` loop is lowered to a gufunc that the threading
layer launches. For a problem whose arithmetic is a few thousand multiply-adds that launch
*is* the call (issue 22: (1, 16, 1, 8) forward plus backward through the torch door took
1.0 ms against SDPA's 0.08 ms). :func:`serial_twin` compiles the very same function a second
time with ``parallel=False``, where Numba runs ``prange`` as ``range`` on the calling thread:
one source of truth, two builds. :func:`flashlab.api.kernels_for` picks the build from the
problem's size.

**Same bits.** Every parallel kernel of flashlab already gives the same bits for any thread
count (each work item writes its own outputs, sums run in an order fixed by the shape), and
one thread running the work items in order is one of those thread counts; the tests compare
the two builds bit for bit.

**Cache.** Numba's on-disk cache names a function's files after its qualified name and keys
an entry by signature and bytecode, not by the compile flags: a plain ``njit`` of the same
``py_func`` would read (or overwrite) the parallel build's entry. The twin is a copy of the
function under its own name, ``<name>_serial``, so it has its own cache files.
"""
from __future__ import annotations

import types
from typing import Any

from numba import njit

from flashlab.numba_cache import CACHE

__all__ = ["serial_twin"]


def serial_twin(kernel: Any) -> Any:
    """The ``@njit`` dispatcher ``kernel`` (``parallel=True``) compiled without ``parallel``.

    Same code object, globals, defaults and other options (``fastmath``), cached as every
    flashlab kernel (:data:`flashlab.numba_cache.CACHE`); named
    ``<name>_serial`` (its own cache entries). Calling it runs every ``prange`` iteration on
    the calling thread, in order.
    """
    f = kernel.py_func
    twin = types.FunctionType(f.__code__, f.__globals__, f"{f.__name__}_serial",
                              f.__defaults__, f.__closure__)
    twin.__qualname__ = f"{f.__qualname__}_serial"
    twin.__module__ = f.__module__
    twin.__doc__ = (f"Serial build of :func:`{f.__module__}.{f.__name__}` (no thread pool; "
                    f":mod:`flashlab.kernels.serial`).")
    # the dispatcher's compile options, less parallel (and nopython, which njit implies); the
    # cache flag is not among them: flashlab's one (:mod:`flashlab.numba_cache`)
    options = {key: value for key, value in kernel.targetoptions.items()
               if key not in ("parallel", "nopython")}
    return njit(cache=CACHE, **options)(twin)
