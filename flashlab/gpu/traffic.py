r"""Global-memory requests of a :mod:`flashlab.gpu` launch, counted two independent ways.

1. **The kernels' own counters.** The instrumented build of each kernel (``count=True``) adds
   the bytes every thread loads and stores into a ``(2,)`` counter, read back as a
   :class:`flashlab.traffic.Traffic` (``Traffic.from_counter``). A kernel counts only what its
   author routed through the counted lines.
2. **The simulator's device arrays** (:func:`record_requests`). In Numba's CUDA simulator every
   array a kernel receives is a ``FakeCUDAArray``; inside :func:`record_requests` each launch's
   array arguments are swapped for a counting subclass, so *every* element any thread loads or
   stores through any path, and every atomic, is recorded per argument
   (:class:`ArrayRequests`), whatever the kernel's source says. A kernel that reads K from
   global memory in its inner loop, outside the counted staging helper, shows up here and not
   in its own counter.

What both count are **global-memory requests**: bytes the threads ask of global memory. On a
GPU the L2 cache (50 MB on an H100 or H200) serves repeated requests to the same lines; the
bytes that reach DRAM lie between the *distinct* bytes a launch touches (each element fetched
once, ``RequestLog.distinct_traffic()``) and the requests. ``flashlab.traffic.traffic``'s
``"gpu:*"`` dataflows give the requests in closed form, its ``"fused"`` / ``"standard"``
dataflows with ``kv_hit=1`` the DRAM bytes when L2 holds every re-read; on a GPU with Nsight
Compute, ``python -m flashlab.gpu.bench --ncu`` measures the DRAM bytes themselves.

This module imports no CUDA package at import time; :func:`record_requests` imports the
simulator's classes when it is entered.
"""
from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from flashlab.traffic import Traffic

__all__ = ["COUNTER_SLOTS", "METADATA_ARGUMENTS", "ArrayRequests", "RequestLog",
           "record_requests"]

#: length of the int64 counter array the counting kernels add into (read bytes, write bytes)
COUNTER_SLOTS = 2

#: kernel arguments outside the traffic convention, the kernels' own ``counter``
#: (instrumentation) and the skip tables ``kv_blocks`` / ``q_blocks`` (launch metadata, 16 bytes
#: per query / key block)
METADATA_ARGUMENTS = ("counter", "kv_blocks", "q_blocks")

#: the simulator's atomic operations with the signature ``(array, index, value)``
_ATOMICS = ("add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min", "nanmax",
            "nanmin")


@dataclass
class ArrayRequests:
    """What the threads of one launch asked of one array argument, in elements.

    ``loads`` / ``stores``: element loads and plain stores; ``atomics``: atomic
    read-modify-writes (counted as stores in the launch's :class:`~flashlab.traffic.Traffic`);
    ``loaded`` / ``stored``: boolean masks of the array's shape, True where an element was
    loaded / written at least once.
    """

    launch: int
    kernel: str
    name: str
    itemsize: int
    loaded: np.ndarray
    stored: np.ndarray
    loads: int = 0
    stores: int = 0
    atomics: int = 0

    @property
    def read_bytes(self) -> int:
        return self.itemsize * self.loads

    @property
    def write_bytes(self) -> int:
        return self.itemsize * (self.stores + self.atomics)

    @property
    def distinct_read_bytes(self) -> int:
        """Bytes of the distinct elements loaded, each fetched once, as from an ideal cache."""
        return self.itemsize * int(self.loaded.sum())

    @property
    def distinct_write_bytes(self) -> int:
        return self.itemsize * int(self.stored.sum())


@dataclass
class RequestLog:
    """Every launch inside one :func:`record_requests`: its array arguments' requests."""

    arrays: list[ArrayRequests] = field(default_factory=list)
    launches: list[str] = field(default_factory=list)

    def _pick(self, ignore) -> list[ArrayRequests]:
        return [a for a in self.arrays if a.name not in ignore]

    def traffic(self, ignore: tuple[str, ...] = METADATA_ARGUMENTS) -> Traffic:
        """All launches' requests in bytes, the arguments named in ``ignore`` left out."""
        picked = self._pick(ignore)
        return Traffic(sum(a.read_bytes for a in picked), sum(a.write_bytes for a in picked))

    def distinct_traffic(self, ignore: tuple[str, ...] = METADATA_ARGUMENTS) -> Traffic:
        """Each launch's distinct elements loaded and written, in bytes: the DRAM traffic if the
        cache served every repeated request (a lower bound for the DRAM bytes of the launches)."""
        picked = self._pick(ignore)
        return Traffic(sum(a.distinct_read_bytes for a in picked),
                       sum(a.distinct_write_bytes for a in picked))

    def by_argument(self) -> dict[str, Traffic]:
        """Requests per argument name, summed over the launches (metadata included)."""
        out: dict[str, Traffic] = {}
        for a in self.arrays:
            out[a.name] = out.get(a.name, Traffic(0, 0)) + Traffic(a.read_bytes, a.write_bytes)
        return out

    def rows(self) -> list[list]:
        """One row per (launch, argument): kernel, argument, loads, stores, atomics (elements),
        read and written bytes, distinct read and written bytes."""
        return [[a.kernel, a.name, a.loads, a.stores, a.atomics, a.read_bytes, a.write_bytes,
                 a.distinct_read_bytes, a.distinct_write_bytes] for a in self.arrays]


@contextmanager
def record_requests() -> Iterator[RequestLog]:
    """Record every global-memory request of every kernel launched inside the ``with`` block.

    Numba's CUDA simulator only (``RuntimeError`` on a real GPU, where Nsight Compute counts
    instead). Launches run as usual, a little slower; the log fills as they run::

        with record_requests() as log:
            o, lse, own = flash_attention_gpu(q, k, v, count_traffic=True)
        assert log.traffic() == own
    """
    from flashlab.gpu.target import is_simulator
    if not is_simulator():
        raise RuntimeError("record_requests counts in Numba's CUDA simulator only; on a GPU use "
                           "Nsight Compute (python -m flashlab.gpu.bench --ncu records its DRAM bytes)")
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator import kernelapi
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray

    log = RequestLog()
    lock = threading.Lock()

    class CountingArray(FakeCUDAArray):
        """A device array whose element loads and stores are added to one log entry."""

        def __init__(self, ary, entry: ArrayRequests, loaded, stored):
            super().__init__(ary)
            self._entry, self._loaded, self._stored = entry, loaded, stored

        def __getitem__(self, idx):
            ret = self._ary[idx]
            if isinstance(ret, np.ndarray):
                # a view (a row, a tile): no request yet, its elements count when read
                return CountingArray(ret, self._entry, self._loaded[idx], self._stored[idx])
            with lock:
                self._entry.loads += 1
                self._loaded[idx] = True
            return ret

        def __setitem__(self, idx, val):
            self._ary[idx] = val
            with lock:
                self._entry.stores += int(np.size(self._stored[idx]))
                self._stored[idx] = True

    def atomic(name, original):
        def counted(self, array, index, val):
            item = getattr(array, "_item", array)
            if not isinstance(item, CountingArray):
                return original(self, array, index, val)
            # one read-modify-write request, done on the bare array
            old = original(self, FakeWithinKernelCUDAArray(FakeCUDAArray(item._ary)), index, val)
            with lock:
                item._entry.atomics += 1
                item._stored[index] = True
            return old
        counted.__name__ = name
        return counted

    launch_original = sim_kernel.FakeCUDAKernel.__call__

    def launch(self, *args):
        if self._device or sim_kernel._get_kernel_context():
            return launch_original(self, *args)          # a device function: no new launch
        names = list(inspect.signature(self.fn).parameters)
        index = len(log.launches)
        log.launches.append(self.fn.__name__)
        wrapped = []
        for name, arg in zip(names, args):
            ary = arg._ary if isinstance(arg, FakeCUDAArray) else arg
            if isinstance(ary, np.ndarray) and ary.ndim > 0:
                entry = ArrayRequests(index, self.fn.__name__, name, ary.itemsize,
                                      np.zeros(ary.shape, bool), np.zeros(ary.shape, bool))
                log.arrays.append(entry)
                arg = CountingArray(ary, entry, entry.loaded, entry.stored)
            wrapped.append(arg)
        return launch_original(self, *wrapped)

    saved = {name: getattr(kernelapi.FakeCUDAAtomic, name) for name in _ATOMICS
             if hasattr(kernelapi.FakeCUDAAtomic, name)}
    sim_kernel.FakeCUDAKernel.__call__ = launch
    for name, original in saved.items():
        setattr(kernelapi.FakeCUDAAtomic, name, atomic(name, original))
    try:
        yield log
    finally:
        sim_kernel.FakeCUDAKernel.__call__ = launch_original
        for name, original in saved.items():
            setattr(kernelapi.FakeCUDAAtomic, name, original)
