"""Input validation shared by the kernels' API and the reference.

Every public entry point goes through :func:`prepare`, so the same bad input gets the same
message everywhere: a ``TypeError`` for a wrong type or dtype, a ``ValueError`` for a wrong
shape or value, each naming the argument and what was expected.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from flashlab.masks import band_from

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


@dataclass
class Problem:
    """Validated attention inputs, in the layout the kernels read.

    q (B, H, Sq, Dqk); k (B, Hkv, Sk, Dqk); v (B, Hkv, Sk, Dv); q_rope (B, H, Sq, Dr) or None;
    k_rope (B, Hr, Sk, Dr) or None; mask (Bm, Hm, Sq, Sk) bool (True = masked out) or None,
    with Bm in {1, B} and Hm in {1, H}; band [i - left, i + right].
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    q_rope: np.ndarray | None
    k_rope: np.ndarray | None
    mask: np.ndarray | None
    scale: float
    left: int
    right: int
    block_q: int
    block_k: int
    dtype: np.dtype  # the inputs' dtype (outputs are returned in it)

    @property
    def shape(self) -> tuple[int, int, int, int, int, int, int]:
        """(B, H, Hkv, Sq, Sk, Dqk, Dv)."""
        B, H, Sq, Dqk = self.q.shape
        return B, H, self.k.shape[1], Sq, self.k.shape[2], Dqk, self.v.shape[3]

    @property
    def d_rope(self) -> int:
        return 0 if self.q_rope is None else self.q_rope.shape[3]


def _array4(name: str, x, expected: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of shape {expected}; got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"{name} must have shape {expected} (4 dims); got shape {x.shape}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, float32 or float64; got dtype {x.dtype}")
    if min(x.shape) < 1:
        raise ValueError(f"{name} must have every dim >= 1 for shape {expected}; got shape {x.shape}")
    return x


def _positive_int(name: str, x) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 1; got {x!r}")
    if x < 1:
        raise ValueError(f"{name} must be >= 1; got {x}")
    return int(x)


def _finite(name: str, *arrays: np.ndarray) -> None:
    for x in arrays:
        if not np.isfinite(x).all():
            raise ValueError(f"{name} contains NaN or inf; attention inputs must be finite")


def _contiguous(x: np.ndarray) -> np.ndarray:
    """C-contiguous and writeable: Numba compiles a separate signature for read-only arrays."""
    x = np.ascontiguousarray(x)
    return x if x.flags.writeable else x.copy()


def prepare(q, k, v, *, scale=None, causal=False, window=None, mask=None,
            q_rope=None, k_rope=None, block_q=64, block_k=64) -> Problem:
    """Check every argument and return a :class:`Problem` (arrays C-contiguous, dtype unchanged)."""
    q = _array4("q", q, "(B, H, Sq, Dqk)")
    k = _array4("k", k, "(B, Hkv, Sk, Dqk)")
    v = _array4("v", v, "(B, Hkv, Sk, Dv)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, Sq, Dqk = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"k and v must have batch B={B} like q; got k {k.shape}, v {v.shape}")
    Hkv, Sk = k.shape[1], k.shape[2]
    if k.shape[3] != Dqk:
        raise ValueError(f"k must have shape (B, Hkv, Sk, Dqk) with Dqk={Dqk} as q; got {k.shape}")
    if v.shape[1] != Hkv or v.shape[2] != Sk:
        raise ValueError(f"v must have shape (B, Hkv, Sk, Dv) = ({B}, {Hkv}, {Sk}, Dv) as k; got {v.shape}")
    if H % Hkv != 0:
        raise ValueError(f"the number of query heads H={H} must be a multiple of k's heads Hkv={Hkv} (GQA)")

    if (q_rope is None) != (k_rope is None):
        raise ValueError("q_rope and k_rope must be given together (or neither)")
    if q_rope is not None:
        q_rope = _array4("q_rope", q_rope, "(B, H, Sq, Dr)")
        k_rope = _array4("k_rope", k_rope, "(B, Hr, Sk, Dr)")
        if q_rope.dtype != q.dtype or k_rope.dtype != q.dtype:
            raise TypeError(f"q_rope and k_rope must have q's dtype {q.dtype}; got {q_rope.dtype}, {k_rope.dtype}")
        if q_rope.shape[:3] != (B, H, Sq):
            raise ValueError(f"q_rope must have shape (B, H, Sq, Dr) = ({B}, {H}, {Sq}, Dr); got {q_rope.shape}")
        Dr = q_rope.shape[3]
        if k_rope.shape[0] != B or k_rope.shape[2] != Sk or k_rope.shape[3] != Dr:
            raise ValueError(f"k_rope must have shape (B, Hr, Sk, Dr) = ({B}, Hr, {Sk}, {Dr}); got {k_rope.shape}")
        if H % k_rope.shape[1] != 0:
            raise ValueError(f"H={H} must be a multiple of k_rope's heads Hr={k_rope.shape[1]}")

    if scale is None:
        scale = 1.0 / math.sqrt(Dqk + (0 if q_rope is None else q_rope.shape[3]))
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None; got {scale!r}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite; got {scale}")

    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {causal!r}")
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"window must be a pair (left, right) of ints or None; got {window!r}")
        for side, w in zip(("left", "right"), window):
            if w is not None and (isinstance(w, bool) or not isinstance(w, numbers.Integral)):
                raise TypeError(f"window {side} must be an int or None; got {w!r}")
    left, right = band_from(bool(causal), window)

    if mask is not None:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"mask must be a numpy bool array broadcastable to (B, H, Sq, Sk) = "
                            f"({B}, {H}, {Sq}, {Sk}); got {type(mask).__name__}")
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must have dtype bool (True = masked out); got {mask.dtype}")
        target = (B, H, Sq, Sk)
        if mask.ndim > 4 or any(m not in (1, t) for m, t in zip(mask.shape[::-1], target[::-1])):
            raise ValueError(f"mask must be broadcastable to (B, H, Sq, Sk) = {target}; got shape {mask.shape}")
        m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        # keep the batch/head axes as they are (1 or full); expand only the (Sq, Sk) plane
        mask = _contiguous(np.broadcast_to(m4, m4.shape[:2] + (Sq, Sk)))

    block_q = _positive_int("block_q", block_q)
    block_k = _positive_int("block_k", block_k)
    _finite("q, k or v", q, k, v)
    if q_rope is not None:
        _finite("q_rope or k_rope", q_rope, k_rope)

    c = _contiguous
    return Problem(c(q), c(k), c(v), None if q_rope is None else c(q_rope),
                   None if k_rope is None else c(k_rope), mask, float(scale),
                   left, right, block_q, block_k, q.dtype)
