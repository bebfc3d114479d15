"""The kernels' vectorised softmax pieces: exp_shifted, exp_nonpositive, row_max and the two
LLVM intrinsics they rest on. Each is compared with NumPy in float64 (stated tolerances)."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from flashlab.kernels.intrinsics import int_bits_as_float32, maxnum
from flashlab.kernels.tile import exp_nonpositive, exp_shifted, row_max


@njit
def _bits(k):
    return int_bits_as_float32(k)


@njit
def _max(a, b):
    return maxnum(a, b)


def test_bit_cast_gives_the_float_with_those_bits():
    for k in (-126, -1, 0, 5, 127):
        # exponent field k + 127, mantissa 0: exactly 2^k
        assert _bits(np.int32((k + 127) << 23)) == np.float32(2.0) ** k
    assert _bits(np.int64(0x3F800000)) == np.float32(1.0)          # int64 truncated to 32 bits
    assert np.isnan(_bits(np.int32(0x7FC00000)))


def test_maxnum_ignores_nan_like_compare_and_select():
    assert _max(np.float32(1.0), np.float32(2.0)) == 2.0
    assert _max(-np.inf, 3.0) == 3.0
    assert _max(np.nan, 3.0) == 3.0 and _max(3.0, np.nan) == 3.0


def test_exp_float32_within_3e_7_relative_and_exact_zeros():
    # e^d on [-86.9, 0]: 2 ulp, 2.2e-7 measured; a re-associated (y + R) - R or Cody-Waite
    # split (the reason the sum's "reassoc" flag stays off exp_nonpositive) breaks this by 1e-3+
    x = np.linspace(-86.9, 0.0, 200_001).astype(np.float32)
    y = x.copy()
    total = exp_shifted(y, np.float32(0.0))
    ref = np.exp(x.astype(np.float64))
    assert y.dtype == np.float32
    assert np.max(np.abs(y - ref) / ref) < 3e-7
    assert abs(total - ref.sum()) / ref.sum() < 1e-6
    # the floor and masked entries: exactly 0, never NaN
    z = np.array([-np.inf, -87.0, -100.0, -1e30, 0.0], dtype=np.float32)
    exp_shifted(z, np.float32(0.0))
    np.testing.assert_array_equal(z, [0.0, 0.0, 0.0, 0.0, 1.0])
    assert exp_nonpositive(np.float32(-np.inf)) == 0.0


@pytest.mark.parametrize("n", [1, 7, 16, 129, 1000])
def test_exp_shifted_row_of_scores(n):
    rng = np.random.default_rng(n)
    for dtype, rtol in ((np.float32, 3e-7), (np.float64, 1e-15)):
        s = (rng.standard_normal(n) * 10).astype(dtype)
        s[rng.random(n) < 0.2] = -np.inf
        shift = s.max() if np.isfinite(s.max()) else 0.0
        got = s.copy()
        total = exp_shifted(got, dtype(shift))
        # the difference x - shift is rounded to the row's dtype, as the kernel computes it
        ref = np.exp((s - dtype(shift)).astype(np.float64))
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=0)
        np.testing.assert_allclose(total, ref.sum(), rtol=max(rtol, 1e-6) * 4)


@pytest.mark.parametrize("n", [1, 7, 16, 129, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_max_is_exact(n, dtype):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    assert row_max(x, dtype(-np.inf)) == x.max()
    assert row_max(x, dtype(100.0)) == 100.0
    x[:] = -np.inf
    assert row_max(x, dtype(-np.inf)) == -np.inf
    x[n // 2] = np.inf
    assert row_max(x, dtype(-np.inf)) == np.inf
