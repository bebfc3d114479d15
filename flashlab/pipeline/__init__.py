"""Models of the hardware the kernels run on.

- :mod:`flashlab.pipeline.params` — the types of a hardware profile: every number a sourced
  :class:`~flashlab.pipeline.params.Param`; per-core profiles carry a
  :class:`~flashlab.pipeline.params.CoreModel` (engines, rates, latencies);
- :mod:`flashlab.pipeline.profiles` — the sourced profiles (Ascend 910B AI Core and chip,
  NVIDIA A100/H100 chips and one SM of each);
- :mod:`flashlab.pipeline.roofline` — the ridge point, the roofline, a
  :class:`~flashlab.pipeline.roofline.RooflinePoint`, and copies of a profile with moved numbers.
- :mod:`flashlab.pipeline.schedule` — the FlashAttention forward tile loop of one core as a
  task graph, for the strategies ``iterate_all``, ``self_mte2``, ``ping_pong``, ``n_buffers``
  and the RECT variants (V padded or native, RoPE concatenated or split); :func:`simulate_fa`
  builds and simulates it.
- :mod:`flashlab.pipeline.simulate` — the discrete-event simulator of in-order engines with
  buffer slots: timeline, makespan, utilization, idle gaps.
- :mod:`flashlab.pipeline.settings` — one design point of the tile loop
  (:class:`~flashlab.pipeline.settings.PipelineSettings`: strategy, tiles, HBM bandwidth, head
  dims, RoPE, kv-blocks), simulated against the ``iterate_all`` baseline; the pipeline
  explorer's model.

Each name lives in one module and is imported from there (``from flashlab.pipeline.profiles
import ASCEND_910B``); this package's face holds the simulator's entry points only.
"""
from flashlab.pipeline.buffers import STRATEGIES
from flashlab.pipeline.schedule import build_fa_graph, simulate_fa
from flashlab.pipeline.simulate import SimResult, Task, TaskGraph, simulate, two_stage_graph
from flashlab.pipeline.timing import bench_simulator

__all__ = ["STRATEGIES", "build_fa_graph",
           "SimResult", "Task", "TaskGraph", "bench_simulator", "simulate", "simulate_fa",
           "two_stage_graph"]
