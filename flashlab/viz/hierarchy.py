"""Memory hierarchies drawn from :mod:`flashlab.pipeline.profiles` profiles (no pasted images).

- :func:`draw_pyramid`: the levels of a GPU as a pyramid, fastest on top, in the manner of
  Fig. 1 (left) of the FlashAttention paper, with sizes and bandwidths read from the profile.
- :func:`draw_ai_core`: the data paths of one Ascend AI Core: GM/L2 -> (MTE2) L1 -> (MTE1)
  L0A/L0B -> Cube -> L0C -> (FixPipe) GM on the cube core, GM -> (MTE2) UB <-> Vector ->
  (MTE3) GM on the vector core.
"""
from __future__ import annotations

import math

from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from flashlab.pipeline.params import HardwareProfile, MemoryLevel, Param, params
from flashlab.viz.style import PALETTE, figure_for, markdown_table

__all__ = ["format_bytes", "format_rate", "format_param", "evidence_table", "draw_pyramid",
           "AI_CORE_LAYOUT", "draw_ai_core"]


def format_bytes(n: float) -> str:
    """``196608 -> '192 KiB'``, ``40e6 -> '40 MB'``, ``80e9 -> '80 GB'``: binary units when ``n``
    is a whole number of the largest one that fits, else decimal units when it is a whole number
    of those (vendors quote both), else three significant digits in binary units."""
    if n < 1000:
        return f"{n:.0f} B"
    binary = next((k, u) for k, u in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB"), (0, "B"))
                  if n >= 1024 ** k)
    decimal = next((k, u) for k, u in ((4, "TB"), (3, "GB"), (2, "MB"), (1, "kB"), (0, "B"))
                   if n >= 1000 ** k)
    for base, (k, unit) in ((1024, binary), (1000, decimal)):
        if n % base ** k == 0:
            return f"{n / base ** k:.0f} {unit}"
    k, unit = binary
    return f"{n / 1024 ** k:.3g} {unit}"


def format_rate(x: float, unit: str = "B/s") -> str:
    """``2.039e12 -> '2.04 TB/s'``: SI prefixes, three significant digits."""
    for k, prefix in ((5, "P"), (4, "T"), (3, "G"), (2, "M"), (1, "k")):
        if x >= 1000 ** k:
            return f"{x / 1000 ** k:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def format_param(p: Param) -> str:
    """A :class:`~flashlab.pipeline.params.Param`'s value in readable units."""
    if p.unit == "B":
        return format_bytes(p.value)
    if p.unit.endswith("/s"):
        return format_rate(p.value, p.unit)
    return f"{p.value:g} {p.unit}"


def evidence_table(profile: HardwareProfile, units: tuple[str, ...] = ("B", "B/s", "FLOP/s")) -> str:
    """A Markdown table of every parameter of ``profile`` whose unit is in ``units``: its path in
    the profile, value, status (published / derived / assumption) and source."""
    rows = [[path, format_param(p), p.status, p.source]
            for path, p in params(profile) if p.unit in units]
    return markdown_table(["parameter", "value", "status", "source"], rows)


def _mark(p: Param) -> str:
    """A suffix that flags numbers that are not published figures."""
    return "" if p.status == "published" else f" ({p.status})"


def _size_text(level: MemoryLevel) -> str:
    n = int(level.count.value)
    each = format_bytes(level.capacity.value)
    return each if n == 1 else f"{n} x {each} = {format_bytes(level.total_bytes)}"


def draw_pyramid(profile: HardwareProfile, levels: list[str] | None = None, *, ax=None):
    """Draw ``profile``'s memory levels as a pyramid (fastest and smallest on top).

    levels: names of the levels to draw, top to bottom (default: all, in profile order).
    Each row reads ``name`` inside the bar and ``size, bandwidth`` beside it. Returns the figure.
    """
    if not isinstance(profile, HardwareProfile):
        raise TypeError(f"profile must be a HardwareProfile; got {type(profile).__name__}")
    chosen = [profile.memory(n) for n in levels] if levels else list(profile.memories)
    fig, ax = figure_for(ax, 7.5, 0.75 * len(chosen) + 0.9)
    n = len(chosen)
    for row, level in enumerate(chosen):
        y = n - 1 - row
        # width grows down the pyramid: bigger and slower memories below
        w = 2.0 + 2.2 * row / max(n - 1, 1)
        ax.add_patch(Rectangle((2.2 - w / 2, y + 0.08), w, 0.84, color=PALETTE["memory"],
                               alpha=0.25 + 0.6 * (n - 1 - row) / max(n - 1, 1), lw=0))
        ax.text(2.2, y + 0.5, level.name, ha="center", va="center", fontsize=9)
        bw = ("bandwidth not modelled" if level.bandwidth is None
              else f"{format_rate(level.bandwidth.value)}{_mark(level.bandwidth)}")
        ax.text(4.5, y + 0.5, f"{_size_text(level)};  {bw}", va="center", fontsize=9)
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.1, n + 0.1)
    ax.axis("off")
    ax.set_title(f"{profile.name}: memory hierarchy (from flashlab.pipeline.profiles)", fontsize=10)
    return fig


#: box centres and sizes (x, y, w, h) of the Ascend AI Core drawing, in axis units (10 x 8)
AI_CORE_LAYOUT: dict[str, tuple[float, float, float, float]] = {
    "GM": (5.0, 7.45, 9.6, 0.7),
    "L2": (5.0, 6.55, 9.6, 0.6),
    "L1": (2.4, 4.5, 2.2, 0.7),
    "L0A": (1.3, 3.1, 1.5, 0.7),
    "L0B": (3.4, 3.1, 1.5, 0.7),
    "Cube": (2.4, 1.6, 1.6, 0.7),
    "L0C": (4.6, 1.6, 1.3, 0.7),
    "UB": (7.8, 3.6, 2.4, 0.8),
    "Vector": (7.8, 1.6, 1.8, 0.7),
}
# traffic to and from GM passes through L2: arrows attach to the L2 box
_ANCHOR = {"GM": "L2"}


def _edge(box, toward):
    """Point on the border of ``box`` (x, y, w, h) in the direction of point ``toward``."""
    x, y, w, h = box
    dx, dy = toward[0] - x, toward[1] - y
    if abs(dy) * w >= abs(dx) * h:  # leaves through top/bottom
        return x + (dx * (h / 2) / abs(dy) if dy else 0), y + math.copysign(h / 2, dy)
    return x + math.copysign(w / 2, dx), y + dy * (w / 2) / abs(dx)


def draw_ai_core(profile: HardwareProfile, *, ax=None,
                 layout: dict[str, tuple[float, float, float, float]] | None = None):
    """Draw the data paths of an Ascend AI Core profile: one box per memory level and compute
    unit, one arrow per :class:`~flashlab.pipeline.params.DataPath` labelled with its engine
    (MTE2, MTE1, FixPipe, MTE3). Sizes come from the profile. Returns the figure."""
    if not isinstance(profile, HardwareProfile):
        raise TypeError(f"profile must be a HardwareProfile; got {type(profile).__name__}")
    layout = dict(AI_CORE_LAYOUT if layout is None else layout)
    names = {m.name for m in profile.memories} | {c.name for c in profile.compute}
    missing = {p for path in profile.paths for p in (path.src, path.dst)} - set(layout)
    if missing:
        raise ValueError(f"layout has no position for {sorted(missing)} of {profile.name}")
    fig, ax = figure_for(ax, 8, 6.4)

    # the two kinds of core, as dashed frames
    n_aiv = next((int(m.count.value) for m in profile.memories if m.name == "UB"), 1)
    for (x0, x1), label in (((0.2, 5.6), "AIC: cube core (MTE2, MTE1, Cube, FixPipe)"),
                            ((6.1, 9.8), f"AIV: vector core (MTE2, Vector, MTE3) x {n_aiv}")):
        ax.add_patch(Rectangle((x0, 0.75), x1 - x0, 4.9, fill=False, ls="--", lw=1,
                               ec=PALETTE["grid"]))
        ax.text(x0 + 0.1, 0.95, label, fontsize=8, va="center", color=PALETTE["text"])

    compute = {c.name for c in profile.compute}
    for name, (x, y, w, h) in layout.items():
        if name not in names:
            continue
        if name in compute:
            text, color = name, PALETTE["compute"]
        else:
            level = profile.memory(name)
            wide = w > 5  # the GM and L2 bands: one line, with the bandwidth if known
            text = f"{name}  {_size_text(level)}" if wide else f"{name}\n{_size_text(level)}"
            if level.bandwidth is not None and wide:
                text += f";  {format_rate(level.bandwidth.value)}{_mark(level.bandwidth)}"
            color = PALETTE["memory"]
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02",
                                    fc=color, alpha=0.25, ec=color, lw=1.5))
        ax.text(x, y, text, ha="center", va="center", fontsize=8)

    pairs = {(p.src, p.dst) for p in profile.paths}
    for path in profile.paths:
        a = layout[_ANCHOR.get(path.src, path.src)]
        b = layout[_ANCHOR.get(path.dst, path.dst)]
        # GM -> UB and UB -> GM are drawn side by side: the one leaving GM on the left
        dx = 0.0
        if (path.dst, path.src) in pairs and "GM" in (path.src, path.dst):
            dx = -0.45 if path.src == "GM" else 0.45
        if path.dst == "GM":  # straight up from the top of the source to the L2 band
            start = (a[0] + dx, a[1] + a[3] / 2)
            end = (start[0], b[1] - b[3] / 2)
        elif path.src == "GM":  # straight down from the L2 band to the top of the target
            end = (b[0] + dx, b[1] + b[3] / 2)
            start = (end[0], a[1] - a[3] / 2)
        else:
            start, end = _edge(a, b[:2]), _edge(b, a[:2])
        # a unit reading/writing its own buffer is drawn unlabelled; movement engines are named
        two_way = "reads/writes" in path.engine
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if two_way else "-|>",
                                     mutation_scale=12, lw=1.4, color=PALETTE["mte"]))
        if "reads" not in path.engine and "writes" not in path.engine:
            ax.text((start[0] + end[0]) / 2 + 0.08, (start[1] + end[1]) / 2, path.engine,
                    fontsize=8, color=PALETTE["text"], fontweight="bold", va="center")
    ax.set_xlim(0, 10)
    ax.set_ylim(0.65, 7.9)
    ax.axis("off")
    ax.set_title(f"{profile.name}: data paths (engines in bold), from flashlab.pipeline.profiles",
                 fontsize=10)
    return fig
