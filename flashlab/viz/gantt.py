"""Gantt charts of a simulated core (:mod:`flashlab.pipeline.simulate`).

- :func:`draw_gantt`: one lane per engine (MTE2, MTE1, CUBE, FIXPIPE, VECTOR, MTE3) with its
  tasks coloured by what they move or compute, one lane per buffer slot below them (ping and
  pong in different colours) showing when each slot holds a tile, a bar per lane with the
  engine's utilization (or the slot's occupancy), and the idle gaps of the critical engine
  (the busiest one) hatched.
- :class:`GanttView`: such a chart redrawn in place for a stream of results (the pipeline
  explorer): the figure, its layout and its legend are kept while the lanes stay the same.
- :func:`gantt_grid`: small multiples -- a grid of such charts (e.g. strategies x tile sizes),
  on a common time axis so that lengths compare, for the static book.

Colours come from ``flashlab.viz.style.PALETTE``: the K copy has K's colour as in every
other chapter, the QK^T work S's colour, and so on.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from flashlab.pipeline.simulate import TIME_UNITS, SimResult
from flashlab.viz.style import PALETTE, background_of, blit_png, new_figure

__all__ = ["KIND_COLORS", "KIND_LABELS", "SLOT_COLORS", "slot_name", "draw_gantt", "GanttView",
           "gantt_grid"]

#: The colour of each task kind (kinds are set by
#: :func:`flashlab.pipeline.schedule.build_fa_graph`), that of the data the task moves or
#: produces (K's colour for the K copy, S's for QK^T).
KIND_COLORS: dict[str, str] = {
    "load_q": PALETTE["q"], "load_k": PALETTE["k"], "load_v": PALETTE["v"],
    "load_rope": PALETTE["rope"], "rope": PALETTE["rope"],
    "qk": PALETTE["s"], "softmax": PALETTE["s"],
    "load_p": PALETTE["p"],
    "pv": PALETTE["o"], "rescale": PALETTE["o"], "final": PALETTE["o"], "store_o": PALETTE["o"],
    # generic pipelines (flashlab.pipeline.simulate.two_stage_graph)
    "copy": PALETTE["mte"], "compute": PALETTE["compute"],
}
#: The legend text of each task kind; kinds of one colour share a legend entry.
KIND_LABELS: dict[str, str] = {
    "load_q": "Q copy", "load_k": "K copy", "load_v": "V copy", "load_rope": "RoPE parts",
    "rope": "RoPE parts", "qk": "S = QK^T", "softmax": "softmax",
    "load_p": "P (through the GM workspace)", "pv": "O_part = PV", "rescale": "rescale O",
    "final": "O / l", "store_o": "O out", "copy": "copy", "compute": "compute",
}
#: The colours of buffer slots 0, 1, 2, ... (ping, pong, then further buffers).
SLOT_COLORS: tuple[str, ...] = (PALETTE["full"], PALETTE["partial"], PALETTE["rope"],
                                PALETTE["o"], PALETTE["v"], PALETTE["k"])
_OTHER = PALETTE["grid"]
_LANE_H = 0.7


def slot_name(slot: int, n_slots: int) -> str:
    """The name of a slot, ``ping`` / ``pong`` for a pair of buffers, ``#k`` for more, ``""``
    for a single one."""
    if n_slots == 1:
        return ""
    if n_slots == 2:
        return ("ping", "pong")[slot]
    return f"#{slot}"


def _default_pools(result: SimResult) -> list[str]:
    pools = list(result.graph.pools)
    l1 = [p for p in pools if p.startswith("L1.") and p != "L1.Q"]
    return l1 if any(p.startswith("L1.") for p in pools) else pools


def _lanes(result: SimResult, pools: Sequence[str]) -> list[tuple[str, str, int | None]]:
    """(label, engine-or-pool, slot) from top to bottom."""
    lanes: list[tuple[str, str, int | None]] = [(e, e, None) for e in result.engines]
    for p in pools:
        n = result.graph.pools[p]
        lanes += [(f"{p} {slot_name(s, n)}".strip(), p, s) for s in range(n)]
    return lanes


def _draw_lanes(ax, result: SimResult, pools: Sequence[str], scale: float, labels: bool,
                highlight: bool) -> tuple[list, set]:
    """Draw every lane on ``ax`` (lane 0 at the top); returns the lanes and the kinds drawn."""
    lanes = _lanes(result, pools)
    row = {(key, slot): k for k, (_, key, slot) in enumerate(lanes)}
    tasks = result.graph.tasks
    kinds = set()
    edge = "white" if len(tasks) <= 400 else "none"
    # engine lanes: one broken_barh per (lane, colour)
    groups: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for i, t in enumerate(tasks):
        colour = KIND_COLORS.get(t.kind, _OTHER)
        kinds.add(t.kind if t.kind in KIND_COLORS else "")
        groups.setdefault((row[(t.engine, None)], colour), []).append(
            (result.start[i] * scale, t.duration * scale))
    for (k, colour), xr in groups.items():
        ax.broken_barh(xr, (k - _LANE_H / 2, _LANE_H), facecolors=colour, edgecolor=edge, lw=0.4)
    # slot lanes: one bar per holding, in the slot's colour
    holdings: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for span in result.occupancy:
        if span.pool in pools:
            k = row[(span.pool, span.slot)]
            colour = SLOT_COLORS[span.slot % len(SLOT_COLORS)]
            holdings.setdefault((k, colour), []).append(
                (span.start * scale, (span.end - span.start) * scale))
    for (k, colour), xr in holdings.items():
        ax.broken_barh(xr, (k - _LANE_H / 2, _LANE_H), facecolors=colour, alpha=0.55,
                       edgecolor=edge, lw=0.4)
    # task names inside the bars that are wide enough
    if labels:
        width = result.makespan * scale
        for i, t in enumerate(tasks):
            if t.duration * scale > 0.035 * width:
                ax.text((result.start[i] + t.duration / 2) * scale, row[(t.engine, None)], t.name,
                        ha="center", va="center", fontsize=6, clip_on=True)
        for span in result.occupancy:
            if span.pool in pools and (span.end - span.start) * scale > 0.035 * width:
                ax.text((span.start + span.end) / 2 * scale, row[(span.pool, span.slot)], span.task,
                        ha="center", va="center", fontsize=6, clip_on=True)
    # the critical engine's idle gaps, hatched
    if highlight and result.critical_engine:
        k = row[(result.critical_engine, None)]
        for a, b in result.idle_gaps:
            ax.add_patch(Rectangle((a * scale, k - _LANE_H / 2), (b - a) * scale, _LANE_H,
                                   fill=False, hatch="////", ec=PALETTE["highlight"], lw=0.8))
    ax.set_yticks(range(len(lanes)), [label for label, _, _ in lanes], fontsize=8)
    for tick, (_, key, _) in zip(ax.get_yticklabels(), lanes):
        critical = highlight and key == result.critical_engine
        tick.set_color(PALETTE["highlight"] if critical else PALETTE["text"])
        tick.set_fontweight("bold" if critical else "normal")
    if len(result.engines) < len(lanes):
        ax.axhline(len(result.engines) - 0.5, color=PALETTE["grid"], lw=0.8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(0, max(result.makespan * scale, 1e-12))
    ax.grid(axis="x", color=PALETTE["grid"], lw=0.4, alpha=0.6)
    ax.set_axisbelow(True)
    return lanes, kinds


def _title(result: SimResult, unit: str, scale: float) -> str:
    info = result.graph.info
    head = info.get("strategy", "")
    if info.get("strategy") == "n_buffers":
        head = f"n_buffers={info.get('n_buffers')}"
    if "block_q" in info:
        head += (f", {info['block_q']}x{info['block_k']} tiles, D={info['d_qk']}/{info['d_v_eff']}"
                 + (" (V padded)" if info.get("pad_v") else "")
                 + (f", rope split {info['split_rope']}" if info.get("split_rope") else ""))
    return f"{head}: makespan {result.makespan * scale:.3g} {unit}".lstrip(": ")


def _unit(unit: str) -> float:
    scales = {**TIME_UNITS, "cycles": 1.0}
    if unit not in scales:
        raise ValueError(f"unit must be one of {sorted(scales)}; got {unit!r}")
    return scales[unit]


def _legend_handles(kinds: set, slots: int) -> list[Patch]:
    """One entry per colour present, naming every kind drawn in it."""
    by_colour: dict[str, list[str]] = {}
    for kind in KIND_COLORS:
        if kind in kinds:
            names = by_colour.setdefault(KIND_COLORS[kind], [])
            if KIND_LABELS[kind] not in names:
                names.append(KIND_LABELS[kind])
    handles = [Patch(color=c, label=", ".join(names)) for c, names in by_colour.items()]
    for s in range(min(slots, len(SLOT_COLORS))):
        handles.append(Patch(color=SLOT_COLORS[s], alpha=0.55,
                             label=f"buffer {slot_name(s, slots) or s} held"))
    handles.append(Patch(fill=False, hatch="////", ec=PALETTE["highlight"],
                         label="idle gap of the critical engine"))
    return handles


def draw_gantt(result: SimResult, *, ax=None, pools: Sequence[str] | None = None,
               unit: str = "us", labels: bool | None = None, title: str | None = None,
               utilization: bool = True, legend: bool = True) -> Figure:
    """Draw the Gantt chart of a :class:`~flashlab.pipeline.simulate.SimResult`.

    Parameters
    ----------
    result : the simulation to draw
    ax : draw into this axes (no utilization panel, no legend) and return its figure
    pools : the buffer pools to draw one lane per slot for (default the L1 pools other than
        Q's, or every pool of a graph without L1 pools)
    unit : the time axis unit, ``"us"`` (default), ``"ns"``, ``"ms"`` or ``"s"``
    labels : write task names into the bars wide enough for them (default when there are at
        most 150 tasks)
    title : the title (default strategy, tiles, head dims and makespan)
    utilization : add a panel on the right with each engine's utilization and each slot's
        occupancy (ignored when ``ax`` is given, so a chart in a grid cell stays compact)
    legend : add a legend of colours below the chart

    Returns
    -------
    matplotlib.figure.Figure
    """
    if not isinstance(result, SimResult):
        raise TypeError(f"result must be a SimResult; got {type(result).__name__}")
    scale = _unit(unit)
    pools = list(_default_pools(result) if pools is None else pools)
    unknown = [p for p in pools if p not in result.graph.pools]
    if unknown:
        raise ValueError(f"pools {unknown} are not in the graph; pools: {sorted(result.graph.pools)}")
    if labels is None:
        labels = len(result.graph.tasks) <= 150
    n_lanes = len(result.engines) + sum(result.graph.pools[p] for p in pools)

    if ax is not None:
        _draw_lanes(ax, result, pools, scale, labels, True)
        ax.set_title(_title(result, unit, scale) if title is None else title, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        return ax.figure

    height = 0.32 * n_lanes + (1.6 if legend else 1.0)
    if utilization:
        fig, (ax, ux) = new_figure(9.5, height, ncols=2, sharey=True,
                                   gridspec_kw={"width_ratios": [6, 1]})
    else:
        fig, ax = new_figure(8.5, height)
    lanes, kinds = _draw_lanes(ax, result, pools, scale, labels, True)
    ax.set_xlabel(f"time ({unit})", fontsize=9)
    ax.set_title(_title(result, unit, scale) if title is None else title, fontsize=10)
    if utilization:
        _draw_utilization(ux, result, lanes)
    if legend:
        slots = max((result.graph.pools[p] for p in pools), default=0)
        fig.legend(handles=_legend_handles(kinds, slots), loc="outside lower center", ncol=4,
                   fontsize=7, frameon=False)
    return fig


class GanttView:
    """A :func:`draw_gantt` chart (utilization panel and legend included) redrawn in place.

    :meth:`show` draws a result. A figure is built for a *frame* -- the lane labels and the
    legend's entries -- and kept (the last :data:`FRAMES_KEPT` frames), so a change that keeps
    the frame only removes the previous result's bars, labels and hatching and draws the new
    ones on the same axes. The first draw of a figure settles its layout (constrained layout)
    and renders the parts a frame fixes -- legend, lane labels, the utilization axis -- once,
    as a background; :meth:`png` then restores that background and draws only the parts a
    result changes (bars, their labels, the axes with the critical engine's lane label, the
    title, the utilization bars) before encoding. The figures are closed in pyplot, so a
    notebook never shows a stray copy of them.
    """

    #: figures kept, one per frame, most recent last (e.g. ping-pong and single-buffer lanes)
    FRAMES_KEPT = 4

    def __init__(self, *, unit: str = "us", dpi: int = 70) -> None:
        self.unit, self.dpi = unit, dpi
        self.fig: Figure | None = None
        self.frame: tuple | None = None
        self.figures_built = 0
        self._kept: dict[tuple, tuple[Figure, object]] = {}   # frame -> (figure, background)

    @staticmethod
    def frame_of(result: SimResult) -> tuple:
        """What a figure is built for: the lane labels and the legend's entries."""
        pools = _default_pools(result)
        kinds = {t.kind if t.kind in KIND_COLORS else "" for t in result.graph.tasks}
        slots = max((result.graph.pools[p] for p in pools), default=0)
        return (tuple(label for label, _, _ in _lanes(result, pools)),
                tuple(h.get_label() for h in _legend_handles(kinds, slots)))

    def show(self, result: SimResult) -> Figure:
        """Draw ``result``; returns the figure (the same one for the same frame)."""
        import matplotlib.pyplot as plt

        frame = self.frame_of(result)
        self.frame = frame
        if frame not in self._kept:
            fig = draw_gantt(result, unit=self.unit)
            plt.close(fig)
            fig.set_dpi(self.dpi)
            self._kept[frame] = (fig, None)
            while len(self._kept) > self.FRAMES_KEPT:
                self._kept.pop(next(iter(self._kept)))
            self.figures_built += 1
            self.fig = fig
            return fig
        fig, background = self._kept.pop(frame)
        self._kept[frame] = (fig, background)    # most recently used last
        self.fig = fig
        ax, ux = fig.axes[:2]
        for a in (ax, ux):
            for c in list(a.containers):
                c.remove()
            for artist in [*a.collections, *a.patches, *a.texts, *a.lines]:
                artist.remove()
        scale = _unit(self.unit)
        lanes, _ = _draw_lanes(ax, result, _default_pools(result), scale,
                               len(result.graph.tasks) <= 150, True)
        ax.set_title(_title(result, self.unit, scale), fontsize=10)
        _draw_utilization(ux, result, lanes)
        return fig

    def _changing(self) -> list:
        """The artists a result changes, in drawing order (lowest zorder first)."""
        assert self.fig is not None, "show a result first"
        ax, ux = self.fig.axes[:2]
        out = [ax.xaxis, ax.yaxis, *ax.collections, *ax.patches, *ax.lines, *ax.texts,
               *ax.spines.values(), ax.title, *ux.patches, *ux.texts, *ux.spines.values()]
        return sorted(out, key=lambda a: a.get_zorder())

    def png(self) -> bytes:
        """The chart as PNG bytes. A figure's first call settles its layout and renders it
        without the changing artists, and keeps that as the frame's background
        (:func:`flashlab.viz.style.background_of`); every call restores the background and
        draws only the changing artists over it (:func:`~flashlab.viz.style.blit_png`): no
        full draw after the first."""
        assert self.frame is not None, "show a result first"
        fig, background = self._kept[self.frame]
        if background is None:
            background = background_of(fig, self._changing())
            self._kept[self.frame] = (fig, background)
        return blit_png(fig, background, self._changing())


def _draw_utilization(ux, result: SimResult, lanes) -> None:
    """Bars: busy / makespan for engine lanes, held / makespan for slot lanes."""
    held: dict[tuple[str, int], float] = {}
    for span in result.occupancy:
        held[(span.pool, span.slot)] = held.get((span.pool, span.slot), 0.0) + span.end - span.start
    values, colours = [], []
    for _, key, slot in lanes:
        if slot is None:
            values.append(result.utilization[key])
            colours.append(PALETTE["highlight"] if key == result.critical_engine else PALETTE["grid"])
        else:
            values.append(held.get((key, slot), 0.0) / result.makespan if result.makespan else 0.0)
            colours.append(SLOT_COLORS[slot % len(SLOT_COLORS)])
    ys = np.arange(len(lanes))
    ux.barh(ys, values, height=_LANE_H, color=colours, alpha=0.8)
    for y, v in zip(ys, values):
        ux.text(min(v, 1.0) + 0.03, y, f"{100 * v:.0f}%", va="center", fontsize=7)
    ux.set_xlim(0, 1.45)
    ux.set_xticks([0, 0.5, 1.0], ["0", "50%", "100%"], fontsize=7)
    ux.set_xlabel("busy / held", fontsize=8)
    ux.tick_params(axis="y", left=False)
    for side in ("top", "right"):
        ux.spines[side].set_visible(False)


def gantt_grid(results: Sequence[Sequence[SimResult]], *, row_labels: Sequence[str] | None = None,
               col_labels: Sequence[str] | None = None, sharex: bool = True, unit: str = "us",
               pools: Sequence[str] | None = None, cell_w: float = 4.2,
               cell_h: float | None = None) -> Figure:
    """Small multiples: ``results[r][c]`` drawn compactly in row ``r``, column ``c``.

    Parameters
    ----------
    results : a rectangular grid (list of rows) of simulations, e.g. strategies x tile sizes
    row_labels, col_labels : the names of the rows and columns; each cell's title is
        ``"<row>, <col>: makespan ..."``
    sharex : one time axis for every cell, so that lengths compare directly (otherwise each
        cell spans its own makespan)
    unit : the time axis unit, as in :func:`draw_gantt`
    pools : the buffer pools to draw (default as in :func:`draw_gantt`)
    cell_w, cell_h : inches per cell (the height defaults to the number of lanes)

    Returns
    -------
    matplotlib.figure.Figure
        with one legend for the whole grid
    """
    rows = [list(r) for r in results]
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("results must be a non-empty rectangular grid (a list of equal-length rows)")
    if any(not isinstance(r, SimResult) for row in rows for r in row):
        raise TypeError("every cell of results must be a SimResult")
    n_r, n_c = len(rows), len(rows[0])
    for name, labels, n in (("row_labels", row_labels, n_r), ("col_labels", col_labels, n_c)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} must have {n} entries; got {len(labels)}")
    scale = _unit(unit)
    n_lanes = max(len(_lanes(r, _default_pools(r) if pools is None else pools))
                  for row in rows for r in row)
    cell_h = cell_h if cell_h is not None else 0.24 * n_lanes + 0.7
    fig, axes = new_figure(cell_w * n_c, cell_h * n_r + 0.6, nrows=n_r, ncols=n_c, squeeze=False,
                           sharex=sharex)
    kinds, slots = set(), 0
    t_max = max(r.makespan for row in rows for r in row) * scale
    for a, row in enumerate(rows):
        for b, r in enumerate(row):
            ax = axes[a][b]
            ps = list(_default_pools(r) if pools is None else pools)
            _, k = _draw_lanes(ax, r, ps, scale, False, True)
            kinds |= k
            slots = max([slots] + [r.graph.pools[p] for p in ps])
            parts = [x for x in (row_labels[a] if row_labels else None, col_labels[b] if col_labels else None) if x]
            ax.set_title(f"{', '.join(parts)}: makespan {r.makespan * scale:.3g} {unit}".lstrip(": "),
                         fontsize=8)
            ax.tick_params(axis="both", labelsize=6)
            if sharex:
                ax.set_xlim(0, t_max)
            if a == n_r - 1:
                ax.set_xlabel(f"time ({unit})", fontsize=8)
    fig.legend(handles=_legend_handles(kinds, slots), loc="outside lower center",
               ncol=max(2, int(cell_w * n_c / 2.4)), fontsize=7, frameon=False)
    return fig
