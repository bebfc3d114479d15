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
:func:`flashlab.ledgers.mla_forward_steps`) over the chip's HBM bandwidth $\beta$:

$$
t_{\text{op}} = \frac{Q_{\text{read}} + Q_{\text{written}}}{\beta}.
$$

*The FA kernel* is the calibrated model of the chip (:mod:`flashlab.pipeline.calibrated`):
whole q-blocks per core in waves of the 24 AI Cores, each a Cube/Vector pipeline of kv-tiles
(the kernel's own tile, 128 x 256 up to $D = 128$), a launch overhead, K/V from L2 when they
fit, and a memory port shared by the active cores. Its stage cycles are pto-isa's, and one
number is fitted to one measured 910B2 time (the book's appendix on the NPU model shows the fit
and the held-out comparison). :func:`forward_time` is the predictor of one forward kernel;
:func:`kernel_seconds` runs the same model with the ideas' kernel variants (V padded to $D$ or
not, $QK^\top$ split in two products, IterateAll or ping-pong).

Assumptions (all of them, so the reader can move them): the separate operators run at the
full HBM bandwidth with no launch overhead; nothing overlaps the separate operators with the
kernel; the kernel's parameters are those of :data:`flashlab.pipeline.calibrated.CHIPS`, each
with its range. The backward (:func:`compose_backward`) has no pipeline model: its kernel is
timed with the roofline, $\max(F/\pi, Q/\beta)$.

This module sits above :mod:`flashlab.pipeline` because the forward kernel's time is the
calibrated model's (:func:`kernel_seconds`); the operator costs it adds come from
:mod:`flashlab.ledgers` and the operator names from :mod:`flashlab.dataflows`.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from flashlab import dataflows, ledgers
from flashlab.arguments import as_bool, as_int, as_real
from flashlab.dataflows import IDEAS, KERNEL_STEPS, REMOVES, Dataflow, Idea, Step
from flashlab.pipeline import calibrated
from flashlab.pipeline.calibrated import ChipModel
from flashlab.pipeline.params import HardwareProfile
from flashlab.pipeline.roofline import RooflinePoint, ridge_point
from flashlab.rope import DEEPSEEK_V3_HEADS, DEEPSEEK_V3_NOPE_DIM, DEEPSEEK_V3_ROPE_DIM, DEEPSEEK_V3_V_DIM

__all__ = ["IDEA_LABELS", "MLAProblem", "check_ideas", "label", "forward_time", "chip_model",
           "all_combinations", "dataflow_of", "kernel_options", "separate_steps", "op_seconds",
           "kernel_seconds", "Composition", "compose", "compose_backward", "speedup",
           "kernel_roofline_by_hit", "break_even_hit"]

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
        """``(args, kwargs)`` for :func:`flashlab.ledgers.mla_forward_steps` / ``mla_backward_steps``."""
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
    """The kernel variant of these ideas, as :func:`flashlab.pipeline.calibrated.predict` takes it:
    ``dv`` (V padded to $D$ unless ``"native_v"``), ``split`` ($QK^\\top$ as two products
    accumulated in place with ``"split_rope"``), ``strategy`` (``"ping_pong"`` or the Matmul
    API's ``"iterate_all"``)."""
    s = check_ideas(ideas)
    return dict(dv=problem.d_qk if Idea.NATIVE_V not in s else problem.d_v,
                split=Idea.SPLIT_ROPE in s,
                strategy="ping_pong" if Idea.PING_PONG in s else "iterate_all")


def separate_steps(problem: MLAProblem, ideas: Iterable[str], *, backward: bool = False
                   ) -> list[Step]:
    """The separate operators around the FA kernel that remain with these ideas, with their
    bytes (:class:`flashlab.dataflows.Step`): the baseline's pad, slice, expand and concat (or
    their gradients, with ``backward=True``) minus those :data:`~flashlab.dataflows.REMOVES` names
    for each idea."""
    s = check_ideas(ideas)
    args, kw = problem.cost_args()
    steps = (ledgers.mla_backward_steps(*args, dataflow=Dataflow.BASELINE, block_q=problem.block_q, **kw)
             if backward else ledgers.mla_forward_steps(*args, dataflow=Dataflow.BASELINE, **kw))
    removed = {name for idea in s for name in REMOVES[idea]}
    return [st for st in steps if st.name not in KERNEL_STEPS and st.name not in removed]


def op_seconds(step: Step, bandwidth: float) -> float:
    """Seconds of a separate operator that only moves data: (read + written) / ``bandwidth``."""
    as_real("bandwidth", bandwidth, lo=0, lo_open=True, what="a positive number of byte/s")
    # t = (Q_read + Q_written) / beta
    return (step.bytes_read + step.bytes_written) / bandwidth


def chip_model(chip: str | ChipModel = "910B2") -> ChipModel:
    """``chip`` as a :class:`~flashlab.pipeline.calibrated.ChipModel`: a name of
    :data:`~flashlab.pipeline.calibrated.CHIPS` (``"910B2"``, ``"A3"``) or a model itself."""
    if isinstance(chip, ChipModel):
        return chip
    if not isinstance(chip, str):
        raise TypeError(f"chip must be a chip name {tuple(calibrated.CHIPS)} or a ChipModel; got {chip!r}")
    return calibrated.chip_model(chip)


def forward_time(batch: int, heads: int, sq: int, sk: int, d: int, dv: int | None = None, *,
                 causal: bool = False, dtype: str = "float16", chip: str | ChipModel = "910B2") -> float:
    """Seconds of one FlashAttention forward kernel on a whole Ascend chip, by the calibrated model.

    ``q`` is ``(batch, heads, sq, d)``, ``k`` ``(batch, heads, sk, d)``, ``v`` ``(batch, heads, sk,
    dv)`` (``dv`` defaults to ``d``); ``causal`` is the top-left mask; ``dtype`` ``"float16"`` or
    ``"bfloat16"``; ``chip`` ``"910B2"`` (24 AI Cores, 1.8 GHz) or ``"A3"`` (one 910C die, 24 AI
    Cores, 1.85 GHz). The model (:func:`flashlab.pipeline.calibrated.predict`) runs whole
    q-blocks in waves of the core count, each a Cube/Vector pipeline of the kernel's tiles, after
    one launch; its fit and its held-out test are in the book's appendix.
    """
    return calibrated.predict(chip_model(chip), batch, heads, sq, sk, d, dv, causal=causal,
                              dtype=dtype).seconds


def _dtype(problem: MLAProblem) -> str:
    if problem.elem != 2:
        raise ValueError(f"the NPU model prices 2-byte operands (fp16/bf16); problem.elem is {problem.elem}")
    return "bfloat16"


def kernel_seconds(problem: MLAProblem, ideas: Iterable[str], *, chip: str | ChipModel = "910B2",
                   cores: int | None = None) -> float:
    """Modelled seconds of the FA forward kernel of ``problem`` with ``ideas`` on ``chip``: the
    calibrated model (:func:`forward_time`'s) with the ideas' kernel variant
    (:func:`kernel_options`), on ``cores`` AI Cores (default: all of the chip's)."""
    opts = kernel_options(ideas, problem)
    p = problem
    return calibrated.predict(chip_model(chip), p.batch, p.heads, p.seq, p.seq, p.d_qk, opts["dv"],
                              causal=p.causal, dtype=_dtype(p), strategy=opts["strategy"],
                              split=opts["split"], cores=cores).seconds


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


def compose(problem: MLAProblem, ideas: Iterable[str], *, chip: str | ChipModel = "910B2") -> Composition:
    """The modelled forward of ``problem`` with ``ideas`` on ``chip``: the FA kernel
    (:func:`kernel_seconds`) plus the separate operators that remain (:func:`separate_steps`),
    each at the chip's HBM bandwidth."""
    s = check_ideas(ideas)
    m = chip_model(chip)
    ops = tuple((st.name, op_seconds(st, m.hbm_bandwidth.value)) for st in separate_steps(problem, s))
    return Composition(s, kernel_seconds(problem, s, chip=m), ops)


def compose_backward(problem: MLAProblem, ideas: Iterable[str], *,
                     chip: str | ChipModel = "910B2") -> Composition:
    """The modelled backward: the FA backward kernel by the roofline of ``chip``,
    $\\max(F / \\pi,\\ Q / \\beta)$ with $F$ and $Q$ from
    :func:`flashlab.ledgers.mla_backward_steps`, plus the separate operators that remain.

    The roofline assumes perfect overlap inside the kernel, so ``"ping_pong"`` changes nothing
    here; V padded or not changes $F$ ($3D + 2D_v$ per attended pair and 2 FLOPs).
    """
    s = check_ideas(ideas)
    m = chip_model(chip)
    args, kw = problem.cost_args()
    # the kernel step of the dataflow of these ideas (V padded or native, RoPE concatenated or split)
    steps = ledgers.mla_backward_steps(*args, dataflow=dataflow_of(s), block_q=problem.block_q, **kw)
    kernel = next(st for st in steps if st.name == "flash attention backward")
    bw = m.hbm_bandwidth.value
    # t = max(F / pi_chip, Q / beta)
    t_kernel = max(kernel.flops / m.peak_flops, (kernel.bytes_read + kernel.bytes_written) / bw)
    ops = tuple((st.name, op_seconds(st, bw)) for st in separate_steps(problem, s, backward=True))
    return Composition(s, t_kernel, ops)


def speedup(before: Composition, after: Composition, *, part: str = "total") -> float:
    """``before / after`` seconds of ``part``: ``"total"``, ``"kernel"`` or ``"ops_total"``
    (1.3 = "30 % faster" in the article's sense of 性能提升)."""
    if part not in ("total", "kernel", "ops_total"):
        raise ValueError(f"part must be 'total', 'kernel' or 'ops_total'; got {part!r}")
    return getattr(before, part) / getattr(after, part)


def _kernel_counts(problem: MLAProblem, kv_hit: float, dataflow: str) -> tuple[float, float]:
    """``(FLOPs, bytes read + written)`` of the FA forward kernel step of ``dataflow``."""
    args, kw = problem.cost_args()
    steps = ledgers.mla_forward_steps(*args, dataflow=dataflow, kv_hit=kv_hit, block_q=problem.block_q, **kw)
    k = next(s for s in steps if s.name == dataflows.StepName.ATTENTION)
    return float(k.flops), float(k.bytes_read + k.bytes_written)


def kernel_roofline_by_hit(profile: HardwareProfile, problem: MLAProblem = MLAProblem(),
                           hits: Iterable[float] = (0.0, 0.5, 0.9, 0.95, 1.0), *,
                           dataflow: str = Dataflow.RECT) -> list[RooflinePoint]:
    r"""The FA forward kernel of ``dataflow`` on ``profile``'s roofline as the K/V hit rate varies.

    FLOPs and bytes are those of the kernel step of :func:`flashlab.ledgers.mla_forward_steps`,
    with the K/V re-reads per q-block served on chip at rate $h$ (:func:`flashlab.traffic.traffic`'s
    model); the ridge point is $\pi / \beta$. At $h = 0$ chapter 1's count (every q-block reads
    K and V from HBM), at $h = 1$ the compulsory traffic of the MLA ledger. Each point is labelled
    ``"kv_hit=<h>"`` and carries the kernel's FLOPs (so its ``bytes_moved``), in the order of ``hits``.
    """
    ridge = ridge_point(profile)
    out = []
    for h in hits:
        f, q = _kernel_counts(problem, h, dataflow)
        # I = F / Q
        out.append(RooflinePoint(f"kv_hit={h:g}", f / q, ridge=ridge, flops=f))
    return out


def break_even_hit(profile: HardwareProfile, problem: MLAProblem = MLAProblem(), *,
                   dataflow: str = Dataflow.RECT) -> float:
    r"""The K/V hit rate above which the FA forward kernel is compute-bound on ``profile``.

    The kernel's bytes are affine in $h$, $Q(h) = Q_1 + (1 - h)(Q_0 - Q_1)$, so the ridge
    $F / Q(h) = \pi / \beta$ is crossed at $h^* = 1 - (F\beta/\pi - Q_1) / (Q_0 - Q_1)$
    (clipped to [0, 1]: 0 when compute-bound even with every re-read a miss).
    """
    (f, q0), (_, q1) = _kernel_counts(problem, 0.0, dataflow), _kernel_counts(problem, 1.0, dataflow)
    q_at_ridge = f / ridge_point(profile)                              # F beta / pi
    if q0 == q1:
        return 0.0 if q0 <= q_at_ridge else 1.0
    h = 1.0 - (q_at_ridge - q1) / (q0 - q1)
    return min(1.0, max(0.0, h))
