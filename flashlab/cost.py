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
"""
from __future__ import annotations

import math

#: floating-point operations counted per softmax element: max, subtract, exp, sum, divide
SOFTMAX_FLOPS_PER_ELEMENT = 5


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    n_qb = _cdiv(seq_q, block_q)
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
                    elem: int = 2) -> dict[str, tuple[float, int]]:
    """``{name: (FLOPs, HBM bytes)}`` per (batch, head) for the roofline.

    The three steps of standard attention as *unfused* operators (each reads its inputs from
    HBM and writes its output back, as :func:`matmul_intensities` counts them):

    - ``"QK^T"``: ``2 Sq Sk Dqk`` FLOPs; reads Q, K, writes S;
    - ``"softmax"``: ``5 Sq Sk`` FLOPs; reads S, writes P;
    - ``"PV"``: ``2 Sq Sk Dv`` FLOPs; reads P, V, writes O;

    then ``"standard attention"``: the three together (their FLOPs and bytes summed; the bytes
    are ``elem * hbm_elements_standard(...)``), and ``"FlashAttention (fused)"``: the same
    arithmetic (the online softmax's rescaling is not counted) with the traffic of
    :func:`hbm_elements_flash`.
    """
    for name, x in (("seq_q", seq_q), ("seq_k", seq_k), ("d_qk", d_qk), ("d_v", d_v),
                    ("block_q", block_q), ("elem", elem)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be an int >= 1; got {x!r}")
    n = seq_q * seq_k
    steps = {
        # Q K^T: 2 n Dqk FLOPs; read Q (Sq x Dqk), K (Sk x Dqk), write S (Sq x Sk)
        "QK^T": (2.0 * n * d_qk, elem * (seq_q * d_qk + seq_k * d_qk + n)),
        # softmax: 5 FLOPs per element; read S, write P
        "softmax": (float(SOFTMAX_FLOPS_PER_ELEMENT * n), elem * 2 * n),
        # P V: 2 n Dv FLOPs; read P (Sq x Sk), V (Sk x Dv), write O (Sq x Dv)
        "PV": (2.0 * n * d_v, elem * (n + seq_k * d_v + seq_q * d_v)),
    }
    total_flops = sum(f for f, _ in steps.values())
    steps["standard attention"] = (total_flops, sum(b for _, b in steps.values()))
    steps["FlashAttention (fused)"] = (
        total_flops, elem * hbm_elements_flash(seq_q, seq_k, d_qk, d_v, block_q))
    return steps


def operation_intensities(seq_q: int, seq_k: int, d_qk: int, d_v: int, *, block_q: int = 128,
                          elem: int = 2) -> dict[str, float]:
    """Arithmetic intensity (FLOP/byte) of each entry of :func:`operation_costs`."""
    return {name: f / b for name, (f, b) in
            operation_costs(seq_q, seq_k, d_qk, d_v, block_q=block_q, elem=elem).items()}
