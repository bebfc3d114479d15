r"""Closed-form cost models: FLOPs, main-memory (HBM) traffic and arithmetic intensity.

All counts are *per (batch, head)* unless a function takes ``batch``/``heads``; bytes use
``elem`` bytes per element (2 for fp16/bf16, 4 for fp32).

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

**MLA dataflows** (:func:`mla_forward_steps`, :func:`mla_backward_steps`): closed forms for the
four dataflows of :mod:`flashlab.mla`, step by step, and the factor each RECT-FA idea saves
(:func:`mla_savings`).

Notation: $B$ batch, $H$ heads, $S_q$/$S_k$ lengths, $D_n$/$D_r$/$D_v$ the NoPE, RoPE and V
head dims (DeepSeek-V3: 128, 64, 128), $D = D_n + D_r$; $P$ the attended (query, key) pairs
of all heads ($B H S_q S_k$, about half with ``causal``); $e$ bytes per element; the LSE is
kept in the compute dtype (:func:`accumulator_bytes`). Row counts: $n_q = B H S_q$ query rows,
$n_k = B H S_k$ per-head key rows, $n_r = B S_k$ rows of the shared ``k_rope``.

* FLOPs: 2 per multiply-add of the matrix products (softmax work not counted, as in the
  FlashAttention papers) and 1 per addition of the head-sum of the baseline's backward.
  Forward $2P(D + D_v^{att})$; backward $2P(3D + 2D_v^{att})$ (5 products), with
  $D_v^{att} = D$ when V is padded and $D_v$ otherwise.
* Bytes: every step reads each input array once and writes each output array once (the
  compulsory traffic of an operator; the tiled kernel's re-reads of K and V per query block,
  :func:`hbm_elements_flash`, come on top).
* Extra memory ("allocated"): every step allocates its outputs, as separate operators do;
  "workspace" is scratch the step frees again: here only the backward kernel's per-head
  partial sums of dK/dV/dK_rope, the price of its deterministic parallel split (the
  alternative, atomic adds into one buffer, is discussed in :mod:`flashlab.kernels.backward`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flashlab.arguments import as_int
from flashlab.dataflows import DATAFLOWS, Dataflow, Step, StepName, total
from flashlab.tiling import cdiv, q_splits

__all__ = ["SOFTMAX_FLOPS_PER_ELEMENT", "attention_flops", "attention_backward_flops",
           "matmul_intensities", "hbm_elements_standard", "hbm_elements_flash", "block_for_sram",
           "fa1_theorem2", "standard_attention_extra_bytes", "operation_costs",
           "operation_intensities", "flash_backward_intensity",
           "mla_dataflow_ideas", "accumulator_bytes", "attended_pairs",
           "check_dataflow", "mla_forward_steps", "backward_partials_elements",
           "mla_backward_steps", "MLA_IDEAS", "mla_savings",
           "KV_RESIDENT", "TRAFFIC_DATAFLOWS", "BACKWARD_TRAFFIC_DATAFLOWS", "Traffic",
           "kv_reread_factor", "traffic", "backward_traffic"]

#: floating-point operations counted per softmax element (max, subtract, exp, sum, divide)
SOFTMAX_FLOPS_PER_ELEMENT = 5


def attention_flops(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, batch: int = 1,
                    heads: int = 1, tile_fraction: float = 1.0) -> float:
    """Matmul FLOPs of the forward: ``2 Sq Sk Dqk`` (Q K^T) + ``2 Sq Sk Dv`` (P V), per the
    convention of the FlashAttention papers (softmax not counted). ``tile_fraction`` scales
    the work for masks whose skipped tiles are never computed (e.g. ~0.5 for causal)."""
    return 2.0 * seq_q * seq_k * (d_qk + d_v) * batch * heads * tile_fraction


def attention_backward_flops(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, batch: int = 1,
                             heads: int = 1, tile_fraction: float = 1.0) -> float:
    """Matmul FLOPs of the recomputing backward: five matmuls per tile,
    ``S = Q K^T`` (Dqk), ``dP = dO V^T`` (Dv), ``dV += P^T dO`` (Dv), ``dQ += dS K`` (Dqk),
    ``dK += dS^T Q`` (Dqk): ``2 Sq Sk (3 Dqk + 2 Dv)``, i.e. 2.5x the forward when Dqk = Dv."""
    return 2.0 * seq_q * seq_k * (3 * d_qk + 2 * d_v) * batch * heads * tile_fraction


def matmul_intensities(seq_q: int, seq_k: int, d_qk: int, d_v: int, elem: int = 2) -> dict:
    """Arithmetic intensity (FLOP per HBM byte) of each step of *standard* attention.

    Returns ``{"QK^T": ..., "softmax": ..., "PV": ...}``: each step reads its inputs from HBM and
    writes its output back, as unfused operators do.
    """
    n = seq_q * seq_k
    qk_bytes = elem * (seq_q * d_qk + seq_k * d_qk + n)
    sm_bytes = elem * 2 * n
    pv_bytes = elem * (n + seq_k * d_v + seq_q * d_v)
    return {
        "QK^T": 2.0 * n * d_qk / qk_bytes,
        "softmax": SOFTMAX_FLOPS_PER_ELEMENT * n / sm_bytes,
        "PV": 2.0 * n * d_v / pv_bytes,
    }


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


def operation_costs(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, block_q: int = 128,
                    elem: int = 2, kv_hit: float = 0.0) -> dict[str, tuple[float, float]]:
    """``{name: (FLOPs, HBM bytes)}`` per (batch, head) for the roofline.

    The three steps of standard attention as *unfused* operators (each reads its inputs from
    HBM and writes its output back, as :func:`matmul_intensities` counts them):

    - ``"QK^T"``: ``2 Sq Sk Dqk`` FLOPs; reads Q, K, writes S;
    - ``"softmax"``: ``5 Sq Sk`` FLOPs; reads S, writes P;
    - ``"PV"``: ``2 Sq Sk Dv`` FLOPs; reads P, V, writes O;

    then ``"standard attention"``: the three together (their FLOPs and bytes summed; the bytes
    are ``elem * hbm_elements_standard(...)``), and ``"FlashAttention (fused)"``: the same
    arithmetic (the online softmax's rescaling is not counted) with the traffic of
    :func:`traffic` ``("fused", kv_hit=kv_hit)``: at the default ``kv_hit=0`` (every K/V re-read
    from main memory) that is ``elem * hbm_elements_flash(...)``.
    """
    for name, x in (("seq_q", seq_q), ("seq_k", seq_k), ("d_qk", d_qk), ("d_v", d_v),
                    ("block_q", block_q), ("elem", elem)):
        as_int(name, x, lo=1)
    _check_hit(kv_hit)
    n = seq_q * seq_k
    steps: dict[str, tuple[float, float]] = {
        # Q K^T: 2 n Dqk FLOPs; read Q (Sq x Dqk), K (Sk x Dqk), write S (Sq x Sk)
        "QK^T": (2.0 * n * d_qk, elem * (seq_q * d_qk + seq_k * d_qk + n)),
        # softmax: 5 FLOPs per element; read S, write P
        "softmax": (float(SOFTMAX_FLOPS_PER_ELEMENT * n), elem * 2 * n),
        # P V: 2 n Dv FLOPs; read P (Sq x Sk), V (Sk x Dv), write O (Sq x Dv)
        "PV": (2.0 * n * d_v, elem * (n + seq_k * d_v + seq_q * d_v)),
    }
    total_flops = sum(f for f, _ in steps.values())
    steps["standard attention"] = (total_flops, sum(b for _, b in steps.values()))
    # fused: the same FLOPs, the bytes of traffic("fused") with every K/V re-read a miss
    steps["FlashAttention (fused)"] = (
        total_flops, traffic("fused", seq_q=seq_q, seq_k=seq_k, d_qk=d_qk, d_v=d_v, elem=elem,
                             block_q=block_q, kv_hit=kv_hit, lse_elem=elem).total)
    return steps


def operation_intensities(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, block_q: int = 128,
                          elem: int = 2, kv_hit: float = 0.0) -> dict[str, float]:
    """Arithmetic intensity (FLOP/byte) of each entry of :func:`operation_costs`."""
    return {name: f / b for name, (f, b) in
            operation_costs(seq_q, seq_k, d_qk, d_v, block_q=block_q, elem=elem, kv_hit=kv_hit).items()}


def flash_backward_intensity(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, block_q: int,
                             elem: int = 4, kv_hit: float = 0.0, causal: bool = False) -> float:
    """Arithmetic intensity (FLOP/byte) of the tiled recomputation backward (model).

    FLOPs: :func:`attention_backward_flops`, five products per tile; bytes: the one traffic
    model's backward, :func:`backward_traffic` (``"fused"``, with the LSE read in the
    accumulator's dtype). With ``kv_hit = 0`` and no mask:
    ``elem (Sq (2 Dqk + 2 Dv) + 3 n_qb Sk (Dqk + Dv)) + a Sq`` bytes.
    """
    t = backward_traffic("fused", seq_q=seq_q, seq_k=seq_k, d_qk=d_qk, d_v=d_v, elem=elem,
                         block_q=block_q, kv_hit=kv_hit, causal=causal)
    return attention_backward_flops(seq_q, seq_k, d_qk, d_v) / t.total


# ------------------------------------------------------------------------------------------
# One traffic model: main-memory bytes of every dataflow, with the on-chip reuse a parameter
# ------------------------------------------------------------------------------------------

#: ``kv_hit = 1``: every K/V re-read of the fused kernel is served on chip (L2 or a resident
#: copy): only the compulsory traffic, one read of K and V, reaches main memory
KV_RESIDENT = 1.0

#: the dataflows :func:`traffic` knows: standard attention (Algorithm 0), the fused kernel,
#: one decoding step, the four MLA dataflows (``"mla:<dataflow>"``) and the two kernels of the
#: CUDA twin :mod:`flashlab.gpu` (``"gpu:standard"``, ``"gpu:fused"``), counted as the twin
#: requests them from global memory
TRAFFIC_DATAFLOWS = ("standard", "fused", "decode", *(f"mla:{f}" for f in DATAFLOWS),
                     "gpu:standard", "gpu:fused")
#: the dataflows :func:`backward_traffic` knows: the fused backward and the twin's
BACKWARD_TRAFFIC_DATAFLOWS = ("fused", "gpu:fused")


def _check_hit(kv_hit) -> None:
    if isinstance(kv_hit, bool) or not isinstance(kv_hit, (int, float)) or not 0.0 <= kv_hit <= 1.0:
        raise ValueError(f"kv_hit must be a number in [0, 1] (the on-chip hit rate of K/V re-reads); "
                         f"got {kv_hit!r}")


def kv_reread_factor(seq_q: int, block_q: int, kv_hit: float, *, seq_k: int | None = None,
                     causal: bool = False) -> float:
    r"""How many times the fused kernel's K and V cross the main-memory bus, per head.

    The kernel runs $n_{qb} = \lceil S_q / B_r \rceil$ q-blocks, each streaming the keys it
    attends: all $S_k$ of them, or with ``causal`` (top-left) the first $\min(i_1, S_k)$ for
    the q-block ending at row $i_1$. Together they read $F_0 S_k$ key rows ($F_0 = n_{qb}$
    without a mask). The first pass is compulsory; each re-read is served on chip with
    probability ``kv_hit`` (the L2 hit rate; 1 = K/V resident):

    $$ f = 1 + (F_0 - 1)(1 - h). $$

    >>> kv_reread_factor(4096, 128, 0.0), kv_reread_factor(4096, 128, 1.0), kv_reread_factor(4096, 128, 0.5)
    (32.0, 1.0, 16.5)
    >>> kv_reread_factor(4096, 128, 0.0, causal=True)
    16.5
    """
    _check_hit(kv_hit)
    sk = seq_q if seq_k is None else seq_k
    if causal:
        # q-block [i0, i1) reads keys [0, min(i1, Sk)): F0 = sum of those / Sk
        ends = [min(i0 + block_q, seq_q) for i0 in range(0, seq_q, block_q)]
        f0 = sum(min(i1, sk) for i1 in ends) / sk
    else:
        f0 = float(cdiv(seq_q, block_q))
    return 1.0 + (f0 - 1.0) * (1.0 - kv_hit)          # f = 1 + (F0 - 1)(1 - h)


@dataclass(frozen=True)
class Traffic:
    """Main-memory bytes of one dataflow: ``read``, ``written`` and their ``total``."""

    read: float
    written: float

    @property
    def total(self) -> float:
        return self.read + self.written


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
      $f$ = :func:`kv_reread_factor` (``kv_hit = 0``, no mask, gives :func:`hbm_elements_flash`;
      with ``causal`` only the tiles the kernel visits are read);
    - ``"decode"``: one decoding step of ``seq_q`` new queries against a cache of ``seq_k``
      keys, one q-block: $f = 1$ whatever ``kv_hit``;
    - ``"mla:baseline"``, ``"mla:native_v"``, ``"mla:split_rope"``, ``"mla:rect"``: every
      operator of the MLA dataflow (:func:`mla_forward_steps`: pad, expand, concat, the kernel,
      slice), the kernel's K/V re-reads with the same $f$. The kernel of ``"mla:native_v"`` *is*
      ``"fused"`` with $d = D_n + D_r$.

    Dims: ``d_qk`` (or ``d_nope + d_rope`` for MLA, where ``d_nope`` is required) and ``d_v``;
    ``elem`` bytes per element, ``lse_elem`` bytes per LSE entry (default: the accumulator's,
    :func:`accumulator_bytes`); ``kv_hit`` in [0, 1] the on-chip hit rate of K/V re-reads
    (:data:`KV_RESIDENT` = 1). Sizes for ``batch * heads`` heads (MLA: ``heads`` query heads,
    one shared RoPE key head).

    The ``"gpu:*"`` dataflows are **global-memory requests**, what the twin's instrumented
    kernels count, whether L2 serves them or DRAM: they take no ``kv_hit`` (it must be 0) and
    ``block_k`` (default ``block_q``) is their key tile. For the DRAM bytes of the same kernels
    when L2 holds every re-read, take ``"fused"`` / ``"standard"`` with ``kv_hit=1``.
    """
    if dataflow not in TRAFFIC_DATAFLOWS:
        raise ValueError(f"dataflow must be one of {TRAFFIC_DATAFLOWS}; got {dataflow!r}")
    _check_hit(kv_hit)
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
    $f = 1 + (F_0 - 1)(1 - h)$ as the forward (:func:`kv_reread_factor`; ``kv_hit`` = $h$):

    $$ \text{read} = e\,(S_q (d + 2 d_v) + 2 f S_k (d + d_v)) + a\,S_q,\qquad
       \text{written} = e\,(S_q d + f S_k (d + d_v)). $$

    ``lse_elem`` ($a$) defaults to the accumulator's bytes (:func:`accumulator_bytes`), as in
    :func:`traffic`. Sizes for ``batch * heads`` heads.
    """
    if dataflow not in BACKWARD_TRAFFIC_DATAFLOWS:
        raise ValueError(f"dataflow must be one of {BACKWARD_TRAFFIC_DATAFLOWS} (the backwards the "
                         f"traffic model covers); got {dataflow!r}")
    _check_hit(kv_hit)
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
        read, written = standard_attention_traffic(seq_q, seq_k, d_qk, d_v, tile=block_q,
                                                   batch=batch, heads=heads, elem=elem)
    else:
        read, written = tiled_attention_traffic(
            seq_q, seq_k, d_qk, d_v, block_q=block_q,
            block_k=block_q if block_k is None else block_k, batch=batch, heads=heads,
            causal=causal, backward=backward, elem=elem, kv_heads=kv_heads)
    return Traffic(float(read), float(written))


# ------------------------------------------------------------------------------------------
# MLA: padding V vs native head dims, concatenating RoPE vs accumulating it in the kernel
# ------------------------------------------------------------------------------------------

def mla_dataflow_ideas(dataflow: str) -> tuple[bool, bool]:
    """``(pad_v, split_rope)`` of an MLA dataflow (:class:`~flashlab.dataflows.Dataflow`).

    >>> [mla_dataflow_ideas(f) for f in DATAFLOWS]
    [(True, False), (False, False), (True, True), (False, True)]
    """
    f = Dataflow(dataflow)
    return f.pad_v, f.split_rope


def accumulator_bytes(elem: int) -> int:
    """Bytes per element of what the kernels compute in: 8 for float64 inputs, else 4 (float32).

    The LSE and the backward's partial sums are kept in it (:func:`flashlab.api.compute_dtype`).
    """
    return 8 if elem == 8 else 4



def attended_pairs(seq_q: int, seq_k: int, causal: bool = False) -> int:
    """Number of (query, key) pairs one head attends: ``Sq Sk``, or with ``causal`` (top-left,
    key ``j <= i``) ``sum_i min(i + 1, Sk)``.

    >>> attended_pairs(4, 4, causal=True), attended_pairs(5, 3, causal=True)
    (10, 12)
    """
    if not causal:
        return seq_q * seq_k
    n = min(seq_q, seq_k)
    # rows 0..n-1 see i + 1 keys; the rows past Sk see all Sk keys
    return n * (n + 1) // 2 + (seq_q - n) * seq_k


def check_dataflow(dataflow) -> Dataflow:
    """``dataflow`` as a :class:`~flashlab.dataflows.Dataflow` (``ValueError`` naming the four)."""
    if dataflow not in DATAFLOWS:
        raise ValueError(f"dataflow must be one of {tuple(map(str, DATAFLOWS))}; got {dataflow!r}")
    return Dataflow(dataflow)


def _check_mla_sizes(dataflow: str, **sizes) -> None:
    check_dataflow(dataflow)
    for name, x in sizes.items():
        as_int(name, x, lo=1)
    if mla_dataflow_ideas(dataflow)[0] and sizes["d_v"] > sizes["d_nope"] + sizes["d_rope"]:
        raise ValueError(f"the {dataflow} dataflow pads V to D = d_nope + d_rope, so d_v must be <= "
                         f"{sizes['d_nope'] + sizes['d_rope']}; got {sizes['d_v']}")


def _attention_dims(dataflow: str, d_nope: int, d_rope: int, d_v: int) -> tuple[int, int]:
    """``(QK dim, V dim)`` the attention kernel computes with: V padded to D in the baseline and
    in split_rope."""
    d = d_nope + d_rope
    return d, (d if mla_dataflow_ideas(dataflow)[0] else d_v)


def mla_forward_steps(batch: int, heads: int, seq: int, d_nope: int, d_rope: int, d_v: int, *,
                      dataflow: str = "rect", causal: bool = False, elem: int = 2,
                      seq_k: int | None = None, kv_hit: float = KV_RESIDENT,
                      block_q: int = 128) -> list[Step]:
    """Closed-form cost of each forward step of ``dataflow`` (see :mod:`flashlab.mla`).

    ``seq`` is the query length, ``seq_k`` the key length (default ``seq``). Returns the
    steps in order, with the names :func:`flashlab.mla.mla_forward` gives them. ``kv_hit``
    is the on-chip hit rate of the kernel's K/V re-reads (:func:`kv_reread_factor`; the
    default 1, K/V resident, is the compulsory traffic the kernels' ledgers count), with
    q-blocks of ``block_q`` rows.
    """
    sk = seq if seq_k is None else seq_k
    _check_mla_sizes(dataflow, batch=batch, heads=heads, seq=seq, seq_k=sk, d_nope=d_nope,
                     d_rope=d_rope, d_v=d_v, elem=elem, block_q=block_q)
    _check_hit(kv_hit)
    d = d_nope + d_rope
    nq, nk, nr = batch * heads * seq, batch * heads * sk, batch * sk
    pairs = batch * heads * attended_pairs(seq, sk, causal)
    d_qk_att, d_v_att = _attention_dims(dataflow, d_nope, d_rope, d_v)
    pad_v, split = mla_dataflow_ideas(dataflow)
    lse = accumulator_bytes(elem) * nq
    steps = []

    def step(name: StepName, flops: int, read: int, written: int) -> None:
        # every step allocates what it writes
        steps.append(Step(name, flops, read, written, written))

    if not split:
        # read k_rope (B, 1, Sk, Dr); write it per head (B, H, Sk, Dr)
        step(StepName.EXPAND_K_ROPE, 0, elem * nr * d_rope, elem * nk * d_rope)
        # read q_nope, q_rope; write Q = [q_nope, q_rope] (B, H, Sq, D)
        step(StepName.CONCAT_Q, 0, elem * nq * (d_nope + d_rope), elem * nq * d)
        # read k_nope and the expanded k_rope; write K (B, H, Sk, D)
        step(StepName.CONCAT_K, 0, elem * nk * (d_nope + d_rope), elem * nk * d)
    if pad_v:
        # read V (B, H, Sk, Dv); write it zero-padded to (B, H, Sk, D)
        step(StepName.PAD_V, 0, elem * nk * d_v, elem * nk * d)
    # FLOPs: S = Q K^T: 2 P D ; O = P V: 2 P Dv_att
    flops = 2 * pairs * d_qk_att + 2 * pairs * d_v_att
    if split:
        # read q_nope, q_rope, k_nope, V (padded in split_rope) and the ONE shared k_rope head
        read = elem * (nq * (d_nope + d_rope) + nk * (d_nope + d_v_att) + nr * d_rope)
    else:
        read = elem * (nq * d + nk * d + nk * d_v_att)
    # K/V re-read per q-block, the misses only: (f - 1) more passes over every head's K, V
    read += round((kv_reread_factor(seq, block_q, kv_hit, seq_k=sk, causal=causal) - 1)
                  * elem * nk * (d + d_v_att))
    # write O (B, H, Sq, Dv_att) and the LSE
    step(StepName.ATTENTION, flops, read, elem * nq * d_v_att + lse)
    if pad_v:
        # read the first Dv columns of O; write them as (B, H, Sq, Dv)
        step(StepName.SLICE_O, 0, elem * nq * d_v, elem * nq * d_v)
    return steps


def backward_partials_elements(batch: int, heads: int, seq_q: int, seq_k: int,
                               grads: list[tuple[int, int]], block_q: int) -> int:
    """Elements of the backward kernel's partial-sum buffers (:mod:`flashlab.kernels.backward`).

    ``grads``: ``(heads of the gradient, its dim)`` for each of dK, dV (and dK_rope). A
    gradient whose heads equal the query heads, with one query chunk per head, is written
    directly; any other gets ``B * H * n_split * Sk * dim`` partials, ``n_split`` from
    :func:`flashlab.tiling.q_splits`.
    """
    n_split = q_splits(batch, heads, cdiv(seq_q, block_q))
    return sum(0 if (g == heads and n_split == 1) else batch * heads * n_split * seq_k * dim
               for g, dim in grads)


def mla_backward_steps(batch: int, heads: int, seq: int, d_nope: int, d_rope: int, d_v: int, *,
                       dataflow: str = "rect", causal: bool = False, elem: int = 2,
                       seq_k: int | None = None, block_q: int = 64) -> list[Step]:
    """Closed-form cost of each backward step of ``dataflow``: the forward's steps reversed.

    ``block_q`` only sets the backward kernel's workspace (its query chunks per head). The
    workspace is counted in the kernel's accumulation dtype: 8 bytes for float64, else 4.
    """
    sk = seq if seq_k is None else seq_k
    _check_mla_sizes(dataflow, batch=batch, heads=heads, seq=seq, seq_k=sk, d_nope=d_nope,
                     d_rope=d_rope, d_v=d_v, elem=elem, block_q=block_q)
    d = d_nope + d_rope
    nq, nk, nr = batch * heads * seq, batch * heads * sk, batch * sk
    pairs = batch * heads * attended_pairs(seq, sk, causal)
    d_qk_att, d_v_att = _attention_dims(dataflow, d_nope, d_rope, d_v)
    pad_v, split = mla_dataflow_ideas(dataflow)
    lse = accumulator_bytes(elem) * nq
    acc_elem = accumulator_bytes(elem)
    steps = []

    def step(name: StepName, flops: int, read: int, written: int, workspace: int = 0) -> None:
        steps.append(Step(name, flops, read, written, written, workspace))

    if pad_v:
        # the gradient of "slice O" is a pad: read dO (B, H, Sq, Dv), write it padded to D
        step(StepName.PAD_DO, 0, elem * nq * d_v, elem * nq * d)
    # FLOPs of the 5 products: S = Q K^T, dQ = dS K, dK = dS^T Q (QK dim); dV = P^T dO,
    # dP = dO V^T (V dim)
    flops = 2 * pairs * (3 * d_qk_att + 2 * d_v_att)
    if split:
        # read dO, O, V (V dim: padded in split_rope), q_nope, k_nope, q_rope, the shared
        # k_rope, LSE
        read = elem * (2 * nq * d_v_att + nk * d_v_att + nq * d_nope + nk * d_nope
                       + nq * d_rope + nr * d_rope) + lse
        # write dq_nope, dk_nope, dV, dq_rope and the shared head's dk_rope
        written = elem * (nq * d_nope + nk * d_nope + nk * d_v_att + nq * d_rope + nr * d_rope)
        grads = [(heads, d_nope), (heads, d_v_att), (1, d_rope)]
    else:
        # read dO, O (V dim), Q, K (D), V, LSE; write dQ, dK (D), dV
        read = elem * (2 * nq * d_v_att + nq * d + nk * d + nk * d_v_att) + lse
        written = elem * (nq * d + nk * d + nk * d_v_att)
        grads = [(heads, d), (heads, d_v_att)]
    workspace = acc_elem * backward_partials_elements(batch, heads, seq, sk, grads, block_q)
    step(StepName.ATTENTION_BACKWARD, flops, read, written, workspace)
    if not split:
        # the gradient of "concat Q": read dQ (D), write dq_nope and dq_rope
        step(StepName.SPLIT_DQ, 0, elem * nq * d, elem * nq * (d_nope + d_rope))
        # the gradient of "concat K": read dK (D), write dk_nope and the per-head dk_rope
        step(StepName.SPLIT_DK, 0, elem * nk * d, elem * nk * (d_nope + d_rope))
        # the gradient of "expand k_rope": add the H per-head gradients, (H - 1) adds each
        step(StepName.SUM_DK_ROPE, (nk - nr) * d_rope, elem * nk * d_rope, elem * nr * d_rope)
    if pad_v:
        # the gradient of "pad V" is a slice: read the first Dv columns of dV, write them
        step(StepName.SLICE_DV, 0, elem * nk * d_v, elem * nk * d_v)
    return steps


#: the two RECT-FA ideas and both together, each as (dataflow before, dataflow after)
MLA_IDEAS = {
    "native V (no pad, no slice)": (Dataflow.BASELINE, Dataflow.NATIVE_V),
    "split RoPE (no expand, no concat)": (Dataflow.NATIVE_V, Dataflow.RECT),
    "RECT-FA (both)": (Dataflow.BASELINE, Dataflow.RECT),
}


def mla_savings(batch: int, heads: int, seq: int, d_nope: int, d_rope: int, d_v: int, *,
                causal: bool = False, elem: int = 2, seq_k: int | None = None,
                block_q: int = 64) -> dict[str, dict[str, float]]:
    """Predicted factor (before / after) of each idea of :data:`MLA_IDEAS`, per quantity.

    Quantities: ``"PV FLOPs"`` (the forward's P V product), ``"forward FLOPs"``,
    ``"backward FLOPs"``, ``"forward bytes"`` and ``"backward bytes"`` (read + written),
    ``"forward memory"`` and ``"backward memory"`` (allocated + workspace of all steps).
    A factor 1.5 means the "before" dataflow does 1.5x the "after" one; the fraction saved
    is ``1 - 1/factor``. With DeepSeek-V3's dims, padding V costs ``"PV FLOPs"`` = 192/128 = 1.5.
    """
    args = (batch, heads, seq, d_nope, d_rope, d_v)
    kw: dict[str, Any] = dict(causal=causal, elem=elem, seq_k=seq_k)
    sk = seq if seq_k is None else seq_k
    pairs = batch * heads * attended_pairs(seq, sk, causal)

    def quantities(flow: str) -> dict[str, float]:
        fwd = total(mla_forward_steps(*args, dataflow=flow, **kw))
        bwd = total(mla_backward_steps(*args, dataflow=flow, block_q=block_q, **kw))
        return {
            "PV FLOPs": 2 * pairs * _attention_dims(flow, d_nope, d_rope, d_v)[1],
            "forward FLOPs": fwd.flops, "backward FLOPs": bwd.flops,
            "forward bytes": fwd.bytes_read + fwd.bytes_written,
            "backward bytes": bwd.bytes_read + bwd.bytes_written,
            "forward memory": fwd.allocated + fwd.workspace,
            "backward memory": bwd.allocated + bwd.workspace,
        }

    q = {flow: quantities(flow) for flow in DATAFLOWS}
    return {idea: {k: q[before][k] / q[after][k] for k in q[before]}
            for idea, (before, after) in MLA_IDEAS.items()}


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
                            kv_heads: int | None = None) -> tuple[int, int]:
    r"""``(read_bytes, write_bytes)`` of global-memory requests by the fused twin (all heads).

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
    return read * n, write * n


def standard_attention_traffic(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, tile: int,
                               batch: int = 1, heads: int = 1, elem: int = 4) -> tuple[int, int]:
    r"""``(read_bytes, write_bytes)`` of the standard three-kernel attention of the twin.

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
    return read * m, write * m


__all__ += ["gpu_keys_visited", "tiled_attention_traffic", "standard_attention_traffic"]
