"""Gantt charts of simulated pipelines: lanes, colours, utilization, highlighted gaps, grids."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from flashlab.pipeline.profiles import ASCEND_910B_AI_CORE  # noqa: E402
from flashlab.pipeline.schedule import simulate_fa  # noqa: E402
from flashlab.pipeline.simulate import simulate, two_stage_graph  # noqa: E402
from flashlab.viz.gantt import (  # noqa: E402
    KIND_COLORS,
    SLOT_COLORS,
    draw_gantt,
    gantt_grid,
    slot_name,
)
from flashlab.viz.style import PALETTE  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def fa(strategy: str, block_k: int = 128, seq_kv: int = 512):
    return simulate_fa(ASCEND_910B_AI_CORE, strategy, 128, seq_kv, 192, 128, 128, block_k)


def _bar_colours(ax, y: float) -> set[str]:
    """Face colours of the bar collections drawn on lane ``y``."""
    out = set()
    for coll in ax.collections:
        colours = coll.get_facecolors()
        for k, path in enumerate(coll.get_paths()):
            ys = path.vertices[:, 1]
            if ys.min() < y < ys.max():
                out.add(to_hex(colours[k % len(colours)][:3]))
    return out


def test_lanes_engines_then_ping_pong_slots():
    r = fa("ping_pong")
    fig = draw_gantt(r)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["MTE2", "MTE1", "CUBE", "FIXPIPE", "VECTOR", "MTE3",
                      "L1.B ping", "L1.B pong", "L1.A ping", "L1.A pong"]
    # ping and pong in different palette colours
    ping, pong = _bar_colours(ax, labels.index("L1.B ping")), _bar_colours(ax, labels.index("L1.B pong"))
    assert ping == {to_hex(SLOT_COLORS[0])} and pong == {to_hex(SLOT_COLORS[1])}
    assert ping != pong and set(SLOT_COLORS[:2]) <= set(PALETTE.values())
    # the K copies on MTE2 have K's colour
    assert to_hex(PALETTE["k"]) in _bar_colours(ax, 0)
    assert set(KIND_COLORS.values()) <= set(PALETTE.values())


def test_critical_engine_gaps_and_utilization():
    r = fa("iterate_all")
    assert r.critical_engine == "MTE2" and r.idle_gaps
    fig = draw_gantt(r)
    ax, ux = fig.axes[0], fig.axes[1]
    hatched = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()]
    assert len(hatched) == len(r.idle_gaps)
    assert all(0.0 - 0.35 <= p.get_y() <= 0.0 for p in hatched)   # all on the MTE2 lane (y = 0)
    bold = [t for t in ax.get_yticklabels() if t.get_fontweight() == "bold"]
    assert [t.get_text() for t in bold] == ["MTE2"]
    texts = [t.get_text() for t in ux.texts]
    assert texts[0] == f"{100 * r.utilization['MTE2']:.0f}%"
    assert len(texts) == len(ax.get_yticklabels())
    assert "makespan" in ax.get_title() and "iterate_all" in ax.get_title()
    assert fig.legends and any("idle gap" in t.get_text() for t in fig.legends[0].get_texts())


def test_time_axis_units():
    r = simulate(two_stage_graph(3, 5, 4, 2))
    fig = draw_gantt(r, unit="s", utilization=False, legend=False)
    ax = fig.axes[0]
    assert ax.get_xlim() == (0.0, r.makespan)
    assert len(fig.axes) == 1 and not fig.legends
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["COPY", "COMPUTE", "buf ping", "buf pong"]
    # small graphs get task names inside the bars
    assert {"copy0", "compute3"} <= {t.get_text() for t in ax.texts}
    us = draw_gantt(fa("ping_pong"), unit="us").axes[0]
    assert us.get_xlim()[1] == pytest.approx(fa("ping_pong").makespan * 1e6)
    with pytest.raises(ValueError, match="unit"):
        draw_gantt(r, unit="fortnights")


def test_draw_into_an_axes_and_pool_choice():
    r = fa("self_mte2")
    fig, ax = plt.subplots()
    out = draw_gantt(r, ax=ax, pools=["L1.B", "L0C"], title="mine")
    assert out is fig and len(fig.axes) == 1 and ax.get_title() == "mine"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-2:] == ["L1.B", "L0C ping"] or labels[-3:] == ["L1.B", "L0C ping", "L0C pong"]
    with pytest.raises(ValueError, match="not in the graph"):
        draw_gantt(r, pools=["L9"])
    with pytest.raises(TypeError, match="SimResult"):
        draw_gantt("result")


def test_slot_names():
    assert slot_name(0, 1) == "" and slot_name(1, 2) == "pong" and slot_name(2, 3) == "#2"


def test_small_multiples_grid():
    strategies = ["iterate_all", "ping_pong"]
    sizes = [64, 128]
    grid = [[fa(s, bk, 384) for bk in sizes] for s in strategies]
    fig = gantt_grid(grid, row_labels=strategies, col_labels=[f"128x{b}" for b in sizes])
    assert len(fig.axes) == 4
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("iterate_all, 128x64: makespan")
    assert titles[3].startswith("ping_pong, 128x128: makespan")
    # one shared time axis: every cell spans the longest makespan
    longest = max(r.makespan for row in grid for r in row) * 1e6
    assert all(ax.get_xlim()[1] == pytest.approx(longest) for ax in fig.axes)
    assert len(fig.legends) == 1
    with pytest.raises(ValueError, match="rectangular"):
        gantt_grid([[grid[0][0]], grid[1]])
    with pytest.raises(ValueError, match="row_labels must have 2"):
        gantt_grid(grid, row_labels=["a"])
    with pytest.raises(TypeError, match="SimResult"):
        gantt_grid([[1]])
