"""Drawings for the masks chapter: a gallery of block maps, and the tiles of a varlen (TND) batch.

- :func:`draw_case` / :func:`mask_gallery`: one block map per mask (causal, window, dense, ...),
  each drawn with :func:`flashlab.viz.tiles.draw_block_map` and titled with its tile counts.
- :func:`sequence_tiles`: the tiles each sequence of a packed TND batch computes when it is
  launched on its own, taken from the operator's own plan (:func:`flashlab.cann.plan`), so the
  band of every sequence is the one :func:`flashlab.flash_attention_score` runs.
- :func:`varlen_figure`: three ways to run the same varlen batch, side by side: one launch per
  sequence (what the operator does), one launch over the packed ``T x T`` scores with the
  block-diagonal mask as a dense mask, and a padded launch over ``B`` copies of the longest
  sequence that computes every tile.

Coordinates: key index ``j`` to the right, query index ``i`` downwards (row 0 at the top).
Colours: :data:`flashlab.viz.style.PALETTE` (``empty`` = skipped, ``partial``, ``full``); an
entry that is computed but masked out or thrown away is its tile's colour faded towards white.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from flashlab.cann import Dims, plan, sparse_mode_mask
from flashlab.masks import EMPTY, FULL, NO_LIMIT, PARTIAL, allowed, band_from, classify_tiles
from flashlab.tiling import cdiv
from flashlab.viz.style import PALETTE, new_figure
from flashlab.viz.tiles import class_image, draw_block_map

__all__ = ["tile_counts", "class_legend", "draw_case", "mask_gallery", "SequenceTiles",
           "sequence_tiles", "packed_allowed", "VarlenCounts", "varlen_counts", "varlen_figure"]

_LABELS = {EMPTY: "empty (skipped)", PARTIAL: "partial (masked per element)",
           FULL: "full (no masking)"}


def tile_counts(classes: np.ndarray) -> str:
    """``"F full, P partial, E empty"`` for a tile-class array from :func:`flashlab.masks.classify_tiles`."""
    return ", ".join(f"{int(np.sum(classes == c))} {name}"
                     for c, name in ((FULL, "full"), (PARTIAL, "partial"), (EMPTY, "empty")))


def class_legend(fig: Figure, **kwargs) -> None:
    """One legend of the three tile classes for the whole figure (below it by default)."""
    handles = [Patch(color=PALETTE[k], label=_LABELS[c])
               for c, k in ((EMPTY, "empty"), (PARTIAL, "partial"), (FULL, "full"))]
    options: dict[str, Any] = dict(loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, -0.06))
    options.update(kwargs)
    fig.legend(handles=handles, **options)


def draw_case(ax, sq: int, sk: int, block_q: int, block_k: int, *, causal: bool = False,
              window: tuple | None = None, mask: np.ndarray | None = None,
              title: str = "") -> np.ndarray:
    """Block map of one mask on ``ax``, titled ``title`` and its tile counts.

    Arguments as :func:`flashlab.flash_attention` (``mask`` (sq, sk) bool, True = masked out).
    Returns the tile classes (n_qblocks, n_kblocks), as :func:`flashlab.masks.classify_tiles`.
    """
    if mask is not None and np.shape(mask) != (sq, sk):
        raise ValueError(f"mask must have shape (sq, sk) = {(sq, sk)}; got {np.shape(mask)}")
    left, right = band_from(causal, window)
    classes = classify_tiles(sq, sk, block_q, block_k, left, right, mask)
    ok = allowed(sq, sk, left, right)
    if mask is not None:
        ok &= ~mask
    draw_block_map(ax, classes, ok, block_q, block_k, legend=False)
    ax.set_title(f"{title}\n{tile_counts(classes)}", fontsize=9)
    ax.set_aspect("equal")
    ax.tick_params(labelsize=7)
    ax.set_xlabel("key j", fontsize=8)
    ax.set_ylabel("query i", fontsize=8)
    return classes


def mask_gallery(cases: dict[str, tuple[int, int, dict]], block_q: int, block_k: int, *,
                 ncols: int = 3, panel: float = 3.2) -> Figure:
    """A grid of block maps, one per entry ``title: (sq, sk, options)`` of ``cases``.

    ``options`` are :func:`flashlab.flash_attention` mask keywords (``causal``, ``window``,
    ``mask``). Every panel shares the tile size ``block_q x block_k`` and one legend.
    """
    if not cases:
        raise ValueError("cases must name at least one mask")
    n = len(cases)
    nrows = cdiv(n, ncols)
    fig, axes = new_figure(panel * ncols, panel * nrows + 0.4, nrows=nrows, ncols=ncols)
    axes = np.atleast_1d(axes).ravel()
    for ax, (title, (sq, sk, options)) in zip(axes, cases.items()):
        draw_case(ax, sq, sk, block_q, block_k, title=title, **options)
    for ax in axes[n:]:
        ax.set_visible(False)
    class_legend(fig, bbox_to_anchor=(0.5, -0.04))
    return fig


# ------------------------------------------------------------------------------- varlen
class SequenceTiles(NamedTuple):
    """The tile grid of one sequence launched on its own, placed in the packed ``T x T`` scores.

    Rows ``[q0, q1)`` and keys ``[k0, k1)`` of the packed batch; ``classes``
    (ceil(sq/block_q), ceil(sk/block_k)) tile classes of the sequence's own grid (it starts at
    ``(q0, k0)``); ``ok`` (sq, sk) bool, the allowed entries.
    """

    q0: int
    q1: int
    k0: int
    k1: int
    classes: np.ndarray
    ok: np.ndarray


def _lengths(name: str, lengths) -> list[int]:
    values = [int(x) for x in lengths]
    if not values or any(x < 0 for x in values):
        raise ValueError(f"{name} must be a non-empty list of sequence lengths >= 0; got {lengths!r}")
    return values


def sequence_tiles(lengths_q, lengths_k=None, *, block_q: int, block_k: int,
                   **operator_mask) -> list[SequenceTiles]:
    """The tiles each non-empty sequence of a TND batch computes when launched on its own.

    ``lengths_q``/``lengths_k``: the sequences' query and key lengths (``lengths_k`` defaults to
    ``lengths_q``; the operator's ``actual_seq_*len`` are their cumulative sums).
    ``operator_mask``: ``sparse_mode``, ``atten_mask``, ``pre_tokens``, ``next_tokens`` as
    :func:`flashlab.flash_attention_score` takes them. The band (and dense mask, if any) of each
    sequence comes from :func:`flashlab.cann.plan`, the code the operator runs.
    """
    lq = _lengths("lengths_q", lengths_q)
    lk = lq if lengths_k is None else _lengths("lengths_k", lengths_k)
    if len(lk) != len(lq):
        raise ValueError(f"lengths_q and lengths_k must list the same number of sequences; "
                         f"got {len(lq)} and {len(lk)}")
    eq, ek = np.cumsum(lq), np.cumsum(lk)
    # (q0, q1, k0, k1) of every sequence in the packed batch
    seqs = [(int(a - x), int(a), int(b - y), int(b)) for a, x, b, y in zip(eq, lq, ek, lk)]
    dims = Dims(len(seqs), 1, 1, int(eq[-1]), int(ek[-1]), 1, 1)
    out = []
    for c in plan(dims, seqs=seqs, **operator_mask):
        sq, sk = c.q_rows.stop - c.q_rows.start, c.kv_rows.stop - c.kv_rows.start
        mask = None if c.mask is None else c.mask[0, 0]
        ok = allowed(sq, sk, c.left, c.right)
        if mask is not None:
            ok &= ~mask
        classes = classify_tiles(sq, sk, block_q, block_k, c.left, c.right, mask)
        out.append(SequenceTiles(c.q_rows.start, c.q_rows.stop, c.kv_rows.start, c.kv_rows.stop,
                                 classes, ok))
    return out


def _draw_pieces(ax, shape: tuple[int, int], pieces, block_q: int, block_k: int) -> None:
    """Draw several tile grids, each at its own offset, on one ``shape`` canvas.

    ``pieces``: ``(row0, col0, classes, ok)`` tuples; the canvas outside every piece is white
    (no launch covers it). Tile borders are drawn per piece, so grids need not align.
    """
    img = np.ones(shape + (3,))
    for r0, c0, classes, ok in pieces:
        h, w = ok.shape
        img[r0:r0 + h, c0:c0 + w] = class_image(classes, ok, block_q, block_k)
    ax.imshow(img, extent=(0, shape[1], shape[0], 0), interpolation="nearest")
    for r0, c0, _, ok in pieces:
        h, w = ok.shape
        for j in list(range(c0, c0 + w, block_k)) + [c0 + w]:
            ax.vlines(j, r0, r0 + h, color="white", lw=1.0)
        for i in list(range(r0, r0 + h, block_q)) + [r0 + h]:
            ax.hlines(i, c0, c0 + w, color="white", lw=1.0)
        ax.add_patch(Rectangle((c0, r0), w, h, fill=False, ec=PALETTE["text"], lw=0.8))
    ax.set_xlim(0, shape[1])
    ax.set_ylim(shape[0], 0)


def _boundaries(ax, ends_q, ends_k) -> None:
    for e in ends_q[:-1]:
        ax.axhline(e, color=PALETTE["highlight"], lw=1.2, ls="--")
    for e in ends_k[:-1]:
        ax.axvline(e, color=PALETTE["highlight"], lw=1.2, ls="--")


def packed_allowed(lengths_q, lengths_k=None, **operator_mask) -> np.ndarray:
    """``(T_q, T_k)`` bool, True = allowed: the operator's mask over a packed TND batch.

    Block-diagonal: each sequence attends only within itself. Computed by
    :func:`flashlab.cann.sparse_mode_mask` from the cumulative ends of the lengths.
    """
    lq = _lengths("lengths_q", lengths_q)
    lk = lq if lengths_k is None else _lengths("lengths_k", lengths_k)
    operator_mask = dict(operator_mask)
    mode = operator_mask.pop("sparse_mode", 0)
    return sparse_mode_mask(int(sum(lq)), int(sum(lk)), mode, actual_seq_qlen=np.cumsum(lq),
                            actual_seq_kvlen=np.cumsum(lk), **operator_mask)


class VarlenCounts(NamedTuple):
    """Tiles computed by the three launches of :func:`varlen_figure`."""

    per_sequence: int
    packed: int
    padded: int


def varlen_counts(lengths_q, lengths_k=None, *, block_q: int, block_k: int,
                  **operator_mask) -> VarlenCounts:
    """Tiles computed per launch: one per sequence, packed with a dense mask, padded and dense.

    - per sequence: the non-empty tiles of every sequence's own grid (:func:`sequence_tiles`);
    - packed: one launch over the ``T_q x T_k`` scores with the operator's allowed set
      (block-diagonal) as a dense mask: its non-empty tiles;
    - padded: ``B`` sequences padded to the longest, no mask: every tile of
      ``B x ceil(max_q/block_q) x ceil(max_k/block_k)``.
    """
    lq = _lengths("lengths_q", lengths_q)
    lk = lq if lengths_k is None else _lengths("lengths_k", lengths_k)
    pieces = sequence_tiles(lq, lk, block_q=block_q, block_k=block_k, **operator_mask)
    per_seq = sum(int(np.sum(p.classes != EMPTY)) for p in pieces)
    ok = packed_allowed(lq, lk, **operator_mask)
    sq, sk = ok.shape
    packed = int(np.sum(classify_tiles(sq, sk, block_q, block_k, NO_LIMIT, NO_LIMIT, ~ok) != EMPTY))
    padded = len(lq) * cdiv(max(lq), block_q) * cdiv(max(lk), block_k)
    return VarlenCounts(per_seq, packed, padded)


def varlen_figure(lengths_q, lengths_k=None, *, block_q: int, block_k: int,
                  **operator_mask) -> Figure:
    """Three launches of one TND batch, with the tiles each computes.

    Top left: the packed ``T x T`` scores; each sequence launched on its own grid (the
    operator's way), white = never visited. Top right: one launch over the packed scores with
    the block-diagonal mask as a dense mask (tiles on a boundary are computed partially).
    Bottom: the sequences padded to the longest and launched densely: every tile computed, the
    padding (faded) thrown away. Dashed lines: sequence boundaries. Arguments as
    :func:`sequence_tiles`.
    """
    lq = _lengths("lengths_q", lengths_q)
    lk = lq if lengths_k is None else _lengths("lengths_k", lengths_k)
    tq, tk = sum(lq), sum(lk)
    mq, mk = max(lq), max(lk)
    counts = varlen_counts(lq, lk, block_q=block_q, block_k=block_k, **operator_mask)
    ends_q, ends_k = list(np.cumsum(lq)), list(np.cumsum(lk))

    fig = plt.figure(figsize=(9.5, 8.0), dpi=80, layout="constrained")
    axd = fig.subplot_mosaic("AB;CC", height_ratios=[1.6, 1.0])

    # one launch per sequence, drawn in place in the packed scores
    pieces = sequence_tiles(lq, lk, block_q=block_q, block_k=block_k, **operator_mask)
    _draw_pieces(axd["A"], (tq, tk), [(p.q0, p.k0, p.classes, p.ok) for p in pieces],
                 block_q, block_k)
    _boundaries(axd["A"], ends_q, ends_k)
    axd["A"].set_title(f"one launch per sequence (the operator): {counts.per_sequence} tiles",
                       fontsize=9)

    # one launch over the packed scores, the block-diagonal mask given densely
    ok = packed_allowed(lq, lk, **operator_mask)
    classes = classify_tiles(tq, tk, block_q, block_k, NO_LIMIT, NO_LIMIT, ~ok)
    draw_block_map(axd["B"], classes, ok, block_q, block_k, legend=False)
    _boundaries(axd["B"], ends_q, ends_k)
    axd["B"].set_title(f"one packed launch, block-diagonal dense mask: {counts.packed} tiles",
                       fontsize=9)

    # padded to the longest sequence, every tile computed; the B grids side by side
    full = np.full((cdiv(mq, block_q), cdiv(mk, block_k)), FULL, dtype=np.int8)
    seq_ok = [np.zeros((sq, sk), dtype=bool) for sq, sk in zip(lq, lk)]
    for s, p in zip([s for s, sq in enumerate(lq) if sq > 0], pieces):
        seq_ok[s] = p.ok
    padded = []
    for s, ok_s in enumerate(seq_ok):
        # real entries keep their allowed pattern; padding rows and columns are all "not allowed"
        ok_pad = np.zeros((mq, mk), dtype=bool)
        ok_pad[:ok_s.shape[0], :ok_s.shape[1]] = ok_s
        padded.append((0, s * mk, full, ok_pad))
    _draw_pieces(axd["C"], (mq, mk * len(lq)), padded, block_q, block_k)
    axd["C"].set_title(f"padded to the longest ({mq} x {mk}) and launched densely: "
                       f"{counts.padded} tiles; faded = computed, then thrown away", fontsize=9)
    axd["C"].set_xlabel("sequence after sequence, key j of each")

    for ax in axd.values():
        ax.set_aspect("equal")
        ax.tick_params(labelsize=7)
    for k in "AB":
        axd[k].set_xlabel("packed key j")
        axd[k].set_ylabel("packed query i")
    axd["C"].set_ylabel("query i")
    class_legend(fig, bbox_to_anchor=(0.5, -0.05))
    fig.suptitle(f"TND batch of {len(lq)} sequences (query lengths {lq}), "
                 f"{block_q} x {block_k} tiles", fontsize=10)
    return fig

