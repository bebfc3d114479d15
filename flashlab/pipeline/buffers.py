"""What one core's FlashAttention tile loop needs in buffers, and whether it fits.

The loop's shape (:class:`FAShape`: sequence lengths, head dims, tiles), the strategies and
where K and V are read from, the buffers each strategy needs on each memory level
(:func:`buffer_needs`) and the check that they fit the profile's memories (:func:`check_fit`).
The graph itself is built by :mod:`flashlab.pipeline.schedule`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flashlab.arguments import as_int
from flashlab.pipeline.params import HardwareProfile

__all__ = ["STRATEGIES", "KV_SOURCES", "BufferNeed", "FAShape", "resolve_buffers", "l0c_slots",
           "buffer_needs", "check_fit"]


#: The strategies of :func:`~flashlab.pipeline.schedule.build_fa_graph`.
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
    :func:`~flashlab.pipeline.schedule.build_fa_graph`."""

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
        return cuts(self.seq_q, self.block_q)

    @property
    def kv_cols(self) -> list[int]:
        """The keys of each kv-block (the last one may be shorter)."""
        return cuts(self.seq_kv, self.block_k)


def cuts(size: int, block: int) -> list[int]:
    return [min(block, size - s) for s in range(0, size, block)]


def positive_int(name: str, value) -> int:
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


def core_of(profile: HardwareProfile):
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
    core = core_of(profile)
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
    core = core_of(profile)
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


def work_chunks(parts: tuple[int, ...], base_k: int) -> int:
    return sum(len(cuts(d, base_k)) for d in parts)
