"""Models of the hardware the kernels run on.

- :mod:`flashlab.pipeline.hardware` — sourced hardware profiles (Ascend 910B AI Core and chip,
  NVIDIA A100/H100), the ridge point and the roofline.

A later issue adds the discrete-event model of one Ascend AI Core running the FlashAttention
tile loop (``schedule.py``, ``simulate.py``).
"""
from flashlab.pipeline.hardware import (
    A100, A100_40GB, A100_80GB, ASCEND_910B, ASCEND_910B_AI_CORE, H100, PROFILES,
    HardwareProfile, MemoryLevel, Param, bound, params, ridge_point, roofline, roofline_time,
    with_hbm_bandwidth,
)

__all__ = ["A100", "A100_40GB", "A100_80GB", "ASCEND_910B", "ASCEND_910B_AI_CORE", "H100",
           "PROFILES", "HardwareProfile", "MemoryLevel", "Param", "bound", "params",
           "ridge_point", "roofline", "roofline_time", "with_hbm_bandwidth"]
