"""Every CANN ``sparse_mode`` drawn on one small ``Sq != Sk`` example, and the same as a table.

The pictures are not drawn from a separate description of the modes: each panel is
:func:`flashlab.cann.sparse_mode_mask`, which runs the operator's own planning code
(:func:`flashlab.cann.plan`) on the example arguments of :func:`example_arguments`. The names
and rules come from :data:`flashlab.cann.sparse_modes.SPARSE_MODES`.

Coordinates: key index ``j`` to the right, query index ``i`` downwards (row 0 at the top).
"""
from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from flashlab.cann import sparse_mode_mask
from flashlab.cann.sparse_modes import SPARSE_MODES, compressed_mask, prefix_mask
from flashlab.masks import allowed
from flashlab.viz.style import PALETTE, new_figure

__all__ = ["example_arguments", "sparse_mode_table", "sparse_mode_markdown"]

_CMAP = ListedColormap([PALETTE["empty"], PALETTE["full"]])


def example_arguments(sq: int = 12, sk: int = 16, *, pre_tokens: int = 6, next_tokens: int = 2,
                      prefix: int = 9, n_seqs: int = 3) -> dict[int, dict]:
    """Keyword arguments of :func:`flashlab.cann.sparse_mode_mask` for each mode, on one example.

    - mode 0: ``pre_tokens``/``next_tokens`` from the top-left, with the atten_mask consistent
      with them (everything outside the band masked), as the operator requires;
    - mode 1: a full atten_mask of two packed documents (block-diagonal), pre/next ignored;
    - modes 2, 3, 4: the compressed 2048 x 2048 mask; mode 4 uses the same pre/next as mode 0,
      measured from the bottom-right;
    - modes 5, 6: ``prefix`` keys visible to every query (5: the full mask, 6: the compressed
      3072 x 2048 one);
    - modes 7, 8: ``sq`` and ``sk`` split into ``n_seqs`` packed sequences (TND); the band
      sequence (last for 7, first for 8) gets the smallest allowed ``pre_tokens`` (its Skv)
      and ``next_tokens`` -1 (7) or 1 (8).
    """
    tri = compressed_mask(2)
    q_lens = [len(a) for a in np.array_split(np.arange(sq), n_seqs)]
    k_lens = [len(a) for a in np.array_split(np.arange(sk), n_seqs)]
    varlen = {"actual_seq_qlen": list(np.cumsum(q_lens)), "actual_seq_kvlen": list(np.cumsum(k_lens))}
    docs = np.ones((sq, sk), dtype=np.bool_)
    docs[: sq // 2, : sk // 2] = False
    docs[sq // 2:, sk // 2:] = False
    return {
        0: {"atten_mask": ~allowed(sq, sk, pre_tokens, next_tokens),
            "pre_tokens": pre_tokens, "next_tokens": next_tokens},
        1: {"atten_mask": docs},
        2: {"atten_mask": tri},
        3: {"atten_mask": tri},
        4: {"atten_mask": tri, "pre_tokens": pre_tokens, "next_tokens": next_tokens},
        5: {"atten_mask": prefix_mask(sq, sk, prefix)[None, None], "prefix": [prefix]},
        6: {"atten_mask": compressed_mask(6), "prefix": [prefix]},
        7: {"atten_mask": tri, "pre_tokens": k_lens[-1], "next_tokens": -1, **varlen},
        8: {"atten_mask": tri, "pre_tokens": k_lens[0], "next_tokens": 1, **varlen},
    }


def _parameters(kwargs: dict) -> str:
    """Short text of the example's scalar arguments for a panel's title."""
    parts = []
    if "pre_tokens" in kwargs:
        parts.append(f"pre={kwargs['pre_tokens']}, next={kwargs['next_tokens']}")
    if "prefix" in kwargs:
        parts.append(f"prefix={kwargs['prefix'][0]}")
    if "actual_seq_qlen" in kwargs:
        parts.append(f"q ends {list(map(int, kwargs['actual_seq_qlen']))}, "
                     f"kv ends {list(map(int, kwargs['actual_seq_kvlen']))}")
    return "; ".join(parts)


def sparse_mode_table(sq: int = 12, sk: int = 16, **example) -> Figure:
    """One panel per sparse_mode (0..8): the allowed entries of the example, titled with name and rule.

    ``example`` is passed to :func:`example_arguments` (``pre_tokens``, ``next_tokens``,
    ``prefix``, ``n_seqs``). Sequence boundaries of the varlen modes 7 and 8 are drawn as lines.
    """
    args = example_arguments(sq, sk, **example)
    fig, axes = new_figure(11.0, 11.5, nrows=3, ncols=3)
    for mode, ax in zip(range(9), axes.flat):
        kw = args[mode]
        ok = sparse_mode_mask(sq, sk, mode, **kw)
        ax.imshow(ok, cmap=_CMAP, vmin=0, vmax=1, extent=(0, sk, sq, 0), interpolation="nearest")
        # the entry grid, faint, so single keys can be counted
        ax.set_xticks(np.arange(0, sk + 1, 4))
        ax.set_yticks(np.arange(0, sq + 1, 4))
        ax.set_xticks(np.arange(sk + 1), minor=True)
        ax.set_yticks(np.arange(sq + 1), minor=True)
        ax.grid(which="minor", color="white", lw=0.5)
        ax.tick_params(which="minor", length=0)
        if "actual_seq_qlen" in kw:
            for e in kw["actual_seq_qlen"][:-1]:
                ax.axhline(e, color=PALETTE["highlight"], lw=1.5)
            for e in kw["actual_seq_kvlen"][:-1]:
                ax.axvline(e, color=PALETTE["highlight"], lw=1.5)
        info = SPARSE_MODES[mode]
        rule = textwrap.fill(info.rule, 42)
        ax.set_title(f"{mode}: {info.name}\n{rule}\n{_parameters(kw)}", fontsize=8)
        ax.set_xlabel("key j", fontsize=8)
        ax.set_ylabel("query i", fontsize=8)
    fig.legend(handles=[Patch(color=PALETTE["full"], label="allowed"),
                        Patch(color=PALETTE["empty"], label="masked out"),
                        Patch(color=PALETTE["highlight"], label="sequence boundary (TND)")],
               loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, -0.03))
    fig.suptitle(f"CANN sparse_mode: effective masks for Sq={sq}, Sk={sk} "
                 f"(computed by flashlab.cann.plan)")
    return fig


def sparse_mode_markdown() -> str:
    """The sparse_mode table as markdown: mode, name, rule, the atten_mask the user passes, TND."""
    lines = ["| mode | name | allowed (i, j) | atten_mask passed | TND |",
             "|---:|---|---|---|---|"]
    for m in SPARSE_MODES:
        cells = [str(m.mode), m.name, m.rule, m.atten_mask, m.varlen]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
