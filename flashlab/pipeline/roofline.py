r"""The roofline (Williams, Waterman & Patterson, *Roofline*, CACM 2009) and moving a profile's numbers.

A kernel that does $F$ floating-point operations and moves $Q$ bytes to and from main memory
has *arithmetic intensity* $I = F / Q$ (FLOP/byte). With peak compute $\pi$ (FLOP/s) and
main-memory bandwidth $\beta$ (byte/s) it can run at most at

$$
P(I) = \min(\pi,\ \beta I) \quad \text{FLOP/s},
$$

memory-bound below the *ridge point* $I^\ast = \pi / \beta$ and compute-bound above it.

Most engine rates inside a core are not published: :func:`with_core` and
:func:`with_hbm_bandwidth` move them, marking each moved number as an assumption.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashlab.arguments import as_real
from flashlab.pipeline.params import HardwareProfile, Param

__all__ = ["RooflinePoint", "ridge_point", "roofline", "roofline_time", "bound", "HBM_ENGINES",
           "MAIN_MEMORY_LEVELS", "with_hbm_bandwidth", "with_core"]


@dataclass(frozen=True)
class RooflinePoint:
    """One kernel placed on a roofline: its intensity and, where known, its roof and its speed.

    label: what the kernel is. intensity: its FLOP per byte of main-memory traffic (a model's).
    ridge: the ridge point $\\pi / \\beta$ (FLOP/byte) of the roofline it is judged against, for
    :attr:`bound` (NaN: none). fraction: its measured FLOP/s over the peak of the same run (NaN:
    not measured). committed: ``True`` for a figure read from a saved run, ``False`` for one
    measured while the page was built. flops: its FLOPs, when counted (NaN otherwise), which
    give :attr:`bytes_moved`.
    """

    label: str
    intensity: float
    ridge: float = math.nan
    fraction: float = math.nan
    committed: bool = False
    flops: float = math.nan

    @property
    def bytes_moved(self) -> float:
        """Bytes of main-memory traffic, ``flops / intensity`` (NaN when ``flops`` is)."""
        return self.flops / self.intensity

    @property
    def bound(self) -> str:
        """``"memory"`` below the ridge point, else ``"compute"`` (``ValueError`` without one)."""
        if math.isnan(self.ridge):
            raise ValueError(f"point {self.label!r} has no ridge to be bound against; give ridge=")
        return "memory" if self.intensity < self.ridge else "compute"


def ridge_point(profile: HardwareProfile) -> float:
    r"""Arithmetic intensity (FLOP/byte) where compute and bandwidth limits meet: $\pi / \beta$."""
    if not isinstance(profile, HardwareProfile):
        raise TypeError(f"profile must be a HardwareProfile; got {type(profile).__name__}")
    # I* = peak FLOP/s / bandwidth byte/s
    return profile.peak_flops.value / profile.hbm_bandwidth.value


def roofline(profile: HardwareProfile, intensity):
    r"""Attainable FLOP/s at arithmetic ``intensity`` (FLOP/byte, scalar or array):
    $\min(\pi, \beta I)$. Returns a float for a scalar, an array for an array."""
    if not isinstance(profile, HardwareProfile):
        raise TypeError(f"profile must be a HardwareProfile; got {type(profile).__name__}")
    i = np.asarray(intensity, dtype=np.float64)
    if np.any(~np.isfinite(i)) or np.any(i < 0):
        raise ValueError(f"intensity must be finite and >= 0 FLOP/byte; got {intensity!r}")
    # P(I) = min(pi, beta * I)
    p = np.minimum(profile.peak_flops.value, profile.hbm_bandwidth.value * i)
    return float(p) if p.ndim == 0 else p


def roofline_time(profile: HardwareProfile, flops: float, bytes_moved: float) -> float:
    r"""Lower bound on the seconds an operation takes: $\max(F / \pi,\ Q / \beta)$ for $F$
    FLOPs and $Q$ bytes of main-memory traffic (compute and transfers overlapped perfectly)."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes_moved must be >= 0; got {flops}, {bytes_moved}")
    # t = max(F / pi, Q / beta)
    return max(flops / profile.peak_flops.value, bytes_moved / profile.hbm_bandwidth.value)


def bound(profile: HardwareProfile, intensity: float) -> str:
    """``"memory"`` if ``intensity`` is below the ridge point, else ``"compute"``."""
    return "memory" if intensity < ridge_point(profile) else "compute"


#: the engines of a :class:`~flashlab.pipeline.params.CoreModel` that stream to and from main
#: memory; their rate is the core's share of the HBM bandwidth (the profile's
#: ``hbm_bandwidth``), see :func:`with_hbm_bandwidth`
HBM_ENGINES = ("load", "store")
#: the memory levels that *are* main memory (their ``bandwidth`` is the whole chip's HBM rate)
MAIN_MEMORY_LEVELS = ("HBM", "GM")


def with_hbm_bandwidth(profile: HardwareProfile, bytes_per_s: float,
                       source: str = "set by the reader") -> HardwareProfile:
    r"""A copy of ``profile`` with another main-memory bandwidth ``bytes_per_s`` for its scope,
    marked as an assumption, and every number derived from it moved with it.

    ``bytes_per_s`` is what ``profile.hbm_bandwidth`` means: the chip's bandwidth for a chip
    profile, one core's share $\beta_{core}$ for a per-core profile (pass
    $\beta_{chip} / 24$ for an Ascend 910B AI Core, as
    :func:`flashlab.pipeline.settings.core_profile` does). The derived numbers are

    - the rate of the core model's load and store engines (:data:`HBM_ENGINES`: MTE2 and MTE3,
      cp.async / TMA and their stores), which stream at the core's HBM share,
      $r_{load} = r_{store} = \beta_{core}$ (at import, ``ASCEND_910B_AI_CORE``'s MTE2 and MTE3
      are ``1.6 TB/s / 24``, the SMs' loads are the chip's bandwidth / SMs);
    - the bandwidth of the main-memory level (:data:`MAIN_MEMORY_LEVELS`), the whole pool that
      this scope has a share of, scaled by the same factor
      $\beta'_{pool} = \beta_{pool}\,\beta' / \beta$ (for a chip profile it is the new bandwidth
      itself; for an AI Core $24\,\beta'_{core}$).

    Everything else (the Cube, MTE1, FixPipe, the L2 workspace rate, latencies) stays.
    """
    if not isinstance(profile, HardwareProfile):
        raise TypeError(f"profile must be a HardwareProfile; got {type(profile).__name__}")
    as_real("bytes_per_s", bytes_per_s, lo=0, lo_open=True, what="a positive number of byte/s")
    bw = Param(float(bytes_per_s), "B/s", source, "assumption")
    # the factor every main-memory number moves by: beta' / beta
    factor = bw.value / profile.hbm_bandwidth.value
    memories = tuple(
        dataclasses.replace(level, bandwidth=Param(
            level.bandwidth.value * factor, "B/s",
            f"{source} (scaled with hbm_bandwidth: {level.bandwidth.value * factor / 1e12:g} TB/s "
            "for the whole pool)", "assumption"))
        if level.name in MAIN_MEMORY_LEVELS and level.bandwidth is not None else level
        for level in profile.memories)
    core = profile.core
    if core is not None:
        # r_load = r_store = beta_core: the movers to and from GM stream at the core's HBM share
        rate = Param(bw.value, "B/s", f"{source}: the core's HBM share (= hbm_bandwidth)", "assumption")
        core = dataclasses.replace(core, **{name: dataclasses.replace(getattr(core, name), rate=rate)
                                            for name in HBM_ENGINES})
    return dataclasses.replace(profile, hbm_bandwidth=bw, memories=memories, core=core)


_ENGINE_FIELDS = ("load", "l1_to_l0", "matmul", "acc_out", "vector", "store")


def with_core(profile: HardwareProfile, source: str = "set by the reader",
              **values: float) -> HardwareProfile:
    """A copy of a per-core ``profile`` with some of its core model's numbers replaced, each
    marked as an assumption with ``source``.

    The keys of ``values`` are an engine (``load``, ``l1_to_l0``, ``matmul``, ``acc_out``,
    ``vector``, ``store``) to set its rate, ``<engine>_latency`` to set its start latency in
    seconds, or ``workspace_bandwidth`` / ``exp_rate``. Example, an Ascend core whose Vector runs
    at half the assumed rate: ``with_core(ASCEND_910B_AI_CORE, vector=64 * 1.8e9)``. To move the
    HBM bandwidth use :func:`with_hbm_bandwidth`, which moves the load and store engines with it;
    ``load=``/``store=`` here set one engine alone (the profile's ``hbm_bandwidth`` stays).
    """
    if not isinstance(profile, HardwareProfile) or profile.core is None:
        raise ValueError("profile must be a HardwareProfile with a core model (a per-core profile, "
                         f"e.g. ASCEND_910B_AI_CORE); got {getattr(profile, 'name', profile)!r}")
    core = profile.core
    changes: dict[str, Any] = {}   # field of CoreModel -> its new Engine or Param
    for key, value in values.items():
        as_real(key, value, lo=0, what="a finite number >= 0")
        name = key.removesuffix("_latency")
        if name in _ENGINE_FIELDS:
            engine = changes.get(name, getattr(core, name))
            if engine is None:
                raise ValueError(f"{profile.name} has no {name} engine to change")
            if key.endswith("_latency"):
                latency = Param(float(value), "s", source, "assumption")
                engine = dataclasses.replace(engine, latency=latency)
            else:
                if value <= 0:
                    raise ValueError(f"{key} must be a positive rate; got {value!r}")
                engine = dataclasses.replace(
                    engine, rate=Param(float(value), engine.rate.unit, source, "assumption"))
            changes[name] = engine
        elif key in ("workspace_bandwidth", "exp_rate"):
            if value <= 0:
                raise ValueError(f"{key} must be a positive rate; got {value!r}")
            unit = getattr(core, key).unit if getattr(core, key) is not None else "B/s"
            changes[key] = Param(float(value), unit, source, "assumption")
        else:
            raise ValueError(f"unknown core parameter {key!r}; expected one of {_ENGINE_FIELDS}, "
                             "'<engine>_latency', 'workspace_bandwidth', 'exp_rate'")
    return dataclasses.replace(profile, core=dataclasses.replace(core, **changes))
