"""The public API of the CUDA twin, on numpy arrays (B, H, S, D) float32.

Each call checks its arguments with :func:`flashlab.validation.prepare` (the CPU API's
checks), copies the arrays to the device (the simulator's "device" is host memory), launches
the kernels of :mod:`flashlab.gpu.forward`, :mod:`flashlab.gpu.backward` or
:mod:`flashlab.gpu.standard`, and copies the results back. With ``count_traffic=True`` the
instrumented build of the same kernel runs and the bytes it counted come back as a
:class:`~flashlab.traffic.Traffic`.
"""
from __future__ import annotations

import numpy as np

from flashlab.arguments import as_bool
from flashlab.gpu.backward import DOT_ROWS, backward_kernel, backward_shared_bytes, backward_threads, dot_kernel
from flashlab.gpu.forward import cuda, forward_kernel, forward_shared_bytes, forward_threads
from flashlab.gpu.standard import (
    SOFTMAX_WARPS,
    STANDARD_TILE,
    pv_kernel,
    scores_kernel,
    softmax_kernel,
    standard_shared_bytes,
    standard_threads,
)
from flashlab.gpu.target import STATIC_SHARED_LIMIT, is_simulator
from flashlab.gpu.traffic import COUNTER_SLOTS
from flashlab.kernels.options import takes_scores_stage
from flashlab.masks import kv_block_range
from flashlab.tiling import cdiv
from flashlab.traffic import Traffic
from flashlab.validation import Problem, backward_operands, prepare

__all__ = ["flash_attention_gpu", "flash_attention_backward_gpu", "standard_attention_gpu",
           "kv_blocks", "q_blocks", "band_scalars", "fused_scalars", "STATIC_SHARED_LIMIT", "MAX_THREADS"]

#: threads per block, at most (one per query row here)
MAX_THREADS = 1024


def band_scalars(p: Problem) -> tuple:
    """The scale and the band ``(left, right)`` as the kernels take them: float32, int64, int64
    (the standard scores kernel's scalar arguments)."""
    return np.float32(p.scale), np.int64(p.left), np.int64(p.right)


def fused_scalars(p: Problem) -> tuple:
    """The fused kernels' scalar arguments, in their order: :func:`band_scalars`, then the
    scores stage's options (a :class:`~flashlab.kernels.options.ScoresStage` of float32). The
    one place a launch spells them."""
    return band_scalars(p) + (p.scores.in_dtype(np.float32),)


def kv_blocks(p: Problem) -> np.ndarray:
    """``(n_qblocks, 2)`` int64: the key-block range ``[kb0, kb1)`` each query block visits.

    From :func:`flashlab.masks.kv_block_range`, the CPU kernels' tile skipping, per block.
    """
    _, _, _, Sq, Sk, _, _ = p.shape
    return np.array([kv_block_range(i0, min(i0 + p.block_q, Sq), Sk, p.block_k, p.left, p.right)
                     for i0 in range(0, Sq, p.block_q)], dtype=np.int64).reshape(-1, 2)


def q_blocks(p: Problem) -> np.ndarray:
    """``(n_kblocks, 2)`` int64: the query-block range ``[qb0, qb1)`` each key block visits.

    The transpose of :func:`kv_blocks` (the backward's loop order, key blocks outer): key block
    ``kb`` is visited by exactly the query blocks whose range holds it, a contiguous run for a
    band mask; ``(0, 0)`` when none does.
    """
    _, _, _, _, Sk, _, _ = p.shape
    ranges = kv_blocks(p)
    out = np.zeros((cdiv(Sk, p.block_k), 2), dtype=np.int64)
    for kb in range(out.shape[0]):
        hit = np.flatnonzero((ranges[:, 0] <= kb) & (kb < ranges[:, 1]))
        if hit.size:
            if hit[-1] - hit[0] + 1 != hit.size:
                raise AssertionError(f"key block {kb}: its query blocks {hit} are not contiguous")
            out[kb] = hit[0], hit[-1] + 1
    return out


def _float32(p: Problem) -> None:
    if p.dtype != np.float32:
        raise TypeError(f"q, k and v must be float32 for the GPU twin; got {p.dtype}")


def _check_launch(threads: int, shared: int, what: str,
                  advice: str = "choose smaller block_q, block_k") -> None:
    if threads > MAX_THREADS:
        raise ValueError(f"{what} must give <= {MAX_THREADS} threads per block; got {threads}")
    if shared > STATIC_SHARED_LIMIT and not is_simulator():
        raise ValueError(f"{what} gives {shared} bytes of shared memory per block, over the "
                         f"{STATIC_SHARED_LIMIT} a CUDA block may declare statically; {advice}")


def _tiles(p: Problem, block_q: int | None, block_k: int | None, shared_bytes) -> Problem:
    """``p`` with the tiles asked for; a ``None`` takes that side of the first tile of
    :data:`flashlab.gpu.inspect.TILE_CHOICES` that fits in static shared memory at p's head dims."""
    if block_q is not None and block_k is not None:
        return p
    from flashlab.gpu.inspect import fitting_tile
    fit = fitting_tile(shared_bytes, p.shape[5], p.shape[6])
    return p.with_blocks(fit[0] if block_q is None else block_q, fit[1] if block_k is None else block_k)


def _counter():
    return cuda.to_device(np.zeros(COUNTER_SLOTS, dtype=np.int64))


@takes_scores_stage
def flash_attention_gpu(q, k, v, *, causal=False, block_q: int | None = None,
                        block_k: int | None = None, count_traffic=False, **scores):
    """Fused attention forward on CUDA (or the simulator): ``(o, lse)`` or ``(o, lse, traffic)``.

    q (B, H, Sq, Dqk), k (B, Hkv, Sk, Dqk), v (B, Hkv, Sk, Dv) float32, H a multiple of Hkv;
    o (B, H, Sq, Dv) and lse (B, H, Sq) float32 (lse = -inf for a row with no allowed key).
    Scale ``1/sqrt(Dqk)``; ``causal``: key j allowed iff j <= i; the scores stage's keywords
    (listed in the signature, taken as ``**scores``) as :func:`flashlab.flash_attention` takes
    them (the logit soft-cap; off by default), checked by
    :func:`flashlab.kernels.options.scores_stage`. Tiles ``block_q x block_k``
    (``None``: the first of :data:`flashlab.gpu.inspect.TILE_CHOICES` whose shared tiles fit in
    48 KiB). ``traffic`` counts global-memory requests in bytes, equal to
    :func:`flashlab.traffic.tiled_attention_traffic`.
    """
    p = prepare(q, k, v, causal=causal, block_q=1 if block_q is None else block_q,
                block_k=1 if block_k is None else block_k, **scores)
    _float32(p)
    p = _tiles(p, block_q, block_k, forward_shared_bytes)
    count = as_bool("count_traffic", count_traffic)
    B, H, _, Sq, _, Dqk, Dv = p.shape
    threads = forward_threads(p.block_q, p.block_k, Dv)
    _check_launch(threads, forward_shared_bytes(p.block_q, p.block_k, Dqk, Dv), "block_q x block_k")
    kernel = forward_kernel(p.block_q, p.block_k, Dqk, Dv, count)
    o = cuda.device_array((B, H, Sq, Dv), dtype=np.float32)
    lse = cuda.device_array((B, H, Sq), dtype=np.float32)
    counter = _counter()
    kernel[(B * H, cdiv(Sq, p.block_q)), threads](
        cuda.to_device(p.q), cuda.to_device(p.k), cuda.to_device(p.v), cuda.to_device(kv_blocks(p)),
        *fused_scalars(p), o, lse, counter)
    out = (o.copy_to_host(), lse.copy_to_host())
    return out + (Traffic.from_counter(counter.copy_to_host()),) if count else out


@takes_scores_stage
def flash_attention_backward_gpu(do, q, k, v, o, lse, *, causal=False,
                                 block_q: int | None = None, block_k: int | None = None,
                                 count_traffic=False, **scores):
    """Fused attention backward on CUDA: ``(dq, dk, dv)`` or ``(dq, dk, dv, traffic)``.

    do, o (B, H, Sq, Dv) float32 and lse (B, H, Sq) from :func:`flash_attention_gpu` (or the
    CPU :func:`flashlab.flash_attention`); other arguments as there. dq (B, H, Sq, Dqk),
    dk (B, Hkv, Sk, Dqk), dv (B, Hkv, Sk, Dv) float32 (GQA: summed over each kv head's group).
    ``traffic`` equals :func:`flashlab.traffic.tiled_attention_traffic` with ``backward=True``
    (and ``kv_heads=Hkv``). One thread block per (batch, kv head, key block), as
    FlashAttention-2 (:mod:`flashlab.gpu.backward`); dQ is summed with atomic adds, so on a
    GPU its last bits can differ from run to run.
    """
    p = prepare(q, k, v, causal=causal, block_q=1 if block_q is None else block_q,
                block_k=1 if block_k is None else block_k, **scores)
    _float32(p)
    p = _tiles(p, block_q, block_k, backward_shared_bytes)
    do, o, lse = backward_operands(p, do, o, lse)
    count = as_bool("count_traffic", count_traffic)
    B, H, Hkv, Sq, Sk, Dqk, Dv = p.shape
    threads = backward_threads(p.block_q, p.block_k, Dqk, Dv)
    _check_launch(threads, backward_shared_bytes(p.block_q, p.block_k, Dqk, Dv), "block_q x block_k")
    kernel = backward_kernel(p.block_q, p.block_k, Dqk, Dv, count)
    gdo, go = cuda.to_device(do), cuda.to_device(o)
    dd = cuda.device_array((B, H, Sq), dtype=np.float32)
    counter = _counter()
    # D = rowsum(dO o O), once (FlashAttention-2's preprocessing kernel)
    dot_kernel(Dv, count)[(B * H, cdiv(Sq, DOT_ROWS)), 8 * DOT_ROWS](gdo, go, dd, counter)
    dq = cuda.to_device(np.zeros((B, H, Sq, Dqk), dtype=np.float32))   # the atomics add into it
    dk = cuda.device_array((B, Hkv, Sk, Dqk), dtype=np.float32)
    dv = cuda.device_array((B, Hkv, Sk, Dv), dtype=np.float32)
    dev = cuda.to_device
    kernel[(B * Hkv, cdiv(Sk, p.block_k)), threads](
        gdo, dev(p.q), dev(p.k), dev(p.v), dev(lse.astype(np.float32)), dd,
        dev(q_blocks(p)), *fused_scalars(p), dq, dk, dv, counter)
    out = (dq.copy_to_host(), dk.copy_to_host(), dv.copy_to_host())
    return out + (Traffic.from_counter(counter.copy_to_host()),) if count else out


def standard_attention_gpu(q, k, v, *, causal=False, count_traffic=False):
    """Standard three-kernel attention on CUDA: ``o`` or ``(o, traffic)``.

    Arguments as :func:`flash_attention_gpu`. S (B, H, Sq, Sk) float32 is materialised in
    global memory; ``traffic`` sums the three launches and equals
    :func:`flashlab.traffic.standard_attention_traffic` with ``tile=STANDARD_TILE``.
    """
    p = prepare(q, k, v, causal=causal)
    _float32(p)
    count = as_bool("count_traffic", count_traffic)
    B, H, _, Sq, Sk, Dqk, Dv = p.shape
    T = STANDARD_TILE
    _check_launch(standard_threads(T, max(Dqk, Dv)), standard_shared_bytes(T, Dqk, Dv),
                  f"the standard kernels' {T}-row tile",
                  "the three-kernel baseline has one fixed tile: use head dims <= 128")
    grid = (B * H, cdiv(Sq, T))
    s = cuda.device_array((B, H, Sq, Sk), dtype=np.float32)
    o = cuda.device_array((B, H, Sq, Dv), dtype=np.float32)
    counter = _counter()
    scores_kernel(T, Dqk, count)[grid, standard_threads(T, Dqk)](
        cuda.to_device(p.q), cuda.to_device(p.k), *band_scalars(p), s, counter)
    softmax_kernel(T, count)[grid, 32 * SOFTMAX_WARPS](s, counter)
    pv_kernel(T, Dv, count)[grid, standard_threads(T, Dv)](s, cuda.to_device(p.v), o, counter)
    out = o.copy_to_host()
    return (out, Traffic.from_counter(counter.copy_to_host())) if count else out
