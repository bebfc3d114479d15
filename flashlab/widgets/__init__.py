"""Interactive explorers for a live Jupyter kernel, each with static fallbacks for the HTML book.

- :mod:`flashlab.widgets.tiles` -- the tile explorer: step through the forward kernel tile by
  tile (:class:`~flashlab.widgets.tiles.TileExplorer`,
  :func:`~flashlab.widgets.tiles.tile_walk_animation`).
- :mod:`flashlab.widgets.pipeline` -- the pipeline explorer: the tile loop of one Ascend AI
  Core as a Gantt chart (:class:`~flashlab.widgets.pipeline.PipelineExplorer`,
  :func:`~flashlab.widgets.pipeline.pipeline_grid`,
  :func:`~flashlab.widgets.pipeline.pipeline_animation`).

``ipywidgets`` is imported inside the explorer classes only, so importing this package (and the
static fallbacks) never needs it.
"""
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
           "chart_output", "pipeline_animation", "pipeline_explorer_change", "pipeline_grid"]
