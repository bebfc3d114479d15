"""The measurements of the Performance chapter's core path, run once and committed.

``python -m flashlab.bench._page flashlab/data/performance_live.json`` measures this machine's
roofline (a STREAM triad on one thread and on all threads, the numpy float32 matmul peak), the
small one-thread benchmark run the chapter's roofline plots (``PAGE_CONFIG``) and the backward
against its BLAS products (:func:`flashlab.bench.ceiling.backward_ceiling`), and writes them as
one JSON file that ``book/performance.ipynb`` reads: the page then executes in seconds, and its
numbers are those of one recorded run (date and machine included) instead of a new noisy one.
"""
from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange
from threadpoolctl import threadpool_limits

from flashlab.bench.ceiling import backward_ceiling
from flashlab.bench.config import BenchConfig
from flashlab.bench.measure import matmul_gflops
from flashlab.bench.suite import machine_info, run_suite

__all__ = ["PAGE_CONFIG", "triad_bandwidth", "performance_page_run"]

#: the chapter's small live run: B = 1, H = 4, float32, D = 128, non-causal, N 256..2048,
#: flashlab (forward and backward) against numpy naive, three timed calls per case
PAGE_CONFIG = BenchConfig(sizes=(256, 512, 1024, 2048), shapes=((128, 128),), causal=(False,), heads=4,
                          baselines=("numpy_naive",), repeats=3, max_timed_seconds=2.0, memory_sizes=(),
                          mla_sizes=(), matmul_n=2048, matmul_repeats=3, first_call=None)


@njit(parallel=True)
def triad(a, b, c, s):
    # STREAM triad: a = b + s c   (reads 2 arrays, writes 1)
    for i in prange(a.shape[0]):
        a[i] = b[i] + s * c[i]


def triad_bandwidth(n_elements: int = 1 << 24, repeats: int = 7) -> float:
    """Bytes per second of the STREAM triad: 3 arrays of ``n_elements`` float32 moved per call,
    the best of ``repeats`` calls, on the current Numba thread count."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(n_elements, dtype=np.float32) for _ in range(3))
    triad(a, b, c, np.float32(3.0))                      # compile, and touch every page once
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        triad(a, b, c, np.float32(3.0))
        times.append(time.perf_counter() - t0)
    return 3 * a.nbytes / min(times)


def performance_page_run(out: str | Path) -> dict:
    """Measure what the chapter's core path shows and write it to ``out`` (JSON); returns it."""
    threads = numba.get_num_threads()
    bandwidth, peak = {}, {}                             # byte/s and GFLOP/s, by thread setting
    numba.set_num_threads(1)
    try:
        bandwidth["1 thread"] = triad_bandwidth()
        with threadpool_limits(1, user_api="blas"):
            live = run_suite(PAGE_CONFIG)                # one core: Numba and every BLAS on one thread
    finally:
        numba.set_num_threads(threads)
    bandwidth["all threads"] = triad_bandwidth()
    # the larger of two measurements, as the suite does (at its start and its end)
    peak["all threads"] = max(matmul_gflops(2048, 3)["gflops"] for _ in range(2))
    peak["1 thread"] = live["matmul"]["peak_gflops"]
    ceiling = backward_ceiling(n=1024, heads=2, threads=1, with_torch=False, matmul_n=None)
    run = {"date": datetime.now(timezone.utc).isoformat(timespec="minutes"), "machine": machine_info(),
           "threads": threads, "bandwidth": bandwidth, "peak": peak, "live": live, "ceiling": ceiling}
    Path(out).write_text(json.dumps(run, indent=1) + "\n")
    return run


if __name__ == "__main__":
    performance_page_run(sys.argv[1] if len(sys.argv) > 1 else "flashlab/data/performance_live.json")
