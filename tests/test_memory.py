"""traced_peak: tracemalloc sees NumPy's allocations, temporaries included."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from flashlab import attention_naive
from flashlab.memory import traced_peak
from flashlab.traffic import standard_attention_extra_bytes

MB8 = 8 * 10 ** 6  # one million float64


def test_result_is_counted():
    x, peak = traced_peak(np.ones, 10 ** 6)
    assert x.shape == (10 ** 6,)
    assert MB8 <= peak < MB8 + 64 * 1024


def test_temporaries_are_counted_and_inputs_are_not():
    a = np.ones(10 ** 6)

    def total(x):
        # x * 2 is a temporary of 8 MB that is freed before returning
        return float((x * 2).sum())

    s, peak = traced_peak(total, a)
    assert s == 2e6
    assert MB8 <= peak < MB8 + 64 * 1024  # the temporary, not the 8 MB input


def test_keyword_arguments_and_errors():
    x, peak = traced_peak(np.zeros, shape=(100, 100), dtype=np.float32)
    assert x.dtype == np.float32 and peak >= 40_000
    with pytest.raises(TypeError, match="callable"):
        traced_peak(42)
    with pytest.raises(ZeroDivisionError):
        traced_peak(lambda: 1 / 0)
    assert not tracemalloc.is_tracing()  # stopped even when fn raised
    tracemalloc.start()
    try:
        with pytest.raises(RuntimeError, match="already tracing"):
            traced_peak(np.ones, 3)
    finally:
        tracemalloc.stop()


def test_naive_attention_memory_grows_as_n_squared():
    rng = np.random.default_rng(0)
    # one untraced call first: on a cold Numba cache the first call compiles the input scan,
    # and the compiler's allocations are not the algorithm's (make test's pytest may be the
    # first process to call it)
    attention_naive(*(rng.standard_normal((1, 2, 8, 32), dtype=np.float32) for _ in range(3)))
    peaks = []
    for n in (256, 512):
        q, k, v = (rng.standard_normal((1, 2, n, 32), dtype=np.float32) for _ in range(3))
        _, peak = traced_peak(attention_naive, q, k, v)
        # at least the (B, H, N, N) float32 score matrix
        assert peak >= standard_attention_extra_bytes(n, n, heads=2, elem=4)
        peaks.append(peak)
    assert 3.0 < peaks[1] / peaks[0] < 4.5
