"""Models of the hardware the kernels run on.

- :mod:`flashlab.pipeline.hardware` — sourced hardware profiles (Ascend 910B AI Core and chip,
  NVIDIA A100/H100 chips and one SM of each), the ridge point and the roofline; per-core
  profiles carry a :class:`~flashlab.pipeline.hardware.CoreModel` (engines, rates, latencies).
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
"""
from flashlab.pipeline.buffers import STRATEGIES
from flashlab.pipeline.hardware import (
    A100_40GB,
    A100_80GB,
    A100_SM,
    ASCEND_910B,
    ASCEND_910B_AI_CORE,
    ASCEND_910B_CORE_MODEL,
    H100,
    H100_SM,
    PROFILES,
    CoreModel,
    Engine,
    HardwareProfile,
    MemoryLevel,
    Param,
    bound,
    params,
    ridge_point,
    roofline,
    roofline_time,
    with_core,
    with_hbm_bandwidth,
)
from flashlab.pipeline.schedule import build_fa_graph, simulate_fa
from flashlab.pipeline.simulate import SimResult, Task, TaskGraph, simulate, two_stage_graph
from flashlab.pipeline.timing import bench_simulator

__all__ = ["A100_40GB", "A100_80GB", "A100_SM", "ASCEND_910B", "ASCEND_910B_AI_CORE",
           "ASCEND_910B_CORE_MODEL", "H100", "H100_SM", "PROFILES", "CoreModel", "Engine",
           "HardwareProfile", "MemoryLevel", "Param", "bound", "params", "ridge_point", "roofline",
           "roofline_time", "with_core", "with_hbm_bandwidth",
           "STRATEGIES", "build_fa_graph",
           "SimResult", "Task", "TaskGraph", "bench_simulator", "simulate", "simulate_fa",
           "two_stage_graph"]
