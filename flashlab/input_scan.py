"""One parallel pass over an input: is it finite, and what is its largest row norm?

:func:`flashlab.validation.prepare` rejects non-finite q, k, v, and
:func:`flashlab.validation.scores_may_overflow` bounds the scores by ``|scale| max|q_i| max|k_j|``.
Done with NumPy (``np.isfinite(x).all()``, then an ``einsum`` in float64 for the norms) that
is about four single-threaded passes over K and one and a half over V, each allocating a
temporary. For the forward at large N this is noise, but a decode step (:mod:`flashlab.kernels.decode`)
is itself one pass over K and V, and the NumPy checks took several times the kernel's time.
This kernel reads each element once, on every
core, with no temporary.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from flashlab.numba_cache import CACHE, serial_twin

__all__ = ["finite_and_max_sq_norm", "finite_and_max_sq_norm_serial", "SCAN_CHUNKS"]

#: The number of chunks the rows are cut into, one parallel item each. It is a constant because
#: the result (a max and an "and") does not depend on the order and nothing is gained by varying it.
SCAN_CHUNKS = 64


@njit(fastmath={"reassoc", "contract"}, cache=CACHE)
def _row_sq_norm(x2, r):
    # |x_r|^2 in float64; reassoc lets LLVM keep SIMD partial sums (the value only bounds the
    # scores, its last bit does not matter)
    acc = 0.0
    for d in range(x2.shape[1]):
        xd = np.float64(x2[r, d])
        acc += xd * xd
    return acc


@njit(parallel=True, cache=CACHE)
def finite_and_max_sq_norm(x2):
    """``(all finite, max_r |x_r|^2)`` of a 2-D C-contiguous array ``x2`` (rows, d).

    The norm is summed in float64. A row whose sum is not finite is scanned element by element:
    it may be a float64 input whose squares overflow (finite, norm ``inf``) rather than NaN/inf.
    """
    n = x2.shape[0]
    chunks = min(n, SCAN_CHUNKS)
    best = np.zeros(chunks)
    finite = np.ones(chunks, dtype=np.bool_)
    for c in prange(chunks):
        lo = c * n // chunks
        hi = (c + 1) * n // chunks
        m = 0.0
        ok = True
        for r in range(lo, hi):
            s = _row_sq_norm(x2, r)
            if not math.isfinite(s):
                for d in range(x2.shape[1]):
                    if not math.isfinite(x2[r, d]):
                        ok = False
                s = np.inf
            m = max(m, s)
        best[c] = m
        finite[c] = ok
    return finite.all(), best.max()


#: :func:`finite_and_max_sq_norm` built without ``parallel`` (:func:`~flashlab.numba_cache.serial_twin`):
#: one pass on the calling thread, for arrays too small to wake the thread pool
finite_and_max_sq_norm_serial = serial_twin(finite_and_max_sq_norm)
