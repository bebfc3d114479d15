r"""Main-memory traffic: one :class:`Traffic` type and one model of every dataflow's bytes.

:class:`Traffic` holds the bytes a dataflow reads and writes: what :func:`traffic` and
:func:`backward_traffic` predict, and what the CUDA twin's kernels count
(:mod:`flashlab.gpu.traffic`). All counts are *per (batch, head)* unless a function takes
``batch``/``heads``; bytes use ``elem`` bytes per element (2 for fp16/bf16, 4 for fp32).

**Standard attention** (FlashAttention paper, Algorithm 0) writes the score matrix and the
probabilities to HBM and reads them back:

$$
\text{HBM}_\text{std} = \underbrace{S_q d + S_k d}_{\text{read }Q,K} + \underbrace{S_q S_k}_{\text{write }S}
+ \underbrace{2 S_q S_k}_{\text{read }S,\ \text{write }P} + \underbrace{S_q S_k + S_k d_v}_{\text{read }P, V}
+ \underbrace{S_q d_v}_{\text{write }O}
\;=\; \Theta(N d + N^2).
$$

**Tiled attention, query-block outer loop** (FlashAttention-2 order, what
:mod:`flashlab.kernels.forward` runs): each query block of ``block_q`` rows is read once, its
output written once, and every key/value block streamed past it:

$$
\text{HBM}_\text{flash} = S_q d + S_q d_v + \Big\lceil \tfrac{S_q}{B_r} \Big\rceil S_k (d + d_v) + S_q
\quad(\text{last term: the LSE}).
$$

With on-chip memory of $M$ elements the largest block that fits has $B_r = \Theta(M/d)$, so
this is $\Theta(N^2 d^2 / M)$: Theorem 2 of the FlashAttention paper.

The on-chip reuse of the fused kernel's K/V re-reads is a parameter, the hit rate ``kv_hit``
(:func:`flashlab.tiling.kv_reread_factor`). The four MLA dataflows are the sums of their step
ledgers (:mod:`flashlab.ledgers`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flashlab.arguments import as_int
from flashlab.dataflows import DATAFLOWS, total
from flashlab.ledgers import accumulator_bytes, mla_forward_steps
from flashlab.tiling import cdiv, check_hit_rate, kv_reread_factor

__all__ = ["Traffic", "hbm_elements_standard", "hbm_elements_flash", "block_for_sram", "fa1_theorem2",
           "standard_attention_extra_bytes", "TRAFFIC_DATAFLOWS", "BACKWARD_TRAFFIC_DATAFLOWS",
           "traffic", "backward_traffic", "gpu_keys_visited", "tiled_attention_traffic",
           "standard_attention_traffic"]


@dataclass(frozen=True)
class Traffic:
    """Bytes ``read`` from and ``written`` to main memory (or, for the CUDA twin's counters,
    requested of global memory), and their ``total``. Traffics add field by field."""

    read: float
    written: float

    @property
    def total(self) -> float:
        return self.read + self.written

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.read + other.read, self.written + other.written)

    @classmethod
    def from_counter(cls, counter) -> Traffic:
        """From a ``(2,)`` integer counter holding (bytes read, bytes written)."""
        return cls(int(counter[0]), int(counter[1]))


def hbm_elements_standard(seq_q: int, seq_k: int, d_qk: int, d_v: int) -> int:
    """HBM elements read + written by standard attention (Algorithm 0), per (batch, head)."""
    n = seq_q * seq_k
    return (seq_q * d_qk + seq_k * d_qk) + n + 2 * n + (n + seq_k * d_v) + seq_q * d_v


def hbm_elements_flash(seq_q: int, seq_k: int, d_qk: int, d_v: int, block_q: int) -> int:
    """HBM elements read + written by the tiled forward with query blocks of ``block_q`` rows."""
    n_qb = cdiv(seq_q, block_q)
    return seq_q * d_qk + seq_q * d_v + n_qb * seq_k * (d_qk + d_v) + seq_q


def block_for_sram(sram_elems: int, d_qk: int, d_v: int) -> int:
    """Largest square block ``B = block_q = block_k`` whose working set fits ``sram_elems``.

    Working set of one step: Q_i (B x Dqk), K_j (B x Dqk), V_j (B x Dv), the score tile
    (B x B) and the output accumulator (B x Dv):  ``B^2 + B (2 Dqk + 2 Dv) <= M``.
    """
    b = 2 * (d_qk + d_v)
    blk = int((-b + math.sqrt(b * b + 4 * sram_elems)) / 2)
    if blk < 1:
        raise ValueError(f"sram_elems={sram_elems} cannot hold even a 1-row block of "
                         f"Dqk={d_qk}, Dv={d_v} (needs {1 + b} elements)")
    return blk


def fa1_theorem2(seq: int, d: int, sram_elems: int) -> float:
    """The order of FlashAttention's HBM accesses from Theorem 2: ``N^2 d^2 / M`` elements."""
    return seq * seq * d * d / sram_elems


def standard_attention_extra_bytes(seq_q: int, seq_k: int, *, batch: int = 1, heads: int = 1,
                                   elem: int = 4) -> int:
    """Bytes of the score/probability matrix that standard attention materialises (one copy)."""
    return batch * heads * seq_q * seq_k * elem

#: the dataflows :func:`traffic` knows: standard attention (Algorithm 0), the fused kernel,
#: one decoding step, the four MLA dataflows (``"mla:<dataflow>"``) and the two kernels of the
#: CUDA twin :mod:`flashlab.gpu` (``"gpu:standard"``, ``"gpu:fused"``), counted as the twin
#: requests them from global memory
TRAFFIC_DATAFLOWS = ("standard", "fused", "decode", *(f"mla:{f}" for f in DATAFLOWS),
                     "gpu:standard", "gpu:fused")
#: the dataflows :func:`backward_traffic` knows: the fused backward and the twin's
BACKWARD_TRAFFIC_DATAFLOWS = ("fused", "gpu:fused")

def traffic(dataflow: str, *, seq_q: int, seq_k: int | None = None, d_qk: int | None = None,
            d_v: int, d_nope: int | None = None, d_rope: int = 0, batch: int = 1, heads: int = 1,
            elem: int = 2, block_q: int = 128, kv_hit: float = 0.0, causal: bool = False,
            lse_elem: int | None = None, block_k: int | None = None) -> Traffic:
    r"""Main-memory (HBM) bytes of ``dataflow``'s forward: the book's one traffic model.

    ``dataflow`` is one of :data:`TRAFFIC_DATAFLOWS`:

    - ``"standard"``: Algorithm 0 as three unfused operators ($S = QK^\top$, $P =
      \operatorname{softmax}(S)$, $O = PV$), each reading its inputs once and writing its output
      once: $e\,(S_q d + S_k d + 4 S_q S_k + S_k d_v + S_q d_v)$ (:func:`hbm_elements_standard`;
      S and P go through main memory). With ``causal`` the mask is one more elementwise pass over
      S (read S, write S, as ``masked_fill`` does between the operators): $+2 e S_q S_k$;
    - ``"gpu:standard"``: the CUDA twin's three kernels (:mod:`flashlab.gpu.standard`), as
      :func:`standard_attention_traffic` with row tile $T$ = ``block_q``: K and V re-read once
      per row tile, S read twice by the two-pass softmax,
      $e\,(S_q d + t S_k d + 5 S_q S_k + t S_k d_v + S_q d_v)$, $t = \lceil S_q / T \rceil$;
      the mask costs nothing (masked scores are written as $-\infty$);
    - ``"gpu:fused"``: the twin's fused forward (:mod:`flashlab.gpu.forward`), as
      :func:`tiled_attention_traffic` with tiles ``block_q`` x ``block_k``: K and V of every
      visited key block once per query block (causal: whole blocks up to the diagonal), O and
      the LSE written once, the LSE in ``elem`` bytes;
    - ``"fused"``: the tiled kernel, $e\,(S_q d + S_q d_v + f\,S_k (d + d_v)) + a\,S_q$ with
      $f$ = :func:`~flashlab.tiling.kv_reread_factor` (``kv_hit = 0``, no mask, gives :func:`hbm_elements_flash`;
      with ``causal`` only the tiles the kernel visits are read);
    - ``"decode"``: one decoding step of ``seq_q`` new queries against a cache of ``seq_k``
      keys, one q-block: $f = 1$ whatever ``kv_hit``;
    - ``"mla:baseline"``, ``"mla:native_v"``, ``"mla:split_rope"``, ``"mla:rect"``: every
      operator of the MLA dataflow (:func:`~flashlab.ledgers.mla_forward_steps`: pad, expand, concat, the kernel,
      slice), the kernel's K/V re-reads with the same $f$. The kernel of ``"mla:native_v"`` *is*
      ``"fused"`` with $d = D_n + D_r$.

    Dims: ``d_qk`` (or ``d_nope + d_rope`` for MLA, where ``d_nope`` is required) and ``d_v``;
    ``elem`` bytes per element, ``lse_elem`` bytes per LSE entry (default: the accumulator's,
    :func:`~flashlab.ledgers.accumulator_bytes`); ``kv_hit`` in [0, 1] the on-chip hit rate of K/V re-reads
    (:data:`~flashlab.tiling.KV_RESIDENT` = 1). Sizes for ``batch * heads`` heads (MLA: ``heads`` query heads,
    one shared RoPE key head).

    The ``"gpu:*"`` dataflows are **global-memory requests**, what the twin's instrumented
    kernels count, whether L2 serves them or DRAM: they take no ``kv_hit`` (it must be 0) and
    ``block_k`` (default ``block_q``) is their key tile. For the DRAM bytes of the same kernels
    when L2 holds every re-read, take ``"fused"`` / ``"standard"`` with ``kv_hit=1``.
    """
    if dataflow not in TRAFFIC_DATAFLOWS:
        raise ValueError(f"dataflow must be one of {TRAFFIC_DATAFLOWS}; got {dataflow!r}")
    check_hit_rate(kv_hit)
    sk = seq_q if seq_k is None else seq_k
    if dataflow.startswith("gpu:"):
        return _gpu_traffic(dataflow, seq_q=seq_q, seq_k=sk, d_qk=d_qk, d_v=d_v, batch=batch,
                            heads=heads, elem=elem, block_q=block_q, block_k=block_k,
                            causal=causal, kv_hit=kv_hit, backward=False)
    if dataflow.startswith("mla:"):
        if d_nope is None:
            raise ValueError(f"the {dataflow} dataflow needs d_nope (and d_rope); got d_nope=None")
        steps = mla_forward_steps(batch, heads, seq_q, d_nope, d_rope, d_v, dataflow=dataflow[4:],
                                  causal=causal, elem=elem, seq_k=sk, kv_hit=kv_hit, block_q=block_q)
        t = total(steps)
        return Traffic(float(t.bytes_read), float(t.bytes_written))
    d = d_qk if d_qk is not None else (d_nope or 0) + d_rope
    for name, x in (("seq_q", seq_q), ("seq_k", sk), ("d_qk", d), ("d_v", d_v), ("batch", batch),
                    ("heads", heads), ("elem", elem), ("block_q", block_q)):
        as_int(name, x, lo=1)
    bh = batch * heads
    if dataflow == "standard":
        n = seq_q * sk
        # read Q, K; write S; read S, write P; read P, V; write O
        elements_read = seq_q * d + sk * d + n + n + sk * d_v
        elements_written = n + n + seq_q * d_v
        if causal:
            # the mask as its own pass: read S, write S
            elements_read += n
            elements_written += n
        return Traffic(float(bh * elem * elements_read), float(bh * elem * elements_written))
    a = accumulator_bytes(elem) if lse_elem is None else lse_elem
    f = 1.0 if dataflow == "decode" else kv_reread_factor(seq_q, block_q, kv_hit, seq_k=sk, causal=causal)
    # read Q once and K, V f times; write O and the LSE
    read = elem * (seq_q * d + f * sk * (d + d_v))
    written = elem * seq_q * d_v + a * seq_q
    return Traffic(bh * read, float(bh * written))


def backward_traffic(dataflow: str = "fused", *, seq_q: int, seq_k: int | None = None, d_qk: int,
                     d_v: int, batch: int = 1, heads: int = 1, elem: int = 2, block_q: int = 128,
                     kv_hit: float = 0.0, causal: bool = False, lse_elem: int | None = None,
                     block_k: int | None = None, kv_heads: int | None = None) -> Traffic:
    r"""Main-memory bytes of the fused kernel's recomputation backward: :func:`traffic`'s backward.

    ``dataflow`` is one of :data:`BACKWARD_TRAFFIC_DATAFLOWS`. ``"gpu:fused"`` is the CUDA
    twin's backward (:mod:`flashlab.gpu.backward`, FlashAttention-2's loop order), its
    global-memory requests as :func:`tiled_attention_traffic` ``(backward=True)`` counts them:
    $dO$ and $O$ read once for $D$; Q, dO, the LSE and D read and dQ added atomically once
    per visited tile; K and V read and dK, dV written once per kv head (``kv_heads``, default
    ``heads``; ``kv_hit`` must be 0, ``block_k`` defaults to ``block_q``).

    ``"fused"`` is the tiled backward of the backward chapter: per head it reads
    $Q$, $O$, $dO$ and the LSE once and writes $dQ$ once; every q-block that visits a key
    block reads $K$, $V$ and the $dK$, $dV$ accumulators and writes the accumulators back,
    so these three streams cross the bus $f$ times, with the same
    $f = 1 + (F_0 - 1)(1 - h)$ as the forward (:func:`~flashlab.tiling.kv_reread_factor`; ``kv_hit`` = $h$):

    $$ \text{read} = e\,(S_q (d + 2 d_v) + 2 f S_k (d + d_v)) + a\,S_q,\qquad
       \text{written} = e\,(S_q d + f S_k (d + d_v)). $$

    ``lse_elem`` ($a$) defaults to the accumulator's bytes (:func:`~flashlab.ledgers.accumulator_bytes`), as in
    :func:`traffic`. Sizes for ``batch * heads`` heads.
    """
    if dataflow not in BACKWARD_TRAFFIC_DATAFLOWS:
        raise ValueError(f"dataflow must be one of {BACKWARD_TRAFFIC_DATAFLOWS} (the backwards the "
                         f"traffic model covers); got {dataflow!r}")
    check_hit_rate(kv_hit)
    sk = seq_q if seq_k is None else seq_k
    if dataflow == "gpu:fused":
        return _gpu_traffic(dataflow, seq_q=seq_q, seq_k=sk, d_qk=d_qk, d_v=d_v, batch=batch,
                            heads=heads, elem=elem, block_q=block_q, block_k=block_k,
                            causal=causal, kv_hit=kv_hit, backward=True, kv_heads=kv_heads)
    if kv_heads is not None and kv_heads != heads:
        raise ValueError(f"kv_heads must be None (or heads) for the 'fused' dataflow; got {kv_heads!r}")
    for name, x in (("seq_q", seq_q), ("seq_k", sk), ("d_qk", d_qk), ("d_v", d_v), ("batch", batch),
                    ("heads", heads), ("elem", elem), ("block_q", block_q)):
        as_int(name, x, lo=1)
    a = accumulator_bytes(elem) if lse_elem is None else lse_elem
    f = kv_reread_factor(seq_q, block_q, kv_hit, seq_k=sk, causal=causal)
    kv = sk * (d_qk + d_v)
    # read Q, O, dO and the LSE once; K, V and the dK, dV accumulators f times
    read = elem * (seq_q * (d_qk + 2 * d_v) + 2 * f * kv) + a * seq_q
    # write dQ once and the dK, dV accumulators f times
    written = elem * (seq_q * d_qk + f * kv)
    bh = batch * heads
    return Traffic(float(bh * read), float(bh * written))


def _gpu_traffic(dataflow: str, *, seq_q: int, seq_k: int, d_qk: int | None, d_v: int,
                 batch: int, heads: int, elem: int, block_q: int, block_k: int | None,
                 causal: bool, kv_hit: float, backward: bool,
                 kv_heads: int | None = None) -> Traffic:
    """The twin's dataflows through their closed forms (requests: no L2 hit rate)."""
    if kv_hit != 0:
        raise ValueError(f"kv_hit must be 0 for {dataflow!r}: it counts global-memory requests, "
                         f"whether L2 serves them or not (for DRAM bytes with every re-read in L2 "
                         f"take {dataflow[4:]!r} with kv_hit=1); got {kv_hit!r}")
    if d_qk is None:
        raise ValueError(f"the {dataflow} dataflow needs d_qk; got d_qk=None")
    as_int("block_q", block_q, lo=1)
    if block_k is not None:
        as_int("block_k", block_k, lo=1)
    if dataflow == "gpu:standard":
        t = standard_attention_traffic(seq_q, seq_k, d_qk, d_v, tile=block_q, batch=batch,
                                       heads=heads, elem=elem)
    else:
        t = tiled_attention_traffic(seq_q, seq_k, d_qk, d_v, block_q=block_q,
                                    block_k=block_q if block_k is None else block_k, batch=batch,
                                    heads=heads, causal=causal, backward=backward, elem=elem,
                                    kv_heads=kv_heads)
    return Traffic(float(t.read), float(t.written))

# ------------------------------------------------------------------------------------------
# Counted GPU traffic: the bytes the kernels of flashlab.gpu move, in closed form
# ------------------------------------------------------------------------------------------
# Self-contained section (issue #24): the CUDA twin (flashlab.gpu) counts, with an
# instrumented build of each kernel, every byte it moves between global memory (HBM) and
# shared memory or registers; tests/test_gpu_traffic.py checks that the counts equal these
# formulas to the byte. Unlike hbm_elements_flash above, the causal skip is included and the
# standard kernel's re-reads of K and V per row tile are counted.

def gpu_keys_visited(seq_q: int, seq_k: int, block_q: int, block_k: int, q_block: int, *,
                     causal: bool = False) -> int:
    """Keys whose K and V rows the twin loads for query block ``q_block`` (rows ``[i0, i1)``).

    Every key block ``[j0, j0 + block_k)`` that holds an allowed key is loaded whole (cut at
    ``seq_k``); causal (key ``j`` allowed iff ``j <= i``) stops after the block holding key
    ``i1 - 1``: ``min(seq_k, block_k * ceil(min(seq_k, i1) / block_k))`` keys, else ``seq_k``.
    """
    if not causal:
        return seq_k
    i1 = min(seq_q, (q_block + 1) * block_q)
    # the last allowed key of the block's last row is i1 - 1: blocks 0 .. ceil(min(Sk, i1)/Bc)-1
    return min(seq_k, block_k * cdiv(min(seq_k, i1), block_k))


def tiled_attention_traffic(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, block_q: int,
                            block_k: int, batch: int = 1, heads: int = 1, causal: bool = False,
                            backward: bool = False, elem: int = 4,
                            kv_heads: int | None = None) -> Traffic:
    r"""Global-memory requests of the fused twin in bytes (all heads).

    Forward (:mod:`flashlab.gpu.forward`), per (batch, query head), with $k_i$ =
    :func:`gpu_keys_visited` of query block $i$:

    $$\text{read} = e\,\big(S_q D_{qk} + \textstyle\sum_i k_i (D_{qk} + D_v)\big),\qquad
    \text{write} = e\,(S_q D_v + S_q)$$

    (Q read once, K and V once per query block, O and the LSE written once; GQA changes
    nothing: each query head's blocks load their kv head's tiles themselves).

    Backward (:mod:`flashlab.gpu.backward`, FlashAttention-2's loop order: key blocks outer),
    with $R = \sum_i r_i \lceil k_i / B_c \rceil$ the query rows of all visited tiles
    ($r_i$ rows in query block $i$). Per (batch, query head): the preprocessing kernel reads
    $dO$ and $O$ once and writes $D$; every visited tile reads its Q, dO, LSE and D rows and
    adds its dQ rows atomically. Per (batch, **kv head**): K and V read once, dK and dV written
    once (``kv_heads`` = $H_{kv}$, default ``heads``):

    $$\text{read} = e\,\big(H (2 S_q D_v + R\,(D_{qk} + D_v + 2)) + H_{kv} S_k (D_{qk} + D_v)\big),$$
    $$\text{write} = e\,\big(H (S_q + R\,D_{qk}) + H_{kv} S_k (D_{qk} + D_v)\big)$$

    per batch. These are requests: the L2 cache may serve repeated ones (see
    :mod:`flashlab.gpu.traffic`).
    """
    kv_heads = heads if kv_heads is None else kv_heads
    for name, x in (("seq_q", seq_q), ("seq_k", seq_k), ("d_qk", d_qk), ("d_v", d_v),
                    ("block_q", block_q), ("block_k", block_k), ("batch", batch),
                    ("heads", heads), ("kv_heads", kv_heads), ("elem", elem)):
        as_int(name, x, lo=1)
    if heads % kv_heads:
        raise ValueError(f"heads must be a multiple of kv_heads; got heads={heads}, kv_heads={kv_heads}")
    block_q, block_k = min(block_q, seq_q), min(block_k, seq_k)
    keys = [gpu_keys_visited(seq_q, seq_k, block_q, block_k, i, causal=causal)
            for i in range(cdiv(seq_q, block_q))]
    if backward:
        # query rows of every visited (query block, key block) tile
        rows = sum(min(block_q, seq_q - i * block_q) * cdiv(k, block_k) for i, k in enumerate(keys))
        kv = seq_k * (d_qk + d_v)
        read = heads * (2 * seq_q * d_v + rows * (d_qk + d_v + 2)) + kv_heads * kv
        write = heads * (seq_q + rows * d_qk) + kv_heads * kv
    else:
        read = heads * (seq_q * d_qk + sum(keys) * (d_qk + d_v))
        write = heads * (seq_q * d_v + seq_q)
    n = batch * elem
    return Traffic(read * n, write * n)


def standard_attention_traffic(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, tile: int,
                               batch: int = 1, heads: int = 1, elem: int = 4) -> Traffic:
    r"""Global-memory requests of the standard three-kernel attention of the twin, in bytes.

    Per (batch, head), with $t = \lceil S_q / T \rceil$ row tiles of ``tile`` rows:

    - scores: Q read once, K once per row tile, S written: read $S_q D_{qk} + t S_k D_{qk}$,
      write $S_q S_k$;
    - softmax, one thread per row, in place: a pass reading S for the max and the sum, a pass
      reading S and writing P: read $2 S_q S_k$, write $S_q S_k$;
    - PV: P read once, V once per row tile, O written: read $S_q S_k + t S_k D_v$, write
      $S_q D_v$.

    Causal masking skips nothing here (masked scores are written as $-\infty$ and read back).
    """
    for name, x in (("seq_q", seq_q), ("seq_k", seq_k), ("d_qk", d_qk), ("d_v", d_v),
                    ("tile", tile), ("batch", batch), ("heads", heads), ("elem", elem)):
        as_int(name, x, lo=1)
    t = cdiv(seq_q, tile)
    n = seq_q * seq_k
    read = (seq_q * d_qk + t * seq_k * d_qk) + 2 * n + (n + t * seq_k * d_v)
    write = n + n + seq_q * d_v
    m = batch * heads * elem
    return Traffic(read * m, write * m)

