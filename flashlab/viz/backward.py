r"""The steps of one tile of the forward and of the backward pass, side by side.

:data:`FORWARD_STEPS` and :data:`BACKWARD_STEPS` list, in the kernels' order, what
:func:`flashlab.kernels.forward.flash_forward_kernel` and
:func:`flashlab.kernels.backward.flash_backward_kernel` do for one (query block $i$, key block
$j$) tile, plus the work done once per query block before or after the loop over $j$. Each
matrix product names the head dim it contracts or produces besides the tile's $B_r \times B_c$
(``"qk"`` for $d_{qk}$, ``"v"`` for $d_v$), so its cost is $2 B_r B_c d$ FLOPs: the forward
has two products, the backward five (without the rope operands).

:func:`draw_tile_steps` draws the two lists as columns of boxes: matrix products in the
"compute" colour, element-wise work in the "vector" colour, per-q-block work dashed.
"""
from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from flashlab.arguments import as_int
from flashlab.viz.style import PALETTE, new_figure

__all__ = ["MATMUL", "VECTOR", "AlgorithmStep", "FORWARD_STEPS", "BACKWARD_STEPS",
           "matmul_flops_per_tile", "draw_tile_steps"]

#: the two kinds of step (a matrix product on the tile, or element-wise vector work)
MATMUL, VECTOR = "matmul", "vector"


@dataclass(frozen=True)
class AlgorithmStep:
    """One step of a kernel's tile loop.

    ``formula`` is matplotlib mathtext; ``kind`` is :data:`MATMUL` or :data:`VECTOR`;
    ``dim`` (products only) is the head dim of the product besides ``B_r x B_c``: ``"qk"`` or
    ``"v"``; ``per_tile`` is False for work done once per query block (before or after the
    loop over key blocks).
    """

    formula: str
    kind: str
    dim: str | None = None
    per_tile: bool = True


#: the forward's steps for one tile, in the kernel's order
FORWARD_STEPS: tuple[AlgorithmStep, ...] = (
    AlgorithmStep(r"$S = (\mathrm{scale}\,Q_i)\,K_j^\top$", MATMUL, "qk"),
    AlgorithmStep(r"$m' = \max(m, \mathrm{rowmax}\,S),\ \tilde P = e^{S - m'},\ \ell' = \dots$", VECTOR),
    AlgorithmStep(r"$\tilde O \leftarrow e^{m - m'}\tilde O + \tilde P\,V_j$", MATMUL, "v"),
    AlgorithmStep(r"$O_i = \tilde O / \ell,\ \ \mathrm{LSE}_i = m + \log \ell$", VECTOR, per_tile=False),
)

#: the backward's steps for one tile, in the kernel's order (5 matrix products)
BACKWARD_STEPS: tuple[AlgorithmStep, ...] = (
    AlgorithmStep(r"$D_i = \mathrm{rowsum}(dO_i \circ O_i)$", VECTOR, per_tile=False),
    AlgorithmStep(r"$S = (\mathrm{scale}\,Q_i)\,K_j^\top$", MATMUL, "qk"),
    AlgorithmStep(r"$P = e^{S - \mathrm{LSE}_i}$", VECTOR),
    AlgorithmStep(r"$dV_j \leftarrow dV_j + P^\top dO_i$", MATMUL, "v"),
    AlgorithmStep(r"$dP = dO_i\,V_j^\top$", MATMUL, "v"),
    AlgorithmStep(r"$dS = P \circ (dP - D_i)$", VECTOR),
    AlgorithmStep(r"$dQ_i \leftarrow dQ_i + dS\,K_j$", MATMUL, "qk"),
    AlgorithmStep(r"$dK_j \leftarrow dK_j + dS^\top (\mathrm{scale}\,Q_i)$", MATMUL, "qk"),
    AlgorithmStep(r"$dQ_i \leftarrow \mathrm{scale}\cdot dQ_i$", VECTOR, per_tile=False),
)


def matmul_flops_per_tile(steps: tuple[AlgorithmStep, ...], block_q: int, block_k: int,
                          d_qk: int, d_v: int) -> int:
    """FLOPs of the matrix products of one full ``block_q x block_k`` tile: ``2 B_r B_c d`` each.

    >>> matmul_flops_per_tile(BACKWARD_STEPS, 64, 64, 128, 128) / matmul_flops_per_tile(
    ...     FORWARD_STEPS, 64, 64, 128, 128)
    2.5
    """
    for name, x in (("block_q", block_q), ("block_k", block_k), ("d_qk", d_qk), ("d_v", d_v)):
        as_int(name, x, lo=1)
    dims: dict[str | None, int] = {"qk": d_qk, "v": d_v}
    return sum(2 * block_q * block_k * dims[s.dim] for s in steps if s.kind == MATMUL)


def _draw_column(ax, steps: tuple[AlgorithmStep, ...], x: float, title: str, width: float) -> None:
    """Boxes for ``steps`` top to bottom at centre ``x``, joined by arrows; products numbered."""
    ax.text(x, 0.6, title, ha="center", va="bottom", fontsize=11, fontweight="bold")
    n_product = 0
    for row, step in enumerate(steps):
        y = -row
        colour = PALETTE["compute"] if step.kind == MATMUL else PALETTE["vector"]
        ax.add_patch(FancyBboxPatch((x - width / 2, y - 0.32), width, 0.64,
                                    boxstyle="round,pad=0.02,rounding_size=0.12",
                                    facecolor=colour, alpha=0.22, edgecolor=colour, lw=1.5,
                                    ls="-" if step.per_tile else "--"))
        ax.text(x, y, step.formula, ha="center", va="center", fontsize=10)
        if not step.per_tile:
            when = "before the key loop" if row == 0 else "after the key loop"
            ax.text(x + width / 2 - 0.08, y - 0.2, when, ha="right", va="center", fontsize=7,
                    style="italic", color=PALETTE["text"])
        if step.kind == MATMUL:
            n_product += 1
            ax.text(x - width / 2 - 0.08, y, f"#{n_product}", ha="right", va="center",
                    fontsize=10, color=PALETTE["compute"], fontweight="bold")
        if row:
            ax.add_patch(FancyArrowPatch((x, y + 0.68), (x, y + 0.32), arrowstyle="-|>",
                                         mutation_scale=10, color=PALETTE["text"], lw=0.8))


def draw_tile_steps(forward: tuple[AlgorithmStep, ...] = FORWARD_STEPS,
                    backward: tuple[AlgorithmStep, ...] = BACKWARD_STEPS, *, dpi: int = 80):
    """Draw the forward's and the backward's steps as two columns; returns the figure.

    Solid boxes run once per tile, dashed ones once per query block; matrix products (blue,
    numbered) carry the FLOPs, element-wise steps (green) the exponentials.
    """
    rows = max(len(forward), len(backward))
    width = 5.2
    fig, ax = new_figure(11.5, 0.55 * rows + 1.3, dpi=dpi)
    _draw_column(ax, forward, 0.0, f"forward: {sum(s.kind == MATMUL for s in forward)} products per tile",
                 width)
    _draw_column(ax, backward, width + 1.0,
                 f"backward: {sum(s.kind == MATMUL for s in backward)} products per tile", width)
    ax.set_xlim(-width / 2 - 0.6, 1.5 * width + 1.2)
    ax.set_ylim(-rows + 0.4, 1.2)
    ax.axis("off")
    ax.legend(handles=[Patch(facecolor=PALETTE["compute"], alpha=0.4, label="matrix product (FLOPs)"),
                       Patch(facecolor=PALETTE["vector"], alpha=0.4, label="element-wise"),
                       Patch(facecolor="white", edgecolor="black", ls="--",
                             label="once per query block")],
              loc="lower left", fontsize=8, frameon=False)
    return fig
