"""Drawings of the tile grid and of the online-softmax state during a walk of the forward kernel.

- :func:`draw_block_map` / :func:`block_map_figure`: the ``Sq x Sk`` score grid cut into
  ``block_q x block_k`` tiles, each tile coloured by its class (empty = skipped, partial =
  masked element by element, full = no masking), the allowed entries shaded inside the tiles.
- :class:`WalkView` / :func:`draw_walk_frame`: one step of a :class:`flashlab.walk.Walk`: the grid with the
  current tile, the Q / K / V blocks that are "on chip" for it, the running max $m$ and sum
  $\\ell$ of the q-block's rows, and the error of the partial output $\\tilde O / \\ell$ against
  the reference output.

Coordinates: key index ``j`` to the right, query index ``i`` downwards (row 0 at the top), as
the score matrix is usually printed.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from matplotlib.artist import Artist
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from flashlab.masks import EMPTY, FULL, PARTIAL, classify_tiles
from flashlab.masks import allowed as band_allowed
from flashlab.tiling import cdiv
from flashlab.viz.style import PALETTE, background_of, blit_png, new_figure

__all__ = ["ERR_FLOOR", "WALK_FONT", "class_image", "draw_block_map", "block_map_figure", "walk_legend_handles",
           "WalkView", "draw_walk_frame", "walk_frame_figure"]

_CLASS_COLOUR = {EMPTY: PALETTE["empty"], PARTIAL: PALETTE["partial"], FULL: PALETTE["full"]}
_CLASS_LABEL = {EMPTY: "empty (skipped)", PARTIAL: "partial (masked per element)",
                FULL: "full (no masking)"}
#: how far a masked-out entry inside a computed tile is blended towards white
_MASKED_FADE = 0.75
#: floor of the log-scale error axis (an exact partial output would otherwise vanish)
ERR_FLOOR = 1e-12
#: an error below this is rounding of the compute dtype, drawn at this height: float32 rows end
#: at 3e-8..4e-7, and which value depends on the BLAS kernels (their summation order)
_ROUNDING = {np.dtype(np.float32): 1e-6, np.dtype(np.float64): ERR_FLOOR}
#: significant digits of the values a walk frame draws (m, l, errors, axis limits)
_DIGITS = 2


def _steady(x, digits: int = _DIGITS) -> np.ndarray:
    """``x`` (any shape) rounded to ``digits`` significant digits; NaN and inf pass through.

    A frame of the walk is stored as PNG in the book and compared by the tests, so it must come
    out the same pixels under every BLAS kernel set and thread count: the float32 running state
    differs between kernel sets in its 7th digit, enough to move an edge by a fraction of a pixel
    (anti-aliased: other pixel values). Rounded to 2 digits (1 % of the value, about a pixel on
    these panels) the values agree unless one sits within ~1e-7 of a rounding boundary.
    """
    x = np.asarray(x, dtype=np.float64)
    # through the decimal string (as printed with `digits` digits): 1.234 -> 1.2 exactly
    return np.vectorize(lambda v: float(f"{v:.{digits - 1}e}"), otypes=[np.float64])(x)


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


#: font sizes of the walk figure in points (at the book's 80 dpi, 9 pt is 10 px, the smallest text)
WALK_FONT = {"tick": 9, "label": 9.5, "title": 9.5, "suptitle": 10.5, "legend": 9}
#: half-width of a row's mark in the running-state panels (rows are 1 apart)
_ROW_HALF = 0.4


def _finite_or_nan(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(x), x, np.nan)


def _qblock_limits(walk, qb: int) -> tuple[tuple[float, float], float]:
    """Fixed y-limits for the m and l panels over all steps of q-block ``qb``."""
    steps = [st for st in walk.steps if st.qb == qb]
    ms = np.concatenate([_finite_or_nan(st.m) for st in steps])
    m_lo, m_hi = (np.nanmin(ms), np.nanmax(ms)) if np.isfinite(ms).any() else (-1.0, 1.0)
    pad = max(0.1 * (m_hi - m_lo), 0.5)      # at least +-0.5: one row's m is a visible mark
    l_hi = max(float(np.max([st.l.max() for st in steps])), 1e-3)
    # rounded, as the drawn values: limits (so ticks) the same under every BLAS kernel set
    (m_lo, m_hi), l_hi = _steady([m_lo - pad, m_hi + pad]), float(_steady(1.1 * l_hi))
    return (float(m_lo), float(m_hi)), l_hi


def _row_segments(rows: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x, y of one short horizontal segment per row (NaN-separated): visible for a single row too."""
    x = np.column_stack([rows - _ROW_HALF, rows + _ROW_HALF, np.full(rows.size, np.nan)]).ravel()
    y = np.column_stack([values, values, np.full(rows.size, np.nan)]).ravel()
    return x, y


def walk_legend_handles() -> list:
    """Legend entries of the walk figure: the three tile classes, the dots and the current tile."""
    from matplotlib.lines import Line2D

    handles: list[Artist] = [Patch(color=_CLASS_COLOUR[c], label=_CLASS_LABEL[c]) for c in (FULL, PARTIAL, EMPTY)]
    handles.append(Line2D([], [], ls="", marker="o", ms=4, color=PALETTE["text"],
                          label="dot: tile computed earlier"))
    handles.append(Patch(fill=False, ec=PALETTE["text"], lw=2,
                         label="outline: current tile (dashed: skipped)"))
    return handles


class WalkView:
    """One figure for a whole :class:`flashlab.walk.Walk`, built once; :meth:`update` shows a step.

    Everything that does not change from step to step is computed and drawn in the constructor:
    the tile classes and the block-map image, the grid lines, the Q / K / V strips, the axes,
    the legend, the centres of the computed tiles, the y-limits of every q-block. A step then
    only moves artists: the current tile's outline, the dots of the tiles computed before it
    (one line artist), the colours of the strip blocks on chip, the marks of the running max
    ``m`` (after and before the tile, one short segment per row, so a one-row q-block shows
    too), the bars of ``l`` and of the error of the partial output, the limits and the title.

    The layout is computed once (constrained layout, on the first draw) and then frozen, so a
    step does not re-run the layout engine either. ``fig`` may be given (it is cleared);
    otherwise a plain :class:`~matplotlib.figure.Figure` (not registered with pyplot) is made.

    The moving artists are attributes, so a test or a reader can inspect a step: ``current``
    (the current tile's outline, a ``Rectangle``), ``dots`` (the computed tiles' centres, a
    ``Line2D``), ``m_after`` (the running max after the tile, a ``Line2D``) and ``l_bars``
    (the bars of ``l``).
    """

    def __init__(self, walk, o_ref: np.ndarray, *, fig: Figure | None = None, w: float = 8.0,
                 h: float = 4.4, dpi: int = 80, title: bool = True) -> None:
        self.walk, self.o_ref, self.title = walk, np.asarray(o_ref, dtype=np.float64), title
        if fig is None:
            fig = Figure(figsize=(w, h), dpi=dpi, layout="constrained")
        else:
            fig.clear()
            fig.set_layout_engine("constrained")
        self.fig = fig
        f = WALK_FONT
        sq, sk, bq, bk = walk.sq, walk.sk, walk.block_q, walk.block_k

        # ---- computed once: classes, allowed entries, computed tiles, per-q-block limits
        ok = band_allowed(sq, sk, walk.left, walk.right)
        if walk.mask is not None:
            ok &= ~walk.mask
        self.classes = classify_tiles(sq, sk, bq, bk, walk.left, walk.right, walk.mask)
        computed = [i for i, st in enumerate(walk.steps) if not st.skipped]
        self._computed_index = np.array(computed, dtype=np.int64)
        # the centre (x = column, y = row) of each computed tile
        xy = np.array([((st.cols[0] + st.cols[1]) / 2, (st.rows[0] + st.rows[1]) / 2)
                       for st in (walk.steps[i] for i in computed)]).reshape(-1, 2)
        self._dot_x, self._dot_y = xy[:, 0], xy[:, 1]
        self._limits = {qb: _qblock_limits(walk, qb) for qb in range(walk.n_qb)}
        self._rounding = _ROUNDING.get(walk.o.dtype, ERR_FLOOR)

        # ---- the left half: block map with the Q, K, V strips
        left_fig, right_fig = fig.subfigures(1, 2, squeeze=False, width_ratios=[1.2, 1.0])[0]
        gs = left_fig.add_gridspec(3, 2, width_ratios=[0.06, 1], height_ratios=[0.05, 0.05, 1],
                                   hspace=0.05, wspace=0.03)
        ax_k = left_fig.add_subplot(gs[0, 1])
        ax_v = left_fig.add_subplot(gs[1, 1])
        ax_q = left_fig.add_subplot(gs[2, 0])
        self.ax_grid = ax = left_fig.add_subplot(gs[2, 1])
        draw_block_map(ax, self.classes, ok, bq, bk, legend=False)
        ax.set_ylabel("")
        ax.tick_params(labelleft=False, labelsize=f["tick"])
        ax.set_xlabel("key index j", fontsize=f["label"])
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
        (self.dots,) = ax.plot([], [], "o", ms=4, color=PALETTE["text"])
        # zorder 3: above the white grid lines (Line2D, zorder 2), which would otherwise cover
        # half of its black edge -- and a changing artist must not be under a fixed one (png)
        self.current = Rectangle((0, 0), 1, 1, fill=False, lw=2.5, ec=PALETTE["text"], zorder=3)
        ax.add_patch(self.current)
        self._strips = {"q": _strip(ax_q, sq, bq, PALETTE["q"], True, "Q"),
                        "k": _strip(ax_k, sk, bk, PALETTE["k"], False, "K"),
                        "v": _strip(ax_v, sk, bk, PALETTE["v"], False, "V")}
        self._on: dict[str, int | None] = {"q": None, "k": None, "v": None}
        for strip_ax in (ax_q, ax_k, ax_v):
            strip_ax.yaxis.label.set_fontsize(f["label"])

        # ---- the right half: the running state of the current q-block's rows
        self.ax_m, self.ax_l, self.ax_e = right_fig.subplots(3, 1, sharex=True)
        (self.m_after,) = self.ax_m.plot([], [], color=PALETTE["s"], lw=2.5,
                                          solid_capstyle="butt", label="after this tile")
        (self._m_before,) = self.ax_m.plot([], [], color=PALETTE["text"], lw=1.2, ls="--",
                                           label="before")
        self.ax_m.set_title("running max m (dashed: before this tile)", fontsize=f["title"],
                            loc="left")
        slots = np.arange(bq, dtype=float)
        self.l_bars = list(self.ax_l.bar(slots, np.zeros(bq), width=2 * _ROW_HALF,
                                          color=PALETTE["full"]))
        self.ax_l.set_title("running sum ℓ", fontsize=f["title"], loc="left")
        self._e_bars = list(self.ax_e.bar(slots, np.full(bq, ERR_FLOOR), width=2 * _ROW_HALF,
                                          color=PALETTE["o"], bottom=ERR_FLOOR * 0.1))
        self.ax_e.set_yscale("log")
        self.ax_e.set_ylim(ERR_FLOOR * 0.1, 10.0)
        self.ax_e.set_yticks([1e-12, 1e-6, 1.0], ["1e-12", "1e-6", "1"])
        floor = "" if self._rounding <= ERR_FLOOR else f" (rounding: at {self._rounding:.0e})".replace("e-0", "e-")
        self.ax_e.set_title(f"error of the partial output Õ/ℓ, per row{floor}", fontsize=f["title"],
                            loc="left")
        self.ax_e.set_xlabel("query row i of the current q-block", fontsize=f["label"])
        self.ax_e.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True, min_n_ticks=1))
        for a in (self.ax_m, self.ax_l, self.ax_e):
            a.tick_params(labelsize=f["tick"])
        self.ax_m.ticklabel_format(axis="y", useOffset=False)
        fig.legend(handles=walk_legend_handles(), loc="outside lower center", ncols=3,
                   fontsize=f["legend"], frameon=False, handlelength=1.5, columnspacing=1.2)
        self._suptitle = fig.suptitle(" ", fontsize=f["suptitle"]) if title else None
        self.index: int | None = None
        self._frozen = False
        self._backgrounds: dict = {}      # q-block -> the fixed parts, rendered on its first png()
        self._strip_axes = (ax_q, ax_k, ax_v)
        self._moving = self._changing()   # the same artists for every step: listed once

    def _set_strip(self, name: str, block: int | None, colour: str) -> None:
        if self._on[name] == block:
            return
        patches = self._strips[name]
        on = self._on[name]
        if on is not None:
            patches[on].set_facecolor(PALETTE["empty"])
        if block is not None:
            patches[block].set_facecolor(colour)
        self._on[name] = block

    def update(self, index: int) -> None:
        """Show step ``index`` of the walk: moves the artists, creates none."""
        walk, st = self.walk, self.walk.steps[index]
        (i0, i1), (j0, j1) = st.rows, st.cols
        # the grid: current tile outline, dots on the tiles computed before this step
        self.current.set_bounds(j0, i0, j1 - j0, i1 - i0)
        self.current.set_linestyle("--" if st.skipped else "-")
        n_done = int(np.searchsorted(self._computed_index, index))
        self.dots.set_data(self._dot_x[:n_done], self._dot_y[:n_done])
        on_chip = None if st.skipped else st.kb
        self._set_strip("q", st.qb, PALETTE["q"])
        self._set_strip("k", on_chip, PALETTE["k"])
        self._set_strip("v", on_chip, PALETTE["v"])
        # the running state of the q-block's rows
        rows = np.arange(i0, i1, dtype=float)
        # every drawn value rounded (_steady): the same pixels under any BLAS kernel set
        self.m_after.set_data(*_row_segments(rows, _steady(_finite_or_nan(st.m))))
        self._m_before.set_data(*_row_segments(rows, _steady(_finite_or_nan(st.m_prev))))
        (m_lo, m_hi), l_hi = self._limits[st.qb]
        self.ax_m.set_ylim(m_lo, m_hi)
        self.ax_l.set_ylim(0, l_hi)
        l_shown = _steady(st.l)
        # err = max_j |O~/l - O_ref|, per row; below the dtype's rounding it is drawn at that level
        err = np.abs(st.o_partial.astype(np.float64) - self.o_ref[i0:i1]).max(axis=1)
        err = _steady(np.maximum(err, self._rounding))
        for k, (lb, eb) in enumerate(zip(self.l_bars, self._e_bars)):
            shown = k < rows.size
            lb.set_visible(shown)
            eb.set_visible(shown)
            if shown:
                lb.set_x(rows[k] - _ROW_HALF)
                lb.set_height(float(l_shown[k]))
                eb.set_x(rows[k] - _ROW_HALF)
                eb.set_height(float(err[k]))
        self.ax_e.set_xlim(i0 - 0.6, i0 + walk.block_q - 0.4)
        if self._suptitle is not None:
            if st.skipped:
                what = f"skipped: {st.reason}"
            else:
                what = "computed (" + ("partial, masked" if st.masked else "full, no masking") + ")"
            self._suptitle.set_text(f"tile {index + 1}/{len(walk.steps)} in loop order: "
                                    f"q-block {st.qb}, kv-block {st.kb}: {what}")
        self.index = index
        if not self._frozen:
            # lay the figure out once (constrained layout, on a draw without rendering), then
            # keep that layout for every later step
            self.fig.draw_without_rendering()
            self.fig.set_layout_engine("none")
            self._frozen = True

    def _changing(self) -> list:
        """The artists a step changes within a q-block, in the order a full draw draws them: per
        axes by zorder, ties as ``Axes.get_children`` lists them. The axes' limits and ticks
        change only with the q-block: they are in the q-block's background."""
        out = [self.dots, self.current]                            # zorder 2, 3
        for strip_ax in self._strip_axes:                          # the blocks' colours
            out += strip_ax.patches
        for a in (self.ax_m, self.ax_l, self.ax_e):                # bars 1, lines 2, spines 2.5
            out += sorted([*a.patches, *a.lines, *a.spines.values()],
                          key=lambda artist: artist.get_zorder())
        if self._suptitle is not None:
            out.append(self._suptitle)
        return out

    def png(self) -> bytes:
        """The current step as PNG bytes, with the pixels of a full draw. The first step shown
        of a q-block renders the figure without the artists a step changes and keeps that as
        the q-block's background (:func:`flashlab.viz.style.background_of`: the right panels'
        limits and ticks are per q-block); every step restores its q-block's background and
        draws only those artists (:func:`~flashlab.viz.style.blit_png`), a fraction of the time
        of a full Agg draw and PNG."""
        qb = self.walk.steps[self.index if self.index is not None else 0].qb
        if qb not in self._backgrounds:
            self._backgrounds[qb] = background_of(self.fig, self._moving)
        return blit_png(self.fig, self._backgrounds[qb], self._moving)


def _strip(ax, size: int, block: int, colour: str, vertical: bool, label: str) -> list:
    """One operand as a strip of blocks beside the grid (all off chip); returns the block patches."""
    n = cdiv(size, block)
    patches = []
    for b in range(n):
        a0, a1 = _tile_bounds(b, block, size)
        rect = (Rectangle((0, a0), 1, a1 - a0) if vertical else Rectangle((a0, 0), a1 - a0, 1))
        rect.set(facecolor=PALETTE["empty"], edgecolor="white", lw=1.2)
        ax.add_patch(rect)
        patches.append(rect)
    if vertical:
        ax.set_xlim(0, 1)
        ax.set_ylim(size, 0)
    else:
        ax.set_xlim(0, size)
        ax.set_ylim(0, 1)
    ax.set_ylabel(label, rotation=0, labelpad=10, va="center")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    return patches


def draw_walk_frame(fig: Figure, walk, index: int, o_ref: np.ndarray, *,
                    title: bool = True) -> WalkView:
    """Draw step ``index`` of ``walk`` (a :class:`flashlab.walk.Walk`) into ``fig`` (cleared first).

    o_ref (Sq, Dv): the reference output of the walked (batch, head), e.g.
    ``attention_reference(...)[0][b, h]``. Panels: the tile grid with the Q, K and V strips
    (the blocks on chip are coloured) and a legend, and for the rows of the current q-block
    the running max ``m`` (dashed: before this tile), the running sum ``l`` and the per-row
    error ``max_d |O_partial - O_ref|`` on a log scale. Returns the :class:`WalkView`; to show
    several steps, keep it and call its :meth:`WalkView.update` (much faster than redrawing).
    """
    view = WalkView(walk, o_ref, fig=fig, title=title)
    view.update(index)
    return view


def walk_frame_figure(walk, index: int, o_ref: np.ndarray, *, w: float = 8.0, h: float = 4.4,
                      dpi: int = 80) -> Figure:
    """A new (non-pyplot) figure holding :func:`draw_walk_frame` of step ``index``."""
    view = WalkView(walk, o_ref, w=w, h=h, dpi=dpi)
    view.update(index)
    return view.fig
