"""FLOP counts and arithmetic intensity (FLOP per main-memory byte) of attention.

FLOPs are 2 per multiply-add of the matrix products, as in the FlashAttention papers (the
softmax is not counted, except by :func:`matmul_intensities` and :func:`operation_costs`,
which count :data:`SOFTMAX_FLOPS_PER_ELEMENT` per score). Intensities divide them by the bytes
of the one traffic model, :mod:`flashlab.traffic`. Counts are *per (batch, head)* unless a
function takes ``batch``/``heads``; bytes use ``elem`` bytes per element.
"""
from __future__ import annotations

from flashlab.arguments import as_int
from flashlab.tiling import check_hit_rate
from flashlab.traffic import backward_traffic, traffic

__all__ = ["SOFTMAX_FLOPS_PER_ELEMENT", "attention_flops", "attention_backward_flops",
           "matmul_intensities", "operation_costs", "operation_intensities", "flash_backward_intensity"]

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
    :func:`~flashlab.traffic.traffic` ``("fused", kv_hit=kv_hit)``: at the default ``kv_hit=0`` (every K/V re-read
    from main memory) that is ``elem * hbm_elements_flash(...)``.
    """
    for name, x in (("seq_q", seq_q), ("seq_k", seq_k), ("d_qk", d_qk), ("d_v", d_v),
                    ("block_q", block_q), ("elem", elem)):
        as_int(name, x, lo=1)
    check_hit_rate(kv_hit)
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
    model's backward, :func:`~flashlab.traffic.backward_traffic` (``"fused"``, with the LSE read in the
    accumulator's dtype). With ``kv_hit = 0`` and no mask:
    ``elem (Sq (2 Dqk + 2 Dv) + 3 n_qb Sk (Dqk + Dv)) + a Sq`` bytes.
    """
    t = backward_traffic("fused", seq_q=seq_q, seq_k=seq_k, d_qk=d_qk, d_v=d_v, elem=elem,
                         block_q=block_q, kv_hit=kv_hit, causal=causal)
    return attention_backward_flops(seq_q, seq_k, d_qk, d_v) / t.total
