r"""The MLA step ledgers: every operator of the four dataflows of :mod:`flashlab.mla`, in closed form.

:func:`mla_forward_steps` and :func:`mla_backward_steps` give each step's FLOPs, bytes read and
written, and the memory it allocates (a :class:`~flashlab.dataflows.Step`), for the four
dataflows (:class:`~flashlab.dataflows.Dataflow`); :func:`mla_savings` the factor each RECT-FA
idea (:data:`MLA_IDEAS`) saves. The ledger :mod:`flashlab.mla` measures on the arrays its steps
really touch produces the same steps; the tests hold the two equal.

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
  :func:`flashlab.traffic.hbm_elements_flash`, come on top).
* Extra memory ("allocated"): every step allocates its outputs, as separate operators do;
  "workspace" is scratch the step frees again: here only the backward kernel's per-head
  partial sums of dK/dV/dK_rope, the price of its deterministic parallel split (the
  alternative, atomic adds into one buffer, is discussed in :mod:`flashlab.kernels.backward`).
"""
from __future__ import annotations

from typing import Any

from flashlab.arguments import as_int
from flashlab.dataflows import DATAFLOWS, Dataflow, Step, StepName, total
from flashlab.tiling import KV_RESIDENT, cdiv, check_hit_rate, kv_reread_factor, q_splits

__all__ = ["accumulator_bytes", "attended_pairs", "mla_dataflow_ideas", "check_dataflow",
           "mla_forward_steps", "backward_partials_elements", "mla_backward_steps", "MLA_IDEAS",
           "mla_savings"]


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


def _sizes(dataflow: str, batch: int, heads: int, seq: int, seq_k: int | None, d_nope: int,
           d_rope: int, d_v: int, elem: int, block_q: int, causal: bool) -> tuple:
    """The sizes both ledgers start from, checked: ``(Sk, D, n_q, n_k, n_r, P, QK dim, V dim,
    pad_v, split_rope, LSE bytes)`` in the notation of the module docstring."""
    sk = seq if seq_k is None else seq_k
    _check_mla_sizes(dataflow, batch=batch, heads=heads, seq=seq, seq_k=sk, d_nope=d_nope,
                     d_rope=d_rope, d_v=d_v, elem=elem, block_q=block_q)
    # n_q = B H Sq query rows, n_k = B H Sk per-head key rows, n_r = B Sk rows of the shared k_rope
    nq, nk, nr = batch * heads * seq, batch * heads * sk, batch * sk
    # P: the attended (query, key) pairs of all heads
    pairs = batch * heads * attended_pairs(seq, sk, causal)
    return (sk, d_nope + d_rope, nq, nk, nr, pairs, *_attention_dims(dataflow, d_nope, d_rope, d_v),
            *mla_dataflow_ideas(dataflow), accumulator_bytes(elem) * nq)


def mla_forward_steps(batch: int, heads: int, seq: int, d_nope: int, d_rope: int, d_v: int, *,
                      dataflow: str = "rect", causal: bool = False, elem: int = 2,
                      seq_k: int | None = None, kv_hit: float = KV_RESIDENT,
                      block_q: int = 128) -> list[Step]:
    """Closed-form cost of each forward step of ``dataflow`` (see :mod:`flashlab.mla`).

    ``seq`` is the query length, ``seq_k`` the key length (default ``seq``). Returns the
    steps in order, with the names :func:`flashlab.mla.mla_forward` gives them. ``kv_hit``
    is the on-chip hit rate of the kernel's K/V re-reads (:func:`~flashlab.tiling.kv_reread_factor`; the
    default 1, K/V resident, is the compulsory traffic the kernels' ledgers count), with
    q-blocks of ``block_q`` rows.
    """
    check_hit_rate(kv_hit)
    sk, d, nq, nk, nr, pairs, d_qk_att, d_v_att, pad_v, split, lse = _sizes(
        dataflow, batch, heads, seq, seq_k, d_nope, d_rope, d_v, elem, block_q, causal)
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
    sk, d, nq, nk, nr, pairs, d_qk_att, d_v_att, pad_v, split, lse = _sizes(
        dataflow, batch, heads, seq, seq_k, d_nope, d_rope, d_v, elem, block_q, causal)
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
