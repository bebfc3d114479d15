"""Keep the BLAS that Numba's ``np.dot`` calls to one thread.

Inside ``@njit``, ``np.dot`` calls SciPy's BLAS (``scipy.linalg.cython_blas``), which is a
separate OpenBLAS from NumPy's. The kernels already run one tile per thread under ``prange``;
if each tile gemm also spawned BLAS threads, the two cores would be oversubscribed (measured
on this 2-core machine: ~56 GFLOP/s instead of ~120-150, see DESIGN.md). That library is
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
