r"""The FlashAttention forward tile loop of one core as a graph of engine tasks.

One core takes the q-blocks of ``seq_q`` one after the other; for each it walks the
``ceil(seq_kv / block_k)`` kv-blocks. One *step* $t$ is one (q-block $i$, kv-block $j$) pair. On
an Ascend AI Core (cube core AIC + 2 vector cores AIV, which hand tiles to each other through a
GM workspace that stays in L2) a step is

=========  =============  ========================================================================
engine     task           moves / computes
=========  =============  ========================================================================
MTE2       ``K``          $K_j$ ($b_k \times d_{qk}$) GM -> L1
MTE1       ``QK.c``       chunk $c$ of $Q_i$ and $K_j$ along $d_{qk}$, L1 -> L0A / L0B
CUBE       ``QK.c``       $S \mathrel{+}= Q_i K_j^T$, chunk by chunk into L0C
FIXPIPE    ``S``          $S$ (fp32) L0C -> GM workspace
VECTOR     ``softmax``    $m_{new} = \max(m, \mathrm{rowmax}(S))$, $P = e^{S - m_{new}}$, $\ell$
MTE3       ``P``          $P$ (fp16) UB -> GM workspace
MTE2       ``V``, ``P``   $V_j$ ($b_k \times d_v$) GM -> L1, $P$ GM workspace -> L1
MTE1       ``PV.c``       chunk $c$ of $P$ and $V_j$ along $b_k$, L1 -> L0A / L0B
CUBE       ``PV.c``       $O_{part} \mathrel{+}= P V_j$, chunk by chunk into L0C
FIXPIPE    ``O``          $O_{part}$ L0C -> GM workspace
VECTOR     ``rescale``    $O \leftarrow e^{m - m_{new}} O + O_{part}$
=========  =============  ========================================================================

and after the last kv-block of a q-block VECTOR ``final`` ($O / \ell$) and MTE3 ``out``. The two
vector cores split the rows and are drawn as one VECTOR engine; their own GM -> UB reads of
$S$ and $O_{part}$ are counted in the VECTOR tasks.

**Strategies** (the article's "自主管理L1缓存,优化计算流水排布" section). The L1 buffers hold
the B operand of each matmul ($K_j$ for $QK^T$, $V_j$ for $PV$) and the A operand $P$; $Q$
stays in L1 for its q-block.

- ``iterate_all``: the Matmul API's ``IterateAll()`` does its own GM -> L1 copy inside each
  matmul, so the copy for the next matmul starts only after the Cube finished the current one
  (and the copies for $PV$ only once $P$ is ready).
- ``self_mte2``: the kernel issues MTE2 itself (the API keeps MTE1), one buffer per operand.
  The buffer is free again as soon as MTE1 has copied the tile to L0 (the Cube works from L0),
  so the next copy overlaps the end of the matmul -- the gaps shrink but remain.
- ``ping_pong``: two buffers per operand (the ping and pong halves): the next tile streams in
  while MTE1 and the Cube still read the current one.
- ``n_buffers``: ``n_buffers = k`` buffers per operand (``self_mte2`` is k = 1, ``ping_pong``
  k = 2).

**RECT variants** change shapes and bytes: ``pad_v=True`` pads $V$ from $d_v$ to $d_{qk}$
(more bytes on MTE2 and FixPipe, more Cube work in $PV$, more vector work in the rescale);
``split_rope=r`` computes $S = Q_{nope} K_{nope}^T + Q_{rope} K_{rope}^T$ as two matmuls over
$d_{qk} - r$ and $r$ accumulated in L0C instead of one over the concatenated $d_{qk}$.

**Program order.** The Cube runs ``lookahead`` $QK^T$ products ahead of the $PV$ products
(``lookahead=1`` gives $QK_0, QK_1, PV_0, QK_2, PV_1, \ldots$, the shipped kernel's order, so
that the vector softmax of step $t$ overlaps the Cube's $QK_{t+1}$); MTE1, FixPipe and the
vector follow the Cube's order. With own MTE2 each copy is issued when its buffer can be
free (see :func:`build_fa_graph`).

**Durations** (:class:`Durations`, from the profile's
:class:`~flashlab.pipeline.hardware.CoreModel`): a copy takes
latency + bytes / bandwidth; a matmul chunk latency + $\lceil m/16 \rceil \lceil n/16 \rceil
\lceil k/16 \rceil$ / (1.8 GHz) on the 910B (granules of the matrix unit / its granule rate);
a vector task latency + element operations / throughput + exponentials / exp rate + the bytes
it reads from the workspace / the workspace bandwidth.

On a GPU SM profile (``exchange="registers"``) S, P and O stay in registers: no FixPipe, no
workspace round trip; the softmax task also rescales O in place and waits for the previous
$PV$ (the accumulator it rescales).
"""
from __future__ import annotations

import math
import time
from collections.abc import Hashable
from dataclasses import dataclass

from flashlab.pipeline.hardware import ASCEND_910B_AI_CORE, HardwareProfile
from flashlab.pipeline.params import CoreModel, Engine
from flashlab.pipeline.simulate import SimResult, TaskGraph, simulate, two_stage_graph
from flashlab.validation import as_int, as_real

__all__ = ["STRATEGIES", "KV_SOURCES", "BufferNeed", "FAShape", "resolve_buffers", "l0c_slots",
           "buffer_needs", "check_fit", "cube_order", "Durations", "FAGraphBuilder",
           "iterate_all_loads", "own_mte2_loads", "build_fa_graph", "simulate_fa", "bench_simulator"]

#: The strategies of :func:`build_fa_graph`.
STRATEGIES = ("iterate_all", "self_mte2", "ping_pong", "n_buffers")

#: Where the load engine reads K and V from (HBM share or L2 rate).
KV_SOURCES = ("hbm", "l2")


@dataclass(frozen=True)
class BufferNeed:
    """``nbytes`` of buffer ``role`` (on memory level ``level``) needed for ``what``."""

    role: str
    level: str
    what: str
    nbytes: int


@dataclass(frozen=True)
class FAShape:
    """The shapes of the tile loop. All sizes in elements; ``pad_v`` and ``split_rope`` as in
    :func:`build_fa_graph`."""

    seq_q: int
    seq_kv: int
    d_qk: int
    d_v: int
    block_q: int
    block_k: int
    pad_v: bool = False
    split_rope: int = 0
    dtype_bytes: int = 2
    acc_bytes: int = 4

    @property
    def d_v_eff(self) -> int:
        """The V head dim the kernel works with ($d_{qk}$ if V is padded, else $d_v$)."""
        return self.d_qk if self.pad_v else self.d_v

    @property
    def qk_parts(self) -> tuple[int, ...]:
        """The reduction dims of the QK^T matmuls, ``(d_qk,)`` concatenated or
        ``(d_qk - r, r)`` split (nope, rope)."""
        r = self.split_rope
        return (self.d_qk,) if r == 0 else (self.d_qk - r, r)

    @property
    def q_rows(self) -> list[int]:
        """The rows of each q-block (the last one may be shorter)."""
        return _cuts(self.seq_q, self.block_q)

    @property
    def kv_cols(self) -> list[int]:
        """The keys of each kv-block (the last one may be shorter)."""
        return _cuts(self.seq_kv, self.block_k)


def _cuts(size: int, block: int) -> list[int]:
    return [min(block, size - s) for s in range(0, size, block)]


def _positive_int(name: str, value) -> int:
    return as_int(name, value, lo=1)


def resolve_buffers(strategy: str, n_buffers: int | None) -> int:
    """The number of L1 buffers per operand a strategy uses (``iterate_all``: the API's one)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}; got {strategy!r}")
    fixed = {"iterate_all": 1, "self_mte2": 1, "ping_pong": 2}
    if strategy in fixed:
        if n_buffers is not None and n_buffers != fixed[strategy]:
            raise ValueError(f"strategy {strategy!r} uses {fixed[strategy]} buffer(s); got "
                             f"n_buffers={n_buffers!r} (use strategy='n_buffers' to choose)")
        return fixed[strategy]
    # a zero-buffer pipeline cannot hold a tile
    return as_int("n_buffers", n_buffers, lo=1, what="an int >= 1 (strategy 'n_buffers')")


def _core(profile: HardwareProfile):
    if not isinstance(profile, HardwareProfile):
        raise TypeError(f"profile must be a HardwareProfile; got {type(profile).__name__}")
    if profile.core is None:
        raise ValueError(f"profile {profile.name!r} has no core model; use a per-core profile "
                         "such as ASCEND_910B_AI_CORE, A100_SM or H100_SM")
    return profile.core


def l0c_slots(profile: HardwareProfile, shape: FAShape) -> int:
    """L0C accumulators that fit at once (at most 2): $\\lfloor L0C / \\max(S, O_{part}) \\rfloor$
    with $S$ = ``block_q x block_k`` and $O_{part}$ = ``block_q x d_v`` in fp32 (>= 1; if even
    one does not fit, :func:`check_fit` says so)."""
    core = _core(profile)
    cap = profile.memory(core.level_of("L0C")).capacity.value
    tile = shape.block_q * max(shape.block_k, shape.d_v_eff) * shape.acc_bytes
    return int(max(1, min(2, cap // tile)))


def buffer_needs(profile: HardwareProfile, shape: FAShape, n_buffers: int, *, base_k: int = 64,
                 l0_buffers: int = 2, l0c_buffers: int | None = None,
                 lookahead: int = 1) -> list[BufferNeed]:
    """What each buffer must hold for this tile loop (bytes per memory level role).

    Ascend (``exchange="gm"``): L1 holds $Q$ plus ``n_buffers`` K tiles and ``n_buffers`` V(+P)
    tiles; L0A/L0B ``l0_buffers`` chunks of ``base_k`` columns of the A and B operands; L0C the
    accumulators; each vector core's UB its share of the rows of $S$ (P is written over it),
    of $O$ and of $O_{part}$ (fp32), and $m$, $\\ell$.
    GPU (``"registers"``): shared memory holds Q, K and V tiles; registers hold $S$ (one per
    step in flight), $O$ and the operand fragments.
    """
    core = _core(profile)
    db, ab = shape.dtype_bytes, shape.acc_bytes
    bq, bk, dqk, dv = shape.block_q, shape.block_k, shape.d_qk, shape.d_v_eff
    gm = core.exchange == "gm"
    lvl = core.level_of
    needs = [
        BufferNeed("L1", lvl("L1"), f"Q tile {bq}x{dqk}", bq * dqk * db),
        BufferNeed("L1", lvl("L1"), f"{n_buffers} x B tile (K {bk}x{dqk} or V {bk}x{dv})",
                   n_buffers * bk * max(dqk, dv) * db),
    ]
    if gm:
        needs.append(BufferNeed("L1", lvl("L1"), f"{n_buffers} x A tile (P {bq}x{bk})",
                                n_buffers * bq * bk * db))
    if core.l1_to_l0 is not None:
        needs.append(BufferNeed("L0A", lvl("L0A"), f"{l0_buffers} x A chunk {bq}x{base_k}",
                                l0_buffers * bq * base_k * db))
        needs.append(BufferNeed("L0B", lvl("L0B"), f"{l0_buffers} x B chunk {max(bk, dv)}x{base_k}",
                                l0_buffers * max(bk, dv) * base_k * db))
    if gm:
        slots = l0c_buffers if l0c_buffers is not None else l0c_slots(profile, shape)
        needs.append(BufferNeed("L0C", lvl("L0C"), f"{slots} x accumulator {bq}x{max(bk, dv)} fp32",
                                slots * bq * max(bk, dv) * ab))
        rows = math.ceil(bq / int(core.vector_units.value))
        needs.append(BufferNeed("UB", lvl("UB"),
                                f"per vector core: S/P {rows}x{bk}, O and O_part {rows}x{dv} "
                                f"(fp32), m and l", (rows * bk + 2 * rows * dv + 2 * rows) * ab))
    else:
        needs.append(BufferNeed("L0C", lvl("L0C"), f"{1 + lookahead} x S {bq}x{bk} + O {bq}x{dv} fp32",
                                ((1 + lookahead) * bq * bk + bq * dv) * ab))
        needs.append(BufferNeed("UB", lvl("UB"), f"m and l ({bq} rows, fp32)", 2 * bq * ab))
    return needs


def check_fit(profile: HardwareProfile, needs: list[BufferNeed]) -> None:
    """Raise ValueError naming the buffer and the sizes if the needs of the roles that share a
    memory level exceed its capacity (per instance: one L1, one UB of one vector core)."""
    by_level: dict[str, list[BufferNeed]] = {}
    for need in needs:
        by_level.setdefault(need.level, []).append(need)
    for level, items in by_level.items():
        cap = profile.memory(level).capacity.value
        total = sum(n.nbytes for n in items)
        if total > cap:
            parts = " + ".join(f"{n.what} = {n.nbytes} B" for n in items)
            raise ValueError(f"the tiles do not fit in {level} of {profile.name}: {parts} = "
                             f"{total} B > {int(cap)} B ({cap / 1024:g} KiB); use smaller "
                             "blocks or fewer buffers")


class _Program:
    """Tasks collected per engine in program order under symbolic keys; deps by key."""

    def __init__(self, engines: tuple[str, ...]):
        self.engines = engines
        self.queues: dict[str, list[Hashable]] = {e: [] for e in engines}
        self.spec: dict[Hashable, dict] = {}

    def add(self, key: Hashable, engine: str, name: str, duration: float, deps=(), *,
            acquire: str | None = None, releases=(), kind: str = "", step: int = -1) -> Hashable:
        if key in self.spec:
            raise RuntimeError(f"duplicate task key {key!r}")  # a bug in this module
        self.queues[engine].append(key)
        self.spec[key] = dict(engine=engine, name=name, duration=duration, deps=tuple(deps),
                              acquire=acquire, releases=tuple(releases), kind=kind, step=step)
        return key

    def depend(self, key: Hashable, *deps: Hashable) -> None:
        """Add dependencies to a task already added."""
        self.spec[key]["deps"] += deps

    def graph(self, pools: dict[str, int], info: dict) -> TaskGraph:
        g = TaskGraph(pools=pools, engines=tuple(e for e in self.engines if self.queues[e]),
                      info=info)
        index = {}
        for e in self.engines:
            for key in self.queues[e]:
                index[key] = len(index)
        for e in self.engines:
            for key in self.queues[e]:
                s = self.spec[key]
                g.add(s["name"], s["engine"], s["duration"], [index[d] for d in s["deps"]],
                      acquire=s["acquire"], releases=[index[r] for r in s["releases"]],
                      kind=s["kind"], step=s["step"])
        return g


def cube_order(n_steps: int, lookahead: int) -> list[tuple[str, int]]:
    """The Cube's program order: ``("QK", t)`` and ``("PV", t)`` with the QK products
    ``lookahead`` steps ahead. ``lookahead=1``: QK0, QK1, PV0, QK2, PV1, ..., PV(n-1)."""
    order = []
    for t in range(n_steps):
        order.append(("QK", t))
        if t - lookahead >= 0:
            order.append(("PV", t - lookahead))
    order += [("PV", t) for t in range(max(0, n_steps - lookahead), n_steps)]
    return order


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
        self.workspace = core.workspace_bandwidth.value if self.gm else self.hbm
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


class FAGraphBuilder:
    """The tasks of one core's tile loop, stage by stage, collected in a ``_Program``.

    :func:`build_fa_graph` runs the stages in this order (each engine's program order is the
    order its tasks are added):

    1. the loads: :func:`iterate_all_loads` or :func:`own_mte2_loads` call :meth:`load_q`,
       :meth:`load_k`, :meth:`load_v`, :meth:`load_p` in MTE2's program order;
    2. :meth:`cube_stage`: per matmul of :func:`cube_order`, MTE1 and Cube chunks
       (:meth:`bmm1` $S = Q K^T$, :meth:`bmm2` $O_{part} = P V$), the release of its L1
       buffers (:meth:`free_l1`) and the FixPipe write-back (:meth:`fixpipe`);
    3. :meth:`vector_stage`: the online softmax (:meth:`softmax`, :meth:`rescale`,
       :meth:`finish`) and the MTE3 write-backs (:meth:`store_p`, :meth:`store_o`);
    4. :meth:`pools`: the buffer slots the tasks acquire.

    Task keys: ``("Q", i, part)``, ``("K", t, part)``, ``("V", t)``, ``("Pin", t)`` (MTE2),
    ``("M1", kind, t, w)`` (MTE1), ``("MM", kind, t, w)`` (Cube), ``("FX", kind, t)``
    (FixPipe), ``("SM", t)``, ``("RS", t)``, ``("FIN", i)`` (Vector), ``("Pout", t)``,
    ``("OUT", i)`` (MTE3), with ``kind`` ``"QK"`` or ``"PV"``, ``w`` the chunk and ``part`` 0
    (nope, or all of $d_{qk}$) or 1 (rope).
    """

    def __init__(self, core: CoreModel, shape: FAShape, strategy: str, n_buffers: int, *,
                 lookahead: int, base_k: int, kv_source: str, softmax_ops: float,
                 rescale_ops: float):
        self.core, self.shape, self.strategy, self.n_buffers = core, shape, strategy, n_buffers
        self.base_k, self.softmax_ops, self.rescale_ops = base_k, softmax_ops, rescale_ops
        self.cost = Durations(core, kv_source)
        self.gm = core.exchange == "gm"
        self.db, self.ab, self.dv = shape.dtype_bytes, shape.acc_bytes, shape.d_v_eff
        # steps t = (q-block i, kv-block j), i-major; the Cube's order of the 2T matmuls
        self.rows, self.cols = shape.q_rows, shape.kv_cols
        self.steps = [(i, j) for i in range(len(self.rows)) for j in range(len(self.cols))]
        self.last_of_block = {i * len(self.cols) + len(self.cols) - 1 for i in range(len(self.rows))}
        self.corder = cube_order(len(self.steps), lookahead)
        # QK^T reduction parts: (d_qk,) or (d_qk - r, r), named "" and "r" in task labels
        self.parts = shape.qk_parts
        self.part_names = ("", "r") if len(self.parts) == 2 else ("",)
        self.E_LOAD, self.E_MTE1 = core.load.name, (core.l1_to_l0.name if core.l1_to_l0 else None)
        self.E_MM, self.E_FIX = core.matmul.name, (core.acc_out.name if core.acc_out else None)
        self.E_VEC, self.E_STORE = core.vector.name, core.store.name
        self.prog = _Program(tuple(e for e in (self.E_LOAD, self.E_MTE1, self.E_MM, self.E_FIX,
                                               self.E_VEC, self.E_STORE) if e))

    def chunks(self, k: int) -> list[int]:
        """The L0 chunks of a reduction axis of length ``k``: ``base_k`` columns each."""
        return _cuts(k, self.base_k)

    def last_mm(self, kind: str, t: int) -> tuple:
        """Key of the last Cube task of matmul ``(kind, t)``."""
        if kind == "QK":
            n_work = _n_work(self.parts, self.base_k)
        else:
            n_work = len(self.chunks(self.cols[self.steps[t][1]]))
        return ("MM", kind, t, n_work - 1)

    # ---- loads: GM -> L1 on MTE2 ------------------------------------------------------------
    def load_q(self, t: int, only: int | None = None) -> None:
        """$Q_i$ (``rows x d`` per part, ``dtype_bytes`` each) HBM -> L1, into L1's one Q
        buffer; ``only`` the part ``only`` (split RoPE under ``IterateAll``)."""
        i = self.steps[t][0]
        for p, (d, nm) in enumerate(zip(self.parts, self.part_names)):
            if only is None or p == only:
                self.prog.add(("Q", i, p), self.E_LOAD, f"Q{nm}{i}",
                              self.cost.move(self.core.load, self.rows[i] * d * self.db, self.cost.hbm),
                              acquire="L1.Q" if p == 0 else None,
                              kind="load_q" if p == 0 else "load_rope", step=t)

    def load_k(self, t: int, only: int | None = None) -> None:
        """$K_j$ (``cols x d`` per part) HBM or L2 -> an L1 B buffer."""
        j = self.steps[t][1]
        for p, (d, nm) in enumerate(zip(self.parts, self.part_names)):
            if only is None or p == only:
                self.prog.add(("K", t, p), self.E_LOAD, f"K{nm}{t}",
                              self.cost.move(self.core.load, self.cols[j] * d * self.db, self.cost.kv),
                              acquire="L1.B" if p == 0 else None,
                              kind="load_k" if p == 0 else "load_rope", step=t)

    def load_v(self, t: int) -> None:
        """$V_j$ (``cols x d_v_eff``: padded to $d_{qk}$ with ``pad_v``) HBM or L2 -> an L1 B
        buffer."""
        j = self.steps[t][1]
        self.prog.add(("V", t), self.E_LOAD, f"V{t}",
                      self.cost.move(self.core.load, self.cols[j] * self.dv * self.db, self.cost.kv),
                      acquire="L1.B", kind="load_v", step=t)

    def load_p(self, t: int) -> None:
        """$P$ (``rows x cols``, fp16) GM workspace -> an L1 A buffer, after MTE3 wrote it
        (Ascend only: the vector cores hand $P$ to the cube core through GM)."""
        i, j = self.steps[t]
        self.prog.add(("Pin", t), self.E_LOAD, f"P{t}",
                      self.cost.move(self.core.load, self.rows[i] * self.cols[j] * self.db,
                                     self.cost.workspace),
                      [("Pout", t)], acquire="L1.A", kind="load_p", step=t)

    # ---- Cube: MTE1 L1 -> L0A / L0B, then the matrix unit into L0C --------------------------
    def cube_stage(self) -> None:
        """MTE1, Cube and FixPipe in the Cube's order: per matmul its chunks, the release of
        its L1 buffers, and (Ascend) its accumulator L0C -> GM."""
        for kind, t in self.corder:
            first, last, last_read = self.bmm1(t) if kind == "QK" else self.bmm2(t)
            self.free_l1(kind, t, last, last_read)
            if self.gm:
                self.fixpipe(kind, t, first, last)

    def bmm1(self, t: int) -> tuple:
        """$S = Q_i K_j^T$ (``rows x cols``), $2 \\cdot rows \\cdot cols \\cdot d_{qk}$ FLOPs:
        with split RoPE two accumulated products $Q_{nope} K_{nope}^T + Q_{rope} K_{rope}^T$,
        each in ``base_k`` chunks of the reduction axis."""
        j = self.steps[t][1]
        # S = sum over parts and chunks of Q[:, chunk] K[:, chunk]^T, accumulated in L0C
        work = [(p, c, kc) for p, d in enumerate(self.parts) for c, kc in enumerate(self.chunks(d))]
        return self._matmul("QK", t, work, b_rows=self.cols[j], out_n=self.cols[j])

    def bmm2(self, t: int) -> tuple:
        """$O_{part} = P V_j$ (``rows x d_v_eff``), $2 \\cdot rows \\cdot cols \\cdot d_v$ FLOPs
        ($d_{qk}$ with ``pad_v``), in ``base_k`` chunks of the keys."""
        j = self.steps[t][1]
        # O_part = sum over chunks of P[:, chunk] V[chunk, :]
        work = [(0, c, kc) for c, kc in enumerate(self.chunks(self.cols[j]))]
        return self._matmul("PV", t, work, b_rows=self.dv, out_n=self.dv)

    def operands(self, kind: str, t: int, p: int) -> list:
        """Keys of the tasks whose tiles chunk ``p`` of matmul ``(kind, t)`` reads: the L1
        copies of $Q_i, K_j$ or of $V_j$ and $P$ ($P$ from the softmax's registers on a GPU,
        where $PV$ also waits for the previous q-block's $O$ to be read out)."""
        i, j = self.steps[t]
        if kind == "QK":
            return [("Q", i, p), ("K", t, p)]
        data = [("V", t)] + ([("Pin", t)] if self.gm else [("SM", t)])
        if not self.gm and j == 0 and i > 0:
            data.append(("FIN", i - 1))  # the O registers are read out before reuse
        return data

    def _matmul(self, kind: str, t: int, work: list, b_rows: int, out_n: int) -> tuple:
        """One MTE1 copy and one Cube task per chunk ``(part, c, kc)`` of ``work``; returns the
        keys ``(first Cube task, last Cube task, last MTE1 copy or None)``."""
        i, j = self.steps[t]
        m = self.rows[i]
        first_key = last_key = last_read = None
        for w, (p, c, kc) in enumerate(work):
            label = f"{kind}{self.part_names[p] if kind == 'QK' else ''}{t}.{c}"
            task_kind = "rope" if (kind == "QK" and p == 1) else kind.lower()
            data = self.operands(kind, t, p)
            mm_deps = list(data)
            if self.E_MTE1:
                # the A chunk (Q or P, m x kc) and the B chunk (K or V, b_rows x kc): L1 -> L0A / L0B
                a_bytes = 0 if (kind == "PV" and not self.gm) else m * kc * self.db
                nbytes = a_bytes + b_rows * kc * self.db
                l1_to_l0 = self.core.l1_to_l0
                mte1 = self.prog.add(("M1", kind, t, w), self.E_MTE1, label,
                                     self.cost.move(l1_to_l0, nbytes, l1_to_l0.rate.value),
                                     data, acquire="L0", kind=task_kind, step=t)
                mm_deps = [mte1]
                last_read = mte1
            # the first chunk takes an L0C accumulator; each chunk frees its L0A/L0B buffer
            key = self.prog.add(("MM", kind, t, w), self.E_MM, label, self.cost.matmul(m, out_n, kc),
                                mm_deps, acquire="L0C" if (self.gm and w == 0) else None,
                                releases=[("M1", kind, t, w)] if self.E_MTE1 else [],
                                kind=task_kind, step=t)
            if first_key is None:
                first_key = key
            last_key = key
        return first_key, last_key, last_read

    def free_l1(self, kind: str, t: int, last_key: tuple, last_read: tuple | None) -> None:
        """Release the L1 buffers of matmul ``(kind, t)`` ($K_j$; $V_j$ and $P$; $Q_i$ after
        the q-block's last $QK^T$) after their last read."""
        i, j = self.steps[t]
        # the L1 buffers of this matmul's tiles are free again after their last read: with
        # IterateAll when the API returns (the Cube finished), with own L1 management as soon
        # as MTE1 has copied the last chunk to L0 (the Cube works from L0)
        rel = [("K", t, 0)] if kind == "QK" else [("V", t)] + ([("Pin", t)] if self.gm else [])
        if kind == "QK" and j == len(self.cols) - 1:
            rel.append(("Q", i, 0))
        frees = last_key if (self.strategy == "iterate_all" or last_read is None) else last_read
        self.prog.spec[frees]["releases"] += tuple(rel)

    # ---- write-back: FixPipe L0C -> GM, MTE3 UB -> GM ---------------------------------------
    def fixpipe(self, kind: str, t: int, first_key: tuple, last_key: tuple) -> None:
        """$S$ or $O_{part}$ (``rows x cols`` or ``rows x d_v_eff``, fp32) L0C -> GM workspace
        on FixPipe, after the matmul's last chunk; frees its L0C accumulator."""
        m = self.rows[self.steps[t][0]]
        out_n = self.cols[self.steps[t][1]] if kind == "QK" else self.dv
        out_bytes = m * out_n * self.ab
        self.prog.add(("FX", kind, t), self.E_FIX, f"{'S' if kind == 'QK' else 'O'}{t}",
                      self.cost.move(self.core.acc_out, out_bytes, self.cost.workspace), [last_key],
                      releases=[first_key], kind=kind.lower(), step=t)

    def store_p(self, t: int) -> None:
        """$P$ (``rows x cols``, fp16) UB -> GM workspace on MTE3, for the cube core's $PV$."""
        i, j = self.steps[t]
        m, n = self.rows[i], self.cols[j]
        self.prog.add(("Pout", t), self.E_STORE, f"P{t}",
                      self.cost.move(self.core.store, m * n * self.db, self.cost.workspace),
                      [("SM", t)], kind="load_p", step=t)

    def store_o(self, t: int) -> None:
        """The q-block's output $O_i$ (``rows x d_v_eff``) UB (registers) -> GM on MTE3."""
        i = self.steps[t][0]
        m = self.rows[i]
        self.prog.add(("OUT", i), self.E_STORE, f"O{i}",
                      self.cost.move(self.core.store, m * self.dv * self.db, self.core.store.rate.value),
                      [("FIN", i)], kind="store_o", step=t)

    # ---- Vector: the online softmax ---------------------------------------------------------
    def vector_stage(self) -> None:
        """The Vector's program (and MTE3's) in the Cube's order: the softmax after each
        $QK^T$, the rescale after each $PV$, the final division after a q-block's last $PV$."""
        for kind, t in self.corder:
            if kind == "QK":
                self.softmax(t)
                if self.gm:
                    self.store_p(t)
            else:
                if self.gm:
                    self.rescale(t)
                if t in self.last_of_block:
                    self.finish(t)
                    self.store_o(t)

    def softmax(self, t: int) -> None:
        """The online softmax of step ``t`` on ``rows x cols`` scores: ``softmax_ops``
        operations and one exponential per score, one exponential per row; on Ascend it reads
        $S$ (fp32) from the workspace, on a GPU it also rescales $O$ in its registers."""
        i, j = self.steps[t]
        m, n = self.rows[i], self.cols[j]
        if self.gm:
            # m_new = max(m, rowmax(S)); P = exp(S - m_new); l = e^{m - m_new} l + rowsum(P)
            self.prog.add(("SM", t), self.E_VEC, f"softmax{t}",
                          self.cost.vector(m * n * self.softmax_ops, m * n + m, read=m * n * self.ab),
                          [("FX", "QK", t)], kind="softmax", step=t)
        else:
            # same, and O <- e^{m - m_new} O in place: it must wait for the previous PV
            deps = [self.last_mm("QK", t)] + ([self.last_mm("PV", t - 1)] if j > 0 else [])
            self.prog.add(("SM", t), self.E_VEC, f"softmax{t}",
                          self.cost.vector(m * n * self.softmax_ops + m * self.dv, m * n + m), deps,
                          kind="softmax", step=t)

    def rescale(self, t: int) -> None:
        """$O \\leftarrow e^{m - m_{new}} O + O_{part}$ on ``rows x d_v_eff`` elements
        (``rescale_ops`` each), reading $O_{part}$ (fp32) from the workspace (Ascend)."""
        m = self.rows[self.steps[t][0]]
        # O <- e^{m - m_new} O + O_part
        self.prog.add(("RS", t), self.E_VEC, f"rescale{t}",
                      self.cost.vector(m * self.dv * self.rescale_ops, read=m * self.dv * self.ab),
                      [("FX", "PV", t)], kind="rescale", step=t)

    def finish(self, t: int) -> None:
        """$O = O / \\ell$ (``rows x d_v_eff`` divisions) after the q-block's last $PV$."""
        i = self.steps[t][0]
        m = self.rows[i]
        fin_deps = [("RS", t)] if self.gm else [self.last_mm("PV", t)]
        self.prog.add(("FIN", i), self.E_VEC, f"final{i}", self.cost.vector(m * self.dv), fin_deps,
                      kind="final", step=t)

    # ---- buffer slots -----------------------------------------------------------------------
    def pools(self, l0_buffers: int, l0c: int) -> dict[str, int]:
        """Slots per buffer pool: one L1 Q buffer, ``n_buffers`` L1 B buffers ($K_j$ or $V_j$)
        and (Ascend) A buffers ($P$), ``l0_buffers`` L0A/L0B chunk pairs, ``l0c``
        accumulators."""
        pools = {"L1.Q": 1, "L1.B": self.n_buffers}
        if self.gm:
            pools["L1.A"] = self.n_buffers
        if self.E_MTE1:
            pools["L0"] = l0_buffers
        if self.gm:
            pools["L0C"] = l0c
        return pools


def iterate_all_loads(b: FAGraphBuilder) -> None:
    """MTE2's program under ``IterateAll``: each matmul copies its own operands, after the
    previous matmul's Cube work (and $PV$'s after the softmax: the API is called once $P$ exists)."""
    prev = None
    for kind, t in b.corder:
        if kind == "QK":
            # split RoPE: two IterateAll calls (nope, then rope), each with its own copies
            for p in range(len(b.parts)):
                first = []
                if b.steps[t][1] == 0:
                    b.load_q(t, p)
                    first.append(("Q", b.steps[t][0], p))
                b.load_k(t, p)
                first.append(("K", t, p))
                if prev is not None:
                    for key in first:
                        b.prog.depend(key, prev)
                prev = ("MM", "QK", t, len(b.chunks(b.parts[0])) - 1)
        else:
            b.load_v(t)
            if b.gm:
                b.load_p(t)
            b.prog.depend(("V", t), ("SM", t))  # the API is called once P is ready
            if prev is not None:
                b.prog.depend(("V", t), prev)
        prev = b.last_mm(kind, t)


def own_mte2_loads(b: FAGraphBuilder) -> None:
    """MTE2's program with own copies into ``n_buffers`` L1 buffers per operand.

    The B tile ($K_t$ or $V_t$) of the matmul at Cube position $c$ is copied once the Cube
    reaches position $c - (n - 1)$ (the buffer it reuses is freed by the matmul at $c - n$);
    $P_t$ when the Cube reaches $PV_t$ (it waits for the softmax anyway). MTE2 runs in order,
    so the queue is sorted by (Cube position it is issued at, Cube position that reads it,
    B before P): everything a copy's buffer waits for is ahead of it in the queue, and the
    schedule cannot deadlock. More buffers move the B copies earlier in the queue — ahead of
    copies of $P$ that the Cube needs sooner.
    """
    pos = {mat: p for p, mat in enumerate(b.corder)}
    queue = []
    for t, (i, j) in enumerate(b.steps):
        if j == 0:
            # Q's one buffer is freed by the last QK of the previous q-block
            at = pos[("QK", t - 1)] + 0.5 if i > 0 else -1.0
            queue.append(((at, pos[("QK", t)], 0), b.load_q, t))
        for kind, load in (("QK", b.load_k), ("PV", b.load_v)):
            c = pos[(kind, t)]
            queue.append(((max(0, c - b.n_buffers + 1) - 0.5, c, 0), load, t))
        if b.gm:
            queue.append(((pos[("PV", t)] - 0.5, pos[("PV", t)], 1), b.load_p, t))
    for _, load, t in sorted(queue, key=lambda item: item[0]):
        load(t)


def build_fa_graph(profile: HardwareProfile, strategy: str, seq_q: int, seq_kv: int, d_qk: int,
                   d_v: int, block_q: int, block_k: int, *, n_buffers: int | None = None,
                   pad_v: bool = False, split_rope: int = 0, lookahead: int = 1,
                   base_k: int = 64, l0_buffers: int = 2, l0c_buffers: int | None = None,
                   kv_source: str = "hbm", dtype_bytes: int = 2, softmax_ops: int = 5,
                   rescale_ops: int = 2) -> TaskGraph:
    """The task graph of the FlashAttention forward on one core of ``profile``.

    Parameters
    ----------
    profile : a per-core :class:`~flashlab.pipeline.hardware.HardwareProfile` (with ``core``)
    strategy : one of :data:`STRATEGIES` (see the module docstring)
    seq_q, seq_kv : rows of Q this core handles, and keys
    d_qk, d_v : head dims of Q/K and of V
    block_q, block_k : tile sizes (any ints >= 1; short last tiles are handled)
    n_buffers : L1 buffers per operand for ``strategy="n_buffers"``
    pad_v : V padded from ``d_v`` to ``d_qk`` (the baseline before RECT-FA; needs
        ``d_v <= d_qk``)
    split_rope : 0 for one QK^T over the concatenated ``d_qk``; ``r`` for two matmuls over
        ``d_qk - r`` (nope) and ``r`` (rope) accumulated in L0C
    lookahead : 0 or 1, how many QK^T products the Cube runs ahead of PV
    base_k : columns of the reduction axis per L0A/L0B chunk (the Matmul API's baseK;
        assumption 64)
    l0_buffers : L0A/L0B chunk buffers (the API's L0 double buffering; assumption 2)
    l0c_buffers : accumulators in L0C (default as many as fit, at most 2)
    kv_source : ``"hbm"`` reads K and V at the load engine's rate (the HBM share of one core),
        ``"l2"`` at the workspace (L2) rate, as when other cores already pulled them into L2
    dtype_bytes : bytes per element of Q, K, V, P (2 for fp16/bf16); accumulators are fp32
    softmax_ops : vector operations per element of S (max, subtract, sum, cast, update;
        assumption 5), plus one exponential
    rescale_ops : vector operations per element of O in the rescale (multiply-add, 2)

    Returns
    -------
    TaskGraph
        tasks in each engine's program order, the buffer pools, and ``info`` (shapes, useful
        and executed FLOPs, K/V bytes, the buffer plan)

    Raises
    ------
    ValueError
        for a bad argument, or tiles that do not fit the profile's buffers (the message names
        the buffer and the sizes)

    Notes
    -----
    Own MTE2 (every strategy but ``iterate_all``) issues each copy when the Cube reaches the
    matmul ``n_buffers - 1`` positions before the one that reads it (the buffer it reuses is
    freed by the matmul ``n_buffers`` positions before), and the copy of $P$ when the Cube
    reaches its $PV$. MTE2 runs in order, so everything a copy's buffer waits for is ahead of
    it in the queue and the schedule cannot deadlock.
    """
    core = _core(profile)
    nb = resolve_buffers(strategy, n_buffers)
    for name, value in (("seq_q", seq_q), ("seq_kv", seq_kv), ("d_qk", d_qk), ("d_v", d_v),
                        ("block_q", block_q), ("block_k", block_k), ("base_k", base_k),
                        ("l0_buffers", l0_buffers), ("dtype_bytes", dtype_bytes)):
        _positive_int(name, value)
    if l0c_buffers is not None:
        _positive_int("l0c_buffers", l0c_buffers)
    if lookahead not in (0, 1):
        raise ValueError(f"lookahead must be 0 or 1; got {lookahead!r}")
    if pad_v and d_v > d_qk:
        raise ValueError(f"pad_v pads V up to d_qk, so it needs d_v <= d_qk; got d_v={d_v}, d_qk={d_qk}")
    as_int("split_rope", split_rope, lo=0, hi=d_qk - 1)
    if kv_source not in KV_SOURCES:
        raise ValueError(f"kv_source must be one of {KV_SOURCES}; got {kv_source!r}")
    for name, value in (("softmax_ops", softmax_ops), ("rescale_ops", rescale_ops)):
        as_real(name, value, lo=0)

    shape = FAShape(seq_q, seq_kv, d_qk, d_v, block_q, block_k, pad_v, split_rope, dtype_bytes)
    needs = buffer_needs(profile, shape, nb, base_k=base_k, l0_buffers=l0_buffers,
                         l0c_buffers=l0c_buffers, lookahead=lookahead)
    check_fit(profile, needs)
    gm = core.exchange == "gm"
    l0c = (l0c_buffers or l0c_slots(profile, shape)) if gm else 0
    b = FAGraphBuilder(core, shape, strategy, nb, lookahead=lookahead, base_k=base_k,
                       kv_source=kv_source, softmax_ops=softmax_ops, rescale_ops=rescale_ops)
    # 1. MTE2: Q, K, V (and P on Ascend) in the strategy's order
    if strategy == "iterate_all":
        iterate_all_loads(b)
    else:
        own_mte2_loads(b)
    # 2. MTE1, Cube and FixPipe in the Cube's order
    b.cube_stage()
    # 3. Vector and MTE3 in the same order
    b.vector_stage()
    # 4. the buffer slots the tasks acquire and release
    pools = b.pools(l0_buffers, l0c)
    info = _info(profile, strategy, nb, shape, lookahead, kv_source, needs, pools, b.steps, len(b.steps))
    return b.prog.graph(pools, info)


def _n_work(parts: tuple[int, ...], base_k: int) -> int:
    return sum(len(_cuts(d, base_k)) for d in parts)


def _info(profile, strategy, nb, shape: FAShape, lookahead, kv_source, needs, pools, steps, T) -> dict:
    """Shapes, useful FLOPs and bytes of the loop, for tables and titles."""
    rows, cols = shape.q_rows, shape.kv_cols
    flops = sum(2 * rows[i] * cols[j] * (shape.d_qk + shape.d_v) for i, j in steps)
    flops_done = sum(2 * rows[i] * cols[j] * (shape.d_qk + shape.d_v_eff) for i, j in steps)
    kv_bytes = sum(cols[j] * (shape.d_qk + shape.d_v_eff) * shape.dtype_bytes for _, j in steps)
    return {
        "profile": profile.name, "strategy": strategy, "n_buffers": nb, "lookahead": lookahead,
        "seq_q": shape.seq_q, "seq_kv": shape.seq_kv, "d_qk": shape.d_qk, "d_v": shape.d_v,
        "d_v_eff": shape.d_v_eff, "block_q": shape.block_q, "block_k": shape.block_k,
        "pad_v": shape.pad_v, "split_rope": shape.split_rope, "kv_source": kv_source,
        "steps": T, "useful_flops": flops, "executed_flops": flops_done, "kv_bytes": kv_bytes,
        "pools": dict(pools), "buffer_needs": list(needs),
    }


# ------------------------------------------------------------------ build and simulate
def simulate_fa(profile, strategy: str, seq_q: int, seq_kv: int, d_qk: int, d_v: int,
                block_q: int, block_k: int, **options) -> SimResult:
    """Simulate the FlashAttention forward tile loop of one core.

    Builds the task graph with :func:`build_fa_graph` (same
    arguments; ``options`` are its keyword options ``n_buffers``, ``pad_v``, ``split_rope``,
    ``lookahead``, ...) and runs :func:`~flashlab.pipeline.simulate.simulate`. The result has ``.makespan`` (seconds),
    ``.timeline``, ``.utilization``, ``.occupancy`` and ``.graph.info`` (shapes, bytes moved,
    FLOPs, the buffer plan).
    """
    graph = build_fa_graph(profile, strategy, seq_q, seq_kv, d_qk, d_v, block_q, block_k, **options)
    return simulate(graph)


def bench_simulator(n_tasks: int = 100_000, repeat: int = 3) -> dict:
    """Time the simulator on about ``n_tasks`` tasks (not a unit test: run it by hand).

    Two graphs: the two-stage pipeline (``n_tasks`` tasks) and the FlashAttention tile loop
    on an Ascend 910B AI Core (ping-pong, 128 x 128 tiles, D = 192/128, enough kv-blocks for
    about ``n_tasks`` tasks). Returns the best of ``repeat`` wall-clock times for building and
    simulating each, and tasks per second.
    """
    def best(fn):
        times, out = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return min(times), out

    out = {}
    t_build, g = best(lambda: two_stage_graph(1.0, 2.0, n_tasks // 2, 2))
    t_sim, _ = best(lambda: simulate(g))
    out["two_stage"] = {"tasks": len(g.tasks), "build_s": t_build, "simulate_s": t_sim,
                        "tasks_per_s": len(g.tasks) / t_sim}
    probe = build_fa_graph(ASCEND_910B_AI_CORE, "ping_pong", 128, 128 * 8, 192, 128, 128, 128)
    per_block = len(probe.tasks) / 8
    n_kv = max(1, round(n_tasks / per_block))
    t_build, g = best(lambda: build_fa_graph(ASCEND_910B_AI_CORE, "ping_pong", 128, 128 * n_kv,
                                             192, 128, 128, 128))
    t_sim, _ = best(lambda: simulate(g))
    out["flash_attention"] = {"tasks": len(g.tasks), "build_s": t_build, "simulate_s": t_sim,
                              "tasks_per_s": len(g.tasks) / t_sim}
    return out
