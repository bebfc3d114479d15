r"""The forward kernel, one tile at a time: a recording of every state the online softmax passes through.

:func:`walk_forward` runs the algorithm of :func:`flashlab.kernels.forward.flash_forward_kernel`
for one ``(batch, head)``, sequentially, from Python. It contains **no arithmetic of its own**:
each step calls the kernel's own ``@njit`` helpers (``kv_block_range``, ``tile_class``,
``tile_fully_masked``, the scores stage ``tile_scores``, ``online_softmax_update``,
``finalize_rows``) in the kernel's order, with the kernel's options record
(``flashlab.api.tile_options``), on buffers of the kernel's dtype, and copies what
they leave behind. So the final ``o`` and ``lse`` equal :func:`flashlab.flash_attention`'s
(``tests/test_walk.py`` checks it), and a drawing of the walk is a drawing of the kernel.

For every tile ``(qb, kb)`` of the ``ceil(Sq/block_q) x ceil(Sk/block_k)`` grid, in the order
the kernel meets them (query block outer, key block inner), one :class:`TileStep` holds

* whether the kernel skipped the tile, and why (outside the band's key range: never visited;
  or removed entirely by the dense mask: skipped after reading the mask tile);
* for a computed tile: the scores $S$ after masking (before the softmax) and $\tilde P = e^{S - m'}$;
* the running state after the step: $m$, $\ell$ and $\tilde O$ for the rows of the q-block, and
  the partial output $\tilde O / \ell$ — what the q-block would output if the walk stopped here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashlab.api import compute_dtype, tile_options
from flashlab.arguments import as_int
from flashlab.kernels.tile import finalize_rows, head_operands, online_softmax_update, tile_scores
from flashlab.masks import EMPTY, FULL, kv_block_range, tile_class, tile_fully_masked
from flashlab.tiling import cdiv
from flashlab.validation import Problem, prepare, scan_kv

__all__ = ["COMPUTED", "OUTSIDE_BAND", "MASKED_OUT", "TileStep", "Walk", "walk_forward"]

#: why a tile was skipped (``TileStep.reason``); computed tiles have reason ``COMPUTED``
COMPUTED = "computed"
OUTSIDE_BAND = "outside the band's key range: never visited"
MASKED_OUT = "dense mask removes the whole tile: skipped after reading it"


@dataclass(frozen=True)
class TileStep:
    r"""One tile of the walk, with the running state of its q-block *after* the tile.

    ``rows = (i0, i1)`` and ``cols = (j0, j1)`` are the tile's half-open index ranges;
    ``r = i1 - i0`` rows, ``c = j1 - j0`` columns, ``Dv`` the value dim.

    - ``tile_class``: EMPTY for a skipped tile, else the band's class (PARTIAL or FULL) from
      :func:`flashlab.masks.tile_class`;
    - ``masked``: whether ``mask_tile`` ran on this tile (band PARTIAL, or a dense mask given);
    - ``s``: (r, c) scores after soft-capping and masking (masked = -inf), before the softmax;
      None when skipped;
    - ``p``: (r, c) $\tilde P = e^{S - m'}$; None when skipped;
    - ``m_prev``, ``m``, ``l``: (r,) running max before / after the tile, running denominator after;
    - ``acc``: (r, Dv) unnormalised output $\tilde O$ after the tile;
    - ``o_partial``: (r, Dv) $\tilde O / \ell$ after the tile (rows with $\ell = 0$ give 0).
    """

    qb: int
    kb: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    tile_class: int
    skipped: bool
    reason: str
    masked: bool
    s: np.ndarray | None
    p: np.ndarray | None
    m_prev: np.ndarray
    m: np.ndarray
    l: np.ndarray
    acc: np.ndarray
    o_partial: np.ndarray


@dataclass
class Walk:
    """A recorded forward pass of one (batch, head).

    steps : every tile of the grid, in the kernel's order (``n_qb * n_kb`` of them)
    o : (Sq, Dv) output in the compute dtype (float32, or float64 for float64 inputs)
    lse : (Sq,) float32 log-sum-exp
    mask : (Sq, Sk) bool dense mask of this (batch, head) (True = masked out) or None
    left, right : the band ``[i - left, i + right]``
    """

    steps: list[TileStep]
    o: np.ndarray
    lse: np.ndarray
    sq: int
    sk: int
    block_q: int
    block_k: int
    left: int
    right: int
    mask: np.ndarray | None
    b: int = 0
    h: int = 0
    tiles_done: np.ndarray | None = None  # (n_qb,) int64: computed tiles per q-block

    @property
    def n_qb(self) -> int:
        return cdiv(self.sq, self.block_q)

    @property
    def n_kb(self) -> int:
        return cdiv(self.sk, self.block_k)

    @property
    def computed(self) -> list[TileStep]:
        """The steps whose tile the kernel actually computed."""
        return [st for st in self.steps if not st.skipped]

    def last_step_of(self, qb: int) -> TileStep:
        """The last step of q-block ``qb`` (its state is the q-block's final state)."""
        return [st for st in self.steps if st.qb == qb][-1]


def walk_forward(q=None, k=None, v=None, *, b: int = 0, h: int = 0, problem: Problem | None = None,
                 **options) -> Walk:
    """Run the tiled forward for query head ``h`` of batch ``b`` one tile at a time; record it.

    ``q``, ``k``, ``v`` and ``options`` are :func:`flashlab.flash_attention`'s (its keyword
    arguments: ``scale``, ``causal``, ``window``, ``mask``, the RoPE pair, ``bias``, ALiBi,
    the scores stage's, ``block_q``/``block_k``...), checked by :func:`flashlab.validation.prepare` with
    the same defaults (tiles :data:`~flashlab.tiling.FORWARD_BLOCK`); or ``problem``, a
    :class:`~flashlab.validation.Problem` already checked, as the kernel API takes it. A walk
    with the same arguments is the kernel's own walk: its scores come from the kernels' stage
    (:func:`flashlab.kernels.tile.tile_scores`), so every option of that stage is walked as the
    kernel computes it. Except dropout: a walk records P as the softmax makes it, and
    ``dropout_p`` must be 0. ``b`` and ``h``: the (batch, query head) to walk. Keep the problem
    small (a few hundred rows): every step copies the q-block's state; to draw a walk with
    several tiles on a small problem, pass small ``block_q``/``block_k`` explicitly.
    """
    if problem is None:
        p = prepare(q, k, v, **options)
    elif q is not None or k is not None or v is not None or options:
        raise TypeError("walk_forward takes either q, k, v with the kernel API's options or a checked "
                        "problem=, not both")
    else:
        p = problem
    if p.dropout_p > 0:
        raise ValueError(f"dropout_p must be 0 in a walk (it records P before any drop); got {p.dropout_p}")
    p = scan_kv(p) if p.lazy_kv else p
    B, H, Hkv, Sq, Sk, _, Dv = p.shape
    b = as_int("b", b, lo=0, hi=B - 1, what=f"an int in [0, {B})")
    h = as_int("h", h, lo=0, hi=H - 1, what=f"an int in [0, {H})")
    ct = compute_dtype(p.dtype)
    # the operands of this (b, h), as the kernel slices them (GQA: kv head h // (H / Hkv))
    hk = h // (H // Hkv)
    qh = p.q[b, h].astype(ct, copy=False)
    kh = p.k[b, hk].astype(ct, copy=False)
    vh = p.v[b, hk].astype(ct, copy=False)
    has_rope = p.q_rope is not None
    no_rope = np.zeros((1, 1), dtype=ct)
    qrh = krh = no_rope
    if p.q_rope is not None and p.k_rope is not None:
        qrh = p.q_rope[b, h].astype(ct, copy=False)
        krh = p.k_rope[b, h // (H // p.k_rope.shape[1])].astype(ct, copy=False)
    record = tile_options(p, ct, check_overflow=False)
    has_mask = record.has_mask
    # this head's 2-D mask (and bias, slope), as the kernel takes them
    mask2d, bias2d, slope = head_operands(record, b, h)
    left, right, bq, bk = p.left, p.right, p.block_q, p.block_k
    n_qb, n_kb = cdiv(Sq, bq), cdiv(Sk, bk)

    o = np.empty((Sq, Dv), dtype=ct)
    lse = np.empty(Sq, dtype=np.float32)
    tiles_done = np.zeros(n_qb, dtype=np.int64)
    steps: list[TileStep] = []
    for qb in range(n_qb):
        i0, i1 = qb * bq, min(qb * bq + bq, Sq)
        rows = i1 - i0
        # scale Q_i once per q-block, in the kernel's dtype
        qs = qh[i0:i1] * ct(p.scale)
        qrs = qrh[i0:i1] * ct(p.scale) if has_rope else no_rope
        m = np.full(rows, -np.inf, dtype=ct)
        l = np.zeros(rows, dtype=ct)
        acc = np.zeros((rows, Dv), dtype=ct)
        kb0, kb1 = kv_block_range(i0, i1, Sk, bk, left, right)
        for kb in range(n_kb):
            j0, j1 = kb * bk, min(kb * bk + bk, Sk)
            m_prev = m.copy()
            if not kb0 <= kb < kb1:
                # the kernel's loop never reaches this kv-block
                cls, reason = EMPTY, OUTSIDE_BAND
            else:
                cls = tile_class(i0, i1, j0, j1, left, right)
                reason = COMPUTED
                if cls == EMPTY:
                    reason = OUTSIDE_BAND
                elif has_mask and tile_fully_masked(mask2d, i0, i1, j0, j1, left, right):
                    cls, reason = EMPTY, MASKED_OUT
            if reason != COMPUTED:
                steps.append(_record(qb, kb, (i0, i1), (j0, j1), cls, reason, False,
                                     None, None, m_prev, m, l, acc))
                continue
            s = np.empty((rows, j1 - j0), dtype=ct)
            kr = krh[j0:j1] if has_rope else no_rope
            # S: the kernels' scores stage (scale, soft-cap, bias, ALiBi, masked entries -inf)
            tile_scores(s, qs, kh[j0:j1], qrs, kr, i0, j0, cls != FULL, mask2d, bias2d, slope,
                        s, False, record)
            masked = bool(cls != FULL or has_mask)
            s_before = s.copy()
            # overwrites s with P~ and updates m, l, acc in place
            online_softmax_update(s, vh[j0:j1], m, l, acc)
            tiles_done[qb] += 1
            steps.append(_record(qb, kb, (i0, i1), (j0, j1), cls, COMPUTED, masked,
                                 s_before, s, m_prev, m, l, acc))
        finalize_rows(m, l, acc, o[i0:i1], lse[i0:i1])
    return Walk(steps, o, lse, Sq, Sk, bq, bk, left, right,
                mask2d.copy() if has_mask else None, b, h, tiles_done)


def _record(qb, kb, rows, cols, cls, reason, masked, s, p_tile, m_prev, m, l, acc) -> TileStep:
    """Freeze the state into a TileStep; the partial output comes from the kernel's finalize_rows."""
    o_partial = np.empty_like(acc)
    lse_scratch = np.empty(acc.shape[0], dtype=np.float32)
    finalize_rows(m.copy(), l.copy(), acc.copy(), o_partial, lse_scratch)
    return TileStep(qb, kb, rows, cols, int(cls), reason != COMPUTED, reason, masked,
                    s, p_tile, m_prev, m.copy(), l.copy(), acc.copy(), o_partial)
