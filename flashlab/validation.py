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
from flashlab.input_scan import finite_and_max_sq_norm, finite_and_max_sq_norm_serial
from flashlab.kernels.options import ScoresStage, scores_stage, takes_scores_stage
from flashlab.masks import band_from, clamp_band
from flashlab.numba_cache import thread_safe
from flashlab.tiling import FORWARD_BLOCK, runs_decode

__all__ = ["FLOAT_DTYPES", "BFLOAT16", "HALF_DTYPES", "FLOAT_NAMES", "Problem", "contiguous",
           "prepare", "prepare_like", "Part", "prepare_parts", "check_alibi_slopes", "check_pair",
           "check_output_like", "scan_kv",
           "scores_may_overflow", "Door", "KERNEL", "operands", "check_operand", "check_same_dtype",
           "check_rope_pair", "check_rope", "rope_operands", "check_like", "check_lse", "check_scale",
           "check_dropout", "check_seed", "check_offset", "packed_sequences", "backward_operands"]

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

    A problem exists only checked: :func:`prepare`, :func:`prepare_like` and
    :func:`prepare_parts` are the only makers, and every value a later call adds (a
    backward's ``do``, ``o``, ``lse``) is checked
    by the function that receives it. One scan is lazy by the problem's kind, fixed when the
    problem is made: K and V of a :attr:`lazy_kv` problem are scanned for NaN/inf by whoever
    runs a kernel on them (the decode kernel as it reads them, any other kernel's caller with
    :func:`scan_kv` first).

    Frozen: a step that learns something about the inputs (:func:`scan_kv`) returns a new
    problem (a copy with the new fields) rather than changing this one, and the squared norms of
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
    #: the scores stage's options (what turns a scaled product into a score; all off by
    #: default), checked by their rules in :func:`flashlab.kernels.options.scores_stage`
    scores: ScoresStage = ScoresStage()
    #: ``max_i |x_i|^2`` (float64) of q, k, q_rope, k_rope from :func:`prepare`'s finiteness
    #: scan, for :func:`scores_may_overflow`; ``None`` where not scanned (k of a :attr:`lazy_kv`
    #: problem before :func:`scan_kv`)
    q_sq_norm: float | None = field(default=None, repr=False, compare=False)
    k_sq_norm: float | None = field(default=None, repr=False, compare=False)
    q_rope_sq_norm: float | None = field(default=None, repr=False, compare=False)
    k_rope_sq_norm: float | None = field(default=None, repr=False, compare=False)
    #: True for the kind whose K and V are scanned lazily, a short query (``Sq <=``
    #: :data:`~flashlab.tiling.DECODE_MAX_SQ`) without RoPE operands, made by the kernel API's
    #: forward (``prepare(lazy_kv=True)``). A decode step is itself one pass over K and V, and
    #: a separate scan first doubled its reads: the decode kernel checks what it reads, and a
    #: caller that runs another kernel on such a problem scans first (:func:`scan_kv`). Every
    #: copy keeps it (a scanned copy too: the kind does not change)
    lazy_kv: bool = field(default=False, repr=False, compare=False)
    #: (B, H, Hkv, Sq, Sk, Dqk, Dv), worked out once (a small call reads it ~10 times)
    shape: tuple[int, int, int, int, int, int, int] = field(init=False, repr=False, compare=False)
    #: the kernels' integer form of ``dropout_p`` (:func:`flashlab.dropout.keep_threshold`)
    drop_threshold: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", self._shape())
        object.__setattr__(self, "drop_threshold", keep_threshold(self.dropout_p))

    def _shape(self) -> tuple[int, int, int, int, int, int, int]:
        B, H, Sq, Dqk = self.q.shape
        return B, H, self.k.shape[1], Sq, self.k.shape[2], Dqk, self.v.shape[3]

    @property
    def d_rope(self) -> int:
        return 0 if self.q_rope is None else self.q_rope.shape[3]

    def _with(self, **changes) -> Problem:
        """A copy with ``changes``: ``dataclasses.replace`` for fields this module sets itself,
        without replace's call of ``__init__`` over every field (the fields were checked when
        ``self`` was made)."""
        new = object.__new__(Problem)
        d = new.__dict__
        d.update(self.__dict__, **changes)
        if "q" in changes or "k" in changes or "v" in changes:
            d["shape"] = new._shape()
        return new

    def with_blocks(self, block_q: int, block_k: int) -> Problem:
        """The problem with tiles ``block_q x block_k``, clamped to the lengths as :func:`prepare`
        clamps them (a tile larger than the problem is the problem; each an int >= 1, checked
        here); ``self`` if unchanged."""
        block_q = min(_positive_int("block_q", block_q), self.q.shape[2])
        block_k = min(_positive_int("block_k", block_k), self.k.shape[2])
        if (block_q, block_k) == (self.block_q, self.block_k):
            return self
        return self._with(block_q=block_q, block_k=block_k)



def _operand_norms(door: Door | None, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                   lazy_kv: bool) -> dict[str, float]:
    """The finiteness scan of q, k, v (of q alone for a :attr:`Problem.lazy_kv` problem)."""
    return _finite(door, q=q) if lazy_kv else _finite(door, q=q, k=k, v=v)


def _positive_int(name: str, x) -> int:
    return as_int(name, x, lo=1, what="an int >= 1")


def _finite(door: Door | None = None, **arrays: np.ndarray) -> dict[str, float]:
    """Raise if an array holds NaN or inf (naming it as ``door`` does); return ``{name: max
    squared row norm}`` (kept in the :class:`Problem`, so that :func:`scores_may_overflow`
    reads q and k once)."""
    norms = {}
    for name, x in arrays.items():
        ok, sq = _scan(x)
        if not ok:
            shown = name if door is None else door.name(name)
            raise ValueError(f"{shown} contains NaN or inf; attention inputs must be finite")
        norms[name] = sq
    return norms


#: arrays of at most this many elements are scanned by the serial build of the scan, in the
#: calling thread: a parallel Numba launch wakes a thread pool, which can wait for torch's
#: spinning OpenMP threads; the parallel scan pays off only on large arrays
SMALL_SCAN = 1 << 18
#: the parallel scan, callable from several Python threads at once under any threading layer
_PARALLEL_SCAN = thread_safe(finite_and_max_sq_norm)


def _scan(x: np.ndarray) -> tuple[bool, float]:
    """``(all finite, max squared norm of the last axis in float64)`` of ``x``.

    float32/float64 arrays in one Numba pass (:mod:`flashlab.input_scan`, faster than the
    NumPy below, which matters for decode, see that module): parallel above ``SMALL_SCAN``
    elements, else its serial build (one call instead of NumPy's three passes and
    temporaries). Empty arrays by NumPy.
    """
    # 'f' float32, 'd' float64 in the machine's byte order (a dtype == type test is ~0.3 us)
    kind = x.dtype.char if x.dtype.isnative else "?"
    if kind not in "fd" and x.dtype in HALF_DTYPES:
        # float16/bfloat16 -> float32 is exact (NaN and inf stay), then the same pass
        x = x.astype(np.float32)
        kind = "f"
    if kind in "fd" and x.size:
        scan = _PARALLEL_SCAN if x.size > SMALL_SCAN else finite_and_max_sq_norm_serial
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
    return check_like(name, x, (B, H, Sq, Dv), "(B, H, Sq, Dv)", p.dtype if same_dtype else None)


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


def _band(causal, window, Sq: int, Sk: int) -> tuple[int, int]:
    """The band ``[i - left, i + right]`` of ``causal`` and ``window``, each side clamped to the
    lengths (a side beyond them is the unbounded side: the same band, no int64 overflow)."""
    window = _window(window)
    return clamp_band(*band_from(as_bool("causal", causal), window), Sq, Sk)


def _mask(mask, target: tuple[int, int, int, int]) -> np.ndarray | None:
    """``mask`` checked: a bool array broadcastable to ``target`` = (B, H, Sq, Sk), as a 4-D view
    in its own shape (a key-padding mask (B, 1, 1, Sk) stays O(B Sk)); or None."""
    if mask is None:
        return None
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"mask must be a numpy bool array broadcastable to (B, H, Sq, Sk) = "
                        f"{target}; got {type(mask).__name__}")
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must have dtype bool (True = masked out); got {mask.dtype}")
    return _broadcastable4("mask", mask, target, "a bool array")


def _bias(bias, target: tuple[int, int, int, int]) -> np.ndarray | None:
    """``bias`` checked: a float array broadcastable to ``target``, finite or -inf, as a 4-D
    view; or None."""
    if bias is None:
        return None
    if not isinstance(bias, np.ndarray):
        raise TypeError(f"bias must be a numpy float array broadcastable to (B, H, Sq, Sk) = "
                        f"{target}; got {type(bias).__name__}")
    if bias.dtype not in FLOAT_DTYPES:
        raise TypeError(f"bias must be {FLOAT_NAMES}; got dtype {bias.dtype}")
    bias = _broadcastable4("bias", bias, target, "a float array")
    if np.isnan(bias).any() or (bias == np.inf).any():
        raise ValueError("bias contains NaN or +inf; it must be finite or -inf (masked)")
    return bias


def _alibi(alibi_slopes, alibi_offset, alibi_sqrt, target: tuple[int, int, int, int]
           ) -> tuple[np.ndarray | None, int, bool]:
    """``(slopes (1 or B, H) float64 or None, offset, sqrt)`` checked for ``target`` = (B, H,
    Sq, Sk); the offset defaults to flash_attn's alignment ``Sk - Sq`` (0 without slopes)."""
    B, H, Sq, Sk = target
    if alibi_slopes is not None:
        alibi_slopes = contiguous(check_alibi_slopes(alibi_slopes, B, H).reshape(-1, H)
                                  .astype(np.float64))
        # flash_attn's alignment by default: bias = -slope |i + Sk - Sq - j|
        alibi_offset = Sk - Sq if alibi_offset is None else as_int(
            "alibi_offset", alibi_offset, lo=-(1 << 62), hi=1 << 62, what="an int or None")
    elif alibi_offset is not None:
        raise ValueError("alibi_offset is used only with alibi_slopes")
    return alibi_slopes, 0 if alibi_offset is None else alibi_offset, as_bool("alibi_sqrt", alibi_sqrt)


@takes_scores_stage
def prepare(q, k, v, *, scale=None, causal=False, window=None, mask=None,
            q_rope=None, k_rope=None, bias=None, alibi_slopes=None, alibi_offset=None,
            alibi_sqrt=False, dropout_p=0.0, seed=0, offset=0,
            block_q=FORWARD_BLOCK[0], block_k=FORWARD_BLOCK[1], lazy_kv: bool = False,
            door: Door | None = None, **scores) -> Problem:
    """Check every argument and return a :class:`Problem` (arrays C-contiguous, dtype unchanged).

    Arguments and defaults as :func:`flashlab.flash_attention` (tiles
    :data:`~flashlab.tiling.FORWARD_BLOCK`). Every array is scanned for NaN/inf here, but
    with ``lazy_kv=True`` (the kernel API's forward) K and V of a short query: the problem is
    then of the :attr:`Problem.lazy_kv` kind (the decode kernel checks them as it reads them).
    Raises ``TypeError`` for a wrong type or dtype and ``ValueError`` for a wrong shape or
    value; the message names the argument and the expected shape or value, in ``door``'s
    names (:class:`Door`; a front door that has checked and translated its operands with
    :func:`operands` passes its own, e.g. CANN's ``query``) or the kernel API's. The scores
    stage's keywords (:class:`~flashlab.kernels.options.ScoresStage`'s fields, listed in the
    signature, taken as ``**scores``) are checked by
    :func:`~flashlab.kernels.options.scores_stage`.
    """
    door = KERNEL if door is None else door
    q, k, v = operands(KERNEL, q, k, v)
    B, H, Sq, Dqk = q.shape
    Sk = k.shape[2]

    check_rope_pair(door, q_rope, k_rope)
    if q_rope is not None:
        q_rope = check_operand("q_rope", q_rope, 4, "(B, H, Sq, Dr)")
        k_rope = check_operand("k_rope", k_rope, 4, "(B, Hr, Sk, Dr)")
        check_rope(door, q, k, q_rope, k_rope)

    if scale is None:
        scale = 1.0 / math.sqrt(Dqk + (0 if q_rope is None else q_rope.shape[3]))
    scale = check_scale(door.name("scale"), scale)
    # the kernels multiply in the compute dtype: float16/float32 inputs are computed in float32
    if q.dtype != np.float64 and abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"{door.name('scale')}={scale} overflows float32, the compute dtype of {q.dtype} inputs "
                         f"(|scale| must be < 3.4e38); pass float64 inputs or a smaller scale")

    stage = scores_stage(door.name, **scores)

    mask, bias = _mask(mask, (B, H, Sq, Sk)), _bias(bias, (B, H, Sq, Sk))
    alibi_slopes, alibi_offset, alibi_sqrt = _alibi(alibi_slopes, alibi_offset, alibi_sqrt,
                                                    (B, H, Sq, Sk))

    dropout_p = check_dropout("dropout_p", dropout_p)
    seed = check_seed(door.name("seed"), seed)
    offset = check_offset(door.name("offset"), offset)

    # a tile larger than the problem is the problem: scratch is sized from the clamped blocks
    # (as Problem.with_blocks clamps)
    block_q = min(_positive_int("block_q", block_q), Sq)
    block_k = min(_positive_int("block_k", block_k), Sk)
    c = contiguous
    q, k, v = c(q), c(k), c(v)
    q_rope, k_rope = (None, None) if q_rope is None else (c(q_rope), c(k_rope))
    lazy_kv = bool(lazy_kv) and runs_decode(Sq, block_q, q_rope is not None)
    norms = _operand_norms(door, q, k, v, lazy_kv)
    if q_rope is not None:
        norms.update(_finite(door, q_rope=q_rope, k_rope=k_rope))
    # the band last: it needs the lengths alone (the window is read before the causal flag)
    left, right = _band(causal, window, Sq, Sk)
    return Problem(q, k, v, q_rope, k_rope, mask, scale,
                   left, right, block_q, block_k, q.dtype, bias, alibi_slopes,
                   alibi_offset, alibi_sqrt, dropout_p,
                   seed, offset, stage, q_sq_norm=norms["q"], k_sq_norm=norms.get("k"),
                   q_rope_sq_norm=norms.get("q_rope"), k_rope_sq_norm=norms.get("k_rope"),
                   lazy_kv=lazy_kv)


def prepare_like(template: Problem, q: np.ndarray, k: np.ndarray, v: np.ndarray, *,
                 seed: int | None = None, door: Door | None = None) -> Problem:
    """A :class:`Problem` with ``template``'s options for new operands of the same kind: the
    per-call part of :func:`prepare`, for a caller that keys its checked calls by everything
    but the values (flashlab.compat's cache by shapes, dtypes and scalar options).

    q, k, v (B, H, S, D) are made C-contiguous and scanned for NaN/inf as :func:`prepare`
    scans them (K and V left to the kernel for a :attr:`~Problem.lazy_kv` problem); their
    dtype and rank must be the template's (``TypeError``/``ValueError`` otherwise); ``seed``:
    this call's dropout seed, checked here (None keeps the template's).
    """
    door = KERNEL if door is None else door
    for name, x in zip("qkv", (q, k, v)):
        check_operand(door.name(name), x, 4, "(B, H, S, D)")
        if x.dtype != template.dtype:
            check_same_dtype(door, template.dtype, **{name: x})
    if seed is not None:
        seed = check_seed(door.name("seed"), seed)
    q, k, v = contiguous(q), contiguous(k), contiguous(v)
    norms = _operand_norms(door, q, k, v, template.lazy_kv)
    return template._with(q=q, k=k, v=v, q_sq_norm=norms["q"], k_sq_norm=norms.get("k"),
                          seed=template.seed if seed is None else seed)


@dataclass(frozen=True)
class Part:
    """One kernel call cut out of a whole call (a front door's plan), for :func:`prepare_parts`.

    ``q_rows``/``kv_rows`` index the whole call's (B, H, S, D) operands (a batch range
    ``(slice(b0, b1),)``, or a sequence's tokens ``(slice(None), slice(None), slice(s0, s1))``);
    the rest is what only this call has, with :func:`prepare`'s meaning, checked against the
    part's own (B', H, Sq', Sk'): the band ``window``, a dense ``mask``, a ``bias`` slice, the
    ALiBi slopes with their ``alibi_offset``/``alibi_sqrt`` and the dropout counter ``offset``.
    """

    q_rows: tuple[slice, ...]
    kv_rows: tuple[slice, ...]
    window: tuple | None = None
    mask: np.ndarray | None = None
    bias: np.ndarray | None = None
    alibi_slopes: np.ndarray | None = None
    alibi_offset: int | None = None
    alibi_sqrt: bool = False
    offset: int = 0


def prepare_parts(q, k, v, q_rope=None, k_rope=None, *, parts: list[Part] | tuple[Part, ...],
                  scale=None, dropout_p=0.0, seed=0, block_q=FORWARD_BLOCK[0], block_k=FORWARD_BLOCK[1],
                  door: Door | None = None) -> list[Problem]:
    """One checked :class:`Problem` per part of a whole call, the whole checked once.

    The door of an operator that runs several kernel calls on pieces of its operands (CANN's
    batches and TND sequences) hands the whole call here: q, k, v, q_rope, k_rope (B, H, S, D)
    and the options every part shares are checked by :func:`prepare` once (the operands
    scanned for NaN/inf once), and each part is cut from that problem: its rows of the checked
    operands (C-contiguous; the squared norms stay the whole's, an upper bound for
    :func:`scores_may_overflow`), tiles clamped to its lengths, and only what is new checked
    (its band, mask, bias, ALiBi and dropout offset). No part: ``[]``, nothing checked.
    """
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, Part) for p in parts):
        raise TypeError(f"parts must be a list of flashlab.validation.Part; got {parts!r:.60}")
    if not parts:
        return []
    door = KERNEL if door is None else door
    whole = prepare(q, k, v, scale=scale, q_rope=q_rope, k_rope=k_rope, dropout_p=dropout_p,
                    seed=seed, block_q=block_q, block_k=block_k, door=door)
    return [_cut(whole, part, door) for part in parts]


def _cut(whole: Problem, part: Part, door: Door) -> Problem:
    """``part`` of the checked ``whole``: its operand rows and its own options, checked."""
    c = contiguous
    q, k, v = c(whole.q[part.q_rows]), c(whole.k[part.kv_rows]), c(whole.v[part.kv_rows])
    rope = {} if whole.q_rope is None or whole.k_rope is None else {
        "q_rope": c(whole.q_rope[part.q_rows]), "k_rope": c(whole.k_rope[part.kv_rows])}
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    target = (B, H, Sq, Sk)
    mask, bias = _mask(part.mask, target), _bias(part.bias, target)
    slopes, alibi_offset, alibi_sqrt = _alibi(part.alibi_slopes, part.alibi_offset,
                                              part.alibi_sqrt, target)
    left, right = _band(False, part.window, Sq, Sk)
    # the whole's tiles were clamped to its lengths, which bound the part's
    return whole._with(q=q, k=k, v=v, **rope, mask=mask, bias=bias, alibi_slopes=slopes,
                       alibi_offset=alibi_offset, alibi_sqrt=alibi_sqrt, left=left, right=right,
                       block_q=min(whole.block_q, Sq), block_k=min(whole.block_k, Sk),
                       offset=check_offset(door.name("offset"), part.offset))


def scan_kv(p: Problem, *, key_rows: tuple[int, int] | None = None) -> Problem:
    """The scan :func:`prepare` leaves out for a :attr:`~Problem.lazy_kv` problem: raise the
    same ``ValueError`` if k or v holds NaN or inf. Returns the scanned problem: without
    ``key_rows`` a copy of ``p`` with k's squared norm for :func:`scores_may_overflow` (``p``
    itself is frozen and unchanged). With ``key_rows=(lo, hi)`` only the key rows outside
    ``[lo, hi)`` are scanned (those a kernel that checked what it read never read) and ``p``
    is returned.
    """
    if key_rows is None:
        norms = _finite(k=p.k, v=p.v)
        return p._with(k_sq_norm=norms["k"])
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

    # Python floats: a product that overflows is inf, never an error
    bound = abs(p.scale) * max_norm(p.q, p.q_sq_norm) * max_norm(p.k, p.k_sq_norm)
    if p.q_rope is not None:
        bound += (abs(p.scale) * max_norm(p.q_rope, p.q_rope_sq_norm)
                  * max_norm(p.k_rope, p.k_rope_sq_norm))
    if p.bias is not None:
        with np.errstate(over="ignore"):
            finite = p.bias[np.isfinite(p.bias)]
            bound += float(np.abs(finite).max()) if finite.size else 0.0
    if p.alibi_slopes is not None:
        B, H, _, Sq, Sk, _, _ = p.shape
        bound += float(np.abs(p.alibi_slopes).max()) * (Sq + Sk + abs(p.alibi_offset))
    return not bound < _HALF_MAX[np.dtype(compute_dtype).char]


#: half the largest finite value of each compute dtype (by type code), for scores_may_overflow
_HALF_MAX = {np.dtype(t).char: float(np.finfo(t).max) / 2 for t in (np.float32, np.float64)}


# ------------------------------------------------------------------------------ front doors
# The front doors (flashlab.compat, flashlab.cann, flashlab.torch_attention) check nothing of
# their own: each describes how it spells the operands (a Door) and hands its arguments to the
# rules below, so that one rule gives one message, naming the argument as the door's user
# spelled it.

@dataclass(frozen=True)
class Door:
    """How a front door spells the attention operands: the table the checks read their names from.

    ``names`` maps the kernel API's argument names (``q``, ``k``, ``v``, ``scale``, ...) to the
    door's (CANN: ``query``, ``key``, ``value``); ``shapes`` gives q's, k's and v's shapes in
    the door's own words and layout; ``order[i]`` is the kernel axis (0 B, 1 H, 2 S, 3 D) of the
    door's axis ``i`` (flash_attn's (B, S, H, D): ``(0, 2, 1, 3)``; a packed (T, H, D) layout:
    ``(2, 1, 3)``, B = 1); ``ndim`` is the operands' rank where it differs from ``len(order)``
    (CANN's BSH [B, S, N*D], which its reader splits); ``symbols`` maps the kernel's size names
    (B, H, Hkv, Sq, Sk, Dqk, Dv) to the door's. ``packed``: the T axis may be empty (a packed
    batch of no tokens). ``note`` ends a shape message where the shapes shown are not the
    user's own (CANN's BSH/SBH, read as [B, N, S, D]).
    """

    names: tuple[tuple[str, str], ...] = ()
    shapes: tuple[str, str, str] = ("(B, H, Sq, Dqk)", "(B, Hkv, Sk, Dqk)", "(B, Hkv, Sk, Dv)")
    #: q_rope's and k_rope's shapes in the door's words
    rope_shapes: tuple[str, str] = ("(B, H, Sq, Dr)", "(B, Hr, Sk, Dr)")
    order: tuple[int, ...] = (0, 1, 2, 3)
    symbols: tuple[tuple[str, str], ...] = ()
    packed: bool = False
    note: str = ""
    #: the operands' rank in the door's layout (0 means ``len(order)``; CANN's BSH has 3, read as 4-D)
    ndim: int = 0
    # derived once in __post_init__ (the per-call checks only read them)
    _names: dict = field(init=False, repr=False, compare=False)
    _symbols: dict = field(init=False, repr=False, compare=False)
    _perm: tuple | None = field(init=False, repr=False, compare=False)
    _qkv: tuple = field(init=False, repr=False, compare=False)
    _rank: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the tables as dicts and the transpose to (B, H, S, D), once per door (not per call)
        inverse = tuple(int(i) for i in np.argsort(self.order))
        perm = (0,) + tuple(1 + i for i in inverse) if len(self.order) == 3 else inverse
        object.__setattr__(self, "_names", dict(self.names))
        object.__setattr__(self, "_symbols", dict(self.symbols))
        object.__setattr__(self, "_perm", None if perm == (0, 1, 2, 3) else perm)
        object.__setattr__(self, "_qkv", tuple(self.name(n) for n in ("q", "k", "v")))
        object.__setattr__(self, "_rank", self.ndim or len(self.order))

    def name(self, n: str) -> str:
        """The door's name for the kernel API's argument ``n``."""
        return self._names.get(n, n)

    def symbol(self, s: str) -> str:
        """The door's name for the kernel's size ``s`` (B, H, Hkv, Sq, Sk, Dqk, Dv)."""
        return self._symbols.get(s, s)

    def show(self, x4: np.ndarray | tuple) -> tuple:
        """A (B, H, S, D) shape in the door's axis order."""
        shape = x4.shape if isinstance(x4, np.ndarray) else x4
        return tuple(shape[a] for a in self.order)

    def to_kernel(self, x: np.ndarray) -> np.ndarray:
        """The door's array as a (B, H, S, D) view (packed: B = 1)."""
        if len(self.order) == 3:
            x = x[None]
        return x if self._perm is None else x.transpose(self._perm)


#: the kernel API's own names and layout (B, H, S, D)
KERNEL = Door()


def check_operand(name: str, x, ndim: int, shape: str) -> np.ndarray:
    """One operand's type, rank and dtype: a numpy array of ``ndim`` dims in :data:`FLOAT_DTYPES`."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of shape {shape}; got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape} ({ndim} dims); got shape {x.shape}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be {FLOAT_NAMES}; got dtype {x.dtype}")
    return x


def check_same_dtype(door: Door, dtype: np.dtype, **others: np.ndarray) -> None:
    """Every operand in ``others`` (kernel names) has q's ``dtype``."""
    for n, x in others.items():
        if x.dtype != dtype:
            extra = " (q, k, v share one dtype)" if n in ("k", "v") else ""
            raise TypeError(f"{door.name(n)} must have {door.name('q')}'s dtype {dtype}"
                            f"{extra.replace('q, k, v', ', '.join(door.name(m) for m in 'qkv'))}; "
                            f"got {x.dtype}")


def operands(door: Door, q, k, v, to_kernel=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v checked in ``door``'s layout and names; returned as (B, H, S, D) views.

    The one operand rule of every entry point: numpy arrays of one float dtype, no empty dim
    (but a packed T), k with q's batch and head dim, q's heads a multiple of k's (GQA), v with
    k's batch, heads and length. ``to_kernel`` (default ``Door.to_kernel`` of each
    operand) reads the door's layout as (B, H, S, D), e.g. CANN's BSH split by ``head_num``.
    """
    qn, kn, vn = door._qkv
    for n, x, shape in zip(door._qkv, (q, k, v), door.shapes):
        check_operand(n, x, door._rank, shape)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        check_same_dtype(door, q.dtype, k=k, v=v)
    first = 1 if door.packed else 0           # a packed T may be 0
    for n, x, shape in zip(door._qkv, (q, k, v), door.shapes):
        if min(x.shape[first:]) < 1:
            raise ValueError(f"{n} must have every dim >= 1{' but T' if door.packed else ''} for "
                             f"shape {shape}; got shape {x.shape}")
    if to_kernel is not None:
        q4, k4, v4 = to_kernel(q, k, v)
    elif door._perm is None and not door.packed:
        q4, k4, v4 = q, k, v
    else:
        q4, k4, v4 = door.to_kernel(q), door.to_kernel(k), door.to_kernel(v)
    B, H, _, Dqk = q4.shape
    Hkv, Sk = k4.shape[1], k4.shape[2]
    s, ks, note = door.symbol, door.shapes[1], door.note
    if k4.shape[0] != B:
        raise ValueError(f"{kn} must have shape {ks} with {s('B')}={B} like {qn}; got "
                         f"{door.show(k4)}{note}")
    if k4.shape[3] != Dqk:
        raise ValueError(f"{kn} must have shape {ks} with {s('Dqk')}={Dqk} as {qn}; got "
                         f"{door.show(k4)}{note}")
    if H % Hkv != 0:
        raise ValueError(f"{kn} must have shape {ks} with {qn}'s heads {s('H')}={H} a multiple of "
                         f"{kn}'s heads {s('Hkv')} (GQA: {s('H')} % {s('Hkv')} == 0); got {kn} "
                         f"{door.show(k4)} for {qn} {door.show(q4)}{note}")
    if v4.shape[:3] != (B, Hkv, Sk):
        want = "(" + ", ".join(str(w) for w in door.show((B, Hkv, Sk, s("Dv")))) + ")"
        raise ValueError(f"{vn} must have shape {door.shapes[2]} = {want} as {kn}; got "
                         f"{door.show(v4)}{note}")
    return q4, k4, v4


def check_rope_pair(door: Door, q_rope, k_rope) -> None:
    """The rope operands come together or not at all (MLA's ``q_rope``/``k_rope``)."""
    if (q_rope is None) != (k_rope is None):
        raise ValueError(f"{door.name('q_rope')} and {door.name('k_rope')} must be given together "
                         f"(or neither)")


def check_rope(door: Door, q4: np.ndarray, k4: np.ndarray, qr4: np.ndarray, kr4: np.ndarray) -> None:
    """The rope operands against q and k, all four as (B, H, S, D) views (named and shown as
    ``door`` does): q's dtype, ``q_rope`` (B, H, Sq, Dr), ``k_rope`` (B, Hr, Sk, Dr) with
    ``H % Hr == 0`` (MLA: Hr = 1, one rope key shared by every head)."""
    if qr4.dtype != q4.dtype or kr4.dtype != q4.dtype:
        check_same_dtype(door, q4.dtype, q_rope=qr4, k_rope=kr4)
    B, H, Sq, _ = q4.shape
    Sk = k4.shape[2]
    qs, ks = door.rope_shapes
    qn, qrn, krn = door.name("q"), door.name("q_rope"), door.name("k_rope")
    s, note = door.symbol, door.note

    def want(shape):
        return "(" + ", ".join(str(w) for w in door.show(shape)) + ")"

    if qr4.shape[:3] != (B, H, Sq):
        raise ValueError(f"{qrn} must have shape {qs} = {want((B, H, Sq, 'Dr'))}; got "
                         f"{door.show(qr4)}{note}")
    Dr = qr4.shape[3]
    if kr4.shape[0] != B or kr4.shape[2] != Sk or kr4.shape[3] != Dr:
        raise ValueError(f"{krn} must have shape {ks} = {want((B, s('Hr'), Sk, Dr))}; got "
                         f"{door.show(kr4)}{note}")
    if H % kr4.shape[1] != 0:
        raise ValueError(f"{krn} must have shape {ks} with {qn}'s heads {s('H')}={H} a multiple "
                         f"of {krn}'s heads {s('Hr')} ({s('H')} % {s('Hr')} == 0); got {krn} "
                         f"{door.show(kr4)}{note}")


def rope_operands(door: Door, q4: np.ndarray, k4: np.ndarray, q_rope, k_rope, shapes: tuple[str, str],
                  to_kernel=None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The rope operands of a front door, checked against its q and k (both (B, H, S, D) views
    from :func:`operands`): given together or not at all, numpy arrays of the door's rank
    (``shapes``: how the messages describe them) and then :func:`check_rope`'s rule. Returns
    them as (B, H, S, D) views (``to_kernel(q_rope, k_rope)``, default ``Door.to_kernel`` of
    each), or ``(None, None)``."""
    check_rope_pair(door, q_rope, k_rope)
    if q_rope is None or k_rope is None:
        return None, None
    qr = check_operand(door.name("q_rope"), q_rope, door._rank, shapes[0])
    kr = check_operand(door.name("k_rope"), k_rope, door._rank, shapes[1])
    qr4, kr4 = (door.to_kernel(qr), door.to_kernel(kr)) if to_kernel is None else to_kernel(qr, kr)
    check_rope(door, q4, k4, qr4, kr4)
    return qr4, kr4


def check_like(name: str, x, expected: tuple, shape: str, dtype: np.dtype | None,
               dtype_of: str = "q", *, scan: bool = True) -> np.ndarray:
    """A gradient-side operand (``do``, ``o``; flash_attn's ``dout``, ``out``; CANN's ``dy``,
    ``attention_in``): a finite numpy array of shape ``expected`` (described as ``shape``) and
    ``dtype`` (``dtype_of``'s; None: any of :data:`FLOAT_DTYPES`). Returns ``x`` unchanged.
    ``scan=False`` leaves the NaN/inf scan to the kernel API's backward, which a front door
    calls next with its own names (one pass)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of shape {shape} = {expected}; "
                        f"got {type(x).__name__}")
    if x.shape != expected:
        raise ValueError(f"{name} must have shape {shape} = {expected}; got {x.shape}")
    if dtype is None:
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be {FLOAT_NAMES}; got dtype {x.dtype}")
    elif x.dtype != dtype:
        raise TypeError(f"{name} must have {dtype_of}'s dtype {dtype}; got {x.dtype}")
    if scan and not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf; it must be finite")
    return x


def check_lse(name: str, lse, expected: tuple, shape: str, *, scan: bool = True) -> np.ndarray:
    """The forward's LSE handed to a backward: float32/float64 of shape ``expected``, no NaN or
    ``+inf`` (``-inf`` is a row with no allowed key). Returns it unchanged. ``scan`` as in
    :func:`check_like`."""
    if not isinstance(lse, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of shape {shape} = {expected}; "
                        f"got {type(lse).__name__}")
    if lse.shape != expected:
        raise ValueError(f"{name} must have shape {shape} = {expected}; got {lse.shape}")
    if lse.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be float32 or float64 (as the forward returns it); got {lse.dtype}")
    # the max is NaN if any entry is (max propagates NaN), +inf if any is: one pass, no temporary
    if scan and not lse.max() < np.inf:
        raise ValueError(f"{name} contains NaN or +inf; it must be finite or -inf (a row with no allowed key)")
    return lse


# ---- scalar options: one rule each, called with the door's name for the argument
def check_scale(name: str, scale, *, optional: bool = True) -> float | None:
    """The softmax scale: a finite real number (or None where the door has a default)."""
    if scale is None and optional:
        return None
    return as_real(name, scale, what="a real number or None" if optional else "a real number")


def check_dropout(name: str, x, *, keep: bool = False) -> float:
    """The drop probability in [0, 1) from ``dropout_p``, or from a keep probability in (0, 1]
    (``keep=True``: CANN's ``keep_prob``, drop = 1 - keep)."""
    if keep:
        return 1.0 - as_real(name, x, lo=0.0, hi=1.0, lo_open=True, what="a real number in (0, 1]")
    return as_real(name, x, lo=0.0, hi=1.0, hi_open=True, what="a real number in [0, 1)")


def check_seed(name: str, x) -> int:
    """A dropout seed: an int in [0, 2**64)."""
    return as_int(name, x, lo=0, hi=(1 << 64) - 1, what="an int in [0, 2**64)")


def check_offset(name: str, x) -> int:
    """A dropout counter offset: an int in [0, 2**62)."""
    return as_int(name, x, lo=0, hi=(1 << 62) - 1, what="an int in [0, 2**62)")


# ---- packed sequences (flash_attn's cu_seqlens, CANN's TND actual_seq_qlen/actual_seq_kvlen)
def _int_list(name: str, x) -> list[int]:
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu" or x.ndim != 1:
            raise TypeError(f"{name} must be a 1-D list or numpy array of ints; got a numpy array "
                            f"of dtype {x.dtype} and shape {x.shape}")
        return [int(i) for i in x.tolist()]
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be a 1-D list or numpy array of ints; got {x!r:.60} of "
                        f"type {type(x).__name__}")
    return [as_int(f"{name}[{i}]", e) for i, e in enumerate(x)]


def packed_sequences(names: tuple[str, str], cum_q, cum_k, totals: tuple[int, int], *,
                     leading_zero: bool, example: str, max_seqlens=None, tokens_beyond: bool = False
                     ) -> list[tuple[int, int, int, int]]:
    """``(q0, q1, k0, k1)`` token ranges of each sequence of a packed batch.

    ``cum_q``/``cum_k`` (named ``names``) are cumulative ends: with ``leading_zero`` the
    ``batch + 1`` boundaries ``[0, e_1, ..., e_B]`` (flash_attn's ``cu_seqlens``), without it
    the ``batch`` ends ``[e_1, ..., e_B]`` followed by zeros for unused batches (CANN's TND
    ``actual_seq_qlen``). Each list never decreases from 0 and ends at the token count of its
    tensor (``totals``); a length may be 0. ``max_seqlens`` (flash_attn's ``max_seqlen_q``,
    ``max_seqlen_k``): ``(name, value)`` pairs each at least the longest sequence. With
    ``tokens_beyond`` a list may end before its token count (CANN's TND: the tiling accepts
    ``T >=`` the last end; the rows past it belong to no sequence).
    """
    ends = []
    for name, cum, total, what in zip(names, (cum_q, cum_k), totals, ("query", "key")):
        if cum is None:
            raise ValueError(f"{name} must be given: cumulative sequence ends, e.g. {example}")
        e = _int_list(name, cum)
        if leading_zero:
            bounds = e
        else:
            n = len(e)
            while n > 1 and e[n - 1] == 0:    # trailing zeros: batches that take no part
                n -= 1
            # kept as empty sequences after the last used one (the caller may drop them)
            bounds = [0] + e[:n] + [e[n - 1]] * (len(e) - n) if e else []
        last_ok = bool(bounds) and (bounds[-1] <= total if tokens_beyond else bounds[-1] == total)
        if not bounds or bounds[0] != 0 or not last_ok \
                or any(b < a for a, b in zip(bounds, bounds[1:])):
            upto = "at most" if tokens_beyond else "to"
            raise ValueError(f"{name} must be non-decreasing cumulative ends from 0 {upto} the {what} "
                             f"token count T={total} (lengths 2, 2, 2 -> {example}); got {e}")
        ends.append(bounds)
    if len(ends[0]) != len(ends[1]):
        raise ValueError(f"{names[0]} and {names[1]} must describe the same number of sequences; "
                         f"got {len(ends[0]) - 1} and {len(ends[1]) - 1}")
    cq, ck = ends
    for (name, m), c in zip(max_seqlens or (), (cq, ck)):
        longest = max((b - a for a, b in zip(c, c[1:])), default=0)
        if as_int(name, m) < longest:
            raise ValueError(f"{name} must be >= the longest sequence, {longest}; got {m}")
    return [(cq[b], cq[b + 1], ck[b], ck[b + 1]) for b in range(len(cq) - 1)]


def backward_operands(p: Problem, do, o, lse, door: Door | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check ``do``, ``o`` (B, H, Sq, Dv) in q's dtype and ``lse`` (B, H, Sq) float32/64.

    Returns them C-contiguous and writeable, dtypes unchanged. ``lse`` may hold ``-inf``
    (rows with no allowed key) but not NaN or ``+inf``; ``do`` and ``o`` must be finite.
    The messages name them as ``door`` does (flash_attn's ``dout``, CANN's ``dy``).
    """
    B, H, _, Sq, _, _, Dv = p.shape
    door = KERNEL if door is None else door
    for name, x in (("do", do), ("o", o)):
        check_output_like(door.name(name), x, p)
    check_lse(door.name("lse"), lse, (B, H, Sq), "(B, H, Sq)")
    # C-contiguous and writeable, as prepare() leaves q, k, v (one Numba signature per dtype)
    return contiguous(do), contiguous(o), contiguous(lse)
