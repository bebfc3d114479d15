"""Interactive explorers, each one implementation for a live Jupyter kernel and the static HTML book.

- :mod:`flashlab.widgets.explorer` -- the mechanism: states computed in Python over a stated
  grid, drawn by one small JavaScript renderer (:class:`~flashlab.widgets.explorer.Explorer`).
- :mod:`flashlab.widgets.tiles` -- the tile explorer: step through the forward kernel tile by
  tile (:class:`~flashlab.widgets.tiles.TileExplorer`,
  :func:`~flashlab.widgets.tiles.tile_walk_animation`).
- :mod:`flashlab.widgets.pipeline` -- the pipeline explorer: the tile loop of one Ascend AI
  Core as a Gantt chart (:class:`~flashlab.widgets.pipeline.PipelineExplorer`,
  :func:`~flashlab.widgets.pipeline.pipeline_grid`,
  :func:`~flashlab.widgets.pipeline.pipeline_animation`).
- :mod:`flashlab.widgets.sparse` -- the CANN ``sparse_mode`` explorer
  (:class:`~flashlab.widgets.sparse.SparseModeExplorer`).
- :mod:`flashlab.widgets.roofline` -- the roofline and hit-rate explorer
  (:class:`~flashlab.widgets.roofline.RooflineExplorer`).

``ipywidgets`` is imported by the explorers' live view only, so importing this package (and the
static pages) never needs it.
"""
from flashlab.widgets.explorer import EXPLORERS, Explorer
from flashlab.widgets.pipeline import (
    BLOCK_K_OPTIONS,
    BLOCK_Q_OPTIONS,
    CHANGE_TARGET_S,
    CHANGES,
    PipelineExplorer,
    chart_output,
    pipeline_animation,
    pipeline_explorer_change,
    pipeline_grid,
)
from flashlab.widgets.roofline import RooflineExplorer
from flashlab.widgets.sparse import SparseModeExplorer
from flashlab.widgets.tiles import (
    MASK_KINDS,
    PATCH,
    PLAY_INTERVAL_MS,
    TileExplorer,
    demo_problem,
    frame_indices,
    tile_walk_animation,
    walk_demo,
)

__all__ = ["MASK_KINDS", "PATCH", "PLAY_INTERVAL_MS", "TileExplorer", "demo_problem",
           "frame_indices", "tile_walk_animation", "walk_demo",
           "BLOCK_K_OPTIONS", "BLOCK_Q_OPTIONS", "CHANGE_TARGET_S", "CHANGES", "PipelineExplorer",
           "chart_output", "pipeline_animation", "pipeline_explorer_change", "pipeline_grid",
           "EXPLORERS", "Explorer", "RooflineExplorer", "SparseModeExplorer"]
