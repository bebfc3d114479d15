"""flashlab.viz.performance: the normalised roofline has its knee at the ridge and puts each point
where it was measured; scaling plots group benchmark rows into lines; round-ratio bars show medians."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from flashlab.pipeline.roofline import RooflinePoint  # noqa: E402
from flashlab.viz.performance import IMPL_COLORS, plot_roofline_fraction, plot_round_ratios, plot_scaling  # noqa: E402
from flashlab.viz.style import new_figure  # noqa: E402


def _roofs(ax):
    """The roof lines: data of the lines drawn with many points (the markers have one)."""
    return [line for line in ax.get_lines() if len(line.get_xdata()) > 10]


def test_roof_is_min_of_one_and_intensity_over_ridge():
    fig = plot_roofline_fraction({"one": 5.0, "two": 8.0})
    ax = fig.axes[0]
    roofs = _roofs(ax)
    assert len(roofs) == 2
    for line, ridge in zip(roofs, (5.0, 8.0)):
        x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        np.testing.assert_allclose(y, np.minimum(1.0, x / ridge))
    # the first roof is drawn solid, the other dashed
    assert [line.get_linestyle() for line in roofs] == ["-", "--"]
    plt.close(fig)


def test_points_are_placed_where_measured_and_filled_only_when_committed():
    pts = [(RooflinePoint("live", 30.0, fraction=0.7, committed=False), IMPL_COLORS["flashlab"], "o"),
           (RooflinePoint("committed", 120.0, fraction=1.4, committed=True), IMPL_COLORS["torch_sdpa"], "^")]
    fig = plot_roofline_fraction({"r": 6.0}, pts, operations={"softmax": 0.625})
    ax = fig.axes[0]
    by_label = {line.get_label(): line for line in ax.get_lines()}
    for p, _, _ in pts:
        line = by_label[p.label]
        assert (line.get_xdata()[0], line.get_ydata()[0]) == (p.intensity, p.fraction)
    assert by_label["live"].get_markerfacecolor() == "white"
    assert by_label["committed"].get_markerfacecolor() != "white"
    # the softmax tick sits on the slanted part of the roof: 0.625 / 6
    ticks = [line for line in ax.get_lines() if line.get_marker() == "|"]
    assert len(ticks) == 1 and ticks[0].get_ydata()[0] == pytest.approx(0.625 / 6.0)
    # the y range shows every point
    lo, hi = ax.get_ylim()
    assert lo < 0.7 and hi > 1.4
    plt.close(fig)


@pytest.mark.parametrize("ridges, points, match", [
    ({}, (), "ridges"),
    (5.0, (), "ridges"),
    ({"r": 0.01}, (), "ridge 'r'"),
    ({"r": float("nan")}, (), "ridge 'r'"),
    ({"r": 5.0}, ((RooflinePoint("p", 1e5, fraction=0.5, committed=True), "k", "o"),), "point 'p'"),
    ({"r": 5.0}, ((RooflinePoint("p", 10.0, fraction=0.0, committed=True), "k", "o"),), "point 'p'"),
    # a modelled point (no measured fraction) has no place on a measured roofline
    ({"r": 5.0}, ((RooflinePoint("p", 10.0), "k", "o"),), "point 'p'"),
])
def test_roofline_rejects_bad_input(ridges, points, match):
    with pytest.raises((ValueError, TypeError), match=match):
        plot_roofline_fraction(ridges, points)
    plt.close("all")


def test_roofline_rejects_points_of_another_type():
    with pytest.raises(TypeError, match="RooflinePoint"):
        plot_roofline_fraction({"r": 5.0}, [("p", 10.0, 0.5, True)])
    with pytest.raises(TypeError, match="RooflinePoint"):
        plot_roofline_fraction({"r": 5.0}, [RooflinePoint("p", 10.0, fraction=0.5)])
    plt.close("all")


def test_one_roofline_point_serves_the_model_and_the_drawing():
    """The chip-roofline points of flashlab.rect are the same type the drawing takes."""
    from flashlab import rect
    from flashlab.pipeline.profiles import ASCEND_910B

    (p,) = rect.kernel_roofline_by_hit(ASCEND_910B, hits=(0.0,))
    assert isinstance(p, RooflinePoint) and p.label == "kv_hit=0"
    assert p.bytes_moved == pytest.approx(p.flops / p.intensity) and p.bound == "memory"
    with pytest.raises(ValueError, match="no ridge"):
        RooflinePoint("p", 1.0).bound  # noqa: B018


def _row(impl, n, seconds, d_qk=128, direction="forward"):
    return {"impl": impl, "n": n, "d_qk": d_qk, "d_v": 128, "seconds": seconds,
            "direction": direction, "causal": False}


def test_scaling_draws_one_line_per_implementation_and_shape_in_n_order():
    rows = [_row("flashlab", 2048, 0.4), _row("flashlab", 1024, 0.1), _row("numpy_naive", 1024, 0.2),
            _row("flashlab", 1024, 0.13, d_qk=192), _row("torch_sdpa", 1024, 0.5)]
    fig, ax = new_figure()
    # torch's row is "not measured" for this value: left out
    lines = plot_scaling(ax, rows, lambda r: None if r["impl"] == "torch_sdpa" else r["seconds"],
                         ylabel="s", reference=(1024, 0.1))
    assert set(lines) == {"flashlab 128/128", "numpy naive 128/128", "flashlab 192/128"}
    fl = lines["flashlab 128/128"]
    assert list(fl.get_xdata()) == [1024, 2048] and list(fl.get_ydata()) == [0.1, 0.4]
    assert fl.get_linestyle() == "-" and lines["flashlab 192/128"].get_linestyle() == "--"
    assert fl.get_color() == IMPL_COLORS["flashlab"]
    # the N^2 guide through (1024, 0.1)
    guide = [line for line in ax.get_lines() if line.get_label() == "$\\propto N^2$"][0]
    np.testing.assert_allclose(guide.get_ydata(), [0.1, 0.4])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    plt.close(fig)


def test_scaling_rejects_a_value_that_is_not_callable():
    fig, ax = new_figure()
    with pytest.raises(TypeError, match="value"):
        plot_scaling(ax, [_row("flashlab", 1024, 0.1)], "seconds", ylabel="s")
    plt.close(fig)


def test_round_ratio_bars_are_medians_in_the_given_order():
    fig, ax = new_figure()
    ratios = {"a": [1.0, 2.0, 3.0], "b": [0.5, 0.7, 0.6, 0.8]}
    bars = plot_round_ratios(ax, ratios)
    widths = [p.get_width() for p in bars.patches]
    assert widths == [2.0, pytest.approx(0.65)]
    # the first label is drawn on top
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert bars.patches[0].get_y() > bars.patches[1].get_y()
    plt.close(fig)


@pytest.mark.parametrize("ratios", [{}, {"a": []}, {"a": [1.0, -1.0]}, {"a": [np.inf]}])
def test_round_ratio_bars_reject_empty_or_non_positive(ratios):
    fig, ax = new_figure()
    with pytest.raises(ValueError, match="ratios"):
        plot_round_ratios(ax, ratios)
    plt.close(fig)
