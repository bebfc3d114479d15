"""Python threads calling flashlab at once, under every threading layer Numba can load.

Each layer runs in a subprocess of its own (``NUMBA_THREADING_LAYER`` is read when Numba
loads its layer, once per process): four threads run forward + backward on a shape above
:data:`flashlab.api.SMALL_WORK` (the parallel kernels) and must give the bits of one thread.
Under ``workqueue`` (not thread-safe: concurrent launches aborted the process, issue 35)
flashlab runs its parallel kernels one at a time (:func:`flashlab.numba_cache.thread_safe`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import threading
import numpy as np
import numba
import flashlab
from flashlab import api

rng = np.random.default_rng(0)
# B H S S (Dqk + Dv) = 2 * 2 * 256 * 256 * 32 = 2**23 multiply-adds: twice SMALL_WORK
q, k, v = (rng.standard_normal((2, 2, 256, 16)).astype(np.float32) for _ in range(3))
B, H, S, D = q.shape
assert B * H * S * S * 2 * D > api.SMALL_WORK
do = rng.standard_normal(q.shape).astype(np.float32)

def step():
    o, lse = flashlab.flash_attention(q, k, v, causal=True)
    return (o, lse) + tuple(flashlab.flash_attention_backward(do, q, k, v, o, lse, causal=True))

results, errors = {}, []

def worker(i):
    try:
        results[i] = [step() for _ in range(5)]
    except BaseException as e:    # a clear error is allowed; it is reported, never swallowed
        errors.append(repr(e))

threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
want = step()
for runs in results.values():
    for got in runs:
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
print("layer", numba.threading_layer())
"""


def _layer_loads(layer: str) -> bool:
    """Whether Numba can load ``layer`` here (tbb needs the tbb package)."""
    module = {"omp": "omppool", "tbb": "tbbpool", "workqueue": "workqueue"}[layer]
    probe = f"import numba.np.ufunc.{module}"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


@pytest.mark.parametrize("layer", ["omp", "tbb", "workqueue"])
def test_threads_call_forward_and_backward_at_once_under_each_layer(layer):
    if not _layer_loads(layer):
        pytest.skip(f"Numba's {layer} threading layer cannot be loaded here")
    env = dict(os.environ, NUMBA_THREADING_LAYER=layer, NUMBA_NUM_THREADS="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env,
                         timeout=600)
    # a negative return code is a signal: SIGABRT (-6) is what workqueue did before
    assert run.returncode == 0, f"{layer}: rc {run.returncode}\n{run.stderr[-3000:]}"
    assert f"layer {layer}" in run.stdout
