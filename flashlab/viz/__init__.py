"""Matplotlib drawings for the book.

- :mod:`flashlab.viz.style` — the shared colour-blind-safe palette and :func:`new_figure`.
- :mod:`flashlab.viz.roofline` — log-log rooflines with attention's operations placed on them.
"""
from flashlab.viz.style import PALETTE, SERIES, new_figure

__all__ = ["PALETTE", "SERIES", "new_figure"]
