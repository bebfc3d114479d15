"""Timings of the matplotlib views behind the tile and pipeline drawings: one step of the tile
walk's view (:func:`tile_explorer_step`) and one change of the Gantt view
(:func:`pipeline_explorer_timing`, :func:`flashlab.widgets.pipeline.pipeline_explorer_change`).
The explorers themselves draw precomputed states in the browser (their response is measured in
headless Chromium by ``tools/check_site.py``).
The widgets are imported when a timing runs, so importing the bench never loads them.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from flashlab.bench.targets import TARGETS

__all__ = ["tile_explorer_step", "pipeline_explorer_timing"]


@functools.cache
def tile_explorer_step(sq: int = 36, sk: int = 36, block: int = 8, mask_kind: str = "causal",
                       dpi: int = 80) -> dict:
    """Seconds per step of the tile walk's matplotlib view: the median over every step of one walk.

    A step is what a frame of the walk's animation costs
    (:func:`flashlab.widgets.tiles.tile_walk_animation`):
    :meth:`flashlab.viz.tiles.WalkView.update` and the PNG
    (:meth:`~flashlab.viz.tiles.WalkView.png`). The figure is built once before timing, as
    the animation builds it once per walk. Returns ``{"problem", "steps", "median_s",
    "max_s", "build_s", "play_interval_s", "target_s"}``.
    """
    from flashlab.viz.tiles import WalkView  # a plain Agg figure: no pyplot, no backend switch
    from flashlab.widgets import PLAY_INTERVAL_MS, walk_demo

    walk, o_ref = walk_demo(sq, sk, block, block, mask_kind=mask_kind)
    t0 = time.perf_counter()
    view = WalkView(walk, o_ref, dpi=dpi)
    view.update(0)
    view.png()
    build = time.perf_counter() - t0
    seconds = []
    for index in range(1, len(walk.steps)):
        t0 = time.perf_counter()
        view.update(index)
        view.png()
        seconds.append(time.perf_counter() - t0)
    return {"problem": f"Sq = Sk = {sq}, {block} x {block} tiles, {mask_kind}, {dpi} dpi",
            "steps": len(seconds), "median_s": float(np.median(seconds)),
            "max_s": float(np.max(seconds)), "build_s": build,
            "play_interval_s": PLAY_INTERVAL_MS / 1e3,
            "target_s": TARGETS["explorer_change_s"]}


def pipeline_explorer_timing() -> dict:
    """Seconds per change of the pipeline explorer:
    :func:`flashlab.widgets.pipeline.pipeline_explorer_change` at its defaults. Returns
    ``{"changes", "median_s", "max_s", "build_s", "figures_built", "target_s"}``."""
    from flashlab.widgets.pipeline import pipeline_explorer_change

    return pipeline_explorer_change()
