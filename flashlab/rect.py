r"""RECT-FA end to end: the three optimizations composed in one model of an MLA attention.

The Ascend article (【昇腾热点算子大解密】消除冗余计算,释放硬件潜力,FlashAttention如何在大模型训练提速30%,
2025-06-25) makes three changes to the FlashAttention (FA) operator of an MLA model:

``"native_v"``
    the kernel computes $PV$ with V's own head dim $D_v = 128$ instead of V padded to
    $D = 192$: the separate **Pad V** and **Slice O** operators disappear, and so do a third
    of the $PV$ work and of the V traffic inside the kernel;
``"split_rope"``
    the kernel takes $(Q^C, K^C)$ and $(Q^R, K^R)$ as two operand pairs and accumulates
    $Q^R {K^R}^\top$ into the score tile of $Q^C {K^C}^\top$: the separate **expand** of the
    shared $k^R$ head and the two **Concat** operators disappear; the kernel runs two matmuls
    of reduction dims 128 and 64 instead of one of 192;
``"ping_pong"``
    the kernel issues its own GM -> L1 copies (MTE2) into two L1 buffers instead of letting
    the Matmul API's ``IterateAll()`` copy each operand just before it is used.

**The model of one forward** for a set of ideas (:func:`compose`) is the sum of two parts.

*The separate operators* (pad, slice, expand, concat) move data through HBM and compute
nothing. Each one's time is its compulsory traffic (bytes read + bytes written, from
:func:`flashlab.cost.mla_forward_steps`) over the chip's HBM bandwidth $\beta$:

$$
t_{\text{op}} = \frac{Q_{\text{read}} + Q_{\text{written}}}{\beta}.
$$

*The FA kernel* is the pipeline model of one AI Core (:func:`flashlab.pipeline.schedule.simulate_fa`):
a core runs its query blocks (q-blocks) one after the other, each against its kv-blocks. In
the simulator the time of a stream of q-blocks is affine in their number (after the first,
every q-block costs the same), and the cost of one q-block is affine in its number $n$ of
kv-blocks, so :func:`qblock_model` fits

$$
t_{\text{q-block}}(n) = a + b\,n
$$

from four simulations (1 and 2 q-blocks, at $n = N/2$ and $n = N$ with $N$ the kv-blocks of
the longest row). The whole problem has $B H$ heads, each with q-blocks $i = 0, 1, \ldots$ of
$n_i$ kv-blocks ($n_i = N$ without a mask; with the top-left causal mask the blocks up to the
diagonal), spread evenly over $c$ AI Cores:

$$
t_{\text{kernel}} = \frac{B H}{c} \sum_i \big(a + b\,n_i\big).
$$

Assumptions (all of them, so the reader can move them): perfect load balance over the
cores; the pipeline's fill and drain once per core left out; the masked part of a diagonal
tile computed in full (as the real kernel does); each core's K/V tiles read from HBM at
$\beta / c$ (``kv_source="hbm"``) or from the L2 cache (``"l2"``); the separate operators
run at the full HBM bandwidth with no launch overhead; nothing overlaps the separate
operators with the kernel. The backward (:func:`compose_backward`) has no pipeline model:
its kernel is timed with the roofline, $\max(F/\pi, Q/\beta)$.

This module sits above :mod:`flashlab.pipeline` because the forward kernel's time *is* the
pipeline simulation of one AI Core (:func:`qblock_model`); the operator costs it adds come
from :mod:`flashlab.cost` and the operator names from :mod:`flashlab.dataflows`.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from flashlab import cost, dataflows
from flashlab.arguments import as_bool, as_int, as_real
from flashlab.dataflows import IDEAS, KERNEL_STEPS, REMOVES, Dataflow, Idea, Step
from flashlab.pipeline.params import HardwareProfile
from flashlab.pipeline.profiles import ASCEND_910B_CORES
from flashlab.pipeline.roofline import with_hbm_bandwidth
from flashlab.pipeline.schedule import simulate_fa
from flashlab.rope import DEEPSEEK_V3_HEADS, DEEPSEEK_V3_NOPE_DIM, DEEPSEEK_V3_ROPE_DIM, DEEPSEEK_V3_V_DIM

__all__ = ["IDEA_LABELS", "MLAProblem", "check_ideas", "label",
           "all_combinations", "dataflow_of", "kernel_options", "separate_steps", "op_seconds",
           "chip_bandwidth", "with_chip_bandwidth", "QBlockModel", "qblock_model",
           "kernel_seconds", "Composition", "compose", "compose_backward", "speedup",
           "RooflinePoint", "kernel_roofline_by_hit", "break_even_hit"]

#: short names of the ideas for tables and legends
IDEA_LABELS = {idea: idea.label for idea in IDEAS}


@dataclass(frozen=True)
class MLAProblem:
    """The attention of one MLA layer for one micro-batch, as the FA operator sees it.

    The defaults are DeepSeek-V3's (:mod:`flashlab.rope`: 128 heads, head dims 128/64/128)
    with one 4096-token sequence (its pre-training length, DeepSeek-V3 Technical Report,
    arXiv:2412.19437) and bf16 operands.

    Attributes
    ----------
    batch
        $B$, sequences in the micro-batch
    heads
        $H$, attention heads
    seq
        the sequence length (of the queries and of the keys)
    d_nope
        $D_n$, the NoPE head dim of Q and K (DeepSeek-V3: 128)
    d_rope
        $D_r$, the RoPE head dim of Q and K (DeepSeek-V3: 64)
    d_v
        $D_v$, V's head dim (DeepSeek-V3: 128)
    causal
        top-left causal mask (key $j \\le$ query $i$)
    elem
        bytes per element of Q, K, V, O (2 for bf16/fp16)
    block_q
        the kernel's q-block rows (the shipped kernel: 128)
    block_k
        the kernel's kv-block keys (the shipped kernel: 128)
    """

    batch: int = 1
    heads: int = DEEPSEEK_V3_HEADS
    seq: int = 4096
    d_nope: int = DEEPSEEK_V3_NOPE_DIM
    d_rope: int = DEEPSEEK_V3_ROPE_DIM
    d_v: int = DEEPSEEK_V3_V_DIM
    causal: bool = True
    elem: int = 2
    block_q: int = 128
    block_k: int = 128

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "causal":
                as_bool("causal", value)
            else:
                as_int(f.name, value, lo=1)
        if self.d_v > self.d_nope + self.d_rope:
            raise ValueError(f"d_v must be <= d_nope + d_rope = {self.d_nope + self.d_rope} "
                             f"(the baseline pads V up to the QK dim); got {self.d_v}")

    @property
    def d_qk(self) -> int:
        """$D = D_n + D_r$, the QK head dim after concatenation."""
        return self.d_nope + self.d_rope

    def kv_blocks(self) -> list[int]:
        """$n_i$: the kv-blocks q-block $i$ of one head visits (all $N$ of them without a mask;
        with the causal mask those up to the diagonal, $\\lceil \\min((i+1) B_r, S) / B_c \\rceil$)."""
        n_kv = math.ceil(self.seq / self.block_k)
        n_q = math.ceil(self.seq / self.block_q)
        if not self.causal:
            return [n_kv] * n_q
        # q-block i holds rows up to (i + 1) B_r - 1: they see keys 0 .. min((i + 1) B_r, S) - 1
        return [math.ceil(min((i + 1) * self.block_q, self.seq) / self.block_k) for i in range(n_q)]

    def cost_args(self) -> tuple[tuple, dict]:
        """``(args, kwargs)`` for :func:`flashlab.cost.mla_forward_steps` / ``mla_backward_steps``."""
        return ((self.batch, self.heads, self.seq, self.d_nope, self.d_rope, self.d_v),
                dict(causal=self.causal, elem=self.elem))


def check_ideas(ideas: Iterable[str]) -> frozenset[dataflows.Idea]:
    """``ideas`` as a frozenset, each one of :data:`~flashlab.dataflows.IDEAS` (``ValueError``
    naming any other)."""
    names = tuple(map(str, IDEAS))
    if isinstance(ideas, str):
        raise TypeError(f"ideas must be an iterable of names from {names}, not one string; "
                        f"got {ideas!r} (write ({ideas!r},))")
    out = frozenset(ideas)
    unknown = sorted(map(str, out - set(IDEAS)))
    if unknown:
        raise ValueError(f"ideas must be names from {names}; got {unknown}")
    return frozenset(dataflows.Idea(i) for i in out)


def label(ideas: Iterable[str]) -> str:
    """A name for a set of ideas: ``"baseline"``, ``"native V + ping-pong"``, ``"RECT-FA (all three)"``."""
    s = check_ideas(ideas)
    if not s:
        return "baseline"
    if s == set(IDEAS):
        return "RECT-FA (all three)"
    return " + ".join(IDEA_LABELS[i] for i in IDEAS if i in s)


def all_combinations() -> list[frozenset[str]]:
    """The 8 subsets of :data:`~flashlab.dataflows.IDEAS`, from the baseline (none) to all three,
    by size."""
    return [frozenset(c) for r in range(len(IDEAS) + 1) for c in itertools.combinations(IDEAS, r)]


def dataflow_of(ideas: Iterable[str]) -> Dataflow:
    """The :class:`~flashlab.dataflows.Dataflow` of the operators these ideas leave:
    ``"baseline"``, ``"native_v"``, ``"split_rope"`` or ``"rect"`` (``"ping_pong"`` changes the
    schedule inside the kernel, not the operators)."""
    return dataflows.dataflow_of(check_ideas(ideas))


def kernel_options(ideas: Iterable[str], problem: MLAProblem) -> dict:
    """The :func:`flashlab.pipeline.schedule.simulate_fa` options of the FA kernel for these ideas:
    ``strategy`` (``"ping_pong"`` or the Matmul API's ``"iterate_all"``), ``pad_v`` (V padded
    to $D$ unless ``"native_v"``), ``split_rope`` ($D_r$ with ``"split_rope"``, else 0)."""
    s = check_ideas(ideas)
    return dict(strategy="ping_pong" if Idea.PING_PONG in s else "iterate_all",
                pad_v=Idea.NATIVE_V not in s,
                split_rope=problem.d_rope if Idea.SPLIT_ROPE in s else 0)


def separate_steps(problem: MLAProblem, ideas: Iterable[str], *, backward: bool = False
                   ) -> list[Step]:
    """The separate operators around the FA kernel that remain with these ideas, with their
    bytes (:class:`flashlab.dataflows.Step`): the baseline's pad, slice, expand and concat (or
    their gradients, with ``backward=True``) minus those :data:`~flashlab.dataflows.REMOVES` names
    for each idea."""
    s = check_ideas(ideas)
    args, kw = problem.cost_args()
    steps = (cost.mla_backward_steps(*args, dataflow=Dataflow.BASELINE, block_q=problem.block_q, **kw)
             if backward else cost.mla_forward_steps(*args, dataflow=Dataflow.BASELINE, **kw))
    removed = {name for idea in s for name in REMOVES[idea]}
    return [st for st in steps if st.name not in KERNEL_STEPS and st.name not in removed]


def op_seconds(step: Step, bandwidth: float) -> float:
    """Seconds of a separate operator that only moves data: (read + written) / ``bandwidth``."""
    as_real("bandwidth", bandwidth, lo=0, lo_open=True, what="a positive number of byte/s")
    # t = (Q_read + Q_written) / beta
    return (step.bytes_read + step.bytes_written) / bandwidth


def chip_bandwidth(profile: HardwareProfile, cores: int = ASCEND_910B_CORES) -> float:
    """The chip's HBM byte/s implied by a per-core profile: its share times ``cores``."""
    # beta_chip = beta_core * c
    return profile.hbm_bandwidth.value * cores


def with_chip_bandwidth(profile: HardwareProfile, bytes_per_s: float,
                        cores: int = ASCEND_910B_CORES) -> HardwareProfile:
    """A copy of the per-core ``profile`` for a chip of ``bytes_per_s`` HBM bandwidth shared by
    ``cores`` AI Cores: the core's HBM share becomes ``bytes_per_s / cores``, and
    :func:`~flashlab.pipeline.hardware.with_hbm_bandwidth` moves its load (MTE2) and store (MTE3)
    engines with it (each marked as an assumption)."""
    as_real("bytes_per_s", bytes_per_s, lo=0, lo_open=True, what="a positive number of byte/s")
    _check_cores(cores)
    # beta_core = beta_chip / c
    share = bytes_per_s / cores
    why = f"chip HBM bandwidth {bytes_per_s / 1e12:g} TB/s / {cores} AI Cores (set by the reader)"
    return with_hbm_bandwidth(profile, share, why)


def _check_cores(cores) -> None:
    as_int("cores", cores, lo=1)


@dataclass(frozen=True)
class QBlockModel:
    """$t(n) = a + b\\,n$: the seconds one more q-block with $n$ kv-blocks adds to a core's
    stream (``a`` per q-block, ``b`` per kv-block), fitted at ``n_fit``."""

    a: float
    b: float
    n_fit: tuple[int, int]

    def __call__(self, n: int) -> float:
        # t(n) = a + b n
        return self.a + self.b * n


def qblock_model(profile: HardwareProfile, problem: MLAProblem, ideas: Iterable[str], *,
                 kv_source: str = "hbm") -> QBlockModel:
    """Fit $t(n) = a + b\\,n$ from four simulations of the kernel on one core of ``profile``.

    The cost of a q-block in a stream is the makespan of 2 q-blocks minus that of 1; it is
    taken at $n = \\lceil N/2 \\rceil$ and $n = N$ kv-blocks ($N$ those of the longest row),
    and the line through the two points is returned. It matches further simulations to 1 % for
    $n \\ge 3$ (the tests check it); a q-block of one or two kv-blocks overlaps differently with
    its neighbours (the line is off by up to ~45 % at $n = 1$, a tiny share of a causal head).
    """
    opts = kernel_options(ideas, problem)
    strategy = opts.pop("strategy")
    n_max = max(problem.kv_blocks())
    n_lo = math.ceil(n_max / 2)  # == n_max only for a single kv-block: a flat line

    def per_qblock(n: int) -> float:
        # t(n) = T(2 q-blocks, n) - T(1 q-block, n)
        one, two = (simulate_fa(profile, strategy, m * problem.block_q, n * problem.block_k,
                                problem.d_qk, problem.d_v, problem.block_q, problem.block_k,
                                dtype_bytes=problem.elem, kv_source=kv_source, **opts).makespan
                    for m in (1, 2))
        return two - one

    t_lo, t_hi = per_qblock(n_lo), per_qblock(n_max)
    # the line through (n_lo, t_lo) and (N, t_hi)
    b = (t_hi - t_lo) / (n_max - n_lo) if n_max > n_lo else 0.0
    return QBlockModel(t_lo - b * n_lo, b, (n_lo, n_max))


def kernel_seconds(profile: HardwareProfile, problem: MLAProblem, ideas: Iterable[str], *,
                   cores: int = ASCEND_910B_CORES, kv_source: str = "hbm") -> float:
    """Modelled seconds of the FA forward kernel on the whole problem:
    $\\frac{BH}{c} \\sum_i t(n_i)$ (:func:`qblock_model`, every q-block of every head, spread
    evenly over ``cores``)."""
    _check_cores(cores)
    t = qblock_model(profile, problem, ideas, kv_source=kv_source)
    # t_kernel = (B H / c) * sum_i (a + b n_i)
    return problem.batch * problem.heads / cores * sum(t(n) for n in problem.kv_blocks())


@dataclass(frozen=True)
class Composition:
    """Modelled seconds of one direction of the MLA attention for a set of ideas.

    Attributes
    ----------
    ideas
        the ideas switched on (a subset of :data:`~flashlab.dataflows.IDEAS`)
    kernel
        seconds of the FA kernel on the whole problem
    ops
        ``(name, seconds)`` of each separate operator that remains
    """

    ideas: frozenset[str]
    kernel: float
    ops: tuple[tuple[str, float], ...]

    @property
    def ops_total(self) -> float:
        """Seconds of all separate operators."""
        return sum(t for _, t in self.ops)

    @property
    def total(self) -> float:
        """Kernel plus separate operators (nothing overlapped)."""
        return self.kernel + self.ops_total

    @property
    def label(self) -> str:
        """The name of its set of ideas (:func:`label`)."""
        return label(self.ideas)


def compose(profile: HardwareProfile, problem: MLAProblem, ideas: Iterable[str], *,
            cores: int = ASCEND_910B_CORES, kv_source: str = "hbm") -> Composition:
    """The modelled forward of ``problem`` with ``ideas`` on a chip of ``cores`` cores like
    ``profile`` (a per-core profile, e.g. ``ASCEND_910B_AI_CORE``): the FA kernel
    (:func:`kernel_seconds`) plus the separate operators that remain (:func:`separate_steps`),
    each at the chip's HBM bandwidth (:func:`chip_bandwidth`)."""
    s = check_ideas(ideas)
    bw = chip_bandwidth(profile, cores)
    ops = tuple((st.name, op_seconds(st, bw)) for st in separate_steps(problem, s))
    return Composition(s, kernel_seconds(profile, problem, s, cores=cores, kv_source=kv_source), ops)


def compose_backward(profile: HardwareProfile, problem: MLAProblem, ideas: Iterable[str], *,
                     cores: int = ASCEND_910B_CORES) -> Composition:
    """The modelled backward: the FA backward kernel by the roofline,
    $\\max(F / (c\\,\\pi_\\text{core}),\\ Q / \\beta)$ with $F$ and $Q$ from
    :func:`flashlab.cost.mla_backward_steps`, plus the separate operators that remain.

    The roofline assumes perfect overlap inside the kernel, so ``"ping_pong"`` changes nothing
    here; V padded or not changes $F$ ($3D + 2D_v$ per attended pair and 2 FLOPs).
    """
    s = check_ideas(ideas)
    _check_cores(cores)
    args, kw = problem.cost_args()
    # the kernel step of the dataflow of these ideas (V padded or native, RoPE concatenated or split)
    steps = cost.mla_backward_steps(*args, dataflow=dataflow_of(s), block_q=problem.block_q, **kw)
    kernel = next(st for st in steps if st.name == "flash attention backward")
    bw = chip_bandwidth(profile, cores)
    # t = max(F / pi_chip, Q / beta)
    t_kernel = max(kernel.flops / (profile.peak_flops.value * cores),
                   (kernel.bytes_read + kernel.bytes_written) / bw)
    ops = tuple((st.name, op_seconds(st, bw)) for st in separate_steps(problem, s, backward=True))
    return Composition(s, t_kernel, ops)


def speedup(before: Composition, after: Composition, *, part: str = "total") -> float:
    """``before / after`` seconds of ``part``: ``"total"``, ``"kernel"`` or ``"ops_total"``
    (1.3 = "30 % faster" in the article's sense of 性能提升)."""
    if part not in ("total", "kernel", "ops_total"):
        raise ValueError(f"part must be 'total', 'kernel' or 'ops_total'; got {part!r}")
    return getattr(before, part) / getattr(after, part)


@dataclass(frozen=True)
class RooflinePoint:
    """Where the FA forward kernel sits on a chip's roofline at one K/V hit rate."""

    kv_hit: float
    flops: float
    bytes_moved: float
    ridge: float             # FLOP/byte where the roofline turns: peak / bandwidth

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved

    @property
    def bound(self) -> str:
        return "compute" if self.intensity >= self.ridge else "memory"


def kernel_roofline_by_hit(profile: HardwareProfile, problem: MLAProblem = MLAProblem(),
                           hits: Iterable[float] = (0.0, 0.5, 0.9, 0.95, 1.0), *,
                           dataflow: str = Dataflow.RECT) -> list[RooflinePoint]:
    r"""The FA forward kernel of ``dataflow`` on ``profile``'s roofline as the K/V hit rate varies.

    FLOPs and bytes are those of the kernel step of :func:`flashlab.cost.mla_forward_steps`,
    with the K/V re-reads per q-block served on chip at rate $h$ (:func:`flashlab.cost.traffic`'s
    model); the ridge point is $\pi / \beta$. At $h = 0$ chapter 1's count (every q-block reads
    K and V from HBM), at $h = 1$ the compulsory traffic of the MLA ledger.
    """
    args, kw = problem.cost_args()
    ridge = profile.peak_flops.value / profile.hbm_bandwidth.value     # pi / beta
    out = []
    for h in hits:
        steps = cost.mla_forward_steps(*args, dataflow=dataflow, kv_hit=h, block_q=problem.block_q, **kw)
        k = next(s for s in steps if s.name == dataflows.StepName.ATTENTION)
        out.append(RooflinePoint(float(h), float(k.flops), float(k.bytes_read + k.bytes_written), ridge))
    return out


def break_even_hit(profile: HardwareProfile, problem: MLAProblem = MLAProblem(), *,
                   dataflow: str = Dataflow.RECT) -> float:
    r"""The K/V hit rate above which the FA forward kernel is compute-bound on ``profile``.

    The kernel's bytes are affine in $h$, $Q(h) = Q_1 + (1 - h)(Q_0 - Q_1)$, so the ridge
    $F / Q(h) = \pi / \beta$ is crossed at $h^* = 1 - (F\beta/\pi - Q_1) / (Q_0 - Q_1)$
    (clipped to [0, 1]: 0 when compute-bound even with every re-read a miss).
    """
    p0, p1 = kernel_roofline_by_hit(profile, problem, (0.0, 1.0), dataflow=dataflow)
    q_at_ridge = p0.flops / p0.ridge                                   # F beta / pi
    if p0.bytes_moved == p1.bytes_moved:
        return 0.0 if p0.bound == "compute" else 1.0
    h = 1.0 - (q_at_ridge - p1.bytes_moved) / (p0.bytes_moved - p1.bytes_moved)
    return min(1.0, max(0.0, h))
