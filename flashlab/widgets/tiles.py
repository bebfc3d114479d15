"""The tile explorer: the forward kernel tile by tile, live and static.

- :class:`TileExplorer`: choose the tile sizes ``Br x Bc``, the lengths ``Sq, Sk`` and a mask;
  step (or play) through the forward kernel tile by tile (:func:`flashlab.walk.walk_forward`),
  drawn by a :class:`flashlab.viz.tiles.WalkView` that is built once per walk and only moves
  its artists from step to step.
- :func:`tile_walk_animation`: the same walk as a matplotlib ``FuncAnimation``; its
  ``to_jshtml()`` plays and scrubs in the static book, where no kernel runs.

``ipywidgets`` is imported inside :class:`TileExplorer` only, so ``import flashlab`` (and the
animation) never needs it.
"""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np

import flashlab
from flashlab.tiling import cdiv
from flashlab.walk import Walk, walk_forward

if TYPE_CHECKING:   # matplotlib is imported when a figure is drawn
    from matplotlib.figure import Figure

    from flashlab.viz.tiles import WalkView

__all__ = ["MASK_KINDS", "PLAY_INTERVAL_MS", "PATCH", "demo_problem", "walk_demo", "frame_indices",
           "tile_walk_animation", "TileExplorer"]

#: the mask kinds the explorer offers
MASK_KINDS = ("none", "causal", "sliding window", "random dense mask")
#: milliseconds between two steps when the explorer plays
PLAY_INTERVAL_MS = 700
#: side of the square patches that the random dense mask removes whole (so some tiles empty)
PATCH = 8


def demo_problem(sq: int = 32, sk: int = 32, *, mask_kind: str = "causal", window: int = 8,
                 d: int = 16, dv: int = 16, seed: int = 0) -> tuple[dict, dict]:
    """Seeded single-head inputs and the mask options for one of :data:`MASK_KINDS`.

    Returns ``(inputs, options)``: inputs ``{"q": (1, 1, sq, d), "k": (1, 1, sk, d),
    "v": (1, 1, sk, dv)}`` float32; options for :func:`flashlab.flash_attention`:
    ``{}``, ``{"causal": True}``, ``{"window": (window, 0)}`` (each row sees itself and the
    ``window`` keys before it) or ``{"mask": (sq, sk) bool}``: a random mask with about 30% of
    the entries masked out plus random ``PATCH x PATCH`` patches masked whole.
    """
    if mask_kind not in MASK_KINDS:
        raise ValueError(f"mask_kind must be one of {MASK_KINDS}; got {mask_kind!r}")
    rng = np.random.default_rng(seed)
    inputs = {"q": rng.standard_normal((1, 1, sq, d)).astype(np.float32),
              "k": rng.standard_normal((1, 1, sk, d)).astype(np.float32),
              "v": rng.standard_normal((1, 1, sk, dv)).astype(np.float32)}
    if mask_kind == "none":
        return inputs, {}
    if mask_kind == "causal":
        return inputs, {"causal": True}
    if mask_kind == "sliding window":
        return inputs, {"window": (window, 0)}
    mask = rng.random((sq, sk)) < 0.3
    patches = rng.random((cdiv(sq, PATCH), cdiv(sk, PATCH))) < 0.35
    mask |= np.kron(patches, np.ones((PATCH, PATCH), dtype=bool))[:sq, :sk]
    return inputs, {"mask": mask}


def walk_demo(sq: int = 32, sk: int = 32, block_q: int = 8, block_k: int = 8, **problem):
    """Walk :func:`demo_problem` with tiles ``block_q x block_k``.

    Returns ``(walk, o_ref)``: the :class:`~flashlab.walk.Walk` and the float64 reference
    output (sq, dv) to compare its partial outputs with.
    """
    inputs, options = demo_problem(sq, sk, **problem)
    walk = walk_forward(**inputs, **options, block_q=block_q, block_k=block_k)
    o_ref, _ = flashlab.attention_reference(**inputs, **options)
    return walk, o_ref[0, 0]


def frame_indices(walk: Walk, include_skipped: bool = False) -> list[int]:
    """Indices into ``walk.steps`` to show: every tile, or only the tiles the kernel computed."""
    return [i for i, st in enumerate(walk.steps) if include_skipped or not st.skipped]


def tile_walk_animation(sq: int = 32, sk: int = 32, block_q: int = 8, block_k: int = 8, *,
                        include_skipped: bool = False, w: float = 8.0, h: float = 4.4,
                        dpi: int = 80, interval: int = 800, **problem):
    """A ``FuncAnimation`` of the tile walk of :func:`demo_problem` (one frame per shown step).

    ``problem``: ``mask_kind``, ``window``, ``d``, ``dv``, ``seed`` as in :func:`demo_problem`.
    Frames: the computed tiles (all tiles with ``include_skipped``). Keep it small: every frame
    is stored as a PNG in the HTML (``to_jshtml``). The figure is a plain
    :class:`matplotlib.figure.Figure`, not registered with pyplot, so a notebook shows only the
    animation, never a stray copy of its last frame.
    """
    from matplotlib.animation import FuncAnimation
    from matplotlib.figure import Figure

    from flashlab.viz.tiles import WalkView

    walk, o_ref = walk_demo(sq, sk, block_q, block_k, **problem)
    shown = frame_indices(walk, include_skipped)
    view = WalkView(walk, o_ref, fig=Figure(figsize=(w, h), dpi=dpi))

    def draw(n: int):
        view.update(shown[n])
        return []

    return FuncAnimation(view.fig, draw, frames=len(shown), interval=interval, blit=False,
                         repeat=False)


class TileExplorer:
    """Step through the forward kernel tile by tile (live kernel; needs ipywidgets).

    Controls: ``Br`` (block_q), ``Bc`` (block_k), ``Sq``, ``Sk``, the mask kind (and the
    window for the sliding window), and a step slider with Play, Prev and Next. Every tile of
    the grid is one step, the skipped ones included (they are drawn with a dashed outline and
    no K/V block on chip), so the step count is ``ceil(Sq/Br) * ceil(Sk/Bc)``.

    Display it as the last expression of a cell; ``.widget`` is the ipywidgets box.
    """

    def __init__(self, sq: int = 32, sk: int = 32, block_q: int = 8, block_k: int = 8,
                 mask_kind: str = "causal", window: int = 8, *, seed: int = 0,
                 draw: bool = True, dpi: int = 80) -> None:
        import ipywidgets as W

        self.seed, self.dpi, self.draw_enabled = seed, dpi, draw
        slider = dict(continuous_update=False, style={"description_width": "3em"},
                      layout=W.Layout(width="14em"))
        self.block_q = W.IntSlider(block_q, min=1, max=32, description="Br", **slider)
        self.block_k = W.IntSlider(block_k, min=1, max=32, description="Bc", **slider)
        self.sq = W.IntSlider(sq, min=1, max=96, description="Sq", **slider)
        self.sk = W.IntSlider(sk, min=1, max=96, description="Sk", **slider)
        self.mask_kind = W.Dropdown(options=MASK_KINDS, value=mask_kind, description="mask",
                                    style={"description_width": "3em"},
                                    layout=W.Layout(width="14em"))
        # "window" needs more than the 3em of the short labels, or the HTML shows "win..."
        self.window = W.IntSlider(window, min=0, max=64, description="window",
                                  **{**slider, "style": {"description_width": "initial"}})
        self.step = W.IntSlider(0, min=0, max=0, description="step", continuous_update=True,
                                layout=W.Layout(width="28em"))
        self.play = W.Play(0, min=0, max=0, interval=PLAY_INTERVAL_MS, description="play")
        W.jslink((self.play, "value"), (self.step, "value"))
        self.prev = W.Button(description="◀ prev", layout=W.Layout(width="6em"))
        self.next = W.Button(description="next ▶", layout=W.Layout(width="6em"))
        self.info = W.HTML()
        self.out = W.Output()
        self.prev.on_click(lambda _: self._move(-1))
        self.next.on_click(lambda _: self._move(+1))
        for control in (self.block_q, self.block_k, self.sq, self.sk, self.mask_kind,
                        self.window):
            control.observe(lambda _: self.rebuild(), names="value")
        self._quiet = False  # True while rebuild() resets the step controls
        self.step.observe(lambda _: None if self._quiet else self.redraw(), names="value")
        self.widget = W.VBox([
            W.HBox([self.block_q, self.block_k, self.sq]),
            W.HBox([self.sk, self.mask_kind, self.window]),
            W.HBox([self.play, self.prev, self.next, self.step]),
            self.info, self.out])
        self.walk: Walk | None = None
        self.o_ref: np.ndarray | None = None
        self.view: WalkView | None = None   # the current walk's: built once per rebuild()
        self.figure: Figure | None = None
        self.rebuild()

    @property
    def n_steps(self) -> int:
        """Number of steps of the current walk (one per tile, skipped tiles included)."""
        assert self.walk is not None, "rebuild() makes the walk"
        return len(self.walk.steps)

    def rebuild(self) -> None:
        """Re-run the walk for the current controls and go back to step 0."""
        self.walk, self.o_ref = walk_demo(self.sq.value, self.sk.value, self.block_q.value,
                                          self.block_k.value, mask_kind=self.mask_kind.value,
                                          window=self.window.value, seed=self.seed)
        self.view = None
        n = self.n_steps
        computed = len(self.walk.computed)
        self.info.value = (f"{n} tiles: {computed} computed, {n - computed} skipped "
                           f"(never loaded or multiplied)")
        # value first (0 is valid for any max), then max; draw once at the end
        self._quiet = True
        self.step.value = self.play.value = 0
        self.step.max = self.play.max = n - 1
        self._quiet = False
        self.redraw()

    def _move(self, delta: int) -> None:
        self.step.value = int(np.clip(self.step.value + delta, 0, self.step.max))

    def redraw(self) -> None:
        """Draw the current step and put it, as a PNG, in the ``Output`` widget.

        The figure is built once per walk (a :class:`~flashlab.viz.tiles.WalkView`, on the
        first redraw after :meth:`rebuild`); a step only updates its artists and encodes the
        PNG. The PNG is set on the widget's ``outputs`` directly rather than captured with
        ``with self.out: display(...)``: that works under any matplotlib backend and in
        kernels driven by a client that does not route captured output (nbval, scripts).
        """
        if not self.draw_enabled or self.walk is None or self.o_ref is None:
            return
        from flashlab.viz.tiles import WalkView

        index = min(self.step.value, self.n_steps - 1)
        if self.view is None:
            self.view = WalkView(self.walk, self.o_ref, dpi=self.dpi)
        self.view.update(index)
        self.figure = self.view.fig
        png = self.view.png()
        self.out.outputs = ({"output_type": "display_data", "metadata": {},
                             "data": {"image/png": base64.b64encode(png).decode("ascii"),
                                      "text/plain": f"<tile {index + 1} of {self.n_steps}>"}},)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
