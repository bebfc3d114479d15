"""The durations model of the tile loop: seconds of one task on an engine of a core model."""
from __future__ import annotations

import math
from typing import cast

from flashlab.pipeline.params import CoreModel, Engine, Param

__all__ = ["Durations"]


class Durations:
    """The durations model: seconds of one task on an engine of ``core``.

    - :meth:`move`: a copy on MTE2, MTE1, FixPipe or MTE3 (GM, L1, L0, UB);
    - :meth:`matmul`: one chunk of a matrix product on the Cube (tensor cores on a GPU);
    - :meth:`vector`: one pass of the Vector units (softmax, rescale, final division).

    The bandwidths a copy can see: ``hbm`` (the load engine's rate, one core's HBM share),
    ``workspace`` (the GM workspace that stays in L2; the HBM share on a GPU, which has none)
    and ``kv`` (``hbm``, or ``workspace`` for ``kv_source="l2"`` on Ascend).
    """

    def __init__(self, core: CoreModel, kv_source: str = "hbm"):
        self.core = core
        self.gm = core.exchange == "gm"
        self.hbm = core.load.rate.value
        # a core that exchanges through GM has a workspace bandwidth (checked with the profile)
        self.workspace = cast(Param, core.workspace_bandwidth).value if self.gm else self.hbm
        self.kv = self.hbm if kv_source == "hbm" else (self.workspace if self.gm else self.hbm)
        self.mma = (int(core.mma_m.value), int(core.mma_n.value), int(core.mma_k.value))

    def move(self, engine: Engine, nbytes: float, bw: float) -> float:
        """A copy of ``nbytes`` on ``engine`` at ``bw`` byte/s."""
        # t = latency + bytes / bandwidth
        return engine.latency.value + nbytes / bw

    def matmul(self, m: int, n: int, k: int) -> float:
        """An ``m x k`` by ``k x n`` product on the matrix unit, in whole granules of
        ``mma_m x mma_n x mma_k`` MACs ($16^3$ on the Cube)."""
        mm = self.mma
        # granules = ceil(m/16) ceil(n/16) ceil(k/16); t = latency + granules * 16^3 / MAC rate
        g = math.ceil(m / mm[0]) * math.ceil(n / mm[1]) * math.ceil(k / mm[2])
        return self.core.matmul.latency.value + g * mm[0] * mm[1] * mm[2] / self.core.matmul.rate.value

    def vector(self, ops: float, exps: float = 0.0, read: float = 0.0) -> float:
        """``ops`` element operations and ``exps`` exponentials on the Vector units, which also
        read ``read`` bytes from the GM workspace (Ascend; a GPU keeps its tiles in registers)."""
        core = self.core
        # t = latency + ops / throughput + exps / exp rate + bytes read / workspace bandwidth
        return (core.vector.latency.value + ops / core.vector.rate.value
                + exps / core.exp_rate.value + (read / self.workspace if self.gm else 0.0))
