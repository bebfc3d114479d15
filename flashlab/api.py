"""The public kernel API: validate, convert once at the boundary, dispatch to the Numba kernels.

Dtypes: float16 inputs are computed in float32 (the kernels are compiled for float32 and
float64 only, which keeps Numba's compile time to two signatures); ``o`` comes back in the
inputs' dtype and ``lse`` as float32.
"""
from __future__ import annotations

import numpy as np

from flashlab.checks import Problem, prepare
from flashlab.kernels.forward import flash_forward_kernel

# placeholders passed for absent optional operands: the kernels have one signature per dtype
_NO_MASK = np.zeros((1, 1, 1, 1), dtype=np.bool_)


def compute_dtype(dtype: np.dtype) -> type:
    """Accumulation dtype for inputs of ``dtype``: float64 stays float64, the rest use float32."""
    return np.float64 if dtype == np.float64 else np.float32


def _forward(p: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Run the kernel on a validated problem.

    Returns ``(o, lse, row_max, tiles_done)``: o (B, H, Sq, Dv) in the compute dtype; lse and
    row_max (B, H, Sq) float32 (row_max = the final running max, CANN's ``softmax_max``);
    tiles_done (B * H * n_qblocks,) int64.
    """
    B, H, _, Sq, _, _, Dv = p.shape
    ct = compute_dtype(p.dtype)
    q, k, v = (x.astype(ct, copy=False) for x in (p.q, p.k, p.v))
    has_rope = p.q_rope is not None
    if has_rope:
        q_rope, k_rope = p.q_rope.astype(ct, copy=False), p.k_rope.astype(ct, copy=False)
    else:
        q_rope = np.zeros((1, 1, 1, 1), dtype=ct)
        k_rope = q_rope
    mask = _NO_MASK if p.mask is None else p.mask
    o = np.empty((B, H, Sq, Dv), dtype=ct)
    lse = np.empty((B, H, Sq), dtype=np.float32)
    row_max = np.empty((B, H, Sq), dtype=np.float32)
    n_qb = -(-Sq // p.block_q)
    tiles = np.zeros(B * H * n_qb, dtype=np.int64)
    flash_forward_kernel(q, k, v, q_rope, k_rope, has_rope, mask, p.mask is not None,
                         ct(p.scale), p.left, p.right, p.block_q, p.block_k, o, lse, row_max, tiles)
    return o, lse, row_max, tiles


def flash_attention(q, k, v, *, scale=None, causal=False, window=None, mask=None,
                    q_rope=None, k_rope=None, block_q=64, block_k=64):
    """Tiled FlashAttention forward (online softmax; nothing of size Sq x Sk is stored).

    Parameters
    ----------
    q : (B, H, Sq, Dqk) float16/32/64
    k : (B, Hkv, Sk, Dqk), same dtype; ``H % Hkv == 0`` (GQA; Hkv = 1 is MQA)
    v : (B, Hkv, Sk, Dv); ``Dv`` may differ from ``Dqk`` (e.g. 192/128), no padding is done
    scale : float, default ``1/sqrt(Dqk + Dr)``
    causal : key ``j`` allowed iff ``j <= i`` (top-left aligned, as torch's ``is_causal``)
    window : ``(left, right)``: key ``j`` allowed iff ``i - left <= j <= i + right``; a side
        may be ``None`` (unbounded) or negative
    mask : bool array broadcastable to (B, H, Sq, Sk), ``True`` = masked out (CANN convention)
    q_rope, k_rope : optional (B, H, Sq, Dr) and (B, Hr, Sk, Dr), ``H % Hr == 0``: their
        product is accumulated into the same score tile as ``q k^T``
    block_q, block_k : tile sizes, any ints >= 1 (need not divide Sq, Sk)

    Returns
    -------
    o : (B, H, Sq, Dv) in q's dtype; lse : (B, H, Sq) float32, natural log.
    A row with no allowed key gives ``o = 0`` and ``lse = -inf``.

    Tiles that ``causal``/``window`` mask completely are never computed (see
    :mod:`flashlab.kernels.forward`); with a dense ``mask`` a tile it masks completely is
    skipped after its mask is read.
    """
    p = prepare(q, k, v, scale=scale, causal=causal, window=window, mask=mask,
                q_rope=q_rope, k_rope=k_rope, block_q=block_q, block_k=block_k)
    o, lse, _, _ = _forward(p)
    return o.astype(p.dtype, copy=False), lse


def tiles_computed(q, k, v, **options) -> np.ndarray:
    """Number of (q-block, kv-block) tiles the forward kernel computes, per (B, H, q-block).

    Same arguments as :func:`flash_attention`; returns an int64 array (B, H, n_qblocks). Used by
    the tests and the masks chapter to show that skipped tiles are really never computed.
    """
    p = prepare(q, k, v, **options)
    tiles = _forward(p)[3]
    B, H = p.q.shape[:2]
    return tiles.reshape(B, H, -1)
