r"""Log-log roofline plots with attention's operations placed on them.

For each hardware profile the roof is $P(I) = \min(\pi, \beta I)$
(:func:`flashlab.pipeline.roofline.roofline`); an operation of arithmetic intensity $I$ sits
on the roof at $x = I$. Below the ridge point $\pi/\beta$ it is memory-bound: its speed is
set by the bandwidth, not by the compute units.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from flashlab.flops import operation_intensities
from flashlab.pipeline.params import HardwareProfile
from flashlab.pipeline.roofline import ridge_point, roofline
from flashlab.viz.style import PALETTE, SERIES, figure_for

__all__ = ["MARKERS", "attention_operations", "plot_roofline"]

#: marker per operation name of :func:`flashlab.flops.operation_costs`; others get "o"
MARKERS = {"QK^T": "s", "softmax": "v", "PV": "D", "standard attention": "P",
           "FlashAttention (fused)": "*"}


def attention_operations(seq: int, d: int, *, d_v: int | None = None, block_q: int = 128,
                         elem: int = 2) -> dict[str, float]:
    """Intensities (FLOP/byte) of QK^T, softmax, PV (unfused), the three together ("standard
    attention") and fused FlashAttention (:func:`flashlab.flops.operation_costs`) for a square
    problem ``Sq = Sk = seq`` with head dims ``d`` (and ``d_v``, default ``d``)."""
    return operation_intensities(seq, seq, d, d if d_v is None else d_v,
                                 block_q=block_q, elem=elem)


def plot_roofline(profiles: Sequence[HardwareProfile], operations: Mapping[str, float] | None = None,
                  *, ax=None, intensity_range: tuple[float, float] = (0.1, 1e4),
                  title: str | None = None):
    """Draw the roofline of each profile and place ``operations`` on every roof.

    profiles: one or more :class:`~flashlab.pipeline.params.HardwareProfile`.
    operations: ``{name: intensity in FLOP/byte}``, e.g. from :func:`attention_operations`.
    ax: axes to draw on (a new figure when ``None``).
    Returns the figure.
    """
    if isinstance(profiles, HardwareProfile):
        profiles = [profiles]
    if not profiles or not all(isinstance(p, HardwareProfile) for p in profiles):
        raise TypeError("profiles must be a non-empty sequence of HardwareProfile")
    lo, hi = intensity_range
    if not 0 < lo < hi:
        raise ValueError(f"intensity_range must be (lo, hi) with 0 < lo < hi; got {intensity_range}")
    operations = dict(operations or {})
    for name, i in operations.items():
        if not lo <= i <= hi:
            raise ValueError(f"operation {name!r} has intensity {i:.3g}, "
                             f"outside intensity_range {intensity_range}")

    fig, ax = figure_for(ax, 7, 4.2)
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    y_floor = min(roofline(p, lo) for p in profiles) / 1e12
    roofs = []
    for k, (color, prof) in enumerate(zip(SERIES, profiles)):
        # P(I) = min(pi, beta I), in TFLOP/s
        roofs += ax.loglog(x, roofline(prof, x) / 1e12, color=color, lw=2,
                  label=f"{prof.name}: {prof.peak_flops.value / 1e12:.0f} TFLOP/s, "
                        f"{prof.hbm_bandwidth.value / 1e12:.2f} TB/s")
        # ridge point I* = pi / beta, labelled near the x axis (one row per profile)
        ridge = ridge_point(prof)
        ax.axvline(ridge, color=color, ls=":", lw=1)
        ax.annotate(f"ridge {ridge:.0f}", (ridge, y_floor), color=color, fontsize=8,
                    xytext=(3, 2 + 11 * k), textcoords="offset points")
        for name, i in operations.items():
            ax.plot(i, roofline(prof, i) / 1e12, MARKERS.get(name, "o"), color=color,
                    ms=11 if MARKERS.get(name) == "*" else 7, mec="black", mew=0.6)
    # the operations in a second legend, by marker
    handles = [ax.plot([], [], MARKERS.get(name, "o"), color="white", mec="black",
                       ms=11 if MARKERS.get(name) == "*" else 7,
                       label=f"{name}: {i:.3g} FLOP/B")[0] for name, i in operations.items()]
    if handles:
        ops_legend = ax.legend(handles=handles, fontsize=8, loc="upper left", title="operations",
                               title_fontsize=8)
        ax.add_artist(ops_legend)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(title or "Roofline: memory-bound left of the ridge, compute-bound right of it",
                 fontsize=10)
    ax.grid(True, which="major", color=PALETTE["grid"], lw=0.5, alpha=0.6)
    ax.legend(handles=roofs, fontsize=8, loc="center right")
    return fig
