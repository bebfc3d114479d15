"""The tile explorer: the forward kernel tile by tile, live and static.

- :class:`TileExplorer`: choose the tile sizes ``Br x Bc``, the lengths ``Sq, Sk`` and a mask;
  step (or play) through the forward kernel tile by tile (:func:`flashlab.walk.walk_forward`).
  One implementation for the live kernel and the static book
  (:class:`flashlab.widgets.explorer.Explorer`): the static page holds every state of its grid.
- :func:`tile_walk_animation`: the walk with its numbers (running maxima, sums, the error of
  the partial output) as a matplotlib ``FuncAnimation`` drawn by a
  :class:`flashlab.viz.tiles.WalkView`; its ``to_jshtml()`` plays and scrubs in the static book.

``ipywidgets`` is imported by the explorer's live view only, so ``import flashlab`` (and the
animation) never needs it.
"""
from __future__ import annotations

import numpy as np

import flashlab
from flashlab.arguments import as_int
from flashlab.masks import EMPTY, FULL, PARTIAL, allowed
from flashlab.tiling import cdiv
from flashlab.walk import Walk, walk_forward
from flashlab.widgets.explorer import Control, Explorer

__all__ = ["MASK_KINDS", "PLAY_INTERVAL_MS", "PATCH", "GRID_BLOCKS", "GRID_LENGTHS", "GRID_WINDOWS",
           "demo_problem", "walk_demo", "frame_indices", "tile_walk_animation", "TileExplorer"]

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


#: the tile sizes Br and Bc the static tile explorer offers (issue 33)
GRID_BLOCKS = (4, 8, 16)
#: the lengths Sq and Sk it offers
GRID_LENGTHS = (16, 36, 64)
#: the sliding windows it offers
GRID_WINDOWS = (4, 8, 16)


class TileExplorer(Explorer):
    """Step through the forward kernel tile by tile: one explorer, live and static.

    Controls: ``Br`` (block_q), ``Bc`` (block_k), ``Sq``, ``Sk``, the mask kind and the window
    of the sliding window; then a step slider with play, previous and next over every tile of
    the walk (:func:`flashlab.walk.walk_forward` on :func:`demo_problem`), the skipped ones
    included (dashed), so the step count is ``ceil(Sq/Br) * ceil(Sk/Bc)``. The picture is the
    score grid (masked entries grey), every tile in its class's colour, the tiles already
    walked filled, the current one outlined with its q-block rows and kv-block keys marked; the
    numbers under it count tiles and, for the current q-block, the allowed scores summed so far.

    The static page offers :data:`GRID_BLOCKS` x :data:`GRID_LENGTHS` x :data:`MASK_KINDS` x
    :data:`GRID_WINDOWS` and every step; a live kernel any ``Br, Bc`` in 1..32, ``Sq, Sk`` in
    1..96 and window in 0..64 (see :class:`~flashlab.widgets.explorer.Explorer`).
    """

    kind = "tiles"
    title = "Tile explorer: the forward kernel's walk, tile by tile"
    notebook = "tiling_online_softmax"
    interval = PLAY_INTERVAL_MS
    controls = (
        Control("block_q", "Br", GRID_BLOCKS, {"min": 1, "max": 32}),
        Control("block_k", "Bc", GRID_BLOCKS, {"min": 1, "max": 32}),
        Control("sq", "Sq", GRID_LENGTHS, {"min": 1, "max": 96}),
        Control("sk", "Sk", GRID_LENGTHS, {"min": 1, "max": 96}),
        Control("mask_kind", "mask", MASK_KINDS),
        Control("window", "window", GRID_WINDOWS, {"min": 0, "max": 64}),
    )
    defaults = {"block_q": 8, "block_k": 8, "sq": 36, "sk": 36, "mask_kind": "causal",
                "window": 8}

    def __init__(self, sq: int = 36, sk: int = 36, block_q: int = 8, block_k: int = 8,
                 mask_kind: str = "causal", window: int = 8) -> None:
        super().__init__(sq=sq, sk=sk, block_q=block_q, block_k=block_k, mask_kind=mask_kind,
                         window=window)

    def walk(self, values: dict | None = None) -> Walk:
        """The :class:`~flashlab.walk.Walk` the explorer shows for ``values`` (default: its own)."""
        v = {**self.values, **(values or {})}
        for name, hi in (("block_q", 32), ("block_k", 32), ("sq", 96), ("sk", 96)):
            as_int(name, v[name], lo=1, hi=hi, what=f"an int in [1, {hi}]")
        as_int("window", v["window"], lo=0, hi=64, what="an int in [0, 64]")
        inputs, options = demo_problem(v["sq"], v["sk"], mask_kind=v["mask_kind"],
                                       window=v["window"])
        return walk_forward(**inputs, **options, block_q=v["block_q"], block_k=v["block_k"])

    def relevant(self, values: dict) -> dict:
        """The window matters for the sliding window only."""
        return {k: v for k, v in values.items()
                if k != "window" or values["mask_kind"] == "sliding window"}

    def state(self, values: dict) -> dict:
        """The walk as tiles ``[i0, i1, j0, j1, class]`` (class 0 for a skipped tile), the mask
        of allowed entries (pooled), and one frame per step with its numbers."""
        walk = self.walk(values)
        ok = allowed(walk.sq, walk.sk, walk.left, walk.right)
        if walk.mask is not None:
            ok &= ~walk.mask
        rows = ["".join("1" if a else "0" for a in row) for row in ok]
        tiles, frames = [], []
        n = len(walk.steps)
        summed = [0] * walk.n_qb
        for k, st in enumerate(walk.steps):
            (i0, i1), (j0, j1) = st.rows, st.cols
            inside = int(ok[i0:i1, j0:j1].sum())
            # the class of classify_tiles: a computed tile is full when no entry is masked
            cls = EMPTY if st.skipped else FULL if inside == (i1 - i0) * (j1 - j0) else PARTIAL
            tiles.append([i0, i1, j0, j1, cls])
            where = (f"step {k + 1} of {n}: q-block {st.qb} (rows {i0}-{i1 - 1}) x kv-block "
                     f"{st.kb} (keys {j0}-{j1 - 1})")
            if st.skipped:
                what = f"skipped: {st.reason}"
            else:
                summed[st.qb] += inside
                kind = "full" if cls == FULL else "partial"
                what = (f"computed ({kind} tile): {inside} of {(i1 - i0) * (j1 - j0)} scores "
                        f"allowed, {(i1 - i0) * (j1 - j0) - inside} masked")
            total = int(ok[i0:i1].sum())
            final = "; its rows are final" if summed[st.qb] == total else ""
            frames.append({"text": [where, what, f"q-block {st.qb} so far: {summed[st.qb]} of "
                                                 f"its {total} allowed scores summed into m, l, "
                                                 f"O~{final}"]})
        computed = len(walk.computed)
        mask = values["mask_kind"] + (f" {values['window']}" if values["mask_kind"] ==
                                      "sliding window" else "")
        return {"sq": walk.sq, "sk": walk.sk, "mask": self.pooled(rows), "tiles": tiles,
                "off": [] if values["mask_kind"] == "sliding window" else ["window"],
                "text": [f"Sq = {walk.sq}, Sk = {walk.sk}, {walk.block_q} x {walk.block_k} tiles, "
                         f"{mask}: {n} tiles, {computed} computed, {n - computed} skipped "
                         f"(never loaded or multiplied)"],
                "frames": frames}
