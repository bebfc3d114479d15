"""Which CUDA target the GPU twin runs on: a real GPU, or Numba's CUDA simulator on the CPU.

``numba.cuda`` (the ``numba-cuda`` package) decides **once, when ``numba.cuda`` is first
imported**, between the simulator and the driver, from ``config.ENABLE_CUDASIM``. Its config
module ``numba.cuda.core.config`` *is* ``numba.core.config`` when Numba is installed
(numba-cuda replaces itself by it), and Numba reads the environment at ``import numba``,
which ``import flashlab`` has long done. So setting ``NUMBA_ENABLE_CUDASIM`` later is not
enough: :func:`cuda` sets it and then calls ``numba.core.config.reload_config()``, before
the first ``import numba.cuda``. After that import the choice is fixed for the process.
:func:`cuda` makes the choice the first time any kernel of :mod:`flashlab.gpu` is needed:

1. ``NUMBA_ENABLE_CUDASIM`` set by the user (``1`` or ``0``) is obeyed as it is;
2. otherwise, if the CUDA driver library (``libcuda``) loads and reports at least one device
   (``cuInit`` + ``cuDeviceGetCount`` through ``ctypes``: no toolkit, no ``numba.cuda``
   needed), the real GPU is used;
3. otherwise ``NUMBA_ENABLE_CUDASIM=1`` is set in ``os.environ`` before ``numba.cuda`` is
   imported: the kernels run in the simulator, one thread block at a time, each CUDA thread
   a Python thread, with shared memory, ``syncthreads`` and atomics.

If ``numba.cuda`` was already imported by someone else, that choice stands; a real-GPU
``numba.cuda`` on a machine without a GPU then makes :func:`cuda` raise a ``RuntimeError``
saying to set ``NUMBA_ENABLE_CUDASIM=1`` before the first import.

``import flashlab`` never imports this module nor ``numba.cuda``: only the kernels of
:mod:`flashlab.gpu` do, on first use.
"""
from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["driver_device_count", "cuda", "is_simulator", "describe", "compile_only",
           "STATIC_SHARED_LIMIT"]

#: static shared memory one CUDA thread block may declare (48 KiB on every CUDA GPU)
STATIC_SHARED_LIMIT = 48 * 1024

_ENV = "NUMBA_ENABLE_CUDASIM"
_COMPILE_ONLY = False   # set by compile_only(): the real numba.cuda, to compile (no GPU needed)


def compile_only() -> None:
    """Choose the real ``numba.cuda`` to *compile* kernels (PTX for any ``cc``) on a machine
    that may have no GPU; launching then fails. For :mod:`flashlab.gpu.inspect`; must be called
    before ``numba.cuda`` is first imported."""
    global _COMPILE_ONLY
    if "numba.cuda" in sys.modules and _simulating(sys.modules["numba.cuda"]):
        raise RuntimeError("numba.cuda was already imported as the simulator; call compile_only() first")
    os.environ[_ENV] = "0"
    _COMPILE_ONLY = True


def driver_device_count() -> int:
    """CUDA devices the driver reports (0 without a driver or a device); imports no CUDA package."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if lib.cuInit(0) != 0:
                return 0
            count = ctypes.c_int(0)
            if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
                return 0
            return int(count.value)
        except AttributeError:
            return 0
    return 0


def cuda():
    """The ``numba.cuda`` module, the target chosen as the module docstring says."""
    if "numba.cuda" not in sys.modules and os.environ.get(_ENV, "").strip() == "":
        if driver_device_count() == 0:
            # must happen before the first `import numba.cuda`: numba-cuda reads it only then
            os.environ[_ENV] = "1"
    if "numba.cuda" not in sys.modules:
        # numba read the environment at its import: re-read it (NUMBA_ENABLE_CUDASIM above,
        # or one the user set after importing numba) before numba.cuda reads the config
        # (a reload resets every setting to the environment's: keep the cache folder that
        # flashlab.numba_cache may have set in code for a read-only install)
        from numba.core import config
        cache_dir = config.CACHE_DIR
        config.reload_config()
        config.CACHE_DIR = cache_dir
    from numba import cuda as numba_cuda
    if not _simulating(numba_cuda) and not _COMPILE_ONLY and not numba_cuda.is_available():
        raise RuntimeError("numba.cuda was imported for a real GPU, but no CUDA GPU is usable here; "
                           f"set {_ENV}=1 before numba.cuda is first imported to use the simulator")
    return numba_cuda


def _simulating(numba_cuda) -> bool:
    from numba.core import config
    return bool(config.ENABLE_CUDASIM)


def is_simulator() -> bool:
    """True when :mod:`flashlab.gpu`'s kernels run in Numba's CUDA simulator (chooses the target)."""
    return _simulating(cuda())


def describe() -> str:
    """One line naming the target: the GPU's name, or the simulator."""
    c = cuda()
    if _simulating(c):
        return "Numba CUDA simulator (on the CPU; no GPU)"
    name = c.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)
