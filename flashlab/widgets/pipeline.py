"""The pipeline explorer: the FlashAttention tile loop of one Ascend AI Core, live and static.

The design points it explores are :class:`flashlab.pipeline.settings.PipelineSettings`
(strategy, tile sizes, HBM bandwidth, head dims, RoPE, kv-blocks); this module is the controls
and the drawings over them.

- :class:`PipelineExplorer`: controls for every setting; the Gantt chart of the simulated
  schedule (a lane per engine, a lane per ping/pong buffer, the critical engine's idle gaps
  hatched) and the makespan and the speedup over ``iterate_all``. A configuration whose tiles
  do not fit the buffers shows the ``ValueError`` message instead of a chart. One
  implementation for the live kernel and the static book
  (:class:`flashlab.widgets.explorer.Explorer`): the static page holds every state of its grid.
- :func:`pipeline_explorer_change`: the seconds one change of the matplotlib Gantt view
  (:class:`flashlab.viz.gantt.GanttView`) costs, for the benchmark.
- Static fallbacks for the HTML book, where no kernel runs: :func:`pipeline_grid` (small
  multiples, strategies x tile sizes or strategies x bandwidths) and
  :func:`pipeline_animation` (one chart revealed step by step in time, for ``to_jshtml``).

``ipywidgets`` is imported by the explorer's live view only, so the static fallbacks never
need it.
"""
from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from flashlab.arguments import as_int
from flashlab.pipeline.buffers import STRATEGIES
from flashlab.pipeline.settings import (
    HEAD_DIMS,
    ROPE_MODES,
    PipelineSettings,
    run_settings,
    simulate_settings,
    summary,
)
from flashlab.pipeline.simulate import TIME_UNITS
from flashlab.widgets.explorer import Control, Explorer

__all__ = ["BLOCK_Q_OPTIONS", "BLOCK_K_OPTIONS", "CHANGE_TARGET_S", "GRID_BLOCKS", "GRID_BUFFERS",
           "GRID_HBM_TB_S", "pipeline_grid",
           "pipeline_animation", "PipelineExplorer", "chart_output", "CHANGES",
           "pipeline_explorer_change"]

#: the explorer's choices of ``block_q``
BLOCK_Q_OPTIONS = (16, 32, 64, 128, 256)
#: the explorer's choices of ``block_k``
BLOCK_K_OPTIONS = (16, 32, 64, 128, 256, 512)
#: seconds a change of a control may take (simulate, redraw, encode), median
CHANGE_TARGET_S = 0.1


# ------------------------------------------------------------------------ static fallbacks
def pipeline_grid(base: PipelineSettings | None = None, *,
                  strategies: Sequence[str] = ("iterate_all", "self_mte2", "ping_pong"),
                  tiles: Sequence[tuple[int, int]] | None = None,
                  bandwidths: Sequence[float] | None = None, **grid_options):
    """Small multiples for the static book: one row per strategy, one column per tile size
    ``(block_q, block_k)`` **or** per HBM bandwidth (TB/s), everything else from ``base``.

    ``grid_options`` go to :func:`flashlab.viz.gantt.gantt_grid` (``sharex``, ``unit``,
    ``cell_w``, ...). Raises ``ValueError`` if a cell's tiles do not fit. Returns the figure.
    """
    from flashlab.viz.gantt import gantt_grid

    base = PipelineSettings() if base is None else base
    if (tiles is None) == (bandwidths is None):
        raise ValueError("give exactly one of tiles=[(block_q, block_k), ...] or "
                         "bandwidths=[TB/s, ...] for the columns")
    if not strategies:
        raise ValueError("strategies must name at least one strategy")
    cols: list[dict[str, Any]]
    if tiles is not None:
        cols = [dict(block_q=bq, block_k=bk) for bq, bk in tiles]
        col_labels = [f"{bq}x{bk}" for bq, bk in tiles]
    else:
        assert bandwidths is not None      # exactly one of the two, checked above
        cols = [dict(hbm_tb_s=float(bw)) for bw in bandwidths]
        col_labels = [f"{bw:g} TB/s" for bw in bandwidths]
    results = [[simulate_settings(dataclasses.replace(base, strategy=s, **c)) for c in cols]
               for s in strategies]
    return gantt_grid(results, row_labels=list(strategies), col_labels=col_labels, **grid_options)


def pipeline_animation(settings: PipelineSettings | None = None, *, frames: int = 24,
                       dpi: int = 100, interval: int = 400, unit: str = "us"):
    """A ``FuncAnimation`` that reveals the Gantt chart of ``settings`` in time: a cursor moves
    to the makespan in ``frames`` equal steps and the part of the chart after it is hidden,
    so the reader sees which engine works while which waits. The first frame already shows
    the first step (never an empty chart), the last one the whole schedule.

    The figure is closed in pyplot, so a notebook shows only the animation (``to_jshtml()``),
    never a stray copy of the chart. Each frame is a PNG in the page: ``dpi`` 100 keeps the
    labels readable; keep ``frames`` small.
    """
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation
    from matplotlib.patches import Rectangle

    from flashlab.viz.gantt import draw_gantt

    frames = as_int("frames", frames, lo=2)
    settings = PipelineSettings() if settings is None else settings
    result = simulate_settings(settings)
    fig = draw_gantt(result, unit=unit, utilization=False, legend=True)
    plt.close(fig)
    fig.set_dpi(dpi)
    ax = fig.axes[0]
    scale = TIME_UNITS[unit]
    end = result.makespan * scale
    y0, y1 = ax.get_ylim()          # inverted: lane 0 at the top
    curtain = Rectangle((0, y1), end, y0 - y1, facecolor="white", edgecolor="none", alpha=0.92,
                        zorder=5)
    ax.add_patch(curtain)
    cursor = ax.axvline(0, color="black", lw=1.2, zorder=6)
    title = ax.get_title()

    def draw(k: int):
        # t_k = makespan * (k + 1) / frames: frame 0 shows the first step, the last the whole chart
        t = end * (k + 1) / frames
        curtain.set_x(t)
        curtain.set_width(end - t)
        cursor.set_xdata([t, t])
        busy = sorted({s.engine for s in result.timeline if s.start * scale <= t < s.end * scale})
        ax.set_title(f"{title}\nt = {t:.2f} {unit}; busy: {', '.join(busy) or 'none'}", fontsize=9)
        return [curtain, cursor]

    return FuncAnimation(fig, draw, frames=frames, interval=interval, blit=False, repeat=False)


# ------------------------------------------------------------------------------ explorer
#: the tile sizes block_q and block_k the static pipeline explorer offers (issue 33)
GRID_BLOCKS = (64, 128, 256)
#: the L1 buffer counts of ``n_buffers`` it offers (2 is ping-pong's count, 4 exercise 5's)
GRID_BUFFERS = (2, 4)
#: the chip's HBM bandwidths it offers, TB/s
GRID_HBM_TB_S = (0.8, 1.6, 3.2)
#: time unit of the explorer's bars: 10 ps, so that every bar is an integer
_TICK_S = 1e-11


class PipelineExplorer(Explorer):
    """Explore the AI Core pipeline of the FlashAttention tile loop: one explorer, live and static.

    Controls: strategy and, for ``n_buffers``, the buffer count; ``block_q``, ``block_k``; the
    chip's HBM bandwidth (TB/s; MTE2 and MTE3 get 1/24 each); the head dims
    (:data:`~flashlab.pipeline.settings.HEAD_DIMS`); RoPE concatenated or split; the number of
    kv-blocks (fixed at 4 in the static page). Each state is the simulated schedule
    (:func:`~flashlab.pipeline.settings.run_settings`) as a Gantt chart: a lane per engine, a
    lane per L1 buffer slot, the critical engine's idle gaps hatched, and
    :func:`~flashlab.pipeline.settings.summary` with the utilization of every engine under
    it. A configuration whose tiles do not fit L1/L0/UB shows the ``ValueError`` message.

    The static page offers every strategy, :data:`GRID_BUFFERS`, ``block_q`` and ``block_k``
    in :data:`GRID_BLOCKS`, every head-dim option, both RoPE modes and :data:`GRID_HBM_TB_S`.
    """

    kind = "pipeline"
    title = "Pipeline explorer: the tile loop of one AI Core (modelled)"
    notebook = "pipeline"
    controls = (
        Control("strategy", "strategy", STRATEGIES),
        Control("n_buffers", "L1 buffers", GRID_BUFFERS, {"min": 1, "max": 4}),
        Control("block_q", "block_q", GRID_BLOCKS, {"options": BLOCK_Q_OPTIONS}),
        Control("block_k", "block_k", GRID_BLOCKS, {"options": BLOCK_K_OPTIONS}),
        Control("hbm_tb_s", "HBM TB/s", GRID_HBM_TB_S, {"min": 0.2, "max": 12.8, "step": 0.1}),
        Control("head_dims", "Dqk/Dv", tuple(HEAD_DIMS)),
        Control("rope", "RoPE", ROPE_MODES),
        Control("kv_blocks", "kv-blocks", (4,), {"min": 1, "max": 16}),
    )
    defaults = {"strategy": "ping_pong", "block_q": 128, "block_k": 128, "hbm_tb_s": 1.6,
                "head_dims": "192/128 native V"}

    def __init__(self, settings: PipelineSettings | None = None) -> None:
        s = PipelineSettings() if settings is None else settings
        super().__init__(**{c.name: getattr(s, c.name) for c in self.controls})

    @staticmethod
    def settings_of(values: dict) -> PipelineSettings:
        """The :class:`~flashlab.pipeline.settings.PipelineSettings` of control values."""
        return PipelineSettings(**{**values, "hbm_tb_s": round(float(values["hbm_tb_s"]), 6)})

    @property
    def settings(self) -> PipelineSettings:
        """The settings the explorer shows."""
        return self.settings_of(self.values)

    def relevant(self, values: dict) -> dict:
        """The buffer count matters for ``n_buffers`` only."""
        return {k: v for k, v in values.items()
                if k != "n_buffers" or values["strategy"] == "n_buffers"}

    def state(self, values: dict) -> dict:
        """The simulated schedule of ``values`` as lanes and bars (integer 10 ps ticks), or the
        error message of a configuration that cannot run."""
        from flashlab.viz.gantt import KIND_COLORS, KIND_LABELS, SLOT_COLORS, _default_pools, _lanes

        settings = self.settings_of(values)
        off = [] if settings.strategy == "n_buffers" else ["n_buffers"]
        try:
            result, baseline, speedup = run_settings(settings)
        except ValueError as exc:
            return {"error": 1, "off": off,
                    "text": [settings.label(), f"This configuration cannot run: {exc}"]}
        pools = _default_pools(result)
        lanes = _lanes(result, pools)
        row = {(key, slot): k for k, (_, key, slot) in enumerate(lanes)}
        palette = sorted({*KIND_COLORS.values(), *SLOT_COLORS, "#BBBBBB"})
        colour = {c: k for k, c in enumerate(palette)}

        def tick(t: float) -> int:
            return round(t / _TICK_S)

        bars = []
        for i, t in enumerate(result.graph.tasks):
            bars.append([row[(t.engine, None)], tick(result.start[i]), tick(result.end[i]),
                         colour[KIND_COLORS.get(t.kind, "#BBBBBB")], t.name])
        for span in result.occupancy:
            if span.pool in pools:
                bars.append([row[(span.pool, span.slot)], tick(span.start), tick(span.end),
                             colour[SLOT_COLORS[span.slot % len(SLOT_COLORS)]], span.task])
        kinds = {t.kind for t in result.graph.tasks}
        legend: dict[str, str] = {}
        for kind, label in KIND_LABELS.items():
            if kind in kinds:
                legend.setdefault(KIND_COLORS[kind], label)
        busy = ", ".join(f"{e} {100 * u:.0f}%" for e, u in result.utilization.items())
        return {"lanes": [label for label, _, _ in lanes], "engines": len(result.engines),
                "crit": row[(result.critical_engine, None)], "T": tick(result.makespan),
                "scale": round(1e-6 / _TICK_S), "unit": "us", "bars": bars,
                "gaps": [[tick(a), tick(b)] for a, b in result.idle_gaps],
                "colors": self.pooled(palette), "legend": self.pooled(sorted(legend.items())),
                "off": off,
                "text": [settings.label(), summary(result, baseline, speedup),
                         f"engines busy: {busy}"]}


def chart_output(png: bytes, settings: PipelineSettings) -> dict:
    """The ``display_data`` output of a chart: the PNG (base64) and a text stand-in."""
    return {"output_type": "display_data", "metadata": {},
            "data": {"image/png": base64.b64encode(png).decode("ascii"),
                     "text/plain": f"<Gantt chart: {settings.label()}>"}}


#: the control changes :func:`pipeline_explorer_change` times, each from the previous settings
CHANGES: tuple[dict, ...] = (
    dict(kv_blocks=5), dict(block_k=256), dict(hbm_tb_s=3.2), dict(strategy="self_mte2"),
    dict(head_dims="128/128"), dict(rope="split"), dict(block_q=64), dict(kv_blocks=6),
    dict(hbm_tb_s=0.8), dict(strategy="ping_pong"), dict(block_k=128), dict(rope="concat"),
)


def pipeline_explorer_change(dpi: int = 70, repeat: int = 2) -> dict:
    """Seconds per change of the pipeline explorer: the median over :data:`CHANGES`, ``repeat``
    times through.

    A change re-simulates and redraws a matplotlib Gantt chart:
    :func:`~flashlab.pipeline.settings.run_settings` (the configuration and its ``iterate_all``
    baseline), :func:`~flashlab.pipeline.settings.summary`, the chart
    (:meth:`flashlab.viz.gantt.GanttView.show` and :meth:`~flashlab.viz.gantt.GanttView.png`)
    and its output. The chart of the first settings is drawn before timing, as the explorer
    draws it when it opens. Returns ``{"changes", "median_s", "max_s", "build_s",
    "figures_built", "target_s"}``.
    """
    from flashlab.viz.gantt import GanttView

    dpi = as_int("dpi", dpi, lo=1)
    repeat = as_int("repeat", repeat, lo=1)
    settings = PipelineSettings()
    t0 = time.perf_counter()
    view = GanttView(dpi=dpi)
    result, baseline, speedup = run_settings(settings)
    view.show(result)
    chart_output(view.png(), settings)
    build = time.perf_counter() - t0
    seconds = []
    for _ in range(repeat):
        for change in CHANGES:
            t0 = time.perf_counter()
            settings = dataclasses.replace(settings, **change)
            result, baseline, speedup = run_settings(settings)
            summary(result, baseline, speedup)
            view.show(result)
            chart_output(view.png(), settings)
            seconds.append(time.perf_counter() - t0)
    seconds.sort()
    return {"changes": len(seconds), "median_s": seconds[len(seconds) // 2],
            "max_s": seconds[-1], "build_s": build, "figures_built": view.figures_built,
            "target_s": CHANGE_TARGET_S}
