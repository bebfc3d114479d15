"""flashlab.pipeline.settings and flashlab.widgets.pipeline: the settings map to the simulator's
arguments, the bandwidth moves MTE2/MTE3, the explorer follows its controls, shows errors
instead of raising and redraws in place (viz.gantt.GanttView), and the static fallbacks (grid,
animation) have the expected panels and frames."""
from __future__ import annotations

import dataclasses
import gc

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashlab.pipeline.profiles import ASCEND_910B_AI_CORE  # noqa: E402
from flashlab.pipeline.schedule import simulate_fa  # noqa: E402
from flashlab.pipeline.settings import (  # noqa: E402
    ROPE_DIM,
    PipelineSettings,
    core_profile,
    run_settings,
    simulate_settings,
    summary,
)
from flashlab.widgets.pipeline import pipeline_animation, pipeline_grid  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ---------------------------------------------------------------------- settings and profile
def test_core_profile_moves_mte2_and_mte3_only():
    base = ASCEND_910B_AI_CORE
    p = core_profile(3.2)
    # beta_core = 3.2 TB/s / 24
    assert p.core.load.rate.value == pytest.approx(3.2e12 / 24)
    assert p.core.store.rate.value == pytest.approx(3.2e12 / 24)
    assert p.hbm_bandwidth.value == pytest.approx(3.2e12 / 24)
    assert p.core.load.rate.status == "assumption" and "3.2 TB/s" in p.core.load.rate.source
    for name in ("l1_to_l0", "matmul", "acc_out", "vector"):
        assert getattr(p.core, name) == getattr(base.core, name)
    # the default bandwidth reproduces the profile's own MTE2 rate
    assert core_profile().core.load.rate.value == pytest.approx(base.core.load.rate.value)
    with pytest.raises(ValueError, match="hbm_tb_s"):
        core_profile(0)
    with pytest.raises(TypeError, match="hbm_tb_s"):
        core_profile("3.2")


def test_settings_map_to_the_simulator():
    s = PipelineSettings(strategy="n_buffers", n_buffers=3, block_q=64, block_k=128,
                         head_dims="192/192 padded V", rope="split", kv_blocks=5)
    r = simulate_settings(s)
    info = r.graph.info
    assert (info["strategy"], info["n_buffers"], info["block_q"], info["block_k"]) == \
        ("n_buffers", 3, 64, 128)
    assert (info["d_qk"], info["d_v_eff"], info["pad_v"], info["split_rope"]) == \
        (192, 192, True, ROPE_DIM)
    assert info["steps"] == 5 and info["seq_q"] == 64 and info["seq_kv"] == 5 * 128
    assert r.graph.pools["L1.B"] == 3
    # the same numbers as calling the simulator directly
    direct = simulate_fa(ASCEND_910B_AI_CORE, "n_buffers", 64, 640, 192, 128, 64, 128,
                         n_buffers=3, pad_v=True, split_rope=ROPE_DIM)
    assert r.makespan == pytest.approx(direct.makespan, rel=1e-12)
    # n_buffers is ignored by the strategies with a fixed buffer count
    assert simulate_settings(dataclasses.replace(s, strategy="ping_pong")).graph.pools["L1.B"] == 2


@pytest.mark.parametrize("bad, error, match", [
    (dict(strategy="double"), ValueError, "strategy"),
    (dict(head_dims="256/256"), ValueError, "head_dims"), (dict(rope="fused"), ValueError, "rope"),
    (dict(kv_blocks=0), ValueError, "kv_blocks must be >= 1"),
    (dict(block_q=1.5), TypeError, "block_q must be an int"),
    (dict(hbm_tb_s=0), ValueError, "hbm_tb_s must be > 0"),
    (dict(hbm_tb_s=True), TypeError, "hbm_tb_s"),
])
def test_settings_validation(bad, error, match):
    with pytest.raises(error, match=match):
        PipelineSettings(**bad)


def test_speedup_is_against_iterate_all_of_the_same_shape():
    s = PipelineSettings(strategy="ping_pong", kv_blocks=8)
    result, baseline, speedup = run_settings(s)
    assert baseline.graph.info["strategy"] == "iterate_all"
    assert baseline.graph.info["steps"] == result.graph.info["steps"] == 8
    assert speedup == pytest.approx(baseline.makespan / result.makespan)
    assert speedup > 1.2                      # MTE2-bound at the default 1.6 TB/s
    _, same, one = run_settings(dataclasses.replace(s, strategy="iterate_all"))
    assert one == 1.0 and same.makespan == baseline.makespan
    text = summary(result, baseline, speedup)
    assert f"speedup {speedup:.3f}x" in text and "Critical engine MTE2" in text


def test_ping_pong_gain_shrinks_when_compute_bound():
    """Ping-pong hides MTE2; once the Vector is the critical engine there is little to hide."""
    slow = run_settings(PipelineSettings(block_k=256, hbm_tb_s=1.6, kv_blocks=16))
    fast = run_settings(PipelineSettings(block_k=256, hbm_tb_s=12.8, kv_blocks=16))
    assert slow[0].critical_engine == "MTE2" and fast[0].critical_engine == "VECTOR"
    assert fast[2] < slow[2]


# --------------------------------------------------------------------------------- explorer
def test_explorer_builds_and_follows_its_controls():
    from flashlab.widgets.pipeline import PipelineExplorer

    ex = PipelineExplorer()
    assert ex.settings == PipelineSettings()
    st = ex.state(ex.values)
    assert st["off"] == ["n_buffers"] and "ping_pong" in st["text"][0]
    slow = ex.state({**ex.values, "strategy": "iterate_all"})
    assert "speedup 1.000x" in slow["text"][1] and slow["T"] > st["T"]
    nb = ex.state({**ex.values, "strategy": "n_buffers", "n_buffers": 3})
    assert nb["off"] == [] and "L1.B #2" in nb["lanes"]
    fast = ex.state({**ex.values, "hbm_tb_s": 3.2})        # faster HBM: MTE2 copies shorten
    assert fast["T"] < st["T"]
    split = ex.state({**ex.values, "rope": "split", "head_dims": "128/128"})
    assert "RoPE split" in split["text"][0] and "D 128/128" in split["text"][0]


def test_explorer_shows_the_error_for_tiles_that_do_not_fit():
    from flashlab.widgets.pipeline import PipelineExplorer

    ex = PipelineExplorer()
    st = ex.state({**ex.values, "block_q": 256, "block_k": 256})   # D = 192: L1 overflows
    assert st["error"] and "cannot run" in st["text"][-1] and "do not fit in L1" in st["text"][-1]


def test_explorer_lanes_are_the_gantt_charts():
    from flashlab.widgets.pipeline import PipelineExplorer

    st = PipelineExplorer(PipelineSettings(kv_blocks=2)).state(
        {**PipelineExplorer().values, "kv_blocks": 2})
    assert st["lanes"][:6] == ["MTE2", "MTE1", "CUBE", "FIXPIPE", "VECTOR", "MTE3"]
    assert "L1.B ping" in st["lanes"] and "L1.B pong" in st["lanes"]
    assert plt.get_fignums() == []


# --------------------------------------------------------------------------- static fallbacks
def test_grid_strategies_by_tiles_and_by_bandwidths():
    base = PipelineSettings(kv_blocks=2)
    fig = pipeline_grid(base, tiles=[(64, 128), (128, 128)])
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 3 * 2
    assert titles[0].startswith("iterate_all, 64x128: makespan")
    assert titles[-1].startswith("ping_pong, 128x128: makespan")
    fig = pipeline_grid(base, strategies=("iterate_all", "ping_pong"), bandwidths=[0.8, 3.2])
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 4 and titles[1].startswith("iterate_all, 3.2 TB/s")
    with pytest.raises(ValueError, match="exactly one"):
        pipeline_grid(base)
    with pytest.raises(ValueError, match="do not fit"):
        pipeline_grid(base, tiles=[(256, 256)])


@pytest.mark.filterwarnings("ignore:Animation was deleted without rendering")
def test_animation_frames():
    anim = pipeline_animation(PipelineSettings(kv_blocks=2), frames=4, dpi=30)
    assert len(list(anim.new_frame_seq())) == 4
    html = anim.to_jshtml()
    assert html.count('"data:image/png;base64') == 4
    assert plt.get_fignums() == []            # closed in pyplot: no stray chart in a notebook
    with pytest.raises(ValueError, match="frames must be >= 2"):
        pipeline_animation(frames=1)
    with pytest.raises(TypeError, match="frames must be an int"):
        pipeline_animation(frames=2.0)
    del anim
    gc.collect()


@pytest.mark.filterwarnings("ignore:Animation was deleted without rendering")
def test_animation_first_frame_is_not_blank_and_last_is_whole():
    anim = pipeline_animation(PipelineSettings(kv_blocks=2), frames=4, dpi=30)
    fig = anim._fig
    curtain = next(p for p in fig.axes[0].patches if p.get_alpha() == 0.92)
    anim._func(0)
    assert curtain.get_x() > 0
    anim._func(3)
    assert curtain.get_width() == 0
    # collected here, under this test's filter (else a later test reports the warning)
    del anim, fig, curtain
    gc.collect()


# ------------------------------------------------------------------ a change redraws in place
def _pixels(png: bytes):
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)))


def test_gantt_view_redraws_in_place_with_one_partial_draw():
    """A change that keeps the lanes reuses the figure, runs no full figure draw (only the
    changing artists over the kept background) and gives the PNG a whole render gives."""
    from flashlab.viz.gantt import GanttView
    from flashlab.viz.style import png_bytes

    view = GanttView(dpi=40)
    first = view.show(run_settings(PipelineSettings(kv_blocks=2))[0])
    view.png()
    full_draws = []
    first.canvas.mpl_connect("draw_event", lambda _: full_draws.append(1))
    # faster HBM: the critical engine moves from MTE2 to VECTOR, so its lane label changes too
    result = run_settings(PipelineSettings(block_k=256, hbm_tb_s=12.8, kv_blocks=3))[0]
    assert result.critical_engine == "VECTOR"
    assert view.show(result) is first and view.figures_built == 1
    png = view.png()
    assert full_draws == []
    assert (_pixels(png) == _pixels(png_bytes(first))).all()
    assert plt.get_fignums() == []


def test_gantt_view_keeps_a_few_frames_and_frees_the_rest():
    import weakref

    from flashlab.viz.gantt import GanttView

    view = GanttView(dpi=30)
    shapes = [dict(strategy="ping_pong"), dict(strategy="self_mte2"),
              dict(strategy="n_buffers", n_buffers=3), dict(strategy="n_buffers", n_buffers=4),
              dict(strategy="ping_pong", rope="split")]
    figures = []
    for shape in shapes:
        result = run_settings(PipelineSettings(kv_blocks=2, **shape))[0]
        figures.append(weakref.ref(view.show(result)))
        view.png()
    assert view.figures_built == len(shapes) == GanttView.FRAMES_KEPT + 1
    gc.collect()
    assert figures[0]() is None and all(f() is not None for f in figures[1:])
    # back to a kept frame: its figure again, nothing built
    assert view.show(run_settings(PipelineSettings(kv_blocks=3, strategy="self_mte2"))[0]) \
        is figures[1]()
    assert view.figures_built == len(shapes)


def test_pipeline_explorer_change_record():
    from flashlab.widgets.pipeline import CHANGE_TARGET_S, CHANGES, pipeline_explorer_change

    rec = pipeline_explorer_change(dpi=30, repeat=1)
    assert rec["changes"] == len(CHANGES) and rec["target_s"] == CHANGE_TARGET_S
    assert 0 < rec["median_s"] <= rec["max_s"] and rec["build_s"] > 0
    assert 1 <= rec["figures_built"] < len(CHANGES)
    assert plt.get_fignums() == []
    with pytest.raises(TypeError, match="repeat"):
        pipeline_explorer_change(repeat=1.0)

