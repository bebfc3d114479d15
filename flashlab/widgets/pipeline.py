"""The pipeline explorer: the FlashAttention tile loop of one Ascend AI Core, live and static.

The design points it explores are :class:`flashlab.pipeline.settings.PipelineSettings`
(strategy, tile sizes, HBM bandwidth, head dims, RoPE, kv-blocks); this module is the controls
and the drawings over them.

- :class:`PipelineExplorer` (live kernel; needs ipywidgets): controls for every setting; it
  redraws the Gantt chart (a :class:`flashlab.viz.gantt.GanttView`: a lane per engine, a lane
  per ping/pong buffer, the critical engine's idle gaps hatched, utilization bars) and prints
  the makespan and the speedup over ``iterate_all``. A configuration whose tiles do not fit the
  buffers shows the ``ValueError`` message instead of a chart.
- :func:`pipeline_explorer_change`: the seconds one change of a control costs, for the
  benchmark.
- Static fallbacks for the HTML book, where no kernel runs: :func:`pipeline_grid` (small
  multiples, strategies x tile sizes or strategies x bandwidths) and
  :func:`pipeline_animation` (one chart revealed step by step in time, for ``to_jshtml``).

``ipywidgets`` is imported inside :class:`PipelineExplorer` only, so the static fallbacks never
need it.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
from flashlab.pipeline.simulate import TIME_UNITS, SimResult

if TYPE_CHECKING:   # matplotlib is imported when a chart is drawn
    from matplotlib.figure import Figure

    from flashlab.viz.gantt import GanttView

__all__ = ["BLOCK_Q_OPTIONS", "BLOCK_K_OPTIONS", "CHANGE_TARGET_S", "pipeline_grid",
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
class PipelineExplorer:
    """Explore the AI Core pipeline of the FlashAttention tile loop (live kernel; ipywidgets).

    Controls: strategy and, for ``n_buffers``, the buffer count; ``block_q``, ``block_k``; the
    chip's HBM bandwidth (TB/s; MTE2 and MTE3 get 1/24 each); the head dims
    (:data:`~flashlab.pipeline.settings.HEAD_DIMS`); RoPE concatenated or split; the number of
    kv-blocks. Every change re-simulates the configuration and its ``iterate_all`` baseline,
    redraws the Gantt chart with utilization bars, and prints
    :func:`~flashlab.pipeline.settings.summary`. A configuration that cannot run (tiles that
    do not fit L1/L0/UB) shows the error message and no chart.

    Attributes: ``settings`` (the current
    :class:`~flashlab.pipeline.settings.PipelineSettings`), ``result``,
    ``baseline``, ``speedup`` (``None`` after an error), ``error`` (the message, or ``None``),
    ``figure`` (the last chart). Display it as the last expression of a cell; ``.widget`` is
    the ipywidgets box.
    """

    def __init__(self, settings: PipelineSettings | None = None, *, draw: bool = True,
                 dpi: int = 70) -> None:
        import ipywidgets as W

        s = PipelineSettings() if settings is None else settings
        self.dpi, self.draw_enabled = dpi, draw
        style = {"description_width": "7em"}
        wide = W.Layout(width="21em")
        self.strategy = W.Dropdown(options=STRATEGIES, value=s.strategy, description="strategy",
                                   style=style, layout=wide)
        self.n_buffers = W.IntSlider(s.n_buffers, min=1, max=4, description="L1 buffers",
                                     continuous_update=False, style=style, layout=wide)
        self.block_q = W.SelectionSlider(options=BLOCK_Q_OPTIONS, value=s.block_q,
                                         description="block_q", continuous_update=False,
                                         style=style, layout=wide)
        self.block_k = W.SelectionSlider(options=BLOCK_K_OPTIONS, value=s.block_k,
                                         description="block_k", continuous_update=False,
                                         style=style, layout=wide)
        self.hbm = W.FloatSlider(s.hbm_tb_s, min=0.2, max=12.8, step=0.1, readout_format=".1f",
                                 description="HBM TB/s", continuous_update=False, style=style,
                                 layout=wide)
        self.head_dims = W.Dropdown(options=tuple(HEAD_DIMS), value=s.head_dims,
                                    description="Dqk/Dv", style=style, layout=wide)
        self.rope = W.ToggleButtons(options=ROPE_MODES, value=s.rope, description="RoPE",
                                    style={**style, "button_width": "6em"})
        self.kv_blocks = W.IntSlider(s.kv_blocks, min=1, max=16, description="kv-blocks",
                                     continuous_update=False, style=style, layout=wide)
        self.info = W.HTML()
        self.out = W.Output()
        self.controls = (self.strategy, self.n_buffers, self.block_q, self.block_k, self.hbm,
                         self.head_dims, self.rope, self.kv_blocks)
        for control in self.controls:
            control.observe(lambda _: self.update(), names="value")
        self.widget = W.VBox([
            W.HBox([self.strategy, self.n_buffers]),
            W.HBox([self.block_q, self.block_k]),
            W.HBox([self.hbm, self.kv_blocks]),
            W.HBox([self.head_dims, self.rope]),
            self.info, self.out])
        self.settings: PipelineSettings = s
        self.result: SimResult | None = None
        self.baseline: SimResult | None = None
        self.speedup: float | None = None
        self.error: str | None = None
        self.view: GanttView | None = None   # one figure while the lanes stay the same
        self.figure: Figure | None = None
        self.update()

    def read_controls(self) -> PipelineSettings:
        """The :class:`~flashlab.pipeline.settings.PipelineSettings` the controls show."""
        return PipelineSettings(strategy=self.strategy.value, n_buffers=self.n_buffers.value,
                                block_q=self.block_q.value, block_k=self.block_k.value,
                                hbm_tb_s=round(float(self.hbm.value), 6),
                                head_dims=self.head_dims.value, rope=self.rope.value,
                                kv_blocks=self.kv_blocks.value)

    def update(self) -> None:
        """Re-simulate for the current controls and redraw (or show why it cannot run)."""
        self.settings = self.read_controls()
        self.n_buffers.disabled = self.settings.strategy != "n_buffers"
        try:
            self.result, self.baseline, self.speedup = run_settings(self.settings)
        except ValueError as exc:
            self.result = self.baseline = self.speedup = None
            self.error = str(exc)
            self.info.value = (f"<b>This configuration cannot run:</b> "
                               f"<code>{html.escape(self.error)}</code>")
            self.out.outputs = ()
            return
        self.error = None
        self.info.value = html.escape(summary(self.result, self.baseline, self.speedup))
        self.redraw()

    def redraw(self) -> None:
        """Draw the current result and put it, as a PNG, in the ``Output`` widget.

        The chart is a :class:`~flashlab.viz.gantt.GanttView`: while the lanes stay the same a
        change redraws the bars on the same figure, with the layout of its first draw, and the
        PNG costs one Agg draw. As in :class:`flashlab.widgets.TileExplorer`, the PNG is set
        on the widget's ``outputs`` directly (not ``with self.out: display(...)``, which leaks
        figures in kernels driven by nbval or scripts).
        """
        if not self.draw_enabled or self.result is None:
            return
        from flashlab.viz.gantt import GanttView

        if self.view is None:
            self.view = GanttView(dpi=self.dpi)
        self.figure = self.view.show(self.result)
        self.out.outputs = (chart_output(self.view.png(), self.settings),)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


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

    A change is what :meth:`PipelineExplorer.update` does besides the widget traffic:
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
