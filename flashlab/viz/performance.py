r"""Drawings of measured performance: a roofline normalised to the machine's own peak, scaling
against $N$ from benchmark rows, and paired ratios from alternating timing rounds.

On a shared machine an absolute GFLOP/s figure depends on what else runs, so these drawings
plot what survives the noise: a rate over the matmul peak **of the same run**, and a time ratio
between two variants timed **in alternation**. The rows they read are those of
:func:`flashlab.bench.run_suite` (``result["cases"]``, or :func:`flashlab.bench.case_table`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from flashlab.pipeline.roofline import RooflinePoint
from flashlab.viz.style import PALETTE, SERIES, figure_for

__all__ = ["IMPL_COLORS", "IMPL_LABELS", "plot_roofline_fraction", "plot_scaling", "plot_round_ratios"]

#: colour of each implementation of :mod:`flashlab.bench`
IMPL_COLORS: dict[str, str] = {"flashlab": SERIES[0], "numpy_naive": SERIES[1],
                               "torch_sdpa": SERIES[2]}
#: how each implementation is named in legends
IMPL_LABELS: dict[str, str] = {"flashlab": "flashlab", "numpy_naive": "numpy naive",
                               "torch_sdpa": "torch SDPA"}


def plot_roofline_fraction(ridges: Mapping[str, float],
                           points: Sequence[tuple[RooflinePoint, str, str]] = (), *,
                           operations: Mapping[str, float] | None = None, ax=None,
                           intensity_range: tuple[float, float] = (0.1, 1000.0),
                           title: str | None = None):
    r"""A roofline in units of the machine's matmul peak, with measured kernels on it.

    Each roof is $P(I)/\pi = \min(1, I / I^\ast)$ for a ridge point $I^\ast = \pi / \beta$
    (FLOP/byte): the peak $\pi$ and the bandwidth $\beta$ measured on the same machine (e.g. on
    one thread and on all of them). Each point sits at its model intensity and its measured
    fraction of the peak; the gap below the roof is what the kernel loses to something other
    than the roofline's two limits.

    ridges: ``{label: I* in FLOP/byte}``, at least one, each inside ``intensity_range``; the
    first is drawn solid, the others dashed. points: ``(point, colour, marker)`` for each kernel,
    a :class:`~flashlab.pipeline.roofline.RooflinePoint` with its ``label``, ``intensity`` and
    measured ``fraction`` of the matmul peak, drawn filled when ``committed`` (read from a saved
    run) and hollow otherwise, in a matplotlib colour and marker. operations: ``{name:
    intensity}`` marked on the first roof (e.g. the steps of standard attention). ax: axes to
    draw on (a new figure when ``None``). Returns the figure.
    """
    lo, hi = intensity_range
    if not 0 < lo < hi:
        raise ValueError(f"intensity_range must be (lo, hi) with 0 < lo < hi; got {intensity_range}")
    if not isinstance(ridges, Mapping) or not ridges:
        raise TypeError(f"ridges must be a non-empty mapping {{label: FLOP/byte}}; got {ridges!r}")
    for label, r in ridges.items():
        if not np.isfinite(r) or not lo < r < hi:
            raise ValueError(f"ridge {label!r} must be a finite FLOP/byte inside intensity_range "
                             f"{intensity_range}; got {r!r}")
    for mark in points:
        if not (isinstance(mark, tuple) and len(mark) == 3 and isinstance(mark[0], RooflinePoint)):
            raise TypeError(f"points must be (RooflinePoint, colour, marker) tuples; got {mark!r}")
        p = mark[0]
        if not (lo <= p.intensity <= hi and p.fraction > 0):
            raise ValueError(f"point {p.label!r}: intensity {p.intensity:.3g} must lie in "
                             f"{intensity_range} and fraction {p.fraction:.3g} must be > 0")
    fig, ax = figure_for(ax, 7, 4.2)
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    first = next(iter(ridges.values()))
    for k, (label, ridge) in enumerate(ridges.items()):
        # P(I) / pi = min(1, I / I*)
        ax.loglog(x, np.minimum(1.0, x / ridge), color=PALETTE["text"], lw=2 if k == 0 else 1.2,
                  ls="-" if k == 0 else "--")
        ax.axvline(ridge, color=PALETTE["grid"], ls=":", lw=1)
        # labelled near the x axis, one row per roof
        ax.annotate(f"{label}: ridge {ridge:.1f} FLOP/B", (ridge, 0.0), xycoords=("data", "axes fraction"),
                    xytext=(4, 4 + 11 * k), textcoords="offset points", fontsize=8)
    ax.fill_between(x, np.minimum(1.0, x / first), 1.0, where=x < first,
                    color=PALETTE["memory"], alpha=0.08, lw=0)
    ax.text(lo * 1.3, 0.55, "memory-bound", color=PALETTE["memory"], fontsize=8)
    ax.text(hi / 8, 0.8, "compute-bound", color=PALETTE["compute"], fontsize=8)
    for name, i in (operations or {}).items():
        if not lo <= i <= hi:
            raise ValueError(f"operation {name!r} has intensity {i:.3g}, outside {intensity_range}")
        y = min(1.0, i / first)
        ax.plot(i, y, "|", color=PALETTE["grid"], ms=14, mew=2)
        ax.annotate(name, (i, y), xytext=(4, -14), textcoords="offset points", fontsize=7,
                    color="#555555")
    for p, color, marker in points:
        ax.plot(p.intensity, p.fraction, marker, ms=8, mew=1.5, color=color,
                mfc=color if p.committed else "white", label=p.label)
    fractions = [p.fraction for p, _, _ in points] + [1.0]
    ax.set_ylim(min(0.02, 0.5 * min(fractions)), 2.5 * max(fractions))
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of main-memory traffic, model)")
    ax.set_ylabel("GFLOP/s / matmul peak of the same run")
    ax.set_title(title or "Roofline of this machine, in units of its matmul peak", fontsize=10)
    ax.grid(True, which="major", color=PALETTE["grid"], lw=0.5, alpha=0.6)
    if points:
        ax.legend(fontsize=7, loc="lower right")
    return fig


def _series_key(row: Mapping) -> tuple[str, int, int]:
    return row["impl"], row["d_qk"], row["d_v"]


def plot_scaling(ax, rows: Sequence[Mapping], value: Callable[[Mapping], float | None], *,
                 ylabel: str, title: str = "", reference: tuple[float, float] | None = None):
    r"""Log-log plot of ``value(row)`` against ``row["n"]``, one line per (implementation,
    head dims) of benchmark ``rows``; 192/128 lines dashed. Rows for which ``value`` returns
    ``None`` (not measured) are left out.

    reference: ``(n0, y0)`` draws a dotted $y = y_0 (N / n_0)^2$ guide ("$N^2$"), the slope of
    attention's work and of standard attention's memory. Returns the lines drawn, by label.
    """
    if not callable(value):
        raise TypeError(f"value must be a callable row -> number; got {type(value).__name__}")
    series: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
    for r in rows:
        y = value(r)
        if y is not None:
            series.setdefault(_series_key(r), []).append((r["n"], y))
    lines = {}
    for (impl, dqk, dv), pts in sorted(series.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pts.sort()
        label = f"{IMPL_LABELS.get(impl, impl)} {dqk}/{dv}"
        lines[label] = ax.loglog([n for n, _ in pts], [y for _, y in pts],
                                 "o-" if dqk == dv else "s--",
                                 color=IMPL_COLORS.get(impl, PALETTE["text"]), ms=4, label=label)[0]
    ns = sorted({n for pts in series.values() for n, _ in pts})
    if reference is not None and ns:
        n0, y0 = reference
        # y = y0 (N / n0)^2
        ax.loglog(ns, [y0 * (n / n0) ** 2 for n in ns], ":", color=PALETTE["grid"], lw=1.5,
                  label="$\\propto N^2$")
    if ns:
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
    ax.set(xlabel="N", ylabel=ylabel, title=title)
    ax.title.set_fontsize(9)
    ax.grid(True, which="major", color=PALETTE["grid"], lw=0.5, alpha=0.6)
    return lines


def plot_round_ratios(ax, ratios: Mapping[str, Sequence[float]], *, reference: float = 1.0,
                      xlabel: str = "time ratio", colors: Sequence[str] | None = None):
    """Horizontal bars: the median of each sequence of per-round ratios, whiskers from the 25th
    to the 75th percentile, the value written at the bar's end, and a line at ``reference``.

    ratios: ``{label: ratios}``, one ratio per alternating timing round (at least one each).
    Returns the bar container.
    """
    if not ratios:
        raise ValueError("ratios must name at least one sequence of ratios")
    for label, r in ratios.items():
        if len(r) == 0 or not np.all(np.isfinite(r)) or np.any(np.asarray(r) <= 0):
            raise ValueError(f"ratios[{label!r}] must be a non-empty sequence of positive numbers")
    labels = list(ratios)
    med = np.array([np.median(ratios[k]) for k in labels])
    q25 = np.array([np.percentile(ratios[k], 25) for k in labels])
    q75 = np.array([np.percentile(ratios[k], 75) for k in labels])
    y = np.arange(len(labels))[::-1]
    colors = list(colors) if colors is not None else [SERIES[i % len(SERIES)] for i in range(len(labels))]
    bars = ax.barh(y, med, xerr=[med - q25, q75 - med], color=colors, alpha=0.85,
                   error_kw=dict(ecolor=PALETTE["text"], capsize=3, lw=1))
    for yi, m in zip(y, med):
        ax.annotate(f"{m:.2f}x", (m, yi), xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.axvline(reference, color=PALETTE["text"], lw=1)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_xlim(0, max(reference, float(q75.max())) * 1.25)
    return bars
