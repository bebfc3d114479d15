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

# The default tile sizes live here, beside the check of ``block_q``/``block_k``, so that every
# entry point taking flash_attention's arguments (:func:`prepare`, ``flash_attention``,
# ``tiles_computed``, ``walk_forward``) defaults to the same tiles; ``flashlab.api`` re-exports
# them (``flashlab.api.FORWARD_BLOCK``), as api imports this module and not the reverse.

#: The forward's default tile sizes ``(block_q, block_k)``. Measured on this 2-core machine
#: (B=1, H=8, fp32, interleaved runs, speed relative to torch SDPA in the same run): D=128,
#: N=4096: 64x64 0.77x, 128x128 0.85x, 256x64 0.86-0.92x, 256x128 0.95x; QK 192 / V 128,
#: N=8192: 64x64 2.1x, 128x128 2.6x, 256x128 2.85x. A taller q-block re-reads K/V from memory fewer times
#: (once per 256 query rows instead of 64) and gives BLAS larger gemms; 256x128 float32 tiles
#: (128 KiB score tile + 128 KiB accumulator) still fit a core's 1 MiB L2.
FORWARD_BLOCK = (256, 128)
#: The backward's default tile sizes ``(block_q, block_k)``. Measured like the forward's,
#: backward at D=128, N=2048 against torch SDPA's backward in the same run: 64x64 0.80x,
#: 128x64 0.94x, 128x128 0.99x (in an earlier run, with torch slower, 64x64 gave 1.05x).
BACKWARD_BLOCK = (128, 128)


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


def _finite(**arrays: np.ndarray) -> None:
    for name, x in arrays.items():
        if not np.isfinite(x).all():
            raise ValueError(f"{name} contains NaN or inf; attention inputs must be finite")


def _contiguous(x: np.ndarray) -> np.ndarray:
    """C-contiguous and writeable: Numba compiles a separate signature for read-only arrays."""
    x = np.ascontiguousarray(x)
    return x if x.flags.writeable else x.copy()


def prepare(q, k, v, *, scale=None, causal=False, window=None, mask=None,
            q_rope=None, k_rope=None, block_q=FORWARD_BLOCK[0],
            block_k=FORWARD_BLOCK[1]) -> Problem:
    """Check every argument and return a :class:`Problem` (arrays C-contiguous, dtype unchanged).

    Arguments and defaults as :func:`flashlab.flash_attention` (tiles :data:`FORWARD_BLOCK`).
    Raises ``TypeError`` for a wrong type or dtype and ``ValueError`` for a wrong shape or
    value; the message names the argument and the expected shape or value.
    """
    q = _array4("q", q, "(B, H, Sq, Dqk)")
    k = _array4("k", k, "(B, Hkv, Sk, Dqk)")
    v = _array4("v", v, "(B, Hkv, Sk, Dv)")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype} (q, k, v share one dtype); got {x.dtype}")
    B, H, Sq, Dqk = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    if k.shape[0] != B:
        raise ValueError(f"k must have shape (B, Hkv, Sk, Dqk) with B={B} like q; got {k.shape}")
    if k.shape[3] != Dqk:
        raise ValueError(f"k must have shape (B, Hkv, Sk, Dqk) with Dqk={Dqk} as q; got {k.shape}")
    if H % Hkv != 0:
        raise ValueError(f"k must have shape (B, Hkv, Sk, Dqk) with q's heads H={H} a multiple of "
                         f"k's heads Hkv (GQA: H % Hkv == 0); got k {k.shape} for q {q.shape}")
    if v.shape[:3] != (B, Hkv, Sk):
        raise ValueError(f"v must have shape (B, Hkv, Sk, Dv) = ({B}, {Hkv}, {Sk}, Dv) as k; got {v.shape}")

    if (q_rope is None) != (k_rope is None):
        raise ValueError("q_rope and k_rope must be given together (or neither)")
    if q_rope is not None:
        q_rope = _array4("q_rope", q_rope, "(B, H, Sq, Dr)")
        k_rope = _array4("k_rope", k_rope, "(B, Hr, Sk, Dr)")
        for name, x in (("q_rope", q_rope), ("k_rope", k_rope)):
            if x.dtype != q.dtype:
                raise TypeError(f"{name} must have q's dtype {q.dtype}; got {x.dtype}")
        if q_rope.shape[:3] != (B, H, Sq):
            raise ValueError(f"q_rope must have shape (B, H, Sq, Dr) = ({B}, {H}, {Sq}, Dr); got {q_rope.shape}")
        Dr = q_rope.shape[3]
        if k_rope.shape[0] != B or k_rope.shape[2] != Sk or k_rope.shape[3] != Dr:
            raise ValueError(f"k_rope must have shape (B, Hr, Sk, Dr) = ({B}, Hr, {Sk}, {Dr}); got {k_rope.shape}")
        if H % k_rope.shape[1] != 0:
            raise ValueError(f"k_rope must have shape (B, Hr, Sk, Dr) with q's heads H={H} a multiple "
                             f"of k_rope's heads Hr (H % Hr == 0); got k_rope {k_rope.shape}")

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
    _finite(q=q, k=k, v=v)
    if q_rope is not None:
        _finite(q_rope=q_rope, k_rope=k_rope)

    c = _contiguous
    return Problem(c(q), c(k), c(v), None if q_rope is None else c(q_rope),
                   None if k_rope is None else c(k_rope), mask, float(scale),
                   left, right, block_q, block_k, q.dtype)
