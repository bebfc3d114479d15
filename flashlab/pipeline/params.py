"""The hardware model's types: sourced numbers (:class:`Param`), memory levels, engines, profiles.

A profile is a frozen dataclass. Every number in it is a :class:`Param` that says where the
number comes from and whether it is

- ``"published"`` — stated by the vendor or by a paper (the source is named),
- ``"derived"`` — computed from published numbers (the formula is in the source string),
- ``"fitted"`` — chosen so that the model reproduces a stated measurement (the fit is in
  :mod:`flashlab.pipeline.calibrated`, the measurement in ``flashlab/data/npu_fa_measured.json``),
- ``"assumption"`` — a model parameter with no official figure behind it; the reader may move
  it (:func:`flashlab.pipeline.roofline.with_hbm_bandwidth`).

Per-core profiles also carry a :class:`CoreModel`: the in-order engines of one core (Ascend's
MTE2, MTE1, Cube, FixPipe, Vector, MTE3; an SM's async copy / TMA, tensor core, FP32 cores)
with their rates and fixed start latencies, the matrix unit's shape, and which memory level
plays which buffer role. :mod:`flashlab.pipeline.schedule` turns it into task durations.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from flashlab.arguments import as_real

__all__ = ["KiB", "MiB", "GiB", "STATUSES", "Param", "MemoryLevel", "ComputeUnit", "DataPath",
           "BUFFER_ROLES", "EXCHANGES", "Engine", "CoreModel", "HardwareProfile", "params"]


KiB = 1024
MiB = 1024 ** 2
GiB = 1024 ** 3

#: the kinds of evidence a :class:`Param` may carry
STATUSES = ("published", "derived", "fitted", "assumption")


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
        ``"published"``, ``"derived"``, ``"fitted"`` or ``"assumption"``
    low
        for an assumption, the low end of the range considered (``low <= value``); ``None``
        when not given
    high
        for an assumption, the high end of the range considered (``value <= high``); ``None``
        when not given
    """

    value: float
    unit: str
    source: str
    status: str = "published"
    low: float | None = None
    high: float | None = None

    def __post_init__(self):
        as_real("Param value", self.value, lo=0.0, what="an int or float")
        if self.status not in STATUSES:
            raise ValueError(f"Param status must be one of {STATUSES}; got {self.status!r}")
        if not self.source.strip():
            raise ValueError("Param source must name where the number comes from; got an empty string")
        if (self.low is None) != (self.high is None):
            raise ValueError(f"Param low and high come together; got low={self.low}, high={self.high}")
        if self.low is not None and self.high is not None and not self.low <= self.value <= self.high:
            raise ValueError(f"Param range must contain the value: low={self.low} <= {self.value} <= "
                             f"high={self.high} does not hold")

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
