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

**Durations** (:class:`~flashlab.pipeline.durations.Durations`, from the profile's
:class:`~flashlab.pipeline.params.CoreModel`): a copy takes
latency + bytes / bandwidth; a matmul chunk latency + $\lceil m/16 \rceil \lceil n/16 \rceil
\lceil k/16 \rceil$ / (1.8 GHz) on the 910B (granules of the matrix unit / its granule rate);
a vector task latency + element operations / throughput + exponentials / exp rate + the bytes
it reads from the workspace / the workspace bandwidth.

On a GPU SM profile (``exchange="registers"``) S, P and O stay in registers: no FixPipe, no
workspace round trip; the softmax task also rescales O in place and waits for the previous
$PV$ (the accumulator it rescales).
"""
from __future__ import annotations

from flashlab.arguments import as_int, as_real
from flashlab.pipeline.buffers import (
    KV_SOURCES,
    FAShape,
    buffer_needs,
    check_fit,
    core_of,
    l0c_slots,
    positive_int,
    resolve_buffers,
)
from flashlab.pipeline.graph_builder import FAGraphBuilder
from flashlab.pipeline.loads import iterate_all_loads, own_mte2_loads
from flashlab.pipeline.params import HardwareProfile
from flashlab.pipeline.simulate import SimResult, TaskGraph, check_memory, simulate

__all__ = ["build_fa_graph", "simulate_fa", "BASE_K", "SOFTMAX_OPS", "RESCALE_OPS"]

#: the default chunk of the reduction axis per Cube task (elements)
BASE_K = 64
#: the default vector operations per score of the online softmax (each score also pays one exponential)
SOFTMAX_OPS = 5
#: the default vector operations per element of O in the rescale
RESCALE_OPS = 2


def build_fa_graph(profile: HardwareProfile, strategy: str, seq_q: int, seq_kv: int, d_qk: int,
                   d_v: int, block_q: int, block_k: int, *, n_buffers: int | None = None,
                   pad_v: bool = False, split_rope: int = 0, lookahead: int = 1,
                   base_k: int = BASE_K, l0_buffers: int = 2, l0c_buffers: int | None = None,
                   kv_source: str = "hbm", dtype_bytes: int = 2, softmax_ops: int = SOFTMAX_OPS,
                   rescale_ops: int = RESCALE_OPS) -> TaskGraph:
    """The task graph of the FlashAttention forward on one core of ``profile``.

    Parameters
    ----------
    profile : a per-core :class:`~flashlab.pipeline.params.HardwareProfile` (with ``core``)
    strategy : one of :data:`~flashlab.pipeline.buffers.STRATEGIES` (see the module docstring)
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
    core = core_of(profile)
    nb = resolve_buffers(strategy, n_buffers)
    for name, value in (("seq_q", seq_q), ("seq_kv", seq_kv), ("d_qk", d_qk), ("d_v", d_v),
                        ("block_q", block_q), ("block_k", block_k), ("base_k", base_k),
                        ("l0_buffers", l0_buffers), ("dtype_bytes", dtype_bytes)):
        positive_int(name, value)
    if l0c_buffers is not None:
        positive_int("l0c_buffers", l0c_buffers)
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
    _check_graph_memory(profile, strategy, shape, dict(
        n_buffers=n_buffers, pad_v=pad_v, split_rope=split_rope, lookahead=lookahead,
        base_k=base_k, l0_buffers=l0_buffers, l0c_buffers=l0c_buffers, kv_source=kv_source,
        dtype_bytes=dtype_bytes, softmax_ops=softmax_ops, rescale_ops=rescale_ops))
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


#: graphs of at most this many tiles are built without an estimate of their size first
_SMALL_TILES = 4096


def _check_graph_memory(profile, strategy: str, shape: FAShape, options: dict) -> None:
    """Refuse, before building it, a graph whose model would exceed the memory budget
    (:func:`flashlab.pipeline.simulate.check_memory`). Its task count is estimated as
    tiles x the tasks per tile of the same loop on at most 4 x 4 full tiles (a tile's tasks
    depend on its size and the options, not on how many tiles there are). ``options``:
    :func:`build_fa_graph`'s keyword options."""
    # ceil(seq / block), not len(shape.q_rows): that list would itself be of the refused size
    n_q, n_k = -(-shape.seq_q // shape.block_q), -(-shape.seq_kv // shape.block_k)
    if n_q * n_k <= _SMALL_TILES:
        return
    small_q, small_k = min(n_q, 4), min(n_k, 4)
    small = build_fa_graph(profile, strategy, small_q * shape.block_q, small_k * shape.block_k,
                           shape.d_qk, shape.d_v, shape.block_q, shape.block_k, **options)
    # tasks ~ (tasks of the small loop / its tiles) x tiles
    tasks = -(-len(small.tasks) * n_q * n_k // (small_q * small_k))
    slots = sum(small.pools.values())
    check_memory(f"the task graph of {n_q} x {n_k} tiles (seq_q={shape.seq_q}, "
                 f"seq_kv={shape.seq_kv}, block_q={shape.block_q}, block_k={shape.block_k})",
                 tasks, slots)


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
