"""Matplotlib drawings for the book.

- :mod:`flashlab.viz.style` — the shared colour-blind-safe palette and :func:`new_figure`.
- :mod:`flashlab.viz.roofline` — log-log rooflines with attention's operations placed on them.
- :mod:`flashlab.viz.hierarchy` — memory hierarchies drawn from the hardware profiles: a GPU
  pyramid and the data paths of an Ascend AI Core.
- :mod:`flashlab.viz.tiles` — block maps of empty/partial/full tiles and frames of the tile walk.
- :mod:`flashlab.viz.backward` — the forward and backward steps of one tile, as data and a diagram.
- :mod:`flashlab.viz.masks` — the mask gallery and varlen (TND) launch maps.
- :mod:`flashlab.viz.mla` — one MLA head's Q/K/V/O, padded and native, and ledger tables.
- :mod:`flashlab.viz.rope` — RoPE feature pairs and the three ways to compute an MLA score tile.
- :mod:`flashlab.viz.sparse_modes` — the CANN ``sparse_mode`` masks, drawn from the operator's code.
- :mod:`flashlab.viz.gantt` — Gantt charts of the AI Core pipeline model, with buffer lanes.
- :mod:`flashlab.viz.performance` — the machine's roofline and benchmark results against N.
- :mod:`flashlab.viz.code` — :func:`~flashlab.viz.code.show_source`, the package's code shown in a chapter.
"""
from flashlab.viz.style import PALETTE, SERIES, animation_html, markdown_table, new_figure

__all__ = ["PALETTE", "SERIES", "animation_html", "markdown_table", "new_figure"]
