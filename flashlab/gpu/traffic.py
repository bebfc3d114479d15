"""Counted global-memory traffic of a :mod:`flashlab.gpu` launch (no CUDA import here)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Traffic", "COUNTER_SLOTS"]

#: length of the int64 counter array the counting kernels add into (read bytes, write bytes)
COUNTER_SLOTS = 2


@dataclass(frozen=True)
class Traffic:
    """Bytes moved between global memory (HBM) and the chip, summed over every thread of a launch.

    ``read_bytes``: loaded from global memory into shared memory or registers;
    ``write_bytes``: stored to global memory (an atomic add counts as a 4-byte store).
    """

    read_bytes: int
    write_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    @classmethod
    def from_counter(cls, counter: np.ndarray) -> "Traffic":
        """From the ``(2,)`` int64 counter the instrumented kernels add into."""
        return cls(int(counter[0]), int(counter[1]))

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes)
