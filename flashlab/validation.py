"""Input validation: the checks every entry point runs, and the validated :class:`Problem`.

Every public entry point goes through :func:`prepare`, so the same bad input gets the same
message everywhere: a ``TypeError`` for a wrong type or dtype, a ``ValueError`` for a wrong
shape or value, each naming the argument and what was expected. The rules for single
numbers are written once: :func:`~flashlab.arguments.as_int` and :func:`~flashlab.arguments.as_real`.

Arguments that only bound something are clamped to the problem, never rejected for being
large: a ``window`` side of ``sys.maxsize`` or ``2**70`` is the unbounded side
(:func:`flashlab.masks.clamp_band`), a ``block_q`` larger than ``Sq`` is ``Sq``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

try:        # numpy has no bfloat16; ml_dtypes (pinned in requirements.txt) gives it one
    from ml_dtypes import bfloat16 as _bf16
    BFLOAT16: np.dtype | None = np.dtype(_bf16)
except ImportError:         # pragma: no cover - without ml_dtypes there are no bfloat16 arrays
    BFLOAT16 = None

from flashlab.arguments import as_bool, as_int, as_real
from flashlab.dropout import keep_threshold
from flashlab.masks import band_from, clamp_band
from flashlab.tiling import FORWARD_BLOCK

__all__ = ["FLOAT_DTYPES", "BFLOAT16", "HALF_DTYPES", "FLOAT_NAMES", "Problem", "contiguous",
           "prepare", "check_alibi_slopes", "check_pair", "check_output_like", "scan_kv",
           "scores_may_overflow"]

#: the input dtypes every entry point accepts; float16 and bfloat16 (``ml_dtypes.bfloat16``)
#: are computed in float32 and returned in their own dtype
FLOAT_DTYPES = (np.float16, np.float32, np.float64) + (() if BFLOAT16 is None else (BFLOAT16,))
#: the half-precision ones (computed in float32)
HALF_DTYPES = (np.float16,) + (() if BFLOAT16 is None else (BFLOAT16,))
#: how the messages name them
FLOAT_NAMES = "float16, bfloat16, float32 or float64"


@dataclass(frozen=True)
class Problem:
    """Validated attention inputs, in the layout the kernels read.

    q (B, H, Sq, Dqk); k (B, Hkv, Sk, Dqk); v (B, Hkv, Sk, Dv); q_rope (B, H, Sq, Dr) or None;
    k_rope (B, Hr, Sk, Dr) or None; mask (Bm, Hm, Sqm, Skm) bool (True = masked out) or None
    and bias (Bb, Hb, Sqb, Skb) float or None, each axis 1 or full (broadcast, never
    expanded); alibi_slopes (1 or B, H) float64 or None with ``alibi_offset`` (an int) and
    ``alibi_sqrt``; band [i - left, i + right] clamped to the lengths; block sizes at most
    the lengths; dropout probability ``dropout_p`` with ``seed`` and ``offset``.

    Frozen: a step that learns something about the inputs (:func:`scan_kv`) returns a new
    problem (``dataclasses.replace``) rather than changing this one, and the squared norms of
    the scan are numbers held here, not a cache keyed by an array's identity.
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
    bias: np.ndarray | None = None
    alibi_slopes: np.ndarray | None = None
    alibi_offset: int = 0
    alibi_sqrt: bool = False
    dropout_p: float = 0.0
    seed: int = 0
    offset: int = 0
    #: ``max_i |x_i|^2`` (float64) of q, k, q_rope, k_rope from :func:`prepare`'s finiteness
    #: scan, for :func:`scores_may_overflow`; ``None`` where not scanned (k with ``scan_kv=False``)
    q_sq_norm: float | None = field(default=None, repr=False, compare=False)
    k_sq_norm: float | None = field(default=None, repr=False, compare=False)
    q_rope_sq_norm: float | None = field(default=None, repr=False, compare=False)
    k_rope_sq_norm: float | None = field(default=None, repr=False, compare=False)
    #: False when :func:`prepare` was asked not to scan k and v (``scan_kv=False``): the
    #: caller must, with :func:`scan_kv` (which returns the scanned problem), or check them as
    #: it reads them (the decode kernel)
    kv_scanned: bool = field(default=True, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int, int, int, int, int, int]:
        """(B, H, Hkv, Sq, Sk, Dqk, Dv)."""
        B, H, Sq, Dqk = self.q.shape
        return B, H, self.k.shape[1], Sq, self.k.shape[2], Dqk, self.v.shape[3]

    @property
    def d_rope(self) -> int:
        return 0 if self.q_rope is None else self.q_rope.shape[3]

    @property
    def drop_threshold(self) -> int:
        """The kernels' integer form of ``dropout_p`` (:func:`flashlab.dropout.keep_threshold`)."""
        return keep_threshold(self.dropout_p)


def _array4(name: str, x, expected: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of shape {expected}; got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"{name} must have shape {expected} (4 dims); got shape {x.shape}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be {FLOAT_NAMES}; got dtype {x.dtype}")
    if min(x.shape) < 1:
        raise ValueError(f"{name} must have every dim >= 1 for shape {expected}; got shape {x.shape}")
    return x


def _positive_int(name: str, x) -> int:
    return as_int(name, x, lo=1, what="an int >= 1")


def _finite(**arrays: np.ndarray) -> dict[str, float]:
    """Raise if an array holds NaN or inf; return ``{name: max squared row norm}`` (kept in the
    :class:`Problem`, so that :func:`scores_may_overflow` reads q and k once)."""
    norms = {}
    for name, x in arrays.items():
        ok, sq = _scan(x)
        if not ok:
            raise ValueError(f"{name} contains NaN or inf; attention inputs must be finite")
        norms[name] = sq
    return norms


#: arrays of at most this many elements are scanned by the serial build of the scan, in the
#: calling thread: a parallel Numba launch wakes a thread pool, which next to torch's spinning
#: OpenMP threads cost 0.13 s per call on this 2-core machine (cProfile of the torch door at
#: (1, 16, 1, 8)). Measured (float32 rows of 32, 2-core machine, best of 100): 2^17 elements
#: serial 15 us, parallel 12 us; 2^19: 61 and 20 us; 2^22: 490 and 247 us; with the other
#: core busy the parallel median was 10-24 ms at every size (the pool waits for its thread)
SMALL_SCAN = 1 << 18


def _scan(x: np.ndarray) -> tuple[bool, float]:
    """``(all finite, max squared norm of the last axis in float64)`` of ``x``.

    float32/float64 arrays in one Numba pass (:mod:`flashlab.input_scan`: measured ~4x
    faster than the NumPy below, which matters for decode, see that module): parallel above
    ``SMALL_SCAN`` elements, else its serial build (one call instead of NumPy's three passes
    and temporaries: ~1 us against ~10 us at (1, 16, 1, 8)). Empty arrays by NumPy.
    """
    if x.dtype in HALF_DTYPES:
        # float16/bfloat16 -> float32 is exact (NaN and inf stay), then the same pass
        x = x.astype(np.float32)
    if x.dtype in (np.float32, np.float64) and x.size:
        from flashlab.input_scan import finite_and_max_sq_norm, finite_and_max_sq_norm_serial
        scan = finite_and_max_sq_norm if x.size > SMALL_SCAN else finite_and_max_sq_norm_serial
        ok, sq = scan(np.ascontiguousarray(x).reshape(-1, x.shape[-1]))
        return bool(ok), float(sq)
    with np.errstate(over="ignore"):
        sq = float(np.max(np.einsum("...d,...d->...", x, x, dtype=np.float64))) if x.size else 0.0
    return bool(np.isfinite(x).all()), sq


def contiguous(x: np.ndarray) -> np.ndarray:
    """C-contiguous and writeable: Numba compiles a separate signature for read-only arrays."""
    x = np.ascontiguousarray(x)
    return x if x.flags.writeable else x.copy()


def _broadcastable4(name: str, x: np.ndarray, target: tuple[int, int, int, int],
                    kind: str) -> np.ndarray:
    """``x`` as a 4-D array whose every axis is 1 or the target's: a view, nothing expanded."""
    if x.ndim > 4 or any(m not in (1, t) for m, t in zip(x.shape[::-1], target[::-1])):
        raise ValueError(f"{name} must be broadcastable to (B, H, Sq, Sk) = {target}; got shape "
                         f"{x.shape} ({kind}, every axis 1 or that size)")
    return contiguous(x.reshape((1,) * (4 - x.ndim) + x.shape))


def check_alibi_slopes(alibi_slopes, B: int, H: int) -> np.ndarray:
    """``alibi_slopes`` checked: a finite float numpy array of shape (H,), (1, H) or (B, H).

    The one rule for every entry point (compat checks the whole array before it cuts it
    into sequences). Returns it unchanged.
    """
    if not isinstance(alibi_slopes, np.ndarray) or alibi_slopes.dtype not in FLOAT_DTYPES:
        raise TypeError(f"alibi_slopes must be a numpy float array ({FLOAT_NAMES}) of shape "
                        f"(H,) or (B, H) = ({H},) or ({B}, {H}); got {alibi_slopes!r:.60}")
    if alibi_slopes.shape not in ((H,), (1, H), (B, H)):
        raise ValueError(f"alibi_slopes must have shape (H,) or (B, H) = ({H},) or ({B}, {H}); "
                         f"got {alibi_slopes.shape}")
    _finite(alibi_slopes=alibi_slopes)
    return alibi_slopes


def check_output_like(name: str, x, p: Problem, *, same_dtype: bool = True) -> np.ndarray:
    """``do`` or ``o`` of a backward: a finite numpy array (B, H, Sq, Dv) of q's dtype.

    The one rule of the kernel backward and the float64 reference backward alike (a nested
    list, another shape, NaN or inf is refused by both). ``same_dtype=False`` (the float64
    reference, which computes everything in float64) accepts any of :data:`FLOAT_DTYPES`
    instead of q's exact dtype. Returns ``x`` unchanged.
    """
    B, H, _, Sq, _, _, Dv = p.shape
    expected = (B, H, Sq, Dv)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of shape (B, H, Sq, Dv) = {expected}; "
                        f"got {type(x).__name__}")
    if x.shape != expected:
        raise ValueError(f"{name} must have shape (B, H, Sq, Dv) = {expected}; got {x.shape}")
    if same_dtype and x.dtype != p.dtype:
        raise TypeError(f"{name} must have q's dtype {p.dtype}; got {x.dtype}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be {FLOAT_NAMES}; got dtype {x.dtype}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf; it must be finite")
    return x


def check_pair(name: str, x, what: str) -> tuple:
    """``x`` as a 2-tuple: ``TypeError`` if not a tuple or list, ``ValueError`` if not of length 2."""
    if not isinstance(x, (tuple, list)):
        raise TypeError(f"{name} must be a pair (left, right) of {what}; got {x!r} ({type(x).__name__})")
    if len(x) != 2:
        raise ValueError(f"{name} must be a pair (left, right) of {what}; got {len(x)} items {x!r}")
    return tuple(x)


def _window(window) -> tuple | None:
    if window is None:
        return None
    window = check_pair("window", window, "ints or None")
    return tuple(None if w is None else as_int(f"window {side}", w, what="an int or None")
                 for side, w in zip(("left", "right"), window))


def prepare(q, k, v, *, scale=None, causal=False, window=None, mask=None,
            q_rope=None, k_rope=None, bias=None, alibi_slopes=None, alibi_offset=None,
            alibi_sqrt=False, dropout_p=0.0, seed=0, offset=0, block_q=FORWARD_BLOCK[0],
            block_k=FORWARD_BLOCK[1], scan_kv: bool = True) -> Problem:
    """Check every argument and return a :class:`Problem` (arrays C-contiguous, dtype unchanged).

    Arguments and defaults as :func:`flashlab.flash_attention` (tiles
    :data:`~flashlab.tiling.FORWARD_BLOCK`). ``scan_kv=False`` leaves the scan of k and v for
    NaN/inf to the caller (``Problem.kv_scanned`` is False; see :func:`scan_kv`): a decode
    step is itself one pass over K and V, and a separate scan first doubled its reads.
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
    scale = as_real("scale", scale, what="a real number or None")
    # the kernels multiply in the compute dtype: float16/float32 inputs are computed in float32
    if q.dtype != np.float64 and abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"scale={scale} overflows float32, the compute dtype of {q.dtype} inputs "
                         f"(|scale| must be < 3.4e38); pass float64 inputs or a smaller scale")

    causal = as_bool("causal", causal)
    # sides beyond the lengths are clamped to them (the same band, no int64 overflow)
    left, right = clamp_band(*band_from(causal, _window(window)), Sq, Sk)

    target = (B, H, Sq, Sk)
    if mask is not None:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"mask must be a numpy bool array broadcastable to (B, H, Sq, Sk) = "
                            f"{target}; got {type(mask).__name__}")
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must have dtype bool (True = masked out); got {mask.dtype}")
        # kept in its own shape: a key-padding mask (B, 1, 1, Sk) stays O(B Sk)
        mask = _broadcastable4("mask", mask, target, "a bool array")

    if bias is not None:
        if not isinstance(bias, np.ndarray):
            raise TypeError(f"bias must be a numpy float array broadcastable to (B, H, Sq, Sk) = "
                            f"{target}; got {type(bias).__name__}")
        if bias.dtype not in FLOAT_DTYPES:
            raise TypeError(f"bias must be {FLOAT_NAMES}; got dtype {bias.dtype}")
        bias = _broadcastable4("bias", bias, target, "a float array")
        if np.isnan(bias).any() or (bias == np.inf).any():
            raise ValueError("bias contains NaN or +inf; it must be finite or -inf (masked)")

    if alibi_slopes is not None:
        alibi_slopes = contiguous(check_alibi_slopes(alibi_slopes, B, H).reshape(-1, H)
                                  .astype(np.float64))
        # flash_attn's alignment by default: bias = -slope |i + Sk - Sq - j|
        alibi_offset = Sk - Sq if alibi_offset is None else as_int(
            "alibi_offset", alibi_offset, lo=-(1 << 62), hi=1 << 62, what="an int or None")
    elif alibi_offset is not None:
        raise ValueError("alibi_offset is used only with alibi_slopes")
    alibi_sqrt = as_bool("alibi_sqrt", alibi_sqrt)

    dropout_p = as_real("dropout_p", dropout_p, lo=0.0, hi=1.0, hi_open=True,
                        what="a real number in [0, 1)")
    seed = as_int("seed", seed, lo=0, hi=(1 << 64) - 1, what="an int in [0, 2**64)")
    offset = as_int("offset", offset, lo=0, hi=(1 << 62) - 1, what="an int in [0, 2**62)")

    # a tile larger than the problem is the problem: scratch is sized from the clamped blocks
    block_q = min(_positive_int("block_q", block_q), Sq)
    block_k = min(_positive_int("block_k", block_k), Sk)
    c = contiguous
    q, k, v = c(q), c(k), c(v)
    q_rope, k_rope = (None, None) if q_rope is None else (c(q_rope), c(k_rope))
    norms = _finite(q=q, k=k, v=v) if scan_kv else _finite(q=q)
    if q_rope is not None:
        norms.update(_finite(q_rope=q_rope, k_rope=k_rope))
    return Problem(q, k, v, q_rope, k_rope, mask, scale,
                   left, right, block_q, block_k, q.dtype, bias, alibi_slopes,
                   0 if alibi_offset is None else alibi_offset, bool(alibi_sqrt), dropout_p,
                   seed, offset, q_sq_norm=norms["q"], k_sq_norm=norms.get("k"),
                   q_rope_sq_norm=norms.get("q_rope"), k_rope_sq_norm=norms.get("k_rope"),
                   kv_scanned=bool(scan_kv))


def scan_kv(p: Problem, *, key_rows: tuple[int, int] | None = None) -> Problem:
    """The scan :func:`prepare` left out with ``scan_kv=False``: raise the same ``ValueError`` if
    k or v holds NaN or inf. Returns the scanned problem: without ``key_rows`` a copy of ``p``
    marked scanned, with k's squared norm for :func:`scores_may_overflow` (``p`` itself is
    frozen and unchanged). With ``key_rows=(lo, hi)`` only the key rows outside ``[lo, hi)``
    are scanned (those a kernel that checked what it read never read) and ``p`` is returned.
    """
    if key_rows is None:
        norms = _finite(k=p.k, v=p.v)
        return dataclasses.replace(p, k_sq_norm=norms["k"], kv_scanned=True)
    lo, hi = key_rows
    for part in (slice(0, lo), slice(hi, None)):
        if p.k[:, :, part].size:
            _finite(k=p.k[:, :, part], v=p.v[:, :, part])
    return p


def scores_may_overflow(p: Problem, compute_dtype) -> bool:
    """Whether a score ``scale (q k^T + q_rope k_rope^T) + bias`` could leave ``compute_dtype``.

    Cauchy-Schwarz bounds every score by ``|scale| max|q_i| max|k_j|`` (+ the rope term, the
    bias and ALiBi's largest values). Below half the dtype's largest value nothing can
    overflow and the kernels skip the per-tile check; above it they check every tile and the
    API raises on a real overflow.
    """
    def max_norm(x, sq):
        # sqrt(max_i |x_i|^2), |x_i|^2 in float64: prepare's scan of this array if it ran
        return math.sqrt(_scan(x)[1] if sq is None else sq)

    with np.errstate(over="ignore"):
        bound = abs(p.scale) * max_norm(p.q, p.q_sq_norm) * max_norm(p.k, p.k_sq_norm)
        if p.q_rope is not None:
            bound += (abs(p.scale) * max_norm(p.q_rope, p.q_rope_sq_norm)
                      * max_norm(p.k_rope, p.k_rope_sq_norm))
        if p.bias is not None:
            finite = p.bias[np.isfinite(p.bias)]
            bound += float(np.abs(finite).max()) if finite.size else 0.0
        if p.alibi_slopes is not None:
            B, H, _, Sq, Sk, _, _ = p.shape
            bound += float(np.abs(p.alibi_slopes).max()) * (Sq + Sk + abs(p.alibi_offset))
    return not bound < float(np.finfo(compute_dtype).max) / 2
