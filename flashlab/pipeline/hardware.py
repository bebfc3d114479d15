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

Per-core profiles also carry a :class:`CoreModel`: the in-order engines of one core (Ascend's
MTE2, MTE1, Cube, FixPipe, Vector, MTE3; an SM's async copy / TMA, tensor core, FP32 cores)
with their rates and fixed start latencies, the matrix unit's shape, and which memory level
plays which buffer role. :mod:`flashlab.pipeline.schedule` turns it into task durations.
Most engine rates inside a core are not published: they are ``"assumption"`` Params whose
source says why the number was chosen; :func:`with_core` moves them.
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

    Attributes
    ----------
    value
        the number in base units (bytes, byte/s, FLOP/s, Hz, a count)
    unit
        the unit of ``value``, e.g. ``"B"``, ``"B/s"``, ``"FLOP/s"``
    source
        where it comes from (document and section), or the formula for a derived number,
        or why it is assumed
    status
        ``"published"``, ``"derived"`` or ``"assumption"``
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


#: The buffer roles of the FlashAttention tile loop (see :class:`CoreModel`).
BUFFER_ROLES = ("L1", "L0A", "L0B", "L0C", "UB")
#: How a core's matrix and vector units hand tiles to each other (see :class:`CoreModel`).
EXCHANGES = ("gm", "registers")


@dataclass(frozen=True)
class Engine:
    """One in-order engine of a core: a hardware queue that runs its instructions one after
    the other (Ascend: MTE2, MTE1, Cube, FixPipe, Vector, MTE3; an SM: TMA, tensor core, ...).

    Attributes
    ----------
    name
        the lane name in timelines (``"MTE2"``, ``"TMA"``)
    rate
        bytes/s for a data mover, MAC/s for a matrix unit, element operations/s for a
        vector unit
    latency
        fixed start-up time of every task it runs, in seconds (issue, synchronisation
        flags, pipeline fill), added to the time the work itself takes
    """

    name: str
    rate: Param
    latency: Param
    note: str = ""


@dataclass(frozen=True)
class CoreModel:
    """What the pipeline model (:mod:`flashlab.pipeline.schedule`) needs of one core.

    Attributes
    ----------
    exchange
        ``"gm"`` when the matrix unit and the vector unit sit in different cores that
        pass tiles through GM/L2 (Ascend A2: the Cube writes S with FixPipe, the vector core
        reads it, writes P with MTE3, the cube core reads P back with MTE2); ``"registers"``
        when both work on register-resident tiles of one SM (FlashAttention-2/3 on GPUs)
    load
        the GM -> L1 mover (MTE2, cp.async, TMA); its rate is the GM bandwidth one core gets
    matmul
        the matrix unit, rate in MAC/s; it works in granules of ``mma_m x mma_n x mma_k``,
        so a product of ``m x n x k`` costs ``ceil(m/mma_m) ceil(n/mma_n) ceil(k/mma_k)``
        granules
    vector
        the vector unit(s) of the core, rate in fp32 element operations/s (all vector
        units of the core together); ``exp_rate`` the exponentials/s they compute
    store
        the mover that writes tiles to GM (MTE3, st.global)
    vector_units
        vector cores sharing the work of one core (2 AIV per AIC on Ascend A2);
        each takes ``1 / vector_units`` of the rows, and its UB must hold its share
    buffers
        ``(role, memory level name)`` pairs, the level of the profile that plays each
        role of :data:`BUFFER_ROLES` (roles sharing a level have their needs summed)
    l1_to_l0
        the L1 -> L0A/L0B mover (MTE1, ldmatrix), or ``None`` where the matrix unit
        reads L1 (shared memory) itself (Hopper's wgmma)
    acc_out
        the mover that drains the accumulator (FixPipe, L0C -> GM), or ``None`` where the
        accumulator is read in place (GPU registers)
    workspace_bandwidth
        bytes/s of the GM workspace through which the two kinds of core
        exchange S, P and partial outputs (``exchange == "gm"``); it stays in L2, so it is
        faster than HBM
    """

    exchange: str
    load: Engine
    matmul: Engine
    mma_m: Param
    mma_n: Param
    mma_k: Param
    vector: Engine
    exp_rate: Param
    store: Engine
    vector_units: Param
    buffers: tuple[tuple[str, str], ...]
    l1_to_l0: Engine | None = None
    acc_out: Engine | None = None
    workspace_bandwidth: Param | None = None
    note: str = ""

    def __post_init__(self):
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {EXCHANGES}; got {self.exchange!r}")
        roles = [r for r, _ in self.buffers]
        if sorted(roles) != sorted(BUFFER_ROLES):
            raise ValueError(f"buffers must map each of {BUFFER_ROLES} exactly once; got {roles}")
        if self.exchange == "gm" and (self.acc_out is None or self.workspace_bandwidth is None):
            raise ValueError("exchange='gm' needs acc_out (FixPipe) and workspace_bandwidth")

    def level_of(self, role: str) -> str:
        """The memory level name that plays buffer ``role`` (one of :data:`BUFFER_ROLES`)."""
        for r, level in self.buffers:
            if r == role:
                return level
        raise KeyError(f"no buffer role {role!r}; roles: {BUFFER_ROLES}")

    def engines(self) -> tuple[Engine, ...]:
        """The engines present, in pipeline order: load, l1_to_l0, matmul, acc_out, vector, store."""
        return tuple(e for e in (self.load, self.l1_to_l0, self.matmul, self.acc_out,
                                 self.vector, self.store) if e is not None)


@dataclass(frozen=True)
class HardwareProfile:
    """A chip (or one core of it) as the roofline and the chapters see it.

    peak_flops: dense fp16/bf16 matrix FLOP/s (the tensor core / Cube unit).
    hbm_bandwidth: main-memory (HBM, called GM on Ascend) byte/s available to this scope.
    memories: levels ordered from the compute outwards (fastest and smallest first).
    compute: units that compute (tensor core, Cube, Vector).
    paths: data movements between levels and units, each with the engine that performs it.
    core: the engines of one core for the pipeline model (per-core profiles only), or ``None``.
    """

    name: str
    scope: str
    peak_flops: Param
    hbm_bandwidth: Param
    memories: tuple[MemoryLevel, ...]
    compute: tuple[ComputeUnit, ...] = ()
    paths: tuple[DataPath, ...] = ()
    notes: str = ""
    core: CoreModel | None = None

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


#: the engines of a :class:`CoreModel` that stream to and from main memory: their rate is the
#: core's share of the HBM bandwidth (the profile's ``hbm_bandwidth``), see :func:`with_hbm_bandwidth`
HBM_ENGINES = ("load", "store")
#: the memory levels that *are* main memory (their ``bandwidth`` is the whole chip's HBM rate)
MAIN_MEMORY_LEVELS = ("HBM", "GM")


def with_hbm_bandwidth(profile: HardwareProfile, bytes_per_s: float,
                       source: str = "set by the reader") -> HardwareProfile:
    r"""A copy of ``profile`` with another main-memory bandwidth ``bytes_per_s`` for its scope,
    marked as an assumption, and every number derived from it moved with it.

    ``bytes_per_s`` is what ``profile.hbm_bandwidth`` means: the chip's bandwidth for a chip
    profile, one core's share $\beta_{core}$ for a per-core profile (pass
    $\beta_{chip} / 24$ for an Ascend 910B AI Core, as :func:`flashlab.rect.with_chip_bandwidth`
    and :func:`flashlab.widgets_pipeline.core_profile` do). The derived numbers are

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
    if isinstance(bytes_per_s, bool) or not isinstance(bytes_per_s, (int, float)) \
            or not math.isfinite(bytes_per_s) or bytes_per_s <= 0:
        raise ValueError(f"bytes_per_s must be a positive number of byte/s; got {bytes_per_s!r}")
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
    changes: dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                or not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number >= 0; got {value!r}")
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


def _ascend(name: str, scope: str, n_aic: Param, n_aiv: Param, peak: Param, bw: Param,
            core: CoreModel | None = None) -> HardwareProfile:
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
        core=core,
    )


# --- the engines of one AI Core, for the pipeline model -------------------------------------
MEMORY_RATES = ("CANN platform configs [AICoreMemoryRates] (byte/cycle per core) as quoted in "
                "CANN ops unit tests and third-party tooling tests")


def _cycles(n: int, clock: Param, why: str) -> Param:
    """A start latency of ``n`` cycles of ``clock``, in seconds (always an assumption)."""
    # t = n / f
    return Param(n / clock.value, "s", f"assumed {n} cycles at {clock.value / 1e9:g} GHz: {why}",
                 "assumption")


_LAT_DMA = "issue, address set-up and the first GM round trip; no figure found"
_LAT_ON_CHIP = "issue and the set/wait flags that order it; no figure found"
# share of the HBM bandwidth of one AI Core: beta_core = beta_chip / 24, the core profile's
# hbm_bandwidth; MTE2 and MTE3 (HBM_ENGINES) stream at it, and with_hbm_bandwidth keeps them so
_MTE2_RATE = Param(_HBM_BW_CORE.value, "B/s",
                   "hbm_bandwidth (1.6 TB/s, itself an assumption) / 24 AI Cores: one core's share "
                   "when all 24 stream at once", "derived")
# the GM workspace (S, P, partial O) stays in the 192 MiB L2: 110 byte/cycle x 1.8 GHz
_WORKSPACE_BW = Param(110 * _CUBE_FREQ.value, "B/s",
                      f"l2_rate=110 byte/cycle ({MEMORY_RATES}, for an Ascend910B1.ini; not "
                      "checked against a CANN package) x 1.8 GHz", "assumption")

ASCEND_910B_CORE_MODEL = CoreModel(
    exchange="gm",
    load=Engine("MTE2", _MTE2_RATE, _cycles(200, _CUBE_FREQ, _LAT_DMA), "GM -> L1 on the cube core"),
    l1_to_l0=Engine(
        "MTE1",
        # 256 byte/cycle x 1.8 GHz
        Param(256 * _CUBE_FREQ.value, "B/s",
              f"256 byte/cycle x 1.8 GHz: {MEMORY_RATES} give l1_to_l0_a_rate=512 and "
              "l1_to_l0_b_rate=256 for earlier Ascend chips; no 910B value found; the slower "
              "one is used for both operands", "assumption"),
        _cycles(20, _CUBE_FREQ, _LAT_ON_CHIP), "L1 -> L0A/L0B"),
    matmul=Engine(
        "CUBE",
        # 16*16*16 MAC/cycle x 1.8 GHz
        Param(_CUBE_MACS.value * _CUBE_FREQ.value, "MAC/s",
              f"16*16*16 MAC/cycle x 1.8 GHz ({INI_910B2} cube_m/n/k_size, cube_freq)", "derived"),
        _cycles(20, _CUBE_FREQ, "filling the Cube's pipeline; no figure found"),
        "one 16x16x16 fractal per cycle"),
    mma_m=Param(16, "elements", f"{INI_910B2} [AICoreSpec] cube_m_size=16"),
    mma_n=Param(16, "elements", f"{INI_910B2} [AICoreSpec] cube_n_size=16"),
    mma_k=Param(16, "elements", f"{INI_910B2} [AICoreSpec] cube_k_size=16 (fp16)"),
    acc_out=Engine("FIXPIPE", _WORKSPACE_BW, _cycles(50, _CUBE_FREQ, _LAT_ON_CHIP),
                   "L0C -> GM workspace; assumed limited by the workspace (L2) rate"),
    vector=Engine(
        "VECTOR",
        # 2 AIV x 64 fp32 lanes x 1.8 GHz
        Param(2 * 64 * _CUBE_FREQ.value, "element/s",
              "2 AIV x 64 fp32 operations/cycle x 1.8 GHz: one 256-byte vector repeat per cycle "
              "(ini [AICoreSpec] vec_calc_size=128 fp16 lanes); vector clock assumed equal to the "
              "cube clock", "assumption"),
        _cycles(50, _CUBE_FREQ, _LAT_ON_CHIP),
        "both vector cores together; each takes half of the rows"),
    exp_rate=Param(2 * 64 * _CUBE_FREQ.value, "exp/s",
                   "assumed to issue at the full vector rate; no figure found", "assumption"),
    store=Engine("MTE3", _MTE2_RATE, _cycles(200, _CUBE_FREQ, _LAT_DMA), "UB -> GM on the vector cores"),
    vector_units=_count(2, f"2 vector cores (AIV) per AI Core: {ASCENDC_ARCH}"),
    buffers=(("L1", "L1"), ("L0A", "L0A"), ("L0B", "L0B"), ("L0C", "L0C"), ("UB", "UB")),
    workspace_bandwidth=_WORKSPACE_BW,
    note="AIC engines MTE2, MTE1, CUBE, FIXPIPE; AIV engines VECTOR, MTE3 (the vector cores' own "
         "GM -> UB reads are counted in the VECTOR tasks)",
)


ASCEND_910B = _ascend("Huawei Ascend 910B (A2)", "chip", _N_AIC, _N_AIV, _CHIP_PEAK, _HBM_BW)
ASCEND_910B_AI_CORE = _ascend("Ascend 910B AI Core", "core",
                              _count(1, "one cube core (AIC) per AI Core"),
                              _count(2, f"2 vector cores (AIV) per AI Core: {ASCENDC_ARCH}"),
                              _AIC_PEAK, _HBM_BW_CORE, ASCEND_910B_CORE_MODEL)

# --------------------------------------------------------------------------------------------
# One SM of an A100 / H100, for comparison with one AI Core
# --------------------------------------------------------------------------------------------
PTX_ISA = "NVIDIA PTX ISA (warp-level / warpgroup-level matrix instructions)"
CUDA_GUIDE = ("CUDA C++ Programming Guide, throughput of native arithmetic instructions "
              "(16 results per clock per SM for exp2f on compute capability 8.x/9.0)")
FA3 = "Shah et al., FlashAttention-3 (2024), Sec. 3"
_A100_CLOCK = Param(1.41e9, "Hz", f"{A100_WP}: boost clock 1410 MHz")
_H100_CLOCK = Param(1.83e9, "Hz", "assumed ~1.83 GHz (H100 SXM5 boost clocks quoted between 1.755 "
                                  "and 1.98 GHz); only used for start latencies", "assumption")


def _per_sm(total: Param, sms: Param, unit: str, what: str, per: float = 1.0) -> Param:
    # x_SM = x_chip / (SMs * per)
    return Param(total.value / (sms.value * per), unit, f"{what} / {sms.value:g} SMs", "derived")


def _sm(name: str, chip: HardwareProfile, sms: Param, smem: Param, clock: Param,
        core: dict) -> HardwareProfile:
    hbm_share = _per_sm(chip.hbm_bandwidth, sms, "B/s", f"{chip.name} HBM bandwidth")
    return HardwareProfile(
        name=name,
        scope="core",
        peak_flops=_per_sm(chip.peak_flops, sms, "FLOP/s", f"{chip.name} dense fp16 peak"),
        hbm_bandwidth=hbm_share,
        memories=(
            MemoryLevel("registers", chip.memory("registers").capacity, _count(1, "one SM")),
            MemoryLevel("shared memory", smem, _count(1, "one SM")),
            MemoryLevel("HBM", chip.memory("HBM").capacity, _count(1, "one HBM pool per chip"),
                        chip.hbm_bandwidth, note="shared by all SMs; not per SM"),
        ),
        compute=(ComputeUnit("tensor core", _per_sm(chip.peak_flops, sms, "FLOP/s",
                                                     f"{chip.name} dense fp16 peak")),),
        paths=chip.paths,
        notes=f"one of the {sms.value:g} SMs of the {chip.name}",
        core=CoreModel(
            exchange="registers",
            load=Engine(core["load"], hbm_share, _cycles(200, clock, _LAT_DMA), "HBM -> shared memory"),
            store=Engine(core["store"], hbm_share, _cycles(200, clock, _LAT_DMA), "registers -> HBM"),
            vector_units=_count(1, "the SM's FP32 cores work on the tile in registers"),
            buffers=(("L1", "shared memory"), ("L0A", "registers"), ("L0B", "registers"),
                     ("L0C", "registers"), ("UB", "registers")),
            **{k: v for k, v in core.items() if k not in ("load", "store")},
        ),
    )


A100_SM = _sm(
    "NVIDIA A100 SXM4 80GB, one SM", A100_80GB, _A100_SMS,
    Param(164 * KiB, "B", f"{A100_WP}: shared memory configurable up to 164 KB per SM"),
    _A100_CLOCK,
    dict(load="cp.async", store="st.global",
         l1_to_l0=Engine("ldmatrix", _per_sm(Param(19e12, "B/s", FA1), _A100_SMS, "B/s",
                                             f"{FA1}: shared memory ~19 TB/s"),
                         _cycles(20, _A100_CLOCK, _LAT_ON_CHIP), "shared memory -> registers"),
         matmul=Engine("TENSOR", _per_sm(A100_80GB.peak_flops, _A100_SMS, "MAC/s",
                                         "312 TFLOPS dense fp16 / 2 FLOP per MAC", per=2.0),
                       _cycles(20, _A100_CLOCK, "filling the tensor core pipeline")),
         mma_m=Param(16, "elements", f"{PTX_ISA}: mma.sync m16n8k16 (fp16)"),
         mma_n=Param(8, "elements", f"{PTX_ISA}: mma.sync m16n8k16 (fp16)"),
         mma_k=Param(16, "elements", f"{PTX_ISA}: mma.sync m16n8k16 (fp16)"),
         vector=Engine("FP32", _per_sm(Param(19.5e12, "FLOP/s", A100_DS), _A100_SMS, "element/s",
                                       f"{A100_DS}: FP32 19.5 TFLOPS / 2 FLOP per FMA", per=2.0),
                       _cycles(20, _A100_CLOCK, _LAT_ON_CHIP), "the SM's 64 FP32 lanes"),
         exp_rate=Param(16 * _A100_CLOCK.value, "exp/s", f"{CUDA_GUIDE} x 1410 MHz", "derived")),
)

H100_SM = _sm(
    "NVIDIA H100 SXM5 80GB, one SM", H100, _H100_SMS,
    Param(228 * KiB, "B", f"{H100_WP}: shared memory up to 228 KB per SM"),
    _H100_CLOCK,
    dict(load="TMA", store="TMA store",
         matmul=Engine("TENSOR", _per_sm(H100.peak_flops, _H100_SMS, "MAC/s",
                                         "989.4 TFLOPS dense fp16 / 2 FLOP per MAC", per=2.0),
                       _cycles(20, _H100_CLOCK, "filling the tensor core pipeline"),
                       "wgmma reads its operands from shared memory: no separate L1 -> L0 mover"),
         mma_m=Param(64, "elements", f"{PTX_ISA}: wgmma.mma_async m64nNk16 (fp16)"),
         mma_n=Param(8, "elements", f"{PTX_ISA}: wgmma.mma_async m64nNk16, N a multiple of 8"),
         mma_k=Param(16, "elements", f"{PTX_ISA}: wgmma.mma_async m64nNk16 (fp16)"),
         vector=Engine("FP32", _per_sm(Param(67e12, "FLOP/s", H100_DS), _H100_SMS, "element/s",
                                       f"{H100_DS}: FP32 67 TFLOPS / 2 FLOP per FMA", per=2.0),
                       _cycles(20, _H100_CLOCK, _LAT_ON_CHIP), "the SM's 128 FP32 lanes"),
         exp_rate=_per_sm(Param(3.9e12, "exp/s", FA3), _H100_SMS, "exp/s",
                          f"{FA3}: 3.9 TFLOPS of special functions on H100 SXM5")),
)

#: every profile defined here, by a short key
PROFILES: dict[str, HardwareProfile] = {
    "a100-40gb": A100_40GB,
    "a100-80gb": A100_80GB,
    "h100": H100,
    "ascend-910b": ASCEND_910B,
    "ascend-910b-core": ASCEND_910B_AI_CORE,
    "a100-sm": A100_SM,
    "h100-sm": H100_SM,
}
