"""flashlab.viz.mla: the head-dim figure draws the padding only where the dataflow pads, and the
ledger table holds the ledger's numbers with a total row."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from flashlab import mla  # noqa: E402
from flashlab.viz.mla import head_dims_figure, ledger_markdown  # noqa: E402


def _bars(ax):
    """(x0, width, hatched) of the bar segments drawn on ``ax``, by row (y centre)."""
    rows: dict[float, list] = {}
    for p in ax.patches:
        y = round(p.get_y() + p.get_height() / 2, 6)
        rows.setdefault(y, []).append((p.get_x(), p.get_width(), bool(p.get_hatch())))
    return rows


@pytest.mark.parametrize("dims", [(128, 64, 128), (96, 32, 64), (64, 64, 128)])
def test_padding_drawn_only_in_the_padded_panel(dims):
    d_nope, d_rope, d_v = dims
    d = d_nope + d_rope
    fig = head_dims_figure(d_nope, d_rope, d_v)
    padded, native = (_bars(ax) for ax in fig.axes[:2])
    plt.close(fig)
    # rows: O = 0, V = 1, K = 2, Q = 3; Q and K span D columns in both panels
    for rows in (padded, native):
        for r in (2.0, 3.0):
            assert sum(w for _, w, _ in rows[r]) == d
    # padded: V and O span D, and their last D - Dv columns are hatched zeros
    for r in (0.0, 1.0):
        assert sum(w for _, w, _ in padded[r]) == d
        hatched = [(x, w) for x, w, h in padded[r] if h]
        assert hatched == ([(d_v, d - d_v)] if d > d_v else [])
        # native: V and O span Dv only, nothing hatched
        assert sum(w for _, w, _ in native[r]) == d_v
        assert not any(h for _, _, h in native[r])


@pytest.mark.parametrize("bad, error, match", [
    (dict(d_v=200), ValueError, "d_v"), (dict(d_rope=0), ValueError, "d_rope must be >= 1"),
    (dict(d_nope=1.5), TypeError, "d_nope must be an int"), (dict(d_v=True), TypeError, "d_v"),
])
def test_head_dims_figure_rejects_bad_dims(bad, error, match):
    with pytest.raises(error, match=match):
        head_dims_figure(**bad)


def _ledger():
    rng = np.random.default_rng(0)
    B, H, S = 1, 2, 40
    shapes = [(B, H, S, 16), (B, H, S, 16), (B, H, S, 8), (B, H, S, 8), (B, 1, S, 8)]
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return mla.mla_forward(*args, dataflow="baseline", block_q=16, block_k=16).ledger


def test_ledger_markdown_has_every_step_and_the_total():
    ledger = _ledger()
    lines = ledger_markdown(ledger, unit=1, unit_name="B", digits=0).splitlines()
    # header, separator, one row per step, the total
    assert len(lines) == 2 + len(ledger) + 1
    assert lines[0].startswith("| step | MFLOP | read (B)")
    for line, step in zip(lines[2:], ledger):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == step.name
        assert [int(c.replace(",", "")) for c in cells[2:]] == [
            step.bytes_read, step.bytes_written, step.allocated, step.workspace]
    total = [c.strip().strip("*") for c in lines[-1].strip("|").split("|")]
    assert total[0] == "total"
    assert int(total[3].replace(",", "")) == sum(s.bytes_written for s in ledger)
    assert float(total[1].replace(",", "")) == pytest.approx(
        sum(s.flops for s in ledger) / 1e6, abs=0.05)


def test_ledger_markdown_rejects_bad_arguments():
    with pytest.raises(TypeError, match="ledger"):
        ledger_markdown([])
    with pytest.raises(TypeError, match="ledger"):
        ledger_markdown(["not a step"])
    with pytest.raises(ValueError, match="unit"):
        ledger_markdown(_ledger(), unit=0)
