"""flashlab.rope against the complex-number formulation of RoPE, written here independently.

RoPE rotates feature pair i of the token at position m by m * theta_i, theta_i = base^(-2i/D):
viewing the pair as a complex number z, z' = z * exp(1j * m * theta_i). The conventions differ
only in which features form a pair: (x_i, x_{i+D/2}) for rotate-half, (x_2i, x_2i+1) for
interleaved. The expected values below use numpy's complex arithmetic, never flashlab's code.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashlab import rope
from flashlab.rope import apply_rope, mla_rope, pair_indices, rope_frequencies


def rope_complex(x: np.ndarray, pos: np.ndarray, base: float, interleaved: bool) -> np.ndarray:
    """RoPE as complex multiplication, float64: the test's own reference."""
    x = x.astype(np.float64)
    D = x.shape[-1]
    theta = 1.0 / base ** (np.arange(0, D, 2, dtype=np.float64) / D)
    if interleaved:
        z = x[..., 0::2] + 1j * x[..., 1::2]
    else:
        z = x[..., : D // 2] + 1j * x[..., D // 2:]
    z = z * np.exp(1j * np.asarray(pos, dtype=np.float64)[..., None] * theta)
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
    else:
        out[..., : D // 2], out[..., D // 2:] = z.real, z.imag
    return out


def rand(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


POSITIONS = {
    "default": lambda S, B: None,
    "offset": lambda S, B: np.arange(S) + 1000,                     # decoding after a cache
    "scattered": lambda S, B: np.random.default_rng(3).integers(-50, 5000, S),
    "per-batch": lambda S, B: (np.arange(S)[None, None, :] + 7 * np.arange(B)[:, None, None]),
}


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
@pytest.mark.parametrize("dim", [2, 8, 64])
@pytest.mark.parametrize("pos_kind", POSITIONS)
def test_matches_complex_formulation(interleaved, dim, pos_kind):
    B, H, S = 2, 3, 11
    x = rand(B, H, S, dim, seed=dim)
    pos = POSITIONS[pos_kind](S, B)
    out = apply_rope(x, pos, interleaved=interleaved)
    pos = np.arange(S) if pos is None else pos
    expected = rope_complex(x, pos, 10000.0, interleaved)
    assert out.shape == x.shape and out.dtype == x.dtype
    # float64 angles m * theta carry an absolute error ~ |m| * 1e-16
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12 + 1e-15 * np.abs(pos).max())


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_other_base_and_float32_large_positions(interleaved):
    """float32 in, float32 out, rounded once: angles of positions ~1e5 are computed in float64."""
    x = rand(1, 2, 64, 64, seed=1, dtype=np.float32)
    pos = np.arange(64) * 1500 + 3
    for base in (10000.0, 500000.0):
        out = apply_rope(x, pos, base=base, interleaved=interleaved)
        assert out.dtype == np.float32
        expected = rope_complex(x, pos, base, interleaved)
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6 * np.abs(x).max())


def test_frequencies():
    theta = rope_frequencies(64)
    assert theta.shape == (32,) and theta.dtype == np.float64
    np.testing.assert_allclose(theta, 10000.0 ** (-np.arange(0, 64, 2) / 64), rtol=1e-15)
    assert theta[0] == 1.0 and np.all(np.diff(theta) < 0)


def test_pairs_of_the_two_conventions():
    a, b = pair_indices(8)
    np.testing.assert_array_equal(a, [0, 1, 2, 3])
    np.testing.assert_array_equal(b, [4, 5, 6, 7])
    a, b = pair_indices(8, interleaved=True)
    np.testing.assert_array_equal(a, [0, 2, 4, 6])
    np.testing.assert_array_equal(b, [1, 3, 5, 7])


def test_conventions_differ_by_a_feature_permutation():
    """Permuting features (x0, x2, .., x1, x3, ..) turns interleaved RoPE into rotate-half RoPE
    (the permutation Hugging Face applies to DeepSeek's q_pe/k_pe); the two differ otherwise."""
    x = rand(2, 16, 32, seed=4)
    perm = np.r_[0:32:2, 1:32:2]
    pos = np.arange(16) * 3
    np.testing.assert_allclose(apply_rope(x[..., perm], pos),
                               apply_rope(x, pos, interleaved=True)[..., perm], atol=1e-12)
    assert np.abs(apply_rope(x, pos) - apply_rope(x, pos, interleaved=True)).max() > 0.1


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_score_depends_only_on_relative_position(interleaved):
    """<R_m q, R_n k> is the same for every (m, n) with the same m - n, and changes with m - n."""
    D = 64
    q, k = rand(D, seed=5), rand(D, seed=6)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q[None], np.array([m]), interleaved=interleaved)[0]
        kn = apply_rope(k[None], np.array([n]), interleaved=interleaved)[0]
        return float(qm @ kn)

    for delta in (0, 1, 7, -13, 300):
        scores = [score(m, m - delta) for m in (0, 5, 1000, 40000)]
        np.testing.assert_allclose(scores, scores[0], rtol=1e-9, atol=1e-9)
    assert abs(score(10, 3) - score(10, 4)) > 1e-3
    # without rotation the score is q . k; at m = n it is unchanged (R_m^T R_m = I)
    np.testing.assert_allclose(score(17, 17), q @ k, rtol=1e-12)


def test_rotation_keeps_norms_and_position_zero_is_identity():
    x = rand(3, 5, 16, seed=7)
    out = apply_rope(x, np.arange(5) * 11)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    np.testing.assert_array_equal(apply_rope(x, np.zeros(5, dtype=int)), x)


def test_mla_rope_shares_one_key_head():
    """q_rope per head, k_rope one head for all: each is rotated by its own positions, and the
    rope part of head h's score is the complex formula's (q positions after 8 cached keys)."""
    B, H, Sq, Sk, Dr = 2, 4, 3, 11, rope.DEEPSEEK_V3_ROPE_DIM
    q_r, k_r = rand(B, H, Sq, Dr, seed=8), rand(B, 1, Sk, Dr, seed=9)
    q_pos = np.arange(Sq) + 8
    q2, k2 = mla_rope(q_r, k_r, q_positions=q_pos, interleaved=True)
    assert q2.shape == q_r.shape and k2.shape == (B, 1, Sk, Dr)
    np.testing.assert_allclose(q2, rope_complex(q_r, q_pos, 10000.0, True), atol=1e-12)
    np.testing.assert_allclose(k2, rope_complex(k_r, np.arange(Sk), 10000.0, True), atol=1e-12)
    scores = q2 @ k2.swapaxes(-1, -2)        # (B, H, Sq, Sk): the one k_rope head broadcast
    assert scores.shape == (B, H, Sq, Sk)


def test_deepseek_v3_dims():
    """The head dims of the RECT-FA article: Q/K 192 = 128 + 64, V 128."""
    assert rope.DEEPSEEK_V3_NOPE_DIM + rope.DEEPSEEK_V3_ROPE_DIM == 192
    assert rope.DEEPSEEK_V3_V_DIM == 128
    assert rope.DEEPSEEK_V3_HEADS == 128 and rope.DEEPSEEK_V3_ROPE_BASE == 10000.0


@pytest.mark.parametrize("call, exc, match", [
    (lambda: apply_rope(rand(4, 7)), ValueError, "even"),
    (lambda: apply_rope(rand(7)), ValueError, "at least 2 dims"),
    (lambda: apply_rope(np.ones((4, 8), dtype=np.int64)), TypeError, "float16, float32 or float64"),
    (lambda: apply_rope([[1.0, 2.0]]), TypeError, "numpy.ndarray"),
    (lambda: apply_rope(rand(4, 8), np.arange(4) * 0.5), TypeError, "integer"),
    (lambda: apply_rope(rand(4, 8), np.arange(5)), ValueError, "broadcast"),
    (lambda: apply_rope(rand(4, 8), np.zeros((2, 4), dtype=int)), ValueError, "broadcast"),
    (lambda: apply_rope(rand(4, 8), base=1.0), ValueError, "base"),
    (lambda: apply_rope(rand(4, 8), interleaved=1), TypeError, "interleaved"),
    (lambda: rope_frequencies(7), ValueError, "even"),
    (lambda: rope_frequencies(8.0), TypeError, "dim"),
    (lambda: mla_rope(rand(1, 4, 3, 8), rand(1, 3, 3, 8)), ValueError, "multiple"),
    (lambda: mla_rope(rand(1, 4, 3, 8), rand(1, 1, 3, 6)), ValueError, "k_rope must have shape"),
    (lambda: mla_rope(rand(4, 3, 8), rand(1, 1, 3, 8)), ValueError, "4 dims"),
])
def test_bad_inputs_raise(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
