"""flashlab.widgets.tiles and flashlab.viz.tiles: the explorer builds and follows its controls, the
animation has one frame per computed tile, and the drawings render."""
from __future__ import annotations

import gc

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from flashlab.masks import EMPTY, band_from, classify_tiles  # noqa: E402
from flashlab.viz.tiles import block_map_figure, walk_frame_figure  # noqa: E402
from flashlab.widgets.tiles import MASK_KINDS, TileExplorer, demo_problem, frame_indices, tile_walk_animation, walk_demo  # noqa: E402

pytest.importorskip("ipywidgets")


def _empty_tiles(sq, sk, bq, bk, options):
    left, right = band_from(options.get("causal", False), options.get("window"))
    return int((classify_tiles(sq, sk, bq, bk, left, right, options.get("mask")) == EMPTY).sum())


def test_explorer_builds_and_follows_its_controls():
    ex = TileExplorer(sq=32, sk=32, block_q=8, block_k=8, mask_kind="causal")
    st = ex.state(ex.values)
    # one step per tile; the skipped ones are the empty tiles
    assert len(st["frames"]) == 16
    assert sum(t[4] != 0 for t in st["tiles"]) == 16 - _empty_tiles(32, 32, 8, 8, {"causal": True}) == 10
    v = {**ex.values, "block_q": 5, "mask_kind": "none", "sk": 17}   # 7 x 3, off the grid
    st = ex.state(v)
    assert len(st["frames"]) == 21 and all(t[4] != 0 for t in st["tiles"])
    v.update(mask_kind="sliding window", window=3)
    _, options = demo_problem(32, 17, mask_kind="sliding window", window=3)
    st = ex.state(v)
    assert sum(t[4] != 0 for t in st["tiles"]) == 21 - _empty_tiles(32, 17, 5, 8, options) < 21
    assert ex.state(v)["off"] == [] and ex.state({**v, "mask_kind": "causal"})["off"] == ["window"]


def test_explorer_numbers_follow_the_step():
    ex = TileExplorer(sq=16, sk=16, block_q=8, block_k=8, mask_kind="random dense mask")
    assert ex.numbers(frame=1)[1].startswith("step 2 of 4: q-block 0 (rows 0-7) x kv-block 1")


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_demo_problems(kind):
    walk, o_ref = walk_demo(24, 20, 8, 8, mask_kind=kind, window=4)
    assert o_ref.shape == walk.o.shape == (24, 16)
    np.testing.assert_allclose(walk.o, o_ref, atol=1e-5)


def test_random_dense_mask_empties_some_tiles():
    walk, _ = walk_demo(48, 48, 8, 8, mask_kind="random dense mask", seed=0)
    assert any(st.reason.startswith("dense mask") for st in walk.steps)


def test_demo_problem_rejects_unknown_mask():
    with pytest.raises(ValueError, match="mask_kind"):
        demo_problem(8, 8, mask_kind="diagonal")


@pytest.mark.filterwarnings("ignore:Animation was deleted without rendering")
def test_animation_has_one_frame_per_computed_tile():
    anim = tile_walk_animation(24, 24, 8, 8, mask_kind="causal", dpi=30, w=5, h=2.5)
    assert len(list(anim.new_frame_seq())) == 6       # 3 x 3 tiles, 3 above the diagonal
    html = anim.to_jshtml()
    assert html.count('"data:image/png;base64') == 6
    # not a pyplot figure: nothing left for plt.show() to display twice
    assert plt.get_fignums() == []
    anim = tile_walk_animation(24, 24, 8, 8, mask_kind="causal", include_skipped=True)
    assert len(list(anim.new_frame_seq())) == 9
    del anim               # never rendered: let its warning fire here, where it is filtered
    gc.collect()


def test_drawings_render():
    walk, o_ref = walk_demo(20, 20, 8, 8, mask_kind="sliding window", window=5)
    assert frame_indices(walk) == [i for i, st in enumerate(walk.steps) if not st.skipped]
    for index in (0, len(walk.steps) - 1):
        fig = walk_frame_figure(walk, index, o_ref, dpi=40)
        fig.canvas.draw()
        assert len(fig.subfigs) == 2
    fig = block_map_figure(20, 20, 8, 8, window=(5, 0), current=(1, 1))
    assert "4 empty" in fig.axes[0].get_title()
    plt.close(fig)


def test_a_step_of_the_animation_moves_artists_and_builds_nothing():
    """A step of the walk's view updates the artists of one figure."""
    from matplotlib.figure import Figure

    from flashlab.viz.tiles import WalkView

    walk, o_ref = walk_demo(36, 36, 8, 8, mask_kind="causal")
    view = WalkView(walk, o_ref, fig=Figure())
    view.update(0)
    fig, axes = view.fig, list(view.fig.axes)
    children = [len(ax.get_children()) for ax in axes]
    n = len(walk.steps)
    for index in (1, 5, 6, n - 1):
        view.update(index)
        assert view.fig is fig and list(fig.axes) == axes
        assert [len(ax.get_children()) for ax in axes] == children
        st = walk.steps[index]
        # the outline sits on the step's tile, dashed when skipped; one dot per earlier computed tile
        x, y, w, h = view.current.get_bbox().bounds
        assert (x, y, w, h) == (st.cols[0], st.rows[0], st.cols[1] - st.cols[0], st.rows[1] - st.rows[0])
        assert (view.current.get_linestyle() == "--") == st.skipped
        earlier = sum(not s.skipped for s in walk.steps[:index])
        assert len(view.dots.get_xdata()) == earlier
        assert f"tile {index + 1}/{n}" in fig.get_suptitle()


def test_walk_view_one_row_qblocks_and_legend():
    """With block_q = 1 the running-max panel still shows the row's m (a segment, not a point)."""
    from matplotlib.text import Text

    from flashlab.viz.tiles import WALK_FONT, WalkView

    walk, o_ref = walk_demo(6, 10, 1, 4, mask_kind="causal")
    view = WalkView(walk, o_ref)
    for index, st in enumerate(walk.steps):
        view.update(index)
        x, y = view.m_after.get_data()
        finite = np.isfinite(y)
        if np.isfinite(st.m).all():
            assert finite.sum() == 2 and x[finite][1] - x[finite][0] > 0.5   # a visible segment
        visible = [b for b in view.l_bars if b.get_visible()]
        # l drawn rounded to 2 significant digits (the same pixels on every BLAS kernel set)
        assert len(visible) == 1 and visible[0].get_height() == pytest.approx(float(st.l[0]), rel=0.05)
    labels = [t.get_text() for t in view.fig.legends[0].get_texts()]
    assert any("computed earlier" in t for t in labels) and any("skipped" in t for t in labels)
    assert any("current tile" in t for t in labels)
    view.png()
    small = [t.get_text() for t in view.fig.findobj(Text)
             if t.get_text().strip() and t.get_visible() and t.get_fontsize() < WALK_FONT["tick"]]
    assert small == []                         # no text below 9 pt (10 px at 80 dpi)


def test_tile_explorer_step_timing_record():
    from flashlab.bench import tile_explorer_step

    t = tile_explorer_step(sq=12, sk=12, block=4)
    assert t["steps"] == 8 and 0 < t["median_s"] <= t["max_s"]
    assert t["play_interval_s"] == 0.7


@pytest.mark.parametrize("mask_kind, block_q", [("causal", 8), ("sliding window", 4), ("none", 1)])
def test_walk_view_png_is_a_full_draw_without_one(mask_kind, block_q):
    """Every step's PNG has the pixels of a whole render of that step, and a step inside a
    q-block already shown draws no whole figure (only the changing artists over the q-block's
    background), so a step costs milliseconds, not a full Agg draw."""
    import io

    from PIL import Image

    from flashlab.viz.style import png_bytes
    from flashlab.viz.tiles import WalkView

    def pixels(png: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))

    walk, o_ref = walk_demo(13, 11, block_q, 4, mask_kind=mask_kind, window=3)
    view = WalkView(walk, o_ref, dpi=40)
    full_draws = []
    seen = set()
    for index, st in enumerate(walk.steps):
        view.update(index)
        view.fig.canvas.mpl_connect("draw_event", lambda _, index=index: full_draws.append(index))
        png = view.png()
        if st.qb in seen:
            assert full_draws == [], f"step {index} drew the whole figure"
        seen.add(st.qb)
        full_draws.clear()
        whole = png_bytes(view.fig)            # a whole render of the same step
        full_draws.clear()
        assert (pixels(png) == pixels(whole)).all(), f"step {index}: blitted PNG differs"


def test_walk_frames_are_the_same_pixels_when_the_float32_state_moves_in_its_last_digits():
    """The stored animation must not depend on the BLAS kernels: another kernel set changes the
    float32 running state (m, l, the partial output) in its 7th digit and the rounding-level
    errors by up to 3x. A frame drawn from such a state is the same PNG."""
    import dataclasses

    from flashlab.viz.tiles import WalkView, _steady

    walk, o_ref = walk_demo(36, 36, 8, 8, mask_kind="causal")
    rng = np.random.default_rng(1)

    def nudge(x):       # a relative change of up to 2 float32 ulps, as another summation order
        x = np.asarray(x)
        return (x * (1 + rng.uniform(-2.4e-7, 2.4e-7, x.shape))).astype(x.dtype)

    moved = dataclasses.replace(walk, steps=[dataclasses.replace(
        st, m=nudge(st.m), m_prev=nudge(st.m_prev), l=nudge(st.l), o_partial=nudge(st.o_partial))
        for st in walk.steps])
    a, b = WalkView(walk, o_ref, dpi=40), WalkView(moved, o_ref, dpi=40)
    for index in frame_indices(walk):
        a.update(index)
        b.update(index)
        assert a.png() == b.png(), f"step {index}: the frame changed"
    # the last tile of a q-block: every error is float32 rounding, drawn at 1e-6
    last = [i for i in frame_indices(walk) if walk.steps[i].kb == walk.steps[i].qb][-1]
    a.update(last)
    assert {bar.get_height() for bar in a._e_bars if bar.get_visible()} == {1e-6}
    assert list(_steady([0.0, 1.234, -0.05678, np.inf, np.nan], 2)[:3]) == [0.0, 1.2, -0.057]
