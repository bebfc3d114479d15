"""Drawings of the tile grid and of the online-softmax state during a walk of the forward kernel.

- :func:`draw_block_map` / :func:`block_map_figure`: the ``Sq x Sk`` score grid cut into
  ``block_q x block_k`` tiles, each tile coloured by its class (empty = skipped, partial =
  masked element by element, full = no masking), the allowed entries shaded inside the tiles.
- :func:`draw_walk_frame`: one step of a :class:`flashlab.walk.Walk`: the grid with the
  current tile, the Q / K / V blocks that are "on chip" for it, the running max $m$ and sum
  $\\ell$ of the q-block's rows, and the error of the partial output $\\tilde O / \\ell$ against
  the reference output.

Coordinates: key index ``j`` to the right, query index ``i`` downwards (row 0 at the top), as
the score matrix is usually printed.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from flashlab.masks import EMPTY, FULL, PARTIAL, allowed as band_allowed, classify_tiles
from flashlab.viz.style import PALETTE, new_figure

_CLASS_COLOUR = {EMPTY: PALETTE["empty"], PARTIAL: PALETTE["partial"], FULL: PALETTE["full"]}
_CLASS_LABEL = {EMPTY: "empty (skipped)", PARTIAL: "partial (masked per element)",
                FULL: "full (no masking)"}
#: how far a masked-out entry inside a computed tile is blended towards white
_MASKED_FADE = 0.75
#: floor of the log-scale error axis (an exact partial output would otherwise vanish)
ERR_FLOOR = 1e-12


def _tile_bounds(index: int, block: int, size: int) -> tuple[int, int]:
    return index * block, min(size, (index + 1) * block)


def class_image(classes: np.ndarray, ok: np.ndarray, block_q: int, block_k: int) -> np.ndarray:
    """RGB image (Sq, Sk, 3): each entry in its tile's class colour, faded where it is masked out.

    classes (n_qb, n_kb) from :func:`flashlab.masks.classify_tiles`; ok (Sq, Sk) bool, True where
    key j is allowed for row i.
    """
    sq, sk = ok.shape
    tile = classes[np.arange(sq)[:, None] // block_q, np.arange(sk)[None, :] // block_k]
    img = np.empty((sq, sk, 3))
    for cls, colour in _CLASS_COLOUR.items():
        img[tile == cls] = to_rgb(colour)
    faded = (tile != EMPTY) & ~ok
    img[faded] = img[faded] * (1 - _MASKED_FADE) + _MASKED_FADE
    return img


def draw_block_map(ax, classes: np.ndarray, ok: np.ndarray, block_q: int, block_k: int, *,
                   current: tuple[int, int] | None = None, done: Iterable[tuple[int, int]] = (),
                   legend: bool = True) -> None:
    """Draw the tile grid on ``ax``.

    classes (n_qb, n_kb) tile classes; ok (Sq, Sk) allowed entries; ``current`` = (qb, kb) is
    outlined in black (dashed when it is empty); tiles in ``done`` get a small dot (already computed).
    """
    sq, sk = ok.shape
    ax.imshow(class_image(classes, ok, block_q, block_k), extent=(0, sk, sq, 0),
              aspect="auto", interpolation="nearest")
    for j in range(0, sk + 1, block_k):
        ax.axvline(j, color="white", lw=1.2)
    for i in range(0, sq + 1, block_q):
        ax.axhline(i, color="white", lw=1.2)
    for qb, kb in done:
        i0, i1 = _tile_bounds(qb, block_q, sq)
        j0, j1 = _tile_bounds(kb, block_k, sk)
        ax.plot((j0 + j1) / 2, (i0 + i1) / 2, "o", ms=3, color=PALETTE["text"])
    if current is not None:
        i0, i1 = _tile_bounds(current[0], block_q, sq)
        j0, j1 = _tile_bounds(current[1], block_k, sk)
        ax.add_patch(Rectangle((j0, i0), j1 - j0, i1 - i0, fill=False, lw=2.5,
                               ec=PALETTE["text"],
                               ls="-" if classes[current] != EMPTY else "--"))
    ax.set_xlim(0, sk)
    ax.set_ylim(sq, 0)
    ax.set_xlabel("key index j")
    ax.set_ylabel("query index i")
    if legend:
        handles = [Patch(color=_CLASS_COLOUR[c], label=_CLASS_LABEL[c]) for c in (EMPTY, PARTIAL, FULL)]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8,
                  frameon=False)


def block_map_figure(sq: int, sk: int, block_q: int, block_k: int, *, causal: bool = False,
                     window: tuple | None = None, mask: np.ndarray | None = None,
                     current: tuple[int, int] | None = None, w: float = 6.0, h: float = 3.6):
    """A figure with the block map of an ``sq x sk`` problem; mask (sq, sk) bool, True = masked out.

    Returns the figure; its title counts the tiles of each class.
    """
    from flashlab.masks import band_from

    left, right = band_from(causal, window)
    classes = classify_tiles(sq, sk, block_q, block_k, left, right, mask)
    ok = band_allowed(sq, sk, left, right) & (True if mask is None else ~mask)
    fig, ax = new_figure(w, h)
    draw_block_map(ax, classes, ok, block_q, block_k, current=current)
    counts = ", ".join(f"{np.sum(classes == c)} {name}" for c, name in
                       ((FULL, "full"), (PARTIAL, "partial"), (EMPTY, "empty")))
    ax.set_title(f"{sq} x {sk} scores, {block_q} x {block_k} tiles: {counts}", fontsize=9)
    return fig


def _strip(ax, size: int, block: int, current: int | None, colour: str, vertical: bool,
           label: str) -> None:
    """One operand as a strip of blocks beside the grid; the block on chip is filled with ``colour``."""
    n = -(-size // block)
    for b in range(n):
        a0, a1 = _tile_bounds(b, block, size)
        on = b == current
        face = colour if on else PALETTE["empty"]
        rect = (Rectangle((0, a0), 1, a1 - a0) if vertical else Rectangle((a0, 0), a1 - a0, 1))
        rect.set(facecolor=face, edgecolor="white", lw=1.2)
        ax.add_patch(rect)
    if vertical:
        ax.set_xlim(0, 1)
        ax.set_ylim(size, 0)
        ax.set_ylabel(label, rotation=0, labelpad=10, va="center")
    else:
        ax.set_xlim(0, size)
        ax.set_ylim(0, 1)
        ax.set_ylabel(label, rotation=0, labelpad=10, va="center")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def _finite_or_nan(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(x), x, np.nan)


def _qblock_limits(walk, qb: int) -> tuple[tuple[float, float], float]:
    """Fixed y-limits for the m and l panels over all steps of q-block ``qb``."""
    steps = [st for st in walk.steps if st.qb == qb]
    ms = np.concatenate([_finite_or_nan(st.m) for st in steps])
    m_lo, m_hi = (np.nanmin(ms), np.nanmax(ms)) if np.isfinite(ms).any() else (-1.0, 1.0)
    pad = 0.1 * max(m_hi - m_lo, 1e-3)
    l_hi = max(float(np.max([st.l.max() for st in steps])), 1e-3)
    return (m_lo - pad, m_hi + pad), 1.1 * l_hi


def draw_walk_frame(fig: Figure, walk, index: int, o_ref: np.ndarray, *,
                    title: bool = True) -> None:
    """Draw step ``index`` of ``walk`` (a :class:`flashlab.walk.Walk`) into ``fig`` (cleared first).

    o_ref (Sq, Dv): the reference output of the walked (batch, head), e.g.
    ``attention_reference(...)[0][b, h]``. Panels: the tile grid with the Q, K and V strips
    (the blocks on chip are coloured), and for the rows of the current q-block the running max
    ``m`` (dashed: before this tile), the running sum ``l`` and the per-row error
    ``max_d |O_partial - O_ref|`` on a log scale.
    """
    st = walk.steps[index]
    fig.clear()
    left_fig, right_fig = fig.subfigures(1, 2, width_ratios=[1.25, 1.0])
    gs = left_fig.add_gridspec(3, 2, width_ratios=[0.06, 1], height_ratios=[0.05, 0.05, 1],
                               hspace=0.05, wspace=0.03)
    ax_k = left_fig.add_subplot(gs[0, 1])
    ax_v = left_fig.add_subplot(gs[1, 1])
    ax_q = left_fig.add_subplot(gs[2, 0])
    ax_grid = left_fig.add_subplot(gs[2, 1])

    ok = band_allowed(walk.sq, walk.sk, walk.left, walk.right)
    if walk.mask is not None:
        ok &= ~walk.mask
    classes = classify_tiles(walk.sq, walk.sk, walk.block_q, walk.block_k, walk.left,
                             walk.right, walk.mask)
    done = [(s.qb, s.kb) for s in walk.steps[:index] if not s.skipped]
    draw_block_map(ax_grid, classes, ok, walk.block_q, walk.block_k, current=(st.qb, st.kb),
                   done=done, legend=False)
    ax_grid.set_ylabel("")
    ax_grid.tick_params(labelleft=False, labelsize=7)
    ax_grid.set_xlabel("key index j", fontsize=8)
    on_chip = None if st.skipped else st.kb
    _strip(ax_q, walk.sq, walk.block_q, st.qb, PALETTE["q"], True, "Q")
    _strip(ax_k, walk.sk, walk.block_k, on_chip, PALETTE["k"], False, "K")
    _strip(ax_v, walk.sk, walk.block_k, on_chip, PALETTE["v"], False, "V")

    # the q-block's rows: running state after this tile
    i0, i1 = st.rows
    rows = np.arange(i0, i1)
    ax_m, ax_l, ax_e = right_fig.subplots(3, 1, sharex=True)
    (m_lo, m_hi), l_hi = _qblock_limits(walk, st.qb)
    ax_m.step(rows, _finite_or_nan(st.m), where="mid", color=PALETTE["s"], lw=2, label="after")
    ax_m.step(rows, _finite_or_nan(st.m_prev), where="mid", ls="--", lw=1,
              color=PALETTE["text"], label="before")
    ax_m.set_ylim(m_lo, m_hi)
    ax_m.set_title("running max m (dashed: before this tile)", fontsize=8, loc="left")
    ax_l.bar(rows, st.l, width=0.8, color=PALETTE["full"])
    ax_l.set_ylim(0, l_hi)
    ax_l.set_title("running sum ℓ", fontsize=8, loc="left")
    err = np.abs(st.o_partial.astype(np.float64) - o_ref[i0:i1]).max(axis=1)
    ax_e.bar(rows, np.maximum(err, ERR_FLOOR), width=0.8, color=PALETTE["o"],
             bottom=ERR_FLOOR * 0.1)
    ax_e.set_yscale("log")
    ax_e.set_ylim(ERR_FLOOR * 0.1, 10.0)
    ax_e.set_yticks([1e-12, 1e-6, 1.0])
    ax_e.set_title("error of the partial output Õ/ℓ vs reference, per row", fontsize=8,
                   loc="left")
    ax_e.set_xlabel("query row i of the current q-block", fontsize=8)
    ax_e.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_m, ax_l, ax_e):
        ax.tick_params(labelsize=7)
    if title:
        n = len(walk.steps)
        if st.skipped:
            what = f"skipped: {st.reason}"
        else:
            kind = "partial, masked" if st.masked else "full, no masking"
            what = f"computed ({kind})"
        fig.suptitle(f"tile {index + 1}/{n} in loop order: q-block {st.qb}, kv-block {st.kb}: {what}",
                     fontsize=9)


def walk_frame_figure(walk, index: int, o_ref: np.ndarray, *, w: float = 8.0, h: float = 3.8,
                      dpi: int = 80) -> Figure:
    """A new (non-pyplot) figure holding :func:`draw_walk_frame` of step ``index``."""
    fig = Figure(figsize=(w, h), dpi=dpi, layout="constrained")
    draw_walk_frame(fig, walk, index, o_ref)
    return fig
