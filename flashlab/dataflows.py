"""The MLA vocabulary: dataflows, the RECT-FA ideas, the operator names, and one :class:`Step`.

An MLA attention core can be run in four **dataflows** (:class:`Dataflow`), set by two of the
RECT-FA **ideas** (:class:`Idea`): ``native_v`` (the kernel takes $D_{qk} \\ne D_v$, so V is
never padded) and ``split_rope`` (the kernel accumulates $Q^R {K^R}^\\top$ itself, so RoPE is
never expanded or concatenated); ``ping_pong`` changes the schedule inside the kernel only.

Every dataflow is a list of operators, each a :class:`Step` named by :class:`StepName`: the
closed forms of :mod:`flashlab.ledgers` and the ledger :mod:`flashlab.mla` measures both produce
them, and :data:`REMOVES` says which operators each idea removes.

Pure Python: imported by ledgers, traffic, mla, rect and vendor alike.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["Dataflow", "Idea", "StepName", "Step", "COST_FIELDS", "DATAFLOWS", "IDEAS",
           "REMOVES", "KERNEL_STEPS", "PAD_SLICE_STEPS", "dataflow_of", "total"]


class _Name(StrEnum):
    """A name that prints, in lists and dicts too, as the plain string it equals."""

    def __repr__(self) -> str:
        return repr(self.value)


class Dataflow(_Name):
    """The four MLA dataflows (a ``str``: ``Dataflow.RECT == "rect"``)."""

    BASELINE = "baseline"      # pad V + expand/concat RoPE (every head dim equal)
    NATIVE_V = "native_v"      # expand/concat RoPE only: the kernel at D_qk != D_v
    SPLIT_ROPE = "split_rope"  # pad V only: RoPE as the kernel's own operand pair
    RECT = "rect"              # both ideas: nothing around the kernel

    @property
    def pad_v(self) -> bool:
        """Whether V is padded to $D = D_n + D_r$ (and O, dV sliced back)."""
        return self in (Dataflow.BASELINE, Dataflow.SPLIT_ROPE)

    @property
    def split_rope(self) -> bool:
        """Whether RoPE is handed to the kernel as ``q_rope``/``k_rope`` (no expand, no concat)."""
        return self in (Dataflow.SPLIT_ROPE, Dataflow.RECT)


class Idea(_Name):
    """The three RECT-FA ideas, in the article's order."""

    NATIVE_V = "native_v"
    SPLIT_ROPE = "split_rope"
    PING_PONG = "ping_pong"

    @property
    def label(self) -> str:
        """Short name for tables and legends."""
        return {"native_v": "native V", "split_rope": "split RoPE", "ping_pong": "ping-pong"}[self]


class StepName(_Name):
    """The operators of the dataflows, forward then backward (a ``str``: ``== "pad V"``)."""

    EXPAND_K_ROPE = "expand k_rope"
    CONCAT_Q = "concat Q"
    CONCAT_K = "concat K"
    PAD_V = "pad V"
    ATTENTION = "flash attention"
    SLICE_O = "slice O"
    PAD_DO = "pad dO"
    ATTENTION_BACKWARD = "flash attention backward"
    SPLIT_DQ = "split dQ"
    SPLIT_DK = "split dK"
    SUM_DK_ROPE = "sum dk_rope over heads"
    SLICE_DV = "slice dV"
    TOTAL = "total"


DATAFLOWS: tuple[Dataflow, ...] = tuple(Dataflow)
#: the three RECT-FA ideas, in the article's order
IDEAS: tuple[Idea, ...] = tuple(Idea)

#: the attention kernels themselves (every dataflow runs one of them per direction)
KERNEL_STEPS = frozenset({StepName.ATTENTION, StepName.ATTENTION_BACKWARD})

#: the separate operators each idea removes, forward and backward
REMOVES: dict[Idea, tuple[StepName, ...]] = {
    Idea.NATIVE_V: (StepName.PAD_V, StepName.SLICE_O, StepName.PAD_DO, StepName.SLICE_DV),
    Idea.SPLIT_ROPE: (StepName.EXPAND_K_ROPE, StepName.CONCAT_Q, StepName.CONCAT_K,
                      StepName.SPLIT_DQ, StepName.SPLIT_DK, StepName.SUM_DK_ROPE),
    Idea.PING_PONG: (),
}

#: the pads and slices that exist only because V is padded
PAD_SLICE_STEPS = frozenset(REMOVES[Idea.NATIVE_V])


def dataflow_of(ideas: Iterable[str]) -> Dataflow:
    """The dataflow whose operators these ideas leave (``ping_pong`` changes none).

    >>> dataflow_of(()), dataflow_of({"native_v"}), dataflow_of({"native_v", "split_rope"})
    ('baseline', 'native_v', 'rect')
    """
    s = set(ideas)
    pad_v, split = Idea.NATIVE_V not in s, Idea.SPLIT_ROPE in s
    return next(f for f in Dataflow if (f.pad_v, f.split_rope) == (pad_v, split))


@dataclass(frozen=True)
class Step:
    """One operator of a dataflow and what it costs.

    ``bytes_read``/``bytes_written``: every input array read once, every output written once;
    ``allocated``: bytes of the arrays it creates (every step writes into new arrays, so this
    equals ``bytes_written``); ``workspace``: scratch it allocates and frees (the backward
    kernel's partial sums). Measured steps (:mod:`flashlab.mla`) also carry ``reads``/
    ``writes`` (``{name: shape}``) and ``matmuls`` (``{product: FLOPs}``); closed-form ones
    (:mod:`flashlab.ledgers`) leave them empty.
    """

    name: str
    flops: int
    bytes_read: int
    bytes_written: int
    allocated: int
    workspace: int = 0
    reads: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)
    matmuls: dict = field(default_factory=dict)


#: the fields both the closed forms and the measurements fill in
COST_FIELDS = ("name", "flops", "bytes_read", "bytes_written", "allocated", "workspace")


def total(steps: Iterable[Step]) -> Step:
    """The steps summed into one :class:`Step` named ``"total"`` (``matmuls`` summed by product)."""
    steps = list(steps)
    matmuls: dict[str, int] = {}
    for s in steps:
        for k, f in s.matmuls.items():
            matmuls[k] = matmuls.get(k, 0) + f
    flops, bytes_read, bytes_written, allocated, workspace = (sum(getattr(s, f) for s in steps)
                                                              for f in COST_FIELDS[1:])
    return Step(StepName.TOTAL, flops, bytes_read, bytes_written, allocated, workspace, matmuls=matmuls)
