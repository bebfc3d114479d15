r"""Paired ratios of interleaved timings, and whether they resolve an effect.

Two implementations timed in turn, round by round (:func:`flashlab.bench.time_paired`), give one
paired ratio per round, $r_i = t^A_i / t^B_i$: a change of load that lasts a round hits both
times and mostly cancels in $r_i$. The estimate is the median of the $r_i$ and its uncertainty a
percentile bootstrap over the rounds (resample the $n$ rounds with replacement, take the median,
``BOOTSTRAP_SAMPLES`` times, with a fixed seed so the interval is reproducible). A ratio
*resolves* when it has at least ``MIN_ROUNDS`` rounds and its 95 % interval lies within a
factor ``1 +`` ``RESOLUTION`` (±5 %) of the median either way: then a 10 % effect is told from none. The rounds'
minimum is there because a percentile bootstrap of a median from a handful of rounds is not a
95 % interval: from 3 rounds it is the range of the three ratios, which holds the true median only
$1 - 2 \cdot 2^{-3} = 75\,\%$ of the time.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["RESOLUTION", "MIN_ROUNDS", "CONFIDENCE", "BOOTSTRAP_SAMPLES", "BOOTSTRAP_SEED", "PairedRatio",
           "paired_ratio", "paired_ratio_of_rows"]

#: a ratio resolves when its interval lies within this share of its median, either way
RESOLUTION = 0.05
#: a ratio from fewer rounds never resolves (see the module doc)
MIN_ROUNDS = 10
#: the interval's coverage
CONFIDENCE = 0.95
#: bootstrap resamples of the rounds
BOOTSTRAP_SAMPLES = 4000
#: the seed of the bootstrap, so that the same timings always give the same interval
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class PairedRatio:
    """The median of the per-round ratios ``a / b``, its bootstrap interval ``low .. high`` and the
    number of ``rounds`` it was computed from."""

    median: float
    low: float
    high: float
    rounds: int

    @property
    def halfwidth(self) -> float:
        """The smallest ``h`` with ``median / (1 + h) <= low`` and ``high <= median * (1 + h)``.

        The interval's larger distance from the median as a factor less one, so that the ratio
        ``b / a`` has the half-width of ``a / b``."""
        return max(self.high / self.median, self.median / self.low) - 1

    @property
    def resolved(self) -> bool:
        """Whether the ratio has ``MIN_ROUNDS`` rounds and its interval lies within
        ``RESOLUTION`` of the median."""
        return self.rounds >= MIN_ROUNDS and self.halfwidth <= RESOLUTION

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PairedRatio":
        return cls(float(d["median"]), float(d["low"]), float(d["high"]), int(d["rounds"]))


def paired_ratio(a: Sequence[float], b: Sequence[float], *, samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> PairedRatio:
    """The median of ``a[i] / b[i]`` over the rounds ``i`` both have, and its ``CONFIDENCE``
    percentile-bootstrap interval (``samples`` resamples of the rounds, seeded by ``seed``).

    ``a``, ``b``: positive times, one per round (length n >= 1; the longer is cut to the shorter).
    With one round the interval is infinite (nothing to resample).
    """
    n = min(len(a), len(b))
    if n < 1:
        raise ValueError(f"a and b must hold at least one round each; got {len(a)} and {len(b)}")
    r = np.asarray(a[:n], dtype=float) / np.asarray(b[:n], dtype=float)
    if not np.all(np.isfinite(r)) or np.any(r <= 0):
        raise ValueError("a and b must be positive finite times")
    med = float(np.median(r))
    if n == 1:
        return PairedRatio(med, 0.0, float("inf"), 1)
    rng = np.random.default_rng(seed)
    # each row: n rounds drawn with replacement; its median is one bootstrap replicate
    boot = np.median(r[rng.integers(0, n, size=(samples, n))], axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(boot, [tail, 100 - tail])
    return PairedRatio(med, float(low), float(high), n)


def paired_ratio_of_rows(a: dict | list[dict], b: dict | list[dict]) -> PairedRatio:
    """:func:`paired_ratio` of two measured rows' ``"times"`` (one per round), or of lists of rows
    whose times are summed round by round (a forward and its backward, each timed in its own
    interleaved group: round ``i`` of the sum pairs round ``i`` of each group)."""
    def times(rows):
        rows = rows if isinstance(rows, list) else [rows]
        n = min(len(r["times"]) for r in rows)
        return [sum(r["times"][i] for r in rows) for i in range(n)]
    return paired_ratio(times(a), times(b))
