r"""The MLA attention core in four dataflows, with a ledger of what every step costs.

After MLA's up-projections (DeepSeek-V2/V3, see :mod:`flashlab.rope`) head $h$ of a token has
a NoPE query $q^C_h$ and key $k^C_h$ ($D_n = 128$), a RoPE query $q^R_h$ ($D_r = 64$), a value
$v_h$ ($D_v = 128$), and there is **one** RoPE key $k^R$ per token shared by all heads:

$$
S_h = \text{scale}\,\big(Q^C_h {K^C_h}^\top + Q^R_h {K^R}^\top\big), \qquad
O_h = \operatorname{softmax}(S_h)\, V_h, \qquad \text{scale} = 1/\sqrt{D_n + D_r}.
$$

An attention operator that needs one Q, one K and one V of the same head dim forces extra
operators around it (the red Pad, Slice and Concat of the Ascend RECT-FA article, 2025-06-25).
:func:`mla_forward` and :func:`mla_backward` run the same math in four dataflows:

``"baseline"`` (every head dim equal, as FlashAttention-2 requires):
    expand $k^R$ to $H$ heads → concat $Q = [Q^C, Q^R]$ and $K = [K^C, K^R]$ ($D = 192$) →
    pad $V$ from 128 to 192 with zeros → attention at 192/192 → slice $O$ back to 128.
``"native_v"`` (RECT-FA's first idea alone: $D_{qk} \ne D_v$ in the kernel):
    expand, concat as above → attention at 192/128. The $PV$ product shrinks by 192/128.
``"split_rope"`` (RECT-FA's second idea alone):
    pad $V$ to 192 → ``flash_attention(q_nope, k_nope, v_padded, q_rope=q_rope,
    k_rope=k_rope)`` → slice $O$ back to 128: RoPE accumulated in the kernel as in ``"rect"``,
    V padded as in the baseline.
``"rect"`` (both ideas):
    ``flash_attention(q_nope, k_nope, v, q_rope=q_rope, k_rope=k_rope)`` at native dims:
    the kernel adds $Q^R {K^R}^\top$ into the score tile of $Q^C {K^C}^\top$ (RECT-FA's
    in-place Matmul accumulation) and reads the shared $k^R$ head directly: nothing is
    concatenated, expanded, padded or sliced.

The backward runs each dataflow's steps in reverse: the gradient of a slice is a pad, of a
pad a slice, of a concat a split, of an expand a sum over heads.

**The ledger.** Each step runs as a separate operator that allocates its outputs, and
records a :class:`~flashlab.dataflows.Step`: FLOPs, bytes read and written (each input array read once and each
output written once, measured with ``nbytes`` of the arrays it really touched), bytes it
allocated and the scratch it freed again. :mod:`flashlab.ledgers` has the same numbers in
closed form (:func:`flashlab.ledgers.mla_forward_steps`); the tests check that they agree, and
that :func:`ledger_peak` is the peak memory ``tracemalloc`` really sees.

Inputs are float32 or float64 (float16 would be converted to float32 inside the kernel API,
allocations the ledger would not see).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flashlab import api
from flashlab.dataflows import DATAFLOWS, Dataflow, Step, StepName, total
from flashlab.ledgers import backward_partials_elements, check_dataflow
from flashlab.masks import band_from

__all__ = ["DATAFLOWS", "Step", "MLAForward", "mla_forward", "mla_backward",
           "ledger_peak", "format_ledger", "expand_heads", "concat_last", "pad_last", "slice_last",
           "split_last", "sum_heads", "attention", "attention_backward"]


def _record(ledger: list[Step], name: StepName, reads: dict[str, np.ndarray],
            writes: dict[str, np.ndarray], *, matmuls: dict | None = None, flops: int = 0,
            workspace: int = 0) -> None:
    """Append the :class:`Step` of arrays ``reads`` -> ``writes`` to ``ledger``."""
    matmuls = dict(matmuls or {})
    written = sum(x.nbytes for x in writes.values())
    ledger.append(Step(name, int(flops) + sum(matmuls.values()),
                       sum(x.nbytes for x in reads.values()), written, written, int(workspace),
                       {k: x.shape for k, x in reads.items()},
                       {k: x.shape for k, x in writes.items()}, matmuls))


def ledger_peak(ledger: list[Step]) -> int:
    """Peak extra memory of a dataflow whose step outputs all live until it returns.

    ``max_k (allocated by steps 1..k) + workspace of step k``: the workspace of a step is
    freed when it ends. This is what :func:`mla_forward`/:func:`mla_backward` really hold
    (they keep every intermediate: the forward's are saved for the backward).
    """
    peak, held = 0, 0
    for s in ledger:
        held += s.allocated
        peak = max(peak, held + s.workspace)
    return peak


def format_ledger(ledger: list[Step], *, unit: int = 2 ** 20, unit_name: str = "MiB") -> str:
    """The ledger as a fixed-width text table (MFLOP and ``unit_name``), with a total row."""
    head = (f"{'step':<26}{'MFLOP':>10}{'read':>10}{'written':>10}{'allocated':>11}"
            f"{'workspace':>11}   ({unit_name})")
    rows = [head, "-" * len(head)]
    for s in list(ledger) + [total(ledger)]:
        if s.name == StepName.TOTAL:
            rows.append("-" * len(head))
        rows.append(f"{s.name:<26}{s.flops / 1e6:>10.2f}{s.bytes_read / unit:>10.3f}"
                    f"{s.bytes_written / unit:>10.3f}{s.allocated / unit:>11.3f}"
                    f"{s.workspace / unit:>11.3f}")
    return "\n".join(rows)


# ---------------------------------------------------------------------------- the steps
def expand_heads(ledger: list[Step], k_rope: np.ndarray, heads: int) -> np.ndarray:
    """``expand k_rope``: (B, Hr, Sk, Dr) -> a per-head copy (B, H, Sk, Dr)."""
    B, Hr, Sk, Dr = k_rope.shape
    out = np.empty((B, heads, Sk, Dr), dtype=k_rope.dtype)
    # k_rope_h[:, h] = k_rope[:, h // (H / Hr)]   (Hr = 1: the same row copied to every head)
    out.reshape(B, Hr, heads // Hr, Sk, Dr)[...] = k_rope[:, :, None]
    _record(ledger, StepName.EXPAND_K_ROPE, {"k_rope": k_rope}, {"k_rope per head": out})
    return out


def concat_last(ledger: list[Step], name: StepName, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``concat``: [a, b] along the head dim, (.., Da) and (.., Db) -> (.., Da + Db)."""
    out = np.concatenate([a, b], axis=-1)
    _record(ledger, name, {"nope": a, "rope": b}, {"concatenated": out})
    return out


def pad_last(ledger: list[Step], name: StepName, x: np.ndarray, dim: int) -> np.ndarray:
    """``pad``: (.., d) -> (.., dim) with zeros in the columns d..dim-1."""
    out = np.zeros(x.shape[:-1] + (dim,), dtype=x.dtype)
    out[..., :x.shape[-1]] = x
    _record(ledger, name, {"x": x}, {"padded": out})
    return out


def slice_last(ledger: list[Step], name: StepName, x: np.ndarray, dim: int) -> np.ndarray:
    """``slice``: a new array of the first ``dim`` columns of x (only those are read)."""
    part = x[..., :dim]
    out = part.copy()
    _record(ledger, name, {"x[..., :dim]": part}, {"sliced": out})
    return out


def split_last(ledger: list[Step], name: StepName, x: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``split`` (the gradient of concat): (.., D) -> new arrays (.., dim) and (.., D - dim)."""
    a, b = x[..., :dim].copy(), x[..., dim:].copy()
    _record(ledger, name, {"x": x}, {"nope": a, "rope": b})
    return a, b


def sum_heads(ledger: list[Step], x: np.ndarray, groups: int) -> np.ndarray:
    """``sum dk_rope over heads`` (the gradient of expand): (B, H, Sk, Dr) -> (B, Hr, Sk, Dr)."""
    B, H, Sk, Dr = x.shape
    # dk_rope[:, g] = sum over the heads h of group g of dk_rope_h[:, h]
    out = x.reshape(B, groups, H // groups, Sk, Dr).sum(axis=2)
    _record(ledger, StepName.SUM_DK_ROPE, {"dk_rope per head": x}, {"dk_rope": out},
            flops=x.size - out.size)
    return out


def _pairs(q: np.ndarray, k: np.ndarray, causal: bool) -> int:
    """Attended (query, key) pairs of all batches and heads, counted row by row on the band
    the kernel applies (O(Sq) memory: no Sq x Sk mask is built)."""
    B, H, Sq = q.shape[:3]
    Sk = k.shape[2]
    left, right = band_from(causal)
    i = np.arange(Sq, dtype=np.int64)
    # row i sees keys j in [max(0, i - left), min(Sk - 1, i + right)]
    lo = np.maximum(0, i - min(left, Sq))
    hi = np.minimum(Sk - 1, i + min(right, Sk))
    return B * H * int(np.maximum(0, hi - lo + 1).sum())


def attention(ledger: list[Step], q, k, v, q_rope, k_rope, opts: dict) -> tuple[np.ndarray, np.ndarray]:
    """``flash attention``: :func:`flashlab.api.flash_attention` with the arrays it is given."""
    o, lse = api.flash_attention(q, k, v, q_rope=q_rope, k_rope=k_rope, **opts)
    pairs = _pairs(q, k, opts["causal"])
    d_qk = q.shape[-1] + (0 if q_rope is None else q_rope.shape[-1])
    reads = {"q": q, "k": k, "v": v}
    if q_rope is not None:
        reads.update(q_rope=q_rope, k_rope=k_rope)
    # S = Q K^T (+ Q_rope K_rope^T, into the same tile): 2 FLOPs per multiply-add
    # O = P V
    matmuls = {"S = QK^T": 2 * pairs * d_qk, "O = PV": 2 * pairs * v.shape[-1]}
    _record(ledger, StepName.ATTENTION, reads, {"o": o, "lse": lse}, matmuls=matmuls)
    return o, lse


def _workspace_bytes(q, k, v, q_rope, k_rope, block_q: int) -> int:
    """The backward kernel's partial-sum buffers for these operands (see
    :func:`flashlab.ledgers.backward_partials_elements`; measured in the tests)."""
    B, H, Sq = q.shape[:3]
    grads = [(k.shape[1], k.shape[3]), (v.shape[1], v.shape[3])]
    if k_rope is not None:
        grads.append((k_rope.shape[1], k_rope.shape[3]))
    acc = np.dtype(api.compute_dtype(q.dtype)).itemsize
    return acc * backward_partials_elements(B, H, Sq, k.shape[2], grads, block_q)


def attention_backward(ledger: list[Step], do, saved: dict, opts: dict) -> tuple[np.ndarray, ...]:
    """``flash attention backward``: :func:`flashlab.api.flash_attention_backward`."""
    q, k, v, o, lse = (saved[n] for n in ("q", "k", "v", "o", "lse"))
    q_rope, k_rope = saved.get("q_rope"), saved.get("k_rope")
    grads = api.flash_attention_backward(do, q, k, v, o, lse, q_rope=q_rope, k_rope=k_rope, **opts)
    pairs = _pairs(q, k, opts["causal"])
    d_qk = q.shape[-1] + (0 if q_rope is None else q_rope.shape[-1])
    d_v = v.shape[-1]
    reads = {"do": do, "q": q, "k": k, "v": v, "o": o, "lse": lse}
    names = ["dq", "dk", "dv"]
    if q_rope is not None:
        reads.update(q_rope=q_rope, k_rope=k_rope)
        names += ["dq_rope", "dk_rope"]
    matmuls = {
        "S = QK^T": 2 * pairs * d_qk,    # recomputed from Q, K (and the rope parts)
        "dV = P^T dO": 2 * pairs * d_v,
        "dP = dO V^T": 2 * pairs * d_v,
        "dQ = dS K": 2 * pairs * d_qk,   # scale dS [K, K_rope]
        "dK = dS^T Q": 2 * pairs * d_qk,  # scale dS^T [Q, Q_rope]
    }
    _record(ledger, StepName.ATTENTION_BACKWARD, reads, dict(zip(names, grads)), matmuls=matmuls,
            workspace=_workspace_bytes(q, k, v, q_rope, k_rope, opts["block_q"]))
    return grads


# ------------------------------------------------------------------------- the dataflows
@dataclass
class MLAForward:
    """The result of :func:`mla_forward`, and what :func:`mla_backward` needs.

    ``o`` (B, H, Sq, Dv) in the inputs' dtype; ``lse`` (B, H, Sq) float32; ``ledger`` the
    forward's steps; ``saved`` the arrays the backward reads (the attention operator's
    operands, output and LSE: in the baseline the concatenated Q, K, the padded V and O);
    ``dims`` ``(d_nope, d_rope, d_v, rope_heads)``; ``options`` the attention options.
    """

    o: np.ndarray
    lse: np.ndarray
    ledger: list[Step]
    dataflow: Dataflow
    saved: dict[str, np.ndarray]
    dims: tuple[int, int, int, int]
    options: dict


def _check_operands(q_nope, k_nope, v, q_rope, k_rope, dataflow
                    ) -> tuple[int, int, int, int, int, int, int, int, Dataflow]:
    """Check the five operands; return ``(B, H, Sq, Sk, Dn, Dr, Dv, Hr, dataflow)``."""
    dataflow = check_dataflow(dataflow)
    shapes = {"q_nope": "(B, H, Sq, Dn)", "k_nope": "(B, H, Sk, Dn)", "v": "(B, H, Sk, Dv)",
              "q_rope": "(B, H, Sq, Dr)", "k_rope": "(B, Hr, Sk, Dr)"}
    arrays = dict(zip(shapes, (q_nope, k_nope, v, q_rope, k_rope)))
    for name, x in arrays.items():
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a numpy.ndarray of shape {shapes[name]}; got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name} must have shape {shapes[name]} (4 dims); got shape {x.shape}")
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(f"{name} must be float32 or float64 (float16 would be converted inside "
                            f"the kernel API, out of the ledger's sight); got {x.dtype}")
    if len({x.dtype for x in arrays.values()}) > 1:
        raise TypeError(f"the five operands must share one dtype; got "
                        f"{', '.join(f'{n} {x.dtype}' for n, x in arrays.items())}")
    B, H, Sq, Dn = q_nope.shape
    Sk, Dv, Dr, Hr = k_nope.shape[2], v.shape[3], q_rope.shape[3], k_rope.shape[1]
    expected = {"k_nope": (B, H, Sk, Dn), "v": (B, H, Sk, Dv), "q_rope": (B, H, Sq, Dr),
                "k_rope": (B, Hr, Sk, Dr)}
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            raise ValueError(f"{name} must have shape {shapes[name]} = {shape} to match q_nope "
                             f"{q_nope.shape} and k_nope {k_nope.shape}; got {arrays[name].shape}")
    if H % Hr != 0:
        raise ValueError(f"q_nope's heads H={H} must be a multiple of k_rope's heads Hr={Hr} "
                         f"(MLA: Hr = 1, one k_rope shared by all heads)")
    if dataflow.pad_v and Dv > Dn + Dr:
        raise ValueError(f"the {dataflow} dataflow pads V to Dn + Dr = {Dn + Dr}, so V's dim must "
                         f"not exceed it; got Dv={Dv}")
    return B, H, Sq, Sk, Dn, Dr, Dv, Hr, dataflow


def mla_forward(q_nope, k_nope, v, q_rope, k_rope, *, dataflow: str = Dataflow.RECT, scale=None,
                causal: bool = False, block_q: int = 64, block_k: int = 64) -> MLAForward:
    """The MLA attention forward in ``dataflow`` ``"baseline"``, ``"native_v"``, ``"split_rope"``
    or ``"rect"``.

    Parameters
    ----------
    q_nope : (B, H, Sq, Dn); k_nope : (B, H, Sk, Dn); v : (B, H, Sk, Dv)
    q_rope : (B, H, Sq, Dr); k_rope : (B, Hr, Sk, Dr) with ``H % Hr == 0`` (MLA: Hr = 1)
        All float32 or all float64 (DeepSeek-V3: Dn = 128, Dr = 64, Dv = 128).
    scale : default ``1/sqrt(Dn + Dr)`` in every dataflow
    causal, block_q, block_k : as in :func:`flashlab.flash_attention`

    Returns
    -------
    :class:`MLAForward` with ``o`` (B, H, Sq, Dv), ``lse`` and the ``ledger``. The four
    dataflows compute the same ``o`` up to rounding.
    """
    B, H, Sq, Sk, Dn, Dr, Dv, Hr, flow = _check_operands(q_nope, k_nope, v, q_rope, k_rope, dataflow)
    opts = dict(scale=1.0 / math.sqrt(Dn + Dr) if scale is None else scale, causal=causal,
                block_q=block_q, block_k=block_k)
    ledger: list[Step] = []
    pad_v, split = flow.pad_v, flow.split_rope
    if split:
        # S = scale (Q_nope K_nope^T + Q_rope K_rope^T): the kernel takes the rope pair itself
        q, k, q_r, k_r = q_nope, k_nope, q_rope, k_rope
    else:
        # one Q and one K of head dim D = Dn + Dr: the shared k_rope is first copied to every head
        k_rope_h = expand_heads(ledger, k_rope, H)
        q = concat_last(ledger, StepName.CONCAT_Q, q_nope, q_rope)
        k = concat_last(ledger, StepName.CONCAT_K, k_nope, k_rope_h)
        q_r = k_r = None
    # baseline, split_rope: V padded with zeros to D, so that Dq = Dk = Dv
    v_att = pad_last(ledger, StepName.PAD_V, v, Dn + Dr) if pad_v else v
    o_att, lse = attention(ledger, q, k, v_att, q_r, k_r, opts)
    # O = P [V, 0] = [P V, 0]: keep the first Dv columns
    o = slice_last(ledger, StepName.SLICE_O, o_att, Dv) if pad_v else o_att
    saved = dict(q=q, k=k, v=v_att, o=o_att, lse=lse)
    if split:
        saved.update(q_rope=q_rope, k_rope=k_rope)
    return MLAForward(o, lse, ledger, flow, saved, (Dn, Dr, Dv, Hr), opts)


def mla_backward(do, fwd: MLAForward) -> tuple[tuple[np.ndarray, ...], list[Step]]:
    """Gradients of ``sum(o * do)`` through the forward's dataflow, steps reversed.

    Parameters
    ----------
    do : (B, H, Sq, Dv), the forward's dtype
    fwd : what :func:`mla_forward` returned

    Returns
    -------
    ``((dq_nope, dk_nope, dv, dq_rope, dk_rope), ledger)``, the gradients with the shapes of
    the forward's operands (dk_rope (B, Hr, Sk, Dr): summed over the heads that share it) in
    the order of :func:`flashlab.flash_attention_backward`.
    """
    if not isinstance(fwd, MLAForward):
        raise TypeError(f"fwd must be the MLAForward that mla_forward returned; got {type(fwd).__name__}")
    if not isinstance(do, np.ndarray):
        raise TypeError(f"do must be a numpy.ndarray of shape {fwd.o.shape}; got {type(do).__name__}")
    if do.shape != fwd.o.shape:
        raise ValueError(f"do must have the output's shape (B, H, Sq, Dv) = {fwd.o.shape}; got {do.shape}")
    if do.dtype != fwd.o.dtype:
        raise TypeError(f"do must have the output's dtype {fwd.o.dtype}; got {do.dtype}")
    Dn, Dr, Dv, Hr = fwd.dims
    ledger: list[Step] = []
    pad_v, split = fwd.dataflow.pad_v, fwd.dataflow.split_rope
    # O = slice(O_att), so dO_att = pad(dO) (zeros in the padded columns)
    do_att = pad_last(ledger, StepName.PAD_DO, do, Dn + Dr) if pad_v else do
    grads = attention_backward(ledger, do_att, fwd.saved, fwd.options)
    if split:
        # dq_rope = scale dS K_rope, dk_rope = scale dS^T Q_rope (summed over heads inside the kernel)
        dq_nope, dk_nope, dv_att, dq_rope, dk_rope = grads
    else:
        dq, dk, dv_att = grads
        # Q = [q_nope, q_rope], K = [k_nope, k_rope_h]: split the gradients back
        dq_nope, dq_rope = split_last(ledger, StepName.SPLIT_DQ, dq, Dn)
        dk_nope, dk_rope_h = split_last(ledger, StepName.SPLIT_DK, dk, Dn)
        # k_rope_h[:, h] = k_rope[:, h // (H / Hr)]: its gradient adds up the heads
        dk_rope = sum_heads(ledger, dk_rope_h, Hr)
    # V_att = pad(V): dV = the first Dv columns of dV_att
    dv = slice_last(ledger, StepName.SLICE_DV, dv_att, Dv) if pad_v else dv_att
    return (dq_nope, dk_nope, dv, dq_rope, dk_rope), ledger
