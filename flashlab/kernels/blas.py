"""Keep the BLAS that Numba's ``np.dot`` calls to one thread.

Inside ``@njit``, ``np.dot`` calls SciPy's BLAS (``scipy.linalg.cython_blas``), which is a
separate OpenBLAS from NumPy's. The kernels already run one tile per thread under ``prange``;
if each tile gemm also spawned BLAS threads, the cores would be oversubscribed. That library is
loaded lazily, so a ``threadpoolctl`` limit set before it is imported misses it: we import it
first, then limit only SciPy's copy, leaving NumPy's BLAS (used by the baselines) alone.
"""
from __future__ import annotations

import scipy.linalg.cython_blas  # noqa: F401  (load SciPy's BLAS now so the limit below sees it)
from threadpoolctl import ThreadpoolController

_controller = ThreadpoolController()
#: the BLAS libraries whose threads were limited to 1 (for inspection in tests and the book)
LIMITED = [lib for lib in _controller.lib_controllers
           if lib.user_api == "blas" and "scipy.libs" in lib.filepath]
for _lib in LIMITED:
    _lib.set_num_threads(1)


# --------------------------------------------------------------------------------------------
# gemm with alpha and beta: C = alpha A B^T + beta C, and C = alpha A B + beta C
#
# ``np.dot(a, b, out)`` always computes ``out = a @ b`` (alpha = 1, beta = 0). Two kernel steps
# need beta = 1, i.e. *accumulating into* an existing tile:
#   S += Q_rope K_rope^T   (RECT-FA's in-place accumulation: no second score buffer)
#   O~ += P~ V_j           (no P~V scratch tile and no separate add pass)
# Numba exposes BLAS gemm only through np.dot, so we call the same C entry point np.dot uses,
# ``numba_xxgemm`` (a thin wrapper over SciPy's BLAS that Numba registers by name). Because it is
# called by *name*, kernels that use it stay cacheable (a ctypes function pointer would not be).
# ``numba.np.linalg._BLAS`` is private Numba API; it is pinned with numba==0.68.1 in requirements.
# --------------------------------------------------------------------------------------------
import numpy as np  # noqa: E402
from numba import types  # noqa: E402
from numba.core.errors import TypingError  # noqa: E402
from numba.extending import overload  # noqa: E402
from numba.np.linalg import _BLAS, get_blas_kind  # noqa: E402

__all__ = ["LIMITED", "gemm_nt", "gemm_nn", "gemm_tn"]

_T, _N = ord("t"), ord("n")


def _require_c_layout(name: str, *arrays) -> None:
    # the BLAS call takes raw pointers and leading dims: a strided view would be read wrongly
    for x in arrays:
        if not isinstance(x, types.Array) or x.ndim != 2 or x.layout != "C":
            raise TypingError(f"{name} needs 2-D C-contiguous arrays; got {x}")


def _xxgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """Column-major BLAS gemm on raw buffers (only callable from @njit code)."""
    raise NotImplementedError("_xxgemm is only available inside @njit code")


@overload(_xxgemm)
def _xxgemm_impl(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    if not isinstance(c, types.Array) or c.dtype not in (types.float32, types.float64):
        return None
    fn = _BLAS().numba_xxgemm(c.dtype)
    kind = ord(get_blas_kind(c.dtype))

    def impl(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        scalars = np.empty(2, dtype=c.dtype)
        scalars[0] = alpha
        scalars[1] = beta
        r = fn(kind, transa, transb, m, n, k, scalars[0:].ctypes, a.ctypes, lda,
               b.ctypes, ldb, scalars[1:].ctypes, c.ctypes, ldc)
        if r != 0:
            raise RuntimeError("BLAS gemm failed")
    return impl


def gemm_nt(a, b, c, alpha, beta):
    """``c = alpha * a @ b.T + beta * c``; a (m, k), b (n, k), c (m, n), C-contiguous, @njit only.

    Row-major ``c`` is column-major ``c^T = b a^T``: so we ask column-major BLAS for
    ``op(b) = b`` stored as the (k, n) matrix ``b^T`` -> transposed, times ``a^T`` as stored.
    """
    raise NotImplementedError("gemm_nt is only available inside @njit code")


@overload(gemm_nt)
def _gemm_nt_impl(a, b, c, alpha, beta):
    _require_c_layout("gemm_nt", a, b, c)

    def impl(a, b, c, alpha, beta):
        m, k = a.shape
        n = b.shape[0]
        if b.shape[1] != k or c.shape[0] != m or c.shape[1] != n:
            raise ValueError("gemm_nt: shapes do not match")
        _xxgemm(_T, _N, n, m, k, alpha, b, k, a, k, beta, c, n)
    return impl


def gemm_nn(a, b, c, alpha, beta):
    """``c = alpha * a @ b + beta * c``; a (m, k), b (k, n), c (m, n), C-contiguous, @njit only."""
    raise NotImplementedError("gemm_nn is only available inside @njit code")


@overload(gemm_nn)
def _gemm_nn_impl(a, b, c, alpha, beta):
    _require_c_layout("gemm_nn", a, b, c)

    def impl(a, b, c, alpha, beta):
        m, k = a.shape
        n = b.shape[1]
        if b.shape[0] != k or c.shape[0] != m or c.shape[1] != n:
            raise ValueError("gemm_nn: shapes do not match")
        # column-major view: c^T (n, m) = b^T (n, k) a^T (k, m), both stored as-is
        _xxgemm(_N, _N, n, m, k, alpha, b, n, a, k, beta, c, n)
    return impl


def gemm_tn(a, b, c, alpha, beta):
    """``c = alpha * a.T @ b + beta * c``; a (k, m), b (k, n), c (m, n), C-contiguous, @njit only."""
    raise NotImplementedError("gemm_tn is only available inside @njit code")


@overload(gemm_tn)
def _gemm_tn_impl(a, b, c, alpha, beta):
    _require_c_layout("gemm_tn", a, b, c)

    def impl(a, b, c, alpha, beta):
        k, m = a.shape
        n = b.shape[1]
        if b.shape[0] != k or c.shape[0] != m or c.shape[1] != n:
            raise ValueError("gemm_tn: shapes do not match")
        # column-major view: c^T (n, m) = b^T (n, k) a (k, m); a is stored as a^T -> transposed
        _xxgemm(_N, _T, n, m, k, alpha, b, n, a, m, beta, c, n)
    return impl
