r"""The scores stage's per-score transform, written once as scalar code for every target.

A kernel's raw score of query row $i$ and key $j$ is the scaled product
$s = \text{scale}\,(q_i \cdot k_j + q^{rope}_i \cdot k^{rope}_j)$. The scores stage may turn it
into another number before the bias and the mask are added; today one option does,
flash_attn's (>= 2.6) and Gemma 2's logit soft-cap $c$:

$$
S = c \tanh(s / c) \quad (c > 0), \qquad \frac{\partial S}{\partial s} = 1 - \tanh^2(s / c)
= \frac{(c - S)(c + S)}{c^2}.
$$

The options are one record, :class:`flashlab.kernels.options.ScoresStage` (its field rules are
there); a ``stage`` below is any record with its fields: that record (the GPU twin's kernels take
it, in float32) or the CPU kernels' ``TileOptions``, which carries them flat.
:func:`transforms` says whether the stage changes the scores at all, :func:`score` maps one
scaled product to its score and :func:`slope` gives the derivative the backward's $dS$ picks
up, from the score alone (so a kernel that recomputes $S$ needs nothing else). They use plain
arithmetic and ``math`` only, so the same source compiles with ``numba.njit`` for the CPU tile
stage (:func:`flashlab.kernels.tile.stage_scores`) and with ``numba.cuda.jit(device=True)`` for
the GPU twin's kernels, as the online softmax's per-row update
(:mod:`flashlab.kernels.rowstep`) does. Adding a scores option means a field of the records
(``ScoresStage`` and ``TileOptions``) with its rule, these three functions, the float64
reference and the doors' keywords: no kernel changes. Every result has the type of its
arguments (float32 scores and a float32 record stay float32 on the GPU).
"""
from __future__ import annotations

import math

__all__ = ["transforms", "score", "slope"]


def transforms(stage) -> bool:
    """Whether the scores stage changes the scaled products (``False``: ``S = s``, and the
    kernels skip it and the backward's chain factor)."""
    return stage.softcap > 0


def score(s, stage):
    """The score of one scaled product ``s``: ``c tanh(s / c)`` with the soft-cap ``c > 0``,
    else ``s``.

    >>> from flashlab.kernels.options import ScoresStage
    >>> score(1.0, ScoresStage(softcap=0.0)), round(score(100.0, ScoresStage(softcap=50.0)), 6)
    (1.0, 48.201379)
    """
    c = stage.softcap
    if c > 0:
        # S = c tanh(s / c)
        return c * math.tanh(s / c)
    return s


def slope(score_value, stage):
    """``dS/ds`` at the score ``S = score_value`` of a stage that :func:`transforms`:
    ``1 - tanh^2(s / c) = (c - S)(c + S) / c^2`` (only called where the stage transforms, so
    ``c > 0``).

    >>> from flashlab.kernels.options import ScoresStage
    >>> stage = ScoresStage(softcap=50.0)
    >>> abs(slope(score(20.0, stage), stage) - (1 - math.tanh(0.4) ** 2)) < 1e-15
    True
    """
    c = stage.softcap
    # 1 - t^2 with t = S / c, written in c's type (no float64 literal on a float32 device)
    return (c - score_value) * (c + score_value) / (c * c)
