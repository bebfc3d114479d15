r"""Drawings for the RoPE-split chapter: which features RoPE pairs, and three ways to get a score tile.

:func:`draw_rope_pairs` draws the feature pairs that RoPE rotates together in its two memory
layouts, from :func:`flashlab.rope.pair_indices` (so the picture is the code's pairing):
*rotate-half* pairs $(x_i, x_{i + D/2})$, *interleaved* pairs $(x_{2i}, x_{2i+1})$; pair $i$
turns by $m\,\theta_i$ in both.

:func:`draw_score_options` draws, to scale, what one score tile of MLA costs in buffers when
$S = Q^C {K^C}^\top + Q^R {K^R}^\top$ is computed

- ``"concat"``: from $Q = [Q^C, Q^R]$ and $K = [K^C, K^R_h]$, copies made *before* the kernel
  (whole tensors in main memory, with $K^R$ first copied to every head);
- ``"two buffers"``: as two products into two score tiles $S^C$, $S^R$, added afterwards (the
  naive split the Ascend RECT-FA article warns about);
- ``"in place"``: as two products into **one** tile, the second a gemm with $\beta = 1$
  ($S \leftarrow Q^R {K^R}^\top + 1 \cdot S$), which is what
  :func:`flashlab.kernels.tile.score_tile` does.

:func:`tile_buffers` lists those buffers (name, shape, kind) as data; the drawing and the
chapter's tables both read it. Kinds: ``"operand"`` (a tile of an input the kernel loads
anyway), ``"copy"`` (a concatenated or per-head copy: it exists only because of the concat),
``"score"`` (a score tile, ``block_q x block_k``).
"""
from __future__ import annotations

from matplotlib.patches import FancyArrowPatch, Rectangle

from flashlab.arguments import as_int
from flashlab.rope import pair_indices
from flashlab.viz.style import PALETTE, SERIES, new_figure

__all__ = ["TILE_OPTIONS", "BUFFER_KINDS", "tile_buffers", "draw_score_options", "draw_rope_pairs"]

#: the three ways to compute one score tile, in the order they are drawn
TILE_OPTIONS = ("concat", "two buffers", "in place")

#: the kinds of buffer in :func:`tile_buffers`
BUFFER_KINDS = ("operand", "copy", "score")


def _check_size(name: str, x) -> int:
    return as_int(name, x, lo=1)


def tile_buffers(option: str, *, block_q: int = 128, block_k: int = 128, d_nope: int = 128,
                 d_rope: int = 64) -> list[tuple[str, tuple[int, int], str]]:
    """The buffers one score tile of ``option`` uses: ``[(name, (rows, cols), kind), ...]``.

    Operand tiles are ``(block_q, d)`` for queries and ``(block_k, d)`` for keys; score tiles
    ``(block_q, block_k)``. Multiply ``rows * cols`` by the bytes per element for their size.

    >>> [(n, k) for n, _, k in tile_buffers("in place")]
    [('Q^C', 'operand'), ('Q^R', 'operand'), ('K^C', 'operand'), ('K^R', 'operand'), ('S', 'score')]
    """
    if option not in TILE_OPTIONS:
        raise ValueError(f"option must be one of {TILE_OPTIONS}; got {option!r}")
    bq, bk = _check_size("block_q", block_q), _check_size("block_k", block_k)
    dn, dr = _check_size("d_nope", d_nope), _check_size("d_rope", d_rope)
    if option == "concat":
        # Q = [Q^C, Q^R] and K = [K^C, K^R_h]: 192-wide copies, made before the kernel runs
        return [("Q = [Q^C, Q^R]", (bq, dn + dr), "copy"), ("K = [K^C, K^R_h]", (bk, dn + dr), "copy"),
                ("S", (bq, bk), "score")]
    operands = [("Q^C", (bq, dn), "operand"), ("Q^R", (bq, dr), "operand"),
                ("K^C", (bk, dn), "operand"), ("K^R", (bk, dr), "operand")]
    if option == "two buffers":
        # S^C = Q^C K^C^T and S^R = Q^R K^R^T live at the same time, then S^C += S^R
        return operands + [("S^C", (bq, bk), "score"), ("S^R", (bq, bk), "score")]
    # S = Q^C K^C^T, then S += Q^R K^R^T (gemm with beta = 1): one score tile
    return operands + [("S", (bq, bk), "score")]


def _tex(name: str) -> str:
    """A buffer name as mathtext: ``Q^C`` -> ``$Q^C$``, ``Q = [Q^C, Q^R]`` -> ``$Q = [Q^C, Q^R]$``."""
    return "$" + name + "$"


def draw_score_options(*, block_q: int = 128, block_k: int = 128, d_nope: int = 128,
                       d_rope: int = 64, elem: int = 4, dpi: int = 80):
    """Draw the buffers of one score tile for each of :data:`TILE_OPTIONS`; returns the figure.

    Rectangles are to scale (rows x columns of elements). Query operands are drawn as
    ``block_q x d`` blocks, key operands as ``block_k x d`` blocks, score tiles as
    ``block_q x block_k``. Copies that exist only because of the concat are hatched; the score
    tiles are orange. Each panel's footer gives the bytes of its score tiles and of its copies
    for ``elem`` bytes per element (4: float32, as the kernel's score tile).
    Patches carry ``gid`` = the buffer's kind, so tests can count them.
    """
    elem = _check_size("elem", elem)
    fig, axes = new_figure(12.0, 3.9, ncols=len(TILE_OPTIONS), dpi=dpi)
    colours = {"Q": PALETTE["q"], "K": PALETTE["k"], "S": PALETTE["s"]}
    for ax, option in zip(axes, TILE_OPTIONS):
        buffers = tile_buffers(option, block_q=block_q, block_k=block_k, d_nope=d_nope, d_rope=d_rope)
        gap = 0.12 * max(block_q, block_k)
        x, width_used, height_used = 0.0, 0.0, 0.0
        for name, (rows, cols), kind in buffers:
            if kind == "score":
                continue
            # a query or key operand block: rows tall, cols (its head dim) wide
            colour = PALETTE["rope"] if name in ("Q^R", "K^R") else colours[name[0]]
            ax.add_patch(Rectangle((x, 0), cols, -rows, facecolor=colour, alpha=0.45,
                                   edgecolor="black", lw=0.8, hatch="///" if kind == "copy" else None,
                                   gid=kind))
            ax.text(x + cols / 2, -rows / 2, _tex(name), ha="center", va="center",
                    fontsize=9 if kind == "copy" else 10)
            x += cols + gap / 3
            height_used = max(height_used, rows)
        width_used = x
        # the score tiles, under the operands
        y0 = -height_used - gap
        xs = 0.0
        scores = [(n, s) for n, s, k in buffers if k == "score"]
        for i, (name, (rows, cols)) in enumerate(scores):
            ax.add_patch(Rectangle((xs, y0), cols, -rows, facecolor=colours["S"], alpha=0.9,
                                   edgecolor="black", lw=0.8, gid="score"))
            ax.text(xs + cols / 2, y0 - rows / 2, _tex(name), ha="center", va="center", fontsize=11)
            if i:
                ax.text(xs - gap / 2, y0 - rows / 2, "+", ha="center", va="center", fontsize=14)
            xs += cols + gap
        if option == "in place":
            rows, cols = scores[0][1]
            ax.add_patch(FancyArrowPatch((cols + gap * 0.2, y0 - rows * 0.25),
                                         (cols + gap * 0.2, y0 - rows * 0.75),
                                         connectionstyle="arc3,rad=-0.9", arrowstyle="-|>",
                                         mutation_scale=12, color=PALETTE["text"], lw=1.0))
            # the second product accumulated into the same tile
            ax.text(cols + 0.3 * rows + gap, y0 - rows / 2,
                    "$S \\leftarrow Q^R {K^R}^\\top + 1 \\cdot S$\n(gemm with $\\beta = 1$)",
                    ha="left", va="center", fontsize=8)
        score_bytes = sum(r * c for _, (r, c), k in buffers if k == "score") * elem
        copy_bytes = sum(r * c for _, (r, c), k in buffers if k == "copy") * elem
        footer = f"score tiles: {len(scores)} x {block_q}x{block_k} = {score_bytes // 1024} KiB"
        if option == "two buffers":
            footer += "\nthen $S^C \\leftarrow S^C + S^R$: one more pass over the tile"
        if copy_bytes:
            footer += (f"\nhatched: copies made before the kernel,\n{copy_bytes // 1024} KiB per tile pair"
                       f" (whole tensors in main memory)")
        ax.set_title(option, fontsize=11, fontweight="bold")
        ax.text(0, y0 - max(r for _, (r, _c) in scores) - gap * 0.4, footer, ha="left", va="top",
                fontsize=8)
        ax.set_xlim(-gap / 2, max(width_used, xs + 1.6 * gap) + gap)
        ax.set_ylim(y0 - max(block_q, block_k) - 3.2 * gap, gap / 2)
        ax.set_aspect("equal")
        ax.axis("off")
    return fig


def draw_rope_pairs(dim: int = 8, *, dpi: int = 80):
    """Draw which features RoPE rotates together, rotate-half above, interleaved below.

    ``dim`` features per row (even, <= 32 to stay legible); pair ``i`` (one colour) is joined
    by an arc labelled with its frequency $\\theta_i$. Returns the figure; its arcs carry
    ``gid = "pair <i>"``.
    """
    dim = as_int("dim", dim, what="an even int in [2, 32]")
    if dim < 2 or dim % 2 or dim > 32:
        raise ValueError(f"dim must be an even int in [2, 32]; got {dim}")
    fig, ax = new_figure(0.55 * dim + 2.4, 3.2, dpi=dpi)
    rows = (("rotate-half", False, 1.6), ("interleaved", True, 0.0))
    for label, interleaved, y in rows:
        a, b = pair_indices(dim, interleaved)
        pair_of = {}
        for i, (ia, ib) in enumerate(zip(a, b)):
            pair_of[int(ia)], pair_of[int(ib)] = i, i
        for f in range(dim):
            colour = SERIES[pair_of[f] % len(SERIES)]
            ax.add_patch(Rectangle((f, y), 0.9, 0.5, facecolor=colour, alpha=0.5, edgecolor="black", lw=0.6))
            ax.text(f + 0.45, y + 0.25, f"$x_{{{f}}}$", ha="center", va="center", fontsize=9)
        # arcs of equal height h over each pair (arc3's peak is rad * length / 2 above the chord)
        h = 0.45 if interleaved else 0.9
        for i, (ia, ib) in enumerate(zip(a, b)):
            colour = SERIES[i % len(SERIES)]
            ax.add_patch(FancyArrowPatch((ia + 0.45, y + 0.52), (ib + 0.45, y + 0.52),
                                         connectionstyle=f"arc3,rad={-2 * h / (ib - ia)}", arrowstyle="-",
                                         color=colour, lw=1.4, gid=f"pair {i}"))
            ax.text((ia + ib) / 2 + 0.45, y + 0.55 + h, f"$\\theta_{{{i}}}$", ha="center", va="bottom",
                    fontsize=8, color=colour)
        ax.text(-0.3, y + 0.25, label, ha="right", va="center", fontsize=10, fontweight="bold")
    ax.set_xlim(-2.6, dim + 0.2)
    ax.set_ylim(-0.3, 3.5)
    ax.axis("off")
    ax.set_title(f"RoPE feature pairs, D = {dim}: pair $i$ turns by $m\\,\\theta_i$ in both layouts",
                 fontsize=10)
    return fig
