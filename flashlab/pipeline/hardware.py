r"""Hardware profiles: memory hierarchies, peak rates and the roofline, each number sourced.

A profile is a frozen dataclass. Every number in it is a :class:`Param` that says where the
number comes from and whether it is

- ``"published"`` — stated by the vendor or by a paper (the source is named),
- ``"derived"`` — computed from published numbers (the formula is in the source string),
- ``"assumption"`` — a model parameter with no official figure behind it; the reader may move
  it (:func:`with_hbm_bandwidth`).

The roofline model (Williams, Waterman & Patterson, *Roofline*, CACM 2009): a kernel that does
$F$ floating-point operations and moves $Q$ bytes to and from main memory has *arithmetic
intensity* $I = F / Q$ (FLOP/byte). With peak compute $\pi$ (FLOP/s) and main-memory bandwidth
$\beta$ (byte/s) it can run at most at

$$
P(I) = \min(\pi,\ \beta I) \quad \text{FLOP/s},
$$

memory-bound below the *ridge point* $I^\ast = \pi / \beta$ and compute-bound above it.

Extending: a later issue adds engine rates (MTE2, MTE1, FixPipe, Vector) for the pipeline
simulator. Add them as new fields *with defaults* (e.g. ``engines: tuple[Engine, ...] = ()``)
so that the profiles below keep constructing, and give every new number a :class:`Param`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

KiB = 1024
MiB = 1024 ** 2
GiB = 1024 ** 3

#: the kinds of evidence a :class:`Param` may carry
STATUSES = ("published", "derived", "assumption")


@dataclass(frozen=True)
class Param:
    """One number with its unit and its evidence.

    value: the number in base units (bytes, byte/s, FLOP/s, Hz, a count).
    unit: the unit of ``value``, e.g. ``"B"``, ``"B/s"``, ``"FLOP/s"``.
    source: where it comes from (document and section), or the formula for a derived number,
        or why it is assumed.
    status: ``"published"``, ``"derived"`` or ``"assumption"``.
    """

    value: float
    unit: str
    source: str
    status: str = "published"

    def __post_init__(self):
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise TypeError(f"Param value must be an int or float; got {self.value!r}")
        if not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"Param value must be finite and >= 0; got {self.value}")
        if self.status not in STATUSES:
            raise ValueError(f"Param status must be one of {STATUSES}; got {self.status!r}")
        if not self.source.strip():
            raise ValueError("Param source must name where the number comes from; got an empty string")

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class MemoryLevel:
    """One level of a memory hierarchy.

    capacity: bytes of *one* instance (one SM's shared memory, one AI Core's L1, ...).
    count: instances in the profile's scope (108 SMs on an A100 chip; 1 in a per-core profile).
    bandwidth: aggregate byte/s of all instances, or ``None`` where no figure is published.
    """

    name: str
    capacity: Param
    count: Param
    bandwidth: Param | None = None
    note: str = ""

    @property
    def total_bytes(self) -> float:
        """capacity x count."""
        return self.capacity.value * self.count.value


@dataclass(frozen=True)
class ComputeUnit:
    """A unit that computes: peak FLOP/s of all its instances, or ``None`` if not modelled yet."""

    name: str
    peak: Param | None = None
    note: str = ""


@dataclass(frozen=True)
class DataPath:
    """A data movement ``src -> dst`` performed by ``engine`` (e.g. MTE2 moves GM -> L1)."""

    src: str
    dst: str
    engine: str
    source: str


@dataclass(frozen=True)
class HardwareProfile:
    """A chip (or one core of it) as the roofline and the chapters see it.

    peak_flops: dense fp16/bf16 matrix FLOP/s (the tensor core / Cube unit).
    hbm_bandwidth: main-memory (HBM, called GM on Ascend) byte/s available to this scope.
    memories: levels ordered from the compute outwards (fastest and smallest first).
    compute: units that compute (tensor core, Cube, Vector).
    paths: data movements between levels and units, each with the engine that performs it.
    """

    name: str
    scope: str
    peak_flops: Param
    hbm_bandwidth: Param
    memories: tuple[MemoryLevel, ...]
    compute: tuple[ComputeUnit, ...] = ()
    paths: tuple[DataPath, ...] = ()
    notes: str = ""

    def memory(self, name: str) -> MemoryLevel:
        """The memory level called ``name``; ``KeyError`` listing the names if there is none."""
        for level in self.memories:
            if level.name == name:
                return level
        raise KeyError(f"{self.name} has no memory level {name!r}; "
                       f"levels: {[m.name for m in self.memories]}")


def params(obj, prefix: str = "") -> Iterator[tuple[str, Param]]:
    """Every :class:`Param` inside a profile (recursively), as ``(dotted.path, Param)`` pairs.

    Used to print a profile's evidence table and by the tests to check that no number in a
    profile is left without a source: a bare ``int``/``float`` field raises ``TypeError``.
    """
    if isinstance(obj, Param):
        yield prefix, obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from params(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    elif isinstance(obj, tuple):
        for item in obj:
            label = getattr(item, "name", None) or getattr(item, "engine", None)
            yield from params(item, f"{prefix}[{label}]")
    elif isinstance(obj, (bool, int, float)):
        raise TypeError(f"{prefix} is a bare number {obj!r}: wrap it in a Param with its source")


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


def with_hbm_bandwidth(profile: HardwareProfile, bytes_per_s: float,
                       source: str = "set by the reader") -> HardwareProfile:
    """A copy of ``profile`` with another main-memory bandwidth, marked as an assumption."""
    if isinstance(bytes_per_s, bool) or not isinstance(bytes_per_s, (int, float)) or bytes_per_s <= 0:
        raise ValueError(f"bytes_per_s must be a positive number of byte/s; got {bytes_per_s!r}")
    bw = Param(float(bytes_per_s), "B/s", source, "assumption")
    return dataclasses.replace(profile, hbm_bandwidth=bw)


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------
FA1 = "Dao et al., FlashAttention (NeurIPS 2022), Sec. 2.1 and Fig. 1"
A100_WP = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020)"
A100_DS = "NVIDIA A100 datasheet (80GB SXM)"
H100_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)"
H100_DS = "NVIDIA H100 datasheet (SXM5)"
SEED_002 = "article 'Ascend上的FlashAttention实现', Sec. 2.1 (an A100 80G SXM)"
CATLASS = "Huawei catlass include/catlass/arch/arch.hpp, struct AtlasA2"
INI_910B2 = "CANN platform_config/Ascend910B2.ini"
ASCENDC_ARCH = ("CANN Ascend C documentation, AI Core architecture of Atlas A2 "
                "(split AIC/AIV; data paths and their engines)")


def _count(n: int, source: str) -> Param:
    return Param(n, "instances", source)


# --------------------------------------------------------------------------------------------
# NVIDIA A100 SXM4
# --------------------------------------------------------------------------------------------
_A100_SMS = _count(108, f"{A100_WP}; {FA1}")
_A100_HBM_BW_40 = Param(1555e9, "B/s", f"{A100_WP} (40GB HBM2); {FA1} gives the range 1.5-2.0 TB/s")
_A100_HBM_BW_80 = Param(2039e9, "B/s", f"{A100_DS} (HBM2e); also {SEED_002}: 2039 GB/s")


def _a100(name: str, hbm_gb: int, hbm_bw: Param) -> HardwareProfile:
    return HardwareProfile(
        name=name,
        scope="chip",
        peak_flops=Param(312e12, "FLOP/s", f"{A100_WP} (dense fp16/bf16 tensor core); {FA1}; "
                                            f"{SEED_002}"),
        hbm_bandwidth=hbm_bw,
        memories=(
            MemoryLevel("registers", Param(256 * KiB, "B", f"{A100_WP}: 64K 32-bit registers per SM"),
                        _A100_SMS),
            MemoryLevel("SRAM (shared memory/L1)",
                        Param(192 * KiB, "B", f"{A100_WP}: 192 KB combined L1/shared memory per SM; "
                                              f"{FA1}"),
                        _A100_SMS,
                        Param(19e12, "B/s", f"{FA1}: 'estimated around 19TB/s'"),
                        note="what the FlashAttention paper calls SRAM: on-chip, per SM"),
            MemoryLevel("L2", Param(40e6, "B", f"{A100_WP}: 40 MB; {SEED_002}"),
                        _count(1, "one L2 per chip")),
            MemoryLevel("HBM", Param(hbm_gb * 1e9, "B", f"{A100_WP} / {A100_DS}; {FA1}: 40-80GB"),
                        _count(1, "one HBM pool per chip"), hbm_bw),
            MemoryLevel("CPU DRAM", Param(1e12, "B", f"{FA1}: '>1 TB' (host memory; varies by host)"),
                        _count(1, "the host"), Param(12.8e9, "B/s", f"{FA1}: 12.8 GB/s"),
                        note="host memory, reached over PCIe"),
        ),
        compute=(ComputeUnit("tensor core", Param(312e12, "FLOP/s", f"{A100_WP} (dense fp16)")),),
        paths=(
            DataPath("HBM", "L2", "memory controller", A100_WP),
            DataPath("L2", "SRAM (shared memory/L1)", "cp.async / load", A100_WP),
            DataPath("SRAM (shared memory/L1)", "registers", "ld.shared / ldmatrix", A100_WP),
            DataPath("registers", "tensor core", "mma", A100_WP),
        ),
        notes="108 SMs; the FlashAttention paper's SRAM is the per-SM shared memory, not the L2",
    )


A100_40GB = _a100("NVIDIA A100 SXM4 40GB", 40, _A100_HBM_BW_40)
A100_80GB = _a100("NVIDIA A100 SXM4 80GB", 80, _A100_HBM_BW_80)
#: the A100 that the article "Ascend上的FlashAttention实现" quotes (80 GB, 2039 GB/s)
A100 = A100_80GB

# --------------------------------------------------------------------------------------------
# NVIDIA H100 SXM5
# --------------------------------------------------------------------------------------------
_H100_SMS = _count(132, f"{H100_WP} (H100 SXM5)")
_H100_HBM_BW = Param(3.35e12, "B/s", f"{H100_DS}: HBM3 3.35 TB/s")

H100 = HardwareProfile(
    name="NVIDIA H100 SXM5 80GB",
    scope="chip",
    peak_flops=Param(989.4e12, "FLOP/s", f"{H100_DS}: 1979 TFLOPS fp16 with sparsity, half of it dense"),
    hbm_bandwidth=_H100_HBM_BW,
    memories=(
        MemoryLevel("registers", Param(256 * KiB, "B", f"{H100_WP}: 64K 32-bit registers per SM"),
                    _H100_SMS),
        MemoryLevel("SRAM (shared memory/L1)",
                    Param(228 * KiB, "B", f"{H100_WP}: shared memory up to 228 KB per SM "
                                          "(256 KB combined L1/shared)"),
                    _H100_SMS, None),
        MemoryLevel("L2", Param(50e6, "B", f"{H100_WP}: 50 MB"), _count(1, "one L2 per chip")),
        MemoryLevel("HBM", Param(80e9, "B", f"{H100_DS}: 80 GB HBM3"),
                    _count(1, "one HBM pool per chip"), _H100_HBM_BW),
    ),
    compute=(ComputeUnit("tensor core", Param(989.4e12, "FLOP/s", f"{H100_DS} (dense fp16)")),),
    paths=(
        DataPath("HBM", "L2", "memory controller", H100_WP),
        DataPath("L2", "SRAM (shared memory/L1)", "TMA (Tensor Memory Accelerator)", H100_WP),
        DataPath("SRAM (shared memory/L1)", "tensor core", "wgmma (operands from shared memory)", H100_WP),
    ),
    notes="TMA copies whole tiles HBM -> shared memory asynchronously, like Ascend's MTE2",
)

# --------------------------------------------------------------------------------------------
# Huawei Ascend 910B (Atlas A2): one AI Core and the chip
# --------------------------------------------------------------------------------------------
_CUBE_FREQ = Param(1.8e9, "Hz", f"{INI_910B2} [AICoreSpec] cube_freq=1800 (MHz)")
_CUBE_MACS = Param(16 * 16 * 16, "MAC/cycle", f"{INI_910B2} [AICoreSpec] cube_m/n/k_size=16 (fp16)")
_N_AIC = _count(24, f"{INI_910B2} [SoCInfo] cube_core_cnt=24")
_N_AIV = _count(48, f"{INI_910B2} [SoCInfo] vector_core_cnt=48 (2 per cube core)")
# pi_core = 16^3 MAC/cycle * 2 FLOP/MAC * 1.8 GHz
_AIC_PEAK = Param(_CUBE_MACS.value * 2 * _CUBE_FREQ.value, "FLOP/s",
                  "16*16*16 MAC/cycle x 2 FLOP/MAC x 1.8 GHz (not published by Huawei)", "derived")
# pi_chip = 24 AI Cores * pi_core
_CHIP_PEAK = Param(_N_AIC.value * _AIC_PEAK.value, "FLOP/s",
                   "24 AI Cores x 16^3 x 2 x 1.8 GHz ~ 354 TFLOPS fp16 (not published by Huawei)", "derived")
_HBM_BW = Param(1.6e12, "B/s",
                "no official figure found; community figures for 910B disagree (roughly 1.2-1.8 TB/s). "
                "A model parameter: move it with with_hbm_bandwidth()", "assumption")
# the share of one AI Core when all 24 stream at once
_HBM_BW_CORE = Param(_HBM_BW.value / _N_AIC.value, "B/s",
                     "the assumed chip HBM bandwidth / 24 AI Cores", "assumption")

_L1 = Param(512 * KiB, "B", f"{CATLASS} L1_SIZE; {INI_910B2} l1_size=524288")
_L0A = Param(64 * KiB, "B", f"{CATLASS} L0A_SIZE; {INI_910B2} l0_a_size=65536")
_L0B = Param(64 * KiB, "B", f"{CATLASS} L0B_SIZE; {INI_910B2} l0_b_size=65536")
_L0C = Param(128 * KiB, "B", f"{CATLASS} L0C_SIZE; {INI_910B2} l0_c_size=131072")
_UB = Param(192 * KiB, "B", f"{CATLASS} UB_SIZE; {INI_910B2} ub_size=196608 (per vector core)")
_L2 = Param(192 * MiB, "B", f"{INI_910B2} [SoCInfo] l2_size=201326592 (192 MiB)")
_GM = Param(64 * GiB, "B", f"{INI_910B2} [SoCInfo] memory_size=68719476736 (64 GiB HBM)")

_ASCEND_PATHS = (
    DataPath("GM", "L1", "MTE2", ASCENDC_ARCH),
    DataPath("L1", "L0A", "MTE1", ASCENDC_ARCH),
    DataPath("L1", "L0B", "MTE1", ASCENDC_ARCH),
    DataPath("L0A", "Cube", "Cube reads", ASCENDC_ARCH),
    DataPath("L0B", "Cube", "Cube reads", ASCENDC_ARCH),
    DataPath("Cube", "L0C", "Cube writes", ASCENDC_ARCH),
    DataPath("L0C", "GM", "FixPipe", ASCENDC_ARCH),
    DataPath("GM", "UB", "MTE2", ASCENDC_ARCH),
    DataPath("UB", "Vector", "Vector reads/writes", ASCENDC_ARCH),
    DataPath("UB", "GM", "MTE3", ASCENDC_ARCH),
)


def _ascend(name: str, scope: str, n_aic: Param, n_aiv: Param, peak: Param, bw: Param) -> HardwareProfile:
    return HardwareProfile(
        name=name,
        scope=scope,
        peak_flops=peak,
        hbm_bandwidth=bw,
        memories=(
            MemoryLevel("L0A", _L0A, n_aic, note="left matrix operand of the Cube"),
            MemoryLevel("L0B", _L0B, n_aic, note="right matrix operand of the Cube"),
            MemoryLevel("L0C", _L0C, n_aic, note="Cube accumulator (fp32)"),
            MemoryLevel("L1", _L1, n_aic, note="cube core staging buffer"),
            MemoryLevel("UB", _UB, n_aiv, note="Unified Buffer of each vector core"),
            MemoryLevel("L2", _L2, _count(1, "one L2 per chip"), note="shared by all cores; not per core"),
            MemoryLevel("GM", _GM, _count(1, "one HBM pool per chip"), _HBM_BW,
                        note="Global Memory = HBM; not per core"),
        ),
        compute=(
            ComputeUnit("Cube", peak, "16x16x16 fp16 matrix unit of each AI Core (AIC)"),
            ComputeUnit("Vector", None, "SIMD unit of each vector core (AIV); rate modelled later"),
        ),
        paths=_ASCEND_PATHS,
        notes="split architecture: AIC (cube core: MTE1, MTE2, Cube, FixPipe; L1, L0A/B/C) and "
              "2 AIV per AIC (vector core: MTE2, MTE3, Vector; UB); AIC and AIV exchange data "
              "through GM/L2",
    )


ASCEND_910B = _ascend("Huawei Ascend 910B (A2)", "chip", _N_AIC, _N_AIV, _CHIP_PEAK, _HBM_BW)
ASCEND_910B_AI_CORE = _ascend("Ascend 910B AI Core", "core",
                              _count(1, "one cube core (AIC) per AI Core"),
                              _count(2, f"2 vector cores (AIV) per AI Core: {ASCENDC_ARCH}"),
                              _AIC_PEAK, _HBM_BW_CORE)

#: every profile defined here, by a short key
PROFILES: dict[str, HardwareProfile] = {
    "a100-40gb": A100_40GB,
    "a100-80gb": A100_80GB,
    "h100": H100,
    "ascend-910b": ASCEND_910B,
    "ascend-910b-core": ASCEND_910B_AI_CORE,
}
