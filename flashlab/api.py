"""The public kernel API: validate, convert once at the boundary, dispatch to the Numba kernels.

Dtypes: float16 inputs are computed in float32 (the kernels are compiled for float32 and
float64 only, which keeps Numba's compile time to two signatures); ``o`` comes back in the
inputs' dtype and ``lse`` in the compute dtype: float64 for float64 inputs (so float64
gradients reach float64 accuracy), float32 otherwise.

One forward (:func:`flash_attention`) and one backward (:func:`flash_attention_backward`);
the paths a caller may want are choices inside them: ``problem=`` runs a problem checked once
already (:func:`flashlab.validation.prepare`: a training step's backward, a door that cuts one
call into several), ``stats=True`` / ``tiles=True`` also return what the kernels count (the row
max, the tiles computed; :mod:`flashlab.cann` and the tests read them). Which build of the
kernels runs (serial for small problems, :data:`SMALL_WORK`) and whether the split-KV decode
kernel serves a short query are chosen inside, from the problem.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from flashlab.arguments import as_bool
from flashlab.kernels import backward as _kbackward
from flashlab.kernels import decode as _kdecode
from flashlab.kernels import forward as _kforward
from flashlab.kernels.decode import kv_splits
from flashlab.kernels.options import NO_MASK, NO_SLOPES, TileOptions, no_operand
from flashlab.masks import kv_block_range
from flashlab.numba_cache import thread_safe
from flashlab.tiling import BACKWARD_BLOCK, DV_SLICE_ROWS, FORWARD_BLOCK, cdiv, q_splits, runs_decode
from flashlab.validation import (
    KERNEL,
    Door,
    Problem,
    backward_operands,
    contiguous,
    prepare,
    scan_kv,
    scores_may_overflow,
)

# the default tiles are re-exported here because the book reads them as flashlab.api.FORWARD_BLOCK

__all__ = ["flash_attention", "flash_attention_backward", "tiles_computed", "compute_dtype",
           "SMALL_WORK", "FORWARD_BLOCK", "BACKWARD_BLOCK", "LSE_TOLERANCE"]

#: the backward's outputs that a problem without RoPE / without ``want_dbias`` has (dq_rope 4-D;
#: the dK^rope and dbias partials 5-D): never written by the kernel then (each write is under
#: ``if has_rope`` / ``if want_dbias``), so shared
_NO_OUTPUT4 = {t: np.zeros((1, 1, 1, 1), dtype=t) for t in (np.float32, np.float64)}
_NO_OUTPUT5 = {t: np.zeros((1, 1, 1, 1, 1), dtype=t) for t in (np.float32, np.float64)}


def _as_compute(ct, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """``arrays`` in the compute dtype ``ct`` (float16/bfloat16 inputs -> float32 copies;
    arrays already of dtype ``ct`` returned as they are, without an ``astype`` call each)."""
    return tuple(x if x.dtype.type is ct else x.astype(ct) for x in arrays)


#: problems with at most this much work (B H Sq Sk (Dqk + Dv) multiply-adds) run the serial
#: builds of the kernels (``kernels_for``): waking the pool costs more than the work
SMALL_WORK = 1 << 22


class Kernels(NamedTuple):
    """One build of each kernel the API calls: all parallel, or all serial."""

    forward: Any
    decode: Any
    merge: Any
    backward: Any
    sum_partials: Any


#: the ``parallel=True`` kernels (Numba's thread pool, one work item per thread at a time)
#: (each :class:`~flashlab.numba_cache.thread_safe`: one at a time under the ``workqueue`` layer)
PARALLEL = Kernels(*(thread_safe(k) for k in (
    _kforward.flash_forward_kernel, _kdecode.flash_decode_kernel, _kdecode.merge_splits,
    _kbackward.flash_backward_kernel, _kbackward.sum_partials)))
#: the same functions built without ``parallel`` (:func:`~flashlab.numba_cache.serial_twin`)
SERIAL = Kernels(_kforward.flash_forward_serial, _kdecode.flash_decode_serial,
                 _kdecode.merge_splits_serial, _kbackward.flash_backward_serial,
                 _kbackward.sum_partials_serial)


def kernels_for(p: Problem) -> Kernels:
    """:data:`SERIAL` for a problem of at most :data:`SMALL_WORK` multiply-adds, else :data:`PARALLEL`.

    A parallel kernel launches Numba's thread pool on every call (even with one thread set):
    at (1, 16, 1, 8) that launch, not the arithmetic, was the call's time. Both builds run the
    same function and give the same bits (every kernel's result is independent of the thread
    count; tests/test_small_shapes.py compares them), so this changes the time only.
    """
    B, H, _, Sq, Sk, Dqk, Dv = p.shape
    return SERIAL if B * H * Sq * Sk * (Dqk + Dv + p.d_rope) <= SMALL_WORK else PARALLEL


def compute_dtype(dtype: np.dtype) -> type[np.floating[Any]]:
    """Accumulation dtype for inputs of ``dtype``: float64 stays float64, the rest use float32."""
    return np.float64 if dtype == np.float64 else np.float32


def tile_options(p: Problem, ct, check_overflow: bool, want_dbias: bool = False) -> TileOptions:
    """The kernels' :class:`~flashlab.kernels.options.TileOptions` for the checked problem
    ``p`` in the compute dtype ``ct``: built once per call, placeholders where an operand is
    absent (one record type per compute dtype)."""
    if p.q_rope is not None and p.k_rope is not None:   # given together (validation)
        q_rope, k_rope = _as_compute(ct, p.q_rope, p.k_rope)
    else:
        q_rope = k_rope = no_operand(ct)
    bias = no_operand(ct) if p.bias is None else contiguous(p.bias.astype(ct, copy=False))
    return TileOptions(
        scale=ct(p.scale), left=p.left, right=p.right, block_q=p.block_q,
        block_k=p.block_k, mask=NO_MASK if p.mask is None else p.mask,
        has_mask=p.mask is not None, bias=bias, has_bias=p.bias is not None,
        slopes=NO_SLOPES if p.alibi_slopes is None else p.alibi_slopes,
        has_alibi=p.alibi_slopes is not None, alibi_offset=p.alibi_offset,
        alibi_sqrt=p.alibi_sqrt, q_rope=q_rope, k_rope=k_rope, has_rope=p.q_rope is not None,
        drop_threshold=p.drop_threshold, seed=np.uint64(p.seed), offset=p.offset,
        check_overflow=bool(check_overflow), want_dbias=bool(want_dbias),
        **p.scores.in_dtype(ct)._asdict())


def _raise_on_overflow(p: Problem, overflow: np.ndarray, ct) -> None:
    if np.count_nonzero(overflow):        # (a third of .any()'s time on these few flags)
        raise ValueError(
            f"the attention scores scale * q k^T (+ bias) overflow {np.dtype(ct).name} "
            f"(|score| > {np.finfo(ct).max:.3g}) for these inputs (scale={p.scale:g}, "
            f"max |q|={np.abs(p.q).max():.3g}, max |k|={np.abs(p.k).max():.3g}); scale the "
            f"inputs down{' or pass float64 inputs' if ct != np.float64 else ''}. (An overflowed "
            f"score is not a masked one: no result is returned rather than a wrong one.)")


#: How far a row of the backward's recomputed P = exp(S - LSE) may sum from 1, relative to
#: ``max(1, abs(LSE))``, before the LSE is refused as another forward's
#: (:func:`flashlab.kernels.backward.first_foreign_row`), by the coarser of the compute dtype and
#: the LSE's: rounding leaves ~1e-6 in float32 (1e-15 in float64) on the bench's shapes; an LSE
#: off by delta gives a sum of e^-delta.
LSE_TOLERANCE = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10}


def _raise_on_foreign_lse(p: Problem, lse_row: np.ndarray, lse_sum: np.ndarray, tol: float,
                          door: Door | None) -> None:
    """``ValueError`` naming the door's LSE and the first row whose P does not sum to 1."""
    B, H = p.shape[:2]
    n_qb = lse_row.shape[0] // (B * H)
    t = int(np.flatnonzero(lse_row >= 0)[0])
    b, h, i = t // (H * n_qb), (t // n_qb) % H, int(lse_row[t])
    name = (KERNEL if door is None else door).name("lse")
    raise ValueError(
        f"{name} is not the forward's for these inputs: at row (b={b}, h={h}, i={i}) the "
        f"recomputed P = exp(S - lse) sums to {lse_sum[t]:.6g}, not 1 (tolerance {tol:g} x "
        f"max(1, |lse|); a row with no allowed key must have lse = -inf). Pass the {name} that "
        "the forward returned with this o, for the same q, k, v and options.")


def _forward(p: Problem, check_overflow: bool | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Problem]:
    """Run the forward kernel on a checked problem: ``(o, lse, row_max, tiles_done, p)``.

    o (B, H, Sq, Dv), lse and row_max (B, H, Sq), all in the compute dtype (row_max = the
    final running max, CANN's ``softmax_max``); tiles_done (B * H * n_qblocks,) int64; ``p``
    with k and v scanned (or checked by the decode kernel as it read them). Raises
    ``ValueError`` if a score overflows. ``check_overflow``: test every tile (True), none
    (False, for tests that plant NaN on purpose) or only when
    :func:`~flashlab.validation.scores_may_overflow` says so (None).
    """
    decode = uses_decode(p)
    if p.lazy_kv and not decode:      # K and V left to the kernel, and this one does not check
        p = scan_kv(p)
    ct = compute_dtype(p.dtype)
    if check_overflow is None:
        check_overflow = _check_every_tile(p, ct)
    B, H, _, Sq, _, _, Dv = p.shape
    q, k, v = _as_compute(ct, p.q, p.k, p.v)
    options = tile_options(p, ct, bool(check_overflow))
    o = np.empty((B, H, Sq, Dv), dtype=ct)
    lse = np.empty((B, H, Sq), dtype=ct)
    row_max = np.empty((B, H, Sq), dtype=ct)
    kernels = kernels_for(p)
    if decode:
        tiles = _decode_forward(p, q, k, v, options, ct, o, lse, row_max, kernels)
        return o, lse, row_max, tiles, p
    n_qb = cdiv(Sq, p.block_q)
    tiles = np.empty(B * H * n_qb, dtype=np.int64)     # every entry written by the kernel
    overflow = np.empty(B * H * n_qb, dtype=np.int64)
    kernels.forward(q, k, v, o, lse, row_max, tiles, overflow, options)
    _raise_on_overflow(p, overflow, ct)
    return o, lse, row_max, tiles, p


def _check_every_tile(p: Problem, ct) -> bool:
    """Whether a kernel tests every (recomputed) score tile for overflow, forward and backward:
    when :func:`~flashlab.validation.scores_may_overflow` says a score could overflow, and
    whenever K was not scanned (a decode forward checks K as it reads it, so there is no norm
    to bound the scores with): testing a tile costs ~1/D of computing it, a scan of K for
    the bound a whole pass over K."""
    return True if p.k_sq_norm is None else scores_may_overflow(p, ct)


def uses_decode(p: Problem) -> bool:
    """Whether the forward of ``p`` runs the split-KV decode kernel (:mod:`flashlab.kernels.decode`).

    Yes when the query is short (``Sq <= DECODE_MAX_SQ``), fits one q-block and there are no
    RoPE operands: then the tiled forward would have one matrix-vector work item per head
    and read each kv head's K and V once per query head of its group.
    """
    return runs_decode(p.q.shape[2], p.block_q, p.q_rope is not None)


def _decode_forward(p: Problem, q, k, v, options: TileOptions, ct, o, lse, row_max,
                    kernels: Kernels) -> np.ndarray:
    """The split-KV forward into ``o``, ``lse``, ``row_max``; returns the tiles computed per
    head, (B * H,) int64 (the tiled forward's count: one q-block per head)."""
    B, H, Hkv, Sq, Sk, _, Dv = p.shape
    group = H // Hkv
    n_split = kv_splits(B, Hkv, cdiv(Sk, p.block_k))
    part_m = np.empty((B, Hkv, n_split, group * Sq), dtype=ct)
    part_l = np.empty((B, Hkv, n_split, group * Sq), dtype=ct)
    part_acc = np.empty((B, Hkv, n_split, group * Sq, Dv), dtype=ct)
    part_tiles = np.zeros((B, Hkv, n_split, group), dtype=np.int64)
    overflow = np.zeros((B, Hkv, n_split), dtype=np.int64)
    nonfinite = np.zeros((B, Hkv, n_split), dtype=np.int64)
    kernels.decode(q, k, v, n_split, part_m, part_l, part_acc, part_tiles, overflow, nonfinite,
                   options)
    # K and V of a decode problem (Problem.lazy_kv) are checked as the kernel reads them: a
    # NaN/inf in K gives a non-finite score, one in V a non-finite partial output (P~ = 0
    # times inf is NaN), and the kernel flags both in ``nonfinite``. Only then are the whole
    # of K and V scanned, for the message; the key rows the band kept the kernel from reading
    # are scanned here (none without causal/window).
    if np.count_nonzero(nonfinite):
        scan_kv(p)              # raises: the message names k or v
    else:
        kb0, kb1 = kv_block_range(0, Sq, Sk, p.block_k, p.left, p.right)
        if kb0 > 0 or kb1 * p.block_k < Sk:     # some key rows were not read
            scan_kv(p, key_rows=(kb0 * p.block_k, min(kb1 * p.block_k, Sk)) if kb1 > kb0
                    else (0, 0))
    _raise_on_overflow(p, overflow, ct)
    tiles = np.zeros(B * H, dtype=np.int64)
    kernels.merge(part_m, part_l, part_acc, part_tiles, p.drop_threshold, o, lse, row_max, tiles)
    return tiles


def _given_problem(problem, **operands) -> Problem:
    """``problem`` checked as the ``problem=`` argument of the forward or backward: a
    :class:`~flashlab.validation.Problem`, and none of the operands it replaces given too."""
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a flashlab.validation.Problem (from "
                        f"flashlab.validation.prepare) or None; got {type(problem).__name__}")
    given = [name for name, x in operands.items() if x is not None]
    if given:
        raise ValueError(f"pass either {', '.join(operands)} or problem=, not both (the problem "
                         f"holds its operands and options); got {', '.join(given)} too")
    return problem


def flash_attention(q=None, k=None, v=None, *, scale=None, causal=False, window=None,
                    mask=None, q_rope=None, k_rope=None, bias=None, alibi_slopes=None,
                    alibi_offset=None, alibi_sqrt=False, dropout_p=0.0, seed=0, offset=0,
                    softcap=0.0, block_q=FORWARD_BLOCK[0], block_k=FORWARD_BLOCK[1], door=None,
                    problem=None, stats=False):
    """Tiled FlashAttention forward (online softmax; nothing of size Sq x Sk is stored).

    Parameters
    ----------
    q : (B, H, Sq, Dqk) float16/32/64
    k : (B, Hkv, Sk, Dqk), same dtype; ``H % Hkv == 0`` (GQA; Hkv = 1 is MQA)
    v : (B, Hkv, Sk, Dv); ``Dv`` may differ from ``Dqk`` (e.g. 192/128), no padding is done
    scale : float, default ``1/sqrt(Dqk + Dr)``
    causal : key ``j`` allowed iff ``j <= i`` (top-left aligned, as torch's ``is_causal``)
    window : ``(left, right)``: key ``j`` allowed iff ``i - left <= j <= i + right``; a side
        may be ``None`` (unbounded), negative, or any int (sides beyond the lengths are
        clamped to them: ``sys.maxsize`` is unbounded)
    mask : bool array broadcastable to (B, H, Sq, Sk), ``True`` = masked out (CANN
        convention); read in its own shape (a key-padding mask (B, 1, 1, Sk) costs O(B Sk))
    q_rope, k_rope : optional (B, H, Sq, Dr) and (B, Hr, Sk, Dr), ``H % Hr == 0``: their
        product is accumulated into the same score tile as ``q k^T``
    bias : float array broadcastable to (B, H, Sq, Sk), added after scaling:
        ``S = scale (q k^T + q_rope k_rope^T) + bias``; ``-inf`` entries mask their score
    alibi_slopes : (H,) or (B, H) float: adds the ALiBi bias ``-slope_h |j - i - alibi_offset|``
        (``alibi_sqrt``: ``-slope_h sqrt|j - i - alibi_offset|``); ``alibi_offset`` defaults to
        ``Sk - Sq`` (flash_attn's bottom-right alignment)
    dropout_p : probability of dropping each entry of P (0 <= p < 1); the survivors are scaled
        by ``1 / (1 - p)``. Entry (b, h, i, j) is dropped by a hash of ``seed`` and its
        counter ``offset + ((b H + h) Sq + i) Sk + j`` (:mod:`flashlab.dropout`): the same
        ``seed``/``offset`` give the same mask in every run and in the backward
    softcap : logit soft-capping, flash_attn's (>= 2.6) and Gemma 2's: with ``softcap > 0`` the
        scaled scores become ``softcap * tanh(s / softcap)`` before the bias, ALiBi and the
        masks (``0.0``, the default, is off)
    block_q, block_k : tile sizes, any ints >= 1 (need not divide Sq, Sk; larger than the
        lengths means the lengths); the defaults (:data:`~flashlab.tiling.FORWARD_BLOCK`,
        512 x 256) are the fastest of the tiles timed (see there)
    door : how the error messages name the arguments (:class:`flashlab.validation.Door`):
        a front door that has translated its operands passes its own table; default the
        names above
    problem : a :class:`flashlab.validation.Problem` checked already
        (:func:`flashlab.validation.prepare`), instead of q, k, v and the options (which are
        then the problem's; q, k, v must not be given): a door that cuts one call into
        several, or keeps the problem for the backward (``problem=`` there)
    stats : also return the kernel's row max and the tiles it computed

    Returns
    -------
    o : (B, H, Sq, Dv)
        in q's dtype; a row with no allowed key gives ``o = 0``
    lse : (B, H, Sq)
        natural log, float64 for float64 inputs and float32 otherwise; ``-inf`` for a row with
        no allowed key (dropout does not change it: it is the LSE of the undropped scores)
    row_max : (B, H, Sq), only with ``stats``
        the final running max of each row's scores (CANN's ``softmax_max``), lse's dtype
    tiles : (B, H, n_qblocks) int64, only with ``stats``
        the (q-block, kv-block) tiles computed per q-block (:func:`tiles_computed`)

    Raises
    ------
    TypeError
        ``q``, ``k``, ``v`` (or ``q_rope``, ``k_rope``) not a numpy array, not float16/32/64,
        or ``k``, ``v``, ``q_rope``, ``k_rope`` not of q's dtype; ``scale`` not a real number;
        ``causal`` not a bool; a ``window`` side neither int nor None; ``mask`` not a numpy
        array of dtype bool; ``bias`` not a float array; ``block_q``/``block_k``, ``seed``,
        ``offset`` not an int (NumPy integers are accepted).
    ValueError
        an operand not 4-D or with an empty dim; ``k`` not (B, Hkv, Sk, Dqk) with q's B and
        Dqk; ``H % Hkv != 0``; ``v`` not (B, Hkv, Sk, Dv) with k's B, Hkv, Sk; only one of
        ``q_rope``/``k_rope`` given, or their shapes not (B, H, Sq, Dr) / (B, Hr, Sk, Dr) with
        ``H % Hr == 0``; NaN or inf in an operand; ``scale`` not finite or not finite in the
        compute dtype; ``window`` not a pair; ``mask``/``bias`` not broadcastable to
        (B, H, Sq, Sk); ``bias`` with NaN or ``+inf``; ``block_q`` or ``block_k`` < 1;
        ``dropout_p`` outside [0, 1); ``softcap`` negative or not finite; the scores
        overflowing the compute dtype (an overflow is never reported as a masked row). Every
        message names the argument and the expected shape or value.

    Notes
    -----
    Tiles that ``causal``/``window`` mask completely are never computed (see
    :mod:`flashlab.kernels.forward`); with a dense ``mask`` a tile it masks completely is
    skipped after its mask is read.
    """
    if problem is None:
        p = prepare(q, k, v, scale=scale, causal=causal, window=window, mask=mask,
                    q_rope=q_rope, k_rope=k_rope, bias=bias, alibi_slopes=alibi_slopes,
                    alibi_offset=alibi_offset, alibi_sqrt=alibi_sqrt, dropout_p=dropout_p,
                    seed=seed, offset=offset, softcap=softcap, block_q=block_q,
                    block_k=block_k,
                    # a short query's k and v: checked by the decode kernel as it reads them
                    lazy_kv=True, door=door)
    else:
        p = _given_problem(problem, q=q, k=k, v=v)
    stats = as_bool("stats", stats)
    o, lse, row_max, tiles, p = _forward(p, None)
    o = o.astype(p.dtype, copy=False)
    if stats:
        return o, lse, row_max, tiles.reshape(p.shape[0], p.shape[1], -1)
    return o, lse


def tiles_computed(q, k, v, *, block_q=FORWARD_BLOCK[0], block_k=FORWARD_BLOCK[1],
                   **options) -> np.ndarray:
    """Number of (q-block, kv-block) tiles the forward kernel computes, per (B, H, q-block).

    Same arguments and defaults as :func:`flash_attention` (tiles
    :data:`~flashlab.tiling.FORWARD_BLOCK` unless ``block_q``/``block_k`` are given), same
    errors; returns an int64 array (B, H, n_qblocks). Used by the tests and the masks chapter
    to show that skipped tiles are really never computed.
    """
    return flash_attention(q, k, v, block_q=block_q, block_k=block_k, stats=True, **options)[3]


def _reduce_dbias(part: np.ndarray, bias_shape: tuple[int, ...]) -> np.ndarray:
    """(B, H, n, Sqb, Skb) per-work-item dS sums -> the bias's (Bb, Hb, Sqb, Skb), fixed order."""
    total = part.sum(axis=2)
    for axis in (0, 1):
        if bias_shape[axis] == 1:
            total = total.sum(axis=axis, keepdims=True)
    return total


def _backward(p: Problem, do, o, lse, *, want_dbias: bool = False,
              door: Door | None = None) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Run the backward kernels on a checked problem (``door``: whose names the messages
    about ``do``, ``o``, ``lse`` use).

    ``do``, ``o`` and ``lse`` are checked here (:func:`~flashlab.validation.backward_operands`);
    K and V of a :attr:`~flashlab.validation.Problem.lazy_kv` problem are scanned first (the
    backward kernel does not check what it reads).

    Returns ``((dq, dk, dv[, dq_rope, dk_rope][, dbias]), tiles_done)`` with the gradients in
    the compute dtype (dbias in the bias's 4-D broadcast shape, only with ``want_dbias``) and
    ``tiles_done`` (B * H * n_qblocks,) int64, tiles visited per q-block (the tests check
    that it equals the forward's). Raises ``ValueError`` if a recomputed score overflows.
    """
    B, H, Hkv, Sq, Sk, Dqk, Dv = p.shape
    ct = compute_dtype(p.dtype)
    do, o, lse = backward_operands(p, do, o, lse, door)
    if p.lazy_kv:
        p = scan_kv(p)
    lse_dtype = lse.dtype           # a float32 lse of a float64 forward: float32's tolerance
    q, k, v, do, o, lse = _as_compute(ct, p.q, p.k, p.v, do, o, lse)
    bias = p.bias
    want_dbias = bool(want_dbias) and bias is not None
    options = tile_options(p, ct, _check_every_tile(p, ct), want_dbias)
    has_rope = options.has_rope
    Hr, Dr = (options.k_rope.shape[1], p.d_rope) if has_rope else (1, 1)
    n_qb = cdiv(Sq, p.block_q)
    n_split = q_splits(B, H, n_qb)

    def grad_and_partial(heads: int, dim: int) -> tuple[np.ndarray, np.ndarray, bool]:
        # grad (B, heads, Sk, dim), the kernel's per-work-item partial (B, H, n_split, Sk, dim)
        # and whether partials must be summed; with one query head per output head and one
        # chunk the partial IS the gradient (a reshaped view: no extra memory, no sum)
        grad = np.zeros((B, heads, Sk, dim), dtype=ct)
        if heads == H and n_split == 1:
            return grad, grad.reshape(B, H, 1, Sk, dim), False
        return grad, np.zeros((B, H, n_split, Sk, dim), dtype=ct), True

    dk, dk_part, dk_sum = grad_and_partial(Hkv, Dqk)
    dv, dv_part, dv_sum = grad_and_partial(Hkv, Dv)
    if has_rope:
        dk_rope, dkr_part, dkr_sum = grad_and_partial(Hr, Dr)
    else:
        dk_rope, dkr_part, dkr_sum = None, _NO_OUTPUT5[ct], False
    if want_dbias and bias is not None:
        # one dS sum per work item where the bias broadcasts over the rows (they share it),
        # else one per (b, h): each row of dbias is then written by its own work item only
        Sqb, Skb = bias.shape[2:]
        dbias_part = np.zeros((B, H, n_split if Sqb == 1 else 1, Sqb, Skb), dtype=ct)
    else:
        dbias_part = _NO_OUTPUT5[ct]
    dq = np.empty((B, H, Sq, Dqk), dtype=ct)
    dq_rope = np.zeros((B, H, Sq, Dr), dtype=ct) if has_rope else _NO_OUTPUT4[ct]
    tiles = np.empty(B * H * n_qb, dtype=np.int64)     # every entry written by the kernel
    overflow = np.empty(B * H * n_qb, dtype=np.int64)
    lse_row = np.empty(B * H * n_qb, dtype=np.int64)
    lse_sum = np.empty(B * H * n_qb, dtype=np.float64)
    lse_tol = LSE_TOLERANCE[np.dtype(ct) if lse_dtype == np.float64 else np.dtype(np.float32)]
    kernels = kernels_for(p)
    kernels.backward(do, q, k, v, o, lse, n_split, dq, dk_part, dv_part, dq_rope, dkr_part,
                     dbias_part, tiles, overflow, lse_tol, lse_row, lse_sum, DV_SLICE_ROWS,
                     options)
    _raise_on_overflow(p, overflow, ct)
    if lse_row.max() >= 0:
        _raise_on_foreign_lse(p, lse_row, lse_sum, lse_tol, door)
    # add the partials of the heads sharing a kv (rope) head and of the chunks, in a fixed order
    for grad, part, needs_sum in ((dk, dk_part, dk_sum), (dv, dv_part, dv_sum),
                                  (dk_rope, dkr_part, dkr_sum)):
        if needs_sum:
            kernels.sum_partials(part, grad)
    grads: tuple[np.ndarray, ...] = (dq, dk, dv)
    if dk_rope is not None:
        grads += (dq_rope, dk_rope)
    if want_dbias and bias is not None:
        grads += (_reduce_dbias(dbias_part, bias.shape),)
    return grads, tiles


def flash_attention_backward(do, q=None, k=None, v=None, o=None, lse=None, *, scale=None,
                             causal=False, window=None, mask=None, q_rope=None, k_rope=None,
                             bias=None, alibi_slopes=None, alibi_offset=None, alibi_sqrt=False,
                             dropout_p=0.0, seed=0, offset=0, softcap=0.0, return_dbias=False,
                             block_q=BACKWARD_BLOCK[0], block_k=BACKWARD_BLOCK[1], door=None,
                             problem=None, tiles=False):
    """Tiled FlashAttention backward: gradients of ``sum(o * do)``, recomputing P from ``lse``.

    Parameters
    ----------
    do : (B, H, Sq, Dv), the gradient of the loss with respect to ``o``; q's dtype
    q, k, v, scale, causal, window, mask, q_rope, k_rope, bias, alibi_slopes, alibi_offset, \
alibi_sqrt, dropout_p, seed, offset, softcap : as in :func:`flash_attention`,
        and they must be the ones the forward was called with (dropout: the same seed and
        offset recompute the same mask)
    return_dbias : also return the gradient of ``bias`` (in the shape ``bias`` was given)
    block_q, block_k : the backward's tile sizes (any ints >= 1; default
        :data:`~flashlab.tiling.BACKWARD_BLOCK`, 512 x 256), independent of the forward's
    door : as in :func:`flash_attention` (the names the error messages use)
    problem : the checked problem the forward ran (``flash_attention(problem=...)``), instead
        of q, k, v and the options: a training step's backward checks only what it adds
        (``do``, ``o``, ``lse``; checking everything again is a large share of a small call).
        Run with this call's ``block_q``/``block_k``; ``return_dbias`` gives dbias in the
        problem's 4-D broadcast bias shape
    tiles : also return the tiles the backward visited, (B, H, n_qblocks) int64 (the
        forward's count: :func:`tiles_computed`)
    o : (B, H, Sq, Dv)
        the forward's output, q's dtype
    lse : (B, H, Sq)
        the forward's LSE, float32 or float64. The backward's accuracy is bounded by
        ``lse``'s: pass the float64 ``lse`` that the forward returns for float64 inputs.

    Returns
    -------
    grads : tuple
        ``(dq, dk, dv)``, or ``(dq, dk, dv, dq_rope, dk_rope)`` when the rope operands are
        given, then ``dbias`` with ``return_dbias``, in the inputs' dtype with the shapes of
        q, k, v, q_rope, k_rope (dbias: bias's dtype and shape). dk, dv are summed over the
        query heads sharing each kv head (GQA) and dk_rope over those sharing each k_rope
        head; dbias over the axes the bias broadcasts. With ``tiles``: ``(grads, tiles)``.
        Rows with no allowed key
        (``lse = -inf``) contribute nothing; a row with one allowed key gives exactly zero
        dq (its softmax has zero derivative).

    Raises
    ------
    TypeError
        as :func:`flash_attention` for ``q``, ``k``, ``v`` and the options; ``do``, ``o`` or
        ``lse`` not a numpy array; ``do`` or ``o`` not of q's dtype; ``lse`` not float32 or
        float64.
    ValueError
        as :func:`flash_attention` for ``q``, ``k``, ``v`` and the options; ``do`` or ``o``
        not of shape (B, H, Sq, Dv), or not finite; ``lse`` not of shape (B, H, Sq), or
        holding NaN or ``+inf``; ``return_dbias`` without ``bias``; ``lse`` not the
        forward's: a row of the recomputed P = exp(S - lse) that does not sum to 1 within
        :data:`LSE_TOLERANCE` (0 for a row with no allowed key, whose lse is -inf), checked
        as P is recomputed (the message names the first such row). Every message names the
        argument and the expected shape or value.

    Notes
    -----
    With ``softcap`` the gradient is exact: dS picks up the factor
    ``1 - tanh^2(s / softcap)`` of each scaled score ``s`` (dbias does not: the bias is added
    after the cap). Deterministic: the same bits on every run and for any Numba thread count (see
    :mod:`flashlab.kernels.backward` for the parallel split). Tiles are skipped exactly as in
    the forward. float16 inputs are computed in float32.
    """
    if problem is None:
        p = prepare(q, k, v, scale=scale, causal=causal, window=window, mask=mask,
                    q_rope=q_rope, k_rope=k_rope, bias=bias, alibi_slopes=alibi_slopes,
                    alibi_offset=alibi_offset, alibi_sqrt=alibi_sqrt, dropout_p=dropout_p,
                    seed=seed, offset=offset, softcap=softcap, block_q=block_q,
                    block_k=block_k, door=door)
        bias_like = bias
    else:
        p = _given_problem(problem, q=q, k=k, v=v).with_blocks(block_q, block_k)
        bias_like = p.bias
    return_dbias = as_bool("return_dbias", return_dbias)
    tiles = as_bool("tiles", tiles)
    if return_dbias and bias_like is None:
        raise ValueError("return_dbias=True needs a bias (there is no gradient to return)")
    grads, visited = _backward(p, do, o, lse, want_dbias=bool(return_dbias), door=door)
    out = tuple(g.astype(p.dtype, copy=False) for g in grads)
    if return_dbias:
        out = out[:-1] + (out[-1].reshape(np.shape(bias_like)).astype(bias_like.dtype,
                                                                       copy=False),)
    if tiles:
        return out, visited.reshape(p.shape[0], p.shape[1], -1)
    return out
