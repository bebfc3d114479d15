"""The pipeline explorer: the FlashAttention tile loop of one Ascend AI Core, live and static.

- :class:`PipelineSettings`: one point of the design space the chapter explores -- strategy
  (``iterate_all``, ``self_mte2``, ``ping_pong``, ``n_buffers``), tile sizes, the chip's HBM
  bandwidth, head dims (:data:`HEAD_DIMS`), RoPE concatenated or split, number of kv-blocks --
  and :func:`run_settings`, which simulates it and the ``iterate_all`` baseline of the same
  shape (:func:`flashlab.pipeline.schedule.simulate_fa`).
- :func:`core_profile`: the Ascend 910B AI Core profile with the chip's HBM bandwidth moved;
  MTE2 (GM -> L1) and MTE3 (UB -> GM) get a 1/24 share of it each, as in
  :mod:`flashlab.pipeline.hardware`.
- :class:`PipelineExplorer` (live kernel; needs ipywidgets): controls for every setting; it
  redraws the Gantt chart (:func:`flashlab.viz.gantt.draw_gantt`: a lane per engine, a lane per
  ping/pong buffer, the critical engine's idle gaps hatched, utilization bars) and prints the
  makespan and the speedup over ``iterate_all``. A configuration whose tiles do not fit the
  buffers shows the ``ValueError`` message instead of a chart.
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
import io
from collections.abc import Sequence
from dataclasses import dataclass

from flashlab.pipeline.hardware import (
    ASCEND_910B, ASCEND_910B_AI_CORE, ASCEND_910B_CORES, HardwareProfile, with_hbm_bandwidth,
)
from flashlab.pipeline.schedule import STRATEGIES, simulate_fa
from flashlab.pipeline.simulate import TIME_UNITS, SimResult

__all__ = ["HEAD_DIMS", "ROPE_MODES", "ROPE_DIM", "BLOCK_Q_OPTIONS", "BLOCK_K_OPTIONS",
           "DEFAULT_HBM_TB_S", "N_AI_CORES", "core_profile", "PipelineSettings",
           "simulate_settings", "run_settings", "summary", "pipeline_grid", "pipeline_animation",
           "PipelineExplorer"]

#: head-dim presets, name -> (d_qk, d_v, pad_v). "192/192 padded V" is MLA's 192/128 with V
#: padded to 192 (the baseline before RECT-FA); "192/128 native V" is RECT-FA's.
HEAD_DIMS: dict[str, tuple[int, int, bool]] = {
    "128/128": (128, 128, False),
    "192/128 native V": (192, 128, False),
    "192/192 padded V": (192, 128, True),
}
#: how the RoPE part of Q and K enters the score, either one QK^T over the concatenated dims, or two
#: products (NoPE, RoPE) accumulated into one L0C tile
ROPE_MODES = ("concat", "split")
#: the RoPE part's head dim when split (DeepSeek-V3's 64, ``flashlab.rope.DEEPSEEK_V3_ROPE_DIM``)
ROPE_DIM = 64
#: tile sizes the explorer offers
BLOCK_Q_OPTIONS = (16, 32, 64, 128, 256)
BLOCK_K_OPTIONS = (16, 32, 64, 128, 256, 512)
#: the chip's HBM bandwidth the profile assumes, in TB/s (an assumption, no official figure)
DEFAULT_HBM_TB_S = ASCEND_910B.hbm_bandwidth.value / 1e12
#: AI Cores that share the HBM (one L1 per AI Core)
N_AI_CORES = ASCEND_910B_CORES


def core_profile(hbm_tb_s: float = DEFAULT_HBM_TB_S,
                 base: HardwareProfile = ASCEND_910B_AI_CORE) -> HardwareProfile:
    """The AI Core profile ``base`` with the chip's HBM bandwidth set to ``hbm_tb_s`` TB/s.

    One core's share, $\\beta_{core} = \\beta_{chip} / 24$, becomes the profile's
    ``hbm_bandwidth``, and :func:`~flashlab.pipeline.hardware.with_hbm_bandwidth` moves the rate
    of its load engine (MTE2, GM -> L1) and store engine (MTE3, UB -> GM) with it; every other
    number of ``base`` stays. The changed numbers are marked as assumptions that name the chosen
    bandwidth.
    """
    if isinstance(hbm_tb_s, bool) or not isinstance(hbm_tb_s, (int, float)) or not hbm_tb_s > 0:
        raise ValueError(f"hbm_tb_s must be a positive number of TB/s; got {hbm_tb_s!r}")
    # beta_core = beta_chip / 24
    share = hbm_tb_s * 1e12 / N_AI_CORES
    why = f"chip HBM bandwidth set to {hbm_tb_s:g} TB/s, one core's share = 1/{N_AI_CORES} of it"
    return with_hbm_bandwidth(base, share, why)


@dataclass(frozen=True)
class PipelineSettings:
    """One configuration of the tile loop on one AI Core (one q-block of ``block_q`` rows
    against ``kv_blocks`` kv-blocks of ``block_k`` keys).

    Attributes
    ----------
    strategy
        one of :data:`flashlab.pipeline.schedule.STRATEGIES`
    n_buffers
        L1 buffers per operand (used by ``strategy="n_buffers"`` only)
    block_q
        tile rows of Q
    block_k
        keys per kv-block
    hbm_tb_s
        the chip's HBM bandwidth in TB/s (see :func:`core_profile`)
    head_dims
        a key of :data:`HEAD_DIMS`
    rope
        ``"concat"`` or ``"split"`` (:data:`ROPE_MODES`; split: the last :data:`ROPE_DIM`
        dims of Q/K are a second matmul)
    kv_blocks
        number of kv-blocks (steps of the loop)
    """

    strategy: str = "ping_pong"
    n_buffers: int = 2
    block_q: int = 128
    block_k: int = 128
    hbm_tb_s: float = DEFAULT_HBM_TB_S
    head_dims: str = "192/128 native V"
    rope: str = "concat"
    kv_blocks: int = 4

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}; got {self.strategy!r}")
        if self.head_dims not in HEAD_DIMS:
            raise ValueError(f"head_dims must be one of {tuple(HEAD_DIMS)}; got {self.head_dims!r}")
        if self.rope not in ROPE_MODES:
            raise ValueError(f"rope must be one of {ROPE_MODES}; got {self.rope!r}")
        for name in ("n_buffers", "block_q", "block_k", "kv_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1; got {value!r}")

    def profile(self) -> HardwareProfile:
        """The AI Core profile at this HBM bandwidth."""
        return core_profile(self.hbm_tb_s)

    def fa_args(self) -> dict:
        """Keyword arguments of :func:`~flashlab.pipeline.schedule.simulate_fa` (profile included)."""
        d_qk, d_v, pad_v = HEAD_DIMS[self.head_dims]
        return dict(profile=self.profile(), strategy=self.strategy, seq_q=self.block_q,
                    seq_kv=self.kv_blocks * self.block_k, d_qk=d_qk, d_v=d_v,
                    block_q=self.block_q, block_k=self.block_k, pad_v=pad_v,
                    split_rope=ROPE_DIM if self.rope == "split" else 0,
                    n_buffers=self.n_buffers if self.strategy == "n_buffers" else None)

    def label(self) -> str:
        """A one-line description, e.g. ``"ping_pong, 128x128, D 192/128 native V, 1.6 TB/s"``."""
        head = (f"n_buffers={self.n_buffers}" if self.strategy == "n_buffers" else self.strategy)
        rope = ", RoPE split" if self.rope == "split" else ""
        return (f"{head}, {self.block_q}x{self.block_k}, D {self.head_dims}{rope}, "
                f"{self.hbm_tb_s:g} TB/s, {self.kv_blocks} kv-blocks")


def simulate_settings(settings: PipelineSettings) -> SimResult:
    """Simulate one configuration (raises ``ValueError`` if its tiles do not fit the buffers)."""
    if not isinstance(settings, PipelineSettings):
        raise TypeError(f"settings must be a PipelineSettings; got {type(settings).__name__}")
    args = settings.fa_args()
    return simulate_fa(args.pop("profile"), args.pop("strategy"), **args)


def run_settings(settings: PipelineSettings) -> tuple[SimResult, SimResult, float]:
    """``(result, baseline, speedup)``: the configuration, the same shape with ``iterate_all``,
    and ``speedup = makespan(iterate_all) / makespan(result)``."""
    result = simulate_settings(settings)
    if settings.strategy == "iterate_all":
        baseline = result
    else:
        baseline = simulate_settings(dataclasses.replace(settings, strategy="iterate_all"))
    # speedup = t_iterate_all / t_strategy
    return result, baseline, baseline.makespan / result.makespan


def summary(result: SimResult, baseline: SimResult, speedup: float) -> str:
    """Plain text: makespan, the ``iterate_all`` makespan and the speedup, the critical engine
    with its utilization and idle time (all modelled, deterministic)."""
    idle = sum(b - a for a, b in result.idle_gaps)
    crit = result.critical_engine
    return (f"makespan {result.makespan * 1e6:.2f} us; iterate_all {baseline.makespan * 1e6:.2f} us; "
            f"speedup {speedup:.3f}x. Critical engine {crit}: busy "
            f"{100 * result.utilization[crit]:.0f}%, idle {idle * 1e6:.2f} us in "
            f"{len(result.idle_gaps)} gaps")


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
    if tiles is not None:
        cols = [dict(block_q=bq, block_k=bk) for bq, bk in tiles]
        col_labels = [f"{bq}x{bk}" for bq, bk in tiles]
    else:
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

    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 2:
        raise ValueError(f"frames must be an int >= 2; got {frames!r}")
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
    (:data:`HEAD_DIMS`); RoPE concatenated or split; the number of kv-blocks. Every change
    re-simulates the configuration and its ``iterate_all`` baseline, redraws the Gantt chart
    with utilization bars, and prints :func:`summary`. A configuration that cannot run (tiles
    that do not fit L1/L0/UB) shows the error message and no chart.

    Attributes: ``settings`` (the current :class:`PipelineSettings`), ``result``,
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
        self.figure = None
        self.update()

    def read_controls(self) -> PipelineSettings:
        """The :class:`PipelineSettings` the controls show."""
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

        As in :class:`flashlab.widgets.TileExplorer`, the PNG is set on the widget's
        ``outputs`` directly (not ``with self.out: display(...)``, which leaks figures in
        kernels driven by nbval or scripts), and the figure is closed in pyplot.
        """
        if not self.draw_enabled or self.result is None:
            return
        import matplotlib.pyplot as plt

        from flashlab.viz.gantt import draw_gantt

        fig = draw_gantt(self.result)
        fig.set_dpi(self.dpi)
        png = io.BytesIO()
        fig.savefig(png, format="png")
        plt.close(fig)
        self.figure = fig
        self.out.outputs = ({"output_type": "display_data", "metadata": {},
                             "data": {"image/png": base64.b64encode(png.getvalue()).decode("ascii"),
                                      "text/plain": f"<Gantt chart: {self.settings.label()}>"}},)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
