r"""Drawings and tables for the MLA chapter: one head's operands, and the dataflows' ledgers.

- :func:`head_dims_figure`: the head dims of one MLA head as bars, in two dataflows of
  :mod:`flashlab.mla`: ``"baseline"`` (V padded with zeros from $D_v$ to $D = D_n + D_r$ so that
  every head dim is equal, the attention's output sliced back) and ``"native_v"`` (V and O at
  their own $D_v$). The padded columns are hatched: they are stored, moved and multiplied, and
  they are zeros.
- :func:`ledger_markdown`: the per-step ledger of :func:`flashlab.mla.mla_forward` /
  :func:`flashlab.mla.mla_backward` (a list of :class:`flashlab.mla.Step`) as a MyST table,
  with a total row; the same numbers as :func:`flashlab.mla.format_ledger`.

Colours: :data:`flashlab.viz.style.PALETTE` (``q``, ``k``, ``v``, ``o`` for the operands,
``rope`` for the RoPE parts).
"""
from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from flashlab.arguments import as_int
from flashlab.dataflows import Step, total
from flashlab.viz.style import PALETTE, markdown_table, new_figure

__all__ = ["PANELS", "head_dims_figure", "ledger_markdown"]

#: the two dataflows the figure draws, with their panel titles
PANELS = {
    "baseline": "padded: every head dim equal (as FlashAttention-2 requires)",
    "native_v": "native $D_v$: the kernel takes V and returns O at their own head dim",
}

_PAD: dict[str, Any] = dict(facecolor="white", edgecolor=PALETTE["text"], hatch="///", linewidth=0.8)


def _check_dims(d_nope, d_rope, d_v) -> tuple[int, int, int]:
    d_nope, d_rope, d_v = (as_int(name, x, lo=1) for name, x in
                           (("d_nope", d_nope), ("d_rope", d_rope), ("d_v", d_v)))
    if d_v > d_nope + d_rope:
        raise ValueError(f"the padded dataflow pads V up to d_nope + d_rope = {d_nope + d_rope}, "
                         f"so d_v must not exceed it; got d_v={d_v}")
    return int(d_nope), int(d_rope), int(d_v)


def _bar(ax, y: float, x0: float, width: float, label: str, *, color=None, pad=False) -> None:
    """One segment of an operand's row: ``width`` head-dim columns from ``x0``, labelled inside."""
    style = dict(_PAD) if pad else dict(color=color, edgecolor="white", linewidth=0.8)
    ax.barh(y, width, left=x0, height=0.62, **style)
    ax.text(x0 + width / 2, y, label, ha="center", va="center", fontsize=8,
            color=PALETTE["text"] if pad else "white",
            bbox=dict(facecolor="white", edgecolor="none", pad=1) if pad else None)


def head_dims_figure(d_nope: int = 128, d_rope: int = 64, d_v: int = 128) -> Figure:
    """One MLA head's Q, K, V and O as bars of their head-dim columns, padded and native.

    Q is $[q^C, q^R]$ and K is $[k^C, k^R]$ in both dataflows ($D = D_n + D_r$ columns; the
    concatenation the next chapter removes). The top panel pads V with $D - D_v$ zero columns
    and gets an output with as many zero columns, which a slice drops; the bottom one does
    neither. The right margin gives the FLOPs of $PV$ per (query, key) pair, $2 D_v^{att}$.

    Returns the figure (two axes, ``"baseline"`` on top, then ``"native_v"``).
    """
    d_nope, d_rope, d_v = _check_dims(d_nope, d_rope, d_v)
    d = d_nope + d_rope
    fig, axes = new_figure(8.4, 4.4, nrows=2, sharex=True)
    rows = {"Q": 3, "K": 2, "V": 1, "O": 0}
    for ax, (flow, title) in zip(axes, PANELS.items()):
        padded = flow == "baseline"
        # Q = [q^C, q^R], K = [k^C, k^R]: D columns each
        _bar(ax, rows["Q"], 0, d_nope, f"$q^C$ {d_nope}", color=PALETTE["q"])
        _bar(ax, rows["Q"], d_nope, d_rope, f"$q^R$ {d_rope}", color=PALETTE["rope"])
        _bar(ax, rows["K"], 0, d_nope, f"$k^C$ {d_nope}", color=PALETTE["k"])
        _bar(ax, rows["K"], d_nope, d_rope, f"$k^R$ {d_rope}", color=PALETTE["rope"])
        _bar(ax, rows["V"], 0, d_v, f"$v$ {d_v}", color=PALETTE["v"])
        _bar(ax, rows["O"], 0, d_v, f"$o$ {d_v}", color=PALETTE["o"])
        if padded and d > d_v:
            # V_att = [V, 0]  ->  O_att = P [V, 0] = [P V, 0]
            _bar(ax, rows["V"], d_v, d - d_v, f"zeros {d - d_v} (pad V)", pad=True)
            _bar(ax, rows["O"], d_v, d - d_v, f"zeros {d - d_v} (sliced off)", pad=True)
        d_v_att = d if padded else d_v
        # PV costs 2 flops per multiply-add: 2 D_v^att per (query, key) pair
        ax.text(d * 1.03, rows["V"] - 0.5, f"$PV$: $2 \\times {d_v_att}$ FLOPs\nper (query, key)",
                ha="left", va="center", fontsize=8)
        ax.set_yticks(list(rows.values()), list(rows))
        ax.set_ylim(-0.6, 3.6)
        ax.set_xlim(0, d * 1.3)
        ax.set_title(title, fontsize=9, loc="left")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel("head-dim columns of one head")
    axes[-1].set_xticks([0, d_nope, d_v, d] if d_v != d_nope else [0, d_nope, d])
    fig.legend(handles=[Patch(label="RoPE part ($k^R$: one head, shared by all heads)",
                              color=PALETTE["rope"]),
                        Patch(label="zero padding", **_PAD)],
               loc="lower center", ncol=2, frameon=False, fontsize=8, bbox_to_anchor=(0.5, -0.07))
    return fig


def ledger_markdown(ledger: list[Step], *, unit: int = 2 ** 20, unit_name: str = "MiB",
                    digits: int = 2) -> str:
    """The ledger as a MyST table: one row per step (MFLOP; bytes read, written, allocated and
    the workspace in ``unit_name``), then the total in bold.

    ``ledger``: the ``list[Step]`` of :func:`flashlab.mla.mla_forward` (``.ledger``) or of
    :func:`flashlab.mla.mla_backward`; ``unit``: bytes per ``unit_name``; ``digits``: decimals.
    """
    if not isinstance(ledger, list) or not ledger or not all(isinstance(s, Step) for s in ledger):
        raise TypeError("ledger must be a non-empty list of flashlab.mla.Step (a dataflow's ledger)")
    unit = as_int("unit", unit, lo=1, what="a number of bytes (e.g. 2**20 for MiB)")

    def row(s: Step, bold: bool = False) -> list[str]:
        cells = [s.name, f"{s.flops / 1e6:,.1f}"] + [
            f"{getattr(s, f) / unit:,.{digits}f}"
            for f in ("bytes_read", "bytes_written", "allocated", "workspace")]
        return [f"**{c}**" for c in cells] if bold else cells

    header = ["step", "MFLOP", f"read ({unit_name})", f"written ({unit_name})",
              f"allocated ({unit_name})", f"workspace ({unit_name})"]
    return markdown_table(header, [row(s) for s in ledger] + [row(total(ledger), True)])
