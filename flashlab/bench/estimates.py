"""Models used to count, skip and compare cases: the causal tile fraction and matmul FLOPs of a
case, what torch's CPU SDPA runs, arithmetic intensity, the memory estimate that skips a case
that cannot fit, and the modelled MLA peak.
"""
from __future__ import annotations

from typing import Any

from flashlab.bench.config import Case
from flashlab.flops import attention_backward_flops, attention_flops, flash_backward_intensity, operation_intensities
from flashlab.ledgers import mla_backward_steps, mla_forward_steps

__all__ = ["tile_fraction", "case_flops", "torch_uses_math_path", "torch_flash_block_q",
           "model_intensity", "estimated_bytes", "mla_model_peak"]


def tile_fraction(n: int, block_q: int, block_k: int, causal: bool) -> float:
    """Fraction of the ``n x n`` scores flashlab's kernels compute (1.0 unless causal; ~1/2
    causal): the band box (:func:`flashlab.masks.band_box`) of every tile that is not EMPTY
    (:func:`flashlab.masks.classify_tiles`), which for square tiles is the whole tile."""
    if not causal:
        return 1.0
    from flashlab.masks import EMPTY, band_box, band_from, clamp_band, classify_tiles

    left, right = clamp_band(*band_from(causal=True), n, n)
    computed = 0
    for a, c in zip(*(classify_tiles(n, n, block_q, block_k, left, right) != EMPTY).nonzero()):
        i0, j0 = int(a) * block_q, int(c) * block_k
        r0, r1, c0, c1 = band_box(i0, min(n, i0 + block_q), j0, min(n, j0 + block_k), left, right)
        computed += (r1 - r0) * (c1 - c0)
    return computed / (n * n)


def case_flops(case: Case) -> float:
    """Matmul FLOPs of ``case``, the same for every implementation of a shape: attention at
    ``(d_qk + d_rope, d_v)`` (the useful work; the MLA baseline's padding is not counted),
    times :func:`tile_fraction` for causal cases."""
    f = attention_flops if case.direction == "forward" else attention_backward_flops
    return f(case.n, case.n, case.d_qk + case.d_rope, case.d_v, batch=case.batch,
             heads=case.heads, tile_fraction=tile_fraction(case.n, *case.block, case.causal))


def torch_uses_math_path(d_qk: int, d_v: int) -> bool:
    """Whether torch's CPU SDPA falls back to its math path (an ``N x N`` matrix per head):
    its flash kernel needs equal QK and V head dims (192/128 falls back). Used only to
    estimate memory."""
    return d_qk != d_v


def torch_flash_block_q(n: int) -> int:
    """Query-block rows of PyTorch's CPU flash kernel for a sequence of ``n``: 256 once
    ``n >= 768``, 64 from 192, else 32 (``flash_attention_kernel_impl`` in PyTorch's
    ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``)."""
    return 256 if n >= 768 else 64 if n >= 192 else 32


def model_intensity(row: dict, elem: int = 4) -> float:
    """Model arithmetic intensity (FLOP/byte, :mod:`flashlab.flops`) of one result row.

    numpy naive, and torch SDPA on its math path, are standard attention (S and P through
    main memory); flashlab and torch's flash kernel are the fused forward (K, V read once per
    query block of ``block_q`` rows: flashlab's from the row, torch's
    :func:`torch_flash_block_q`) and the recomputation backward.
    """
    n, d_qk, d_v = row["n"], row["d_qk"], row["d_v"]
    if row["impl"] == "numpy_naive" or (row["impl"] == "torch_sdpa" and torch_uses_math_path(d_qk, d_v)):
        return operation_intensities(n, n, d_qk, d_v, elem=elem)["standard attention"]
    block_q = row["block"][0] if row["impl"] == "flashlab" else torch_flash_block_q(n)
    if row["direction"] == "forward":
        return operation_intensities(n, n, d_qk, d_v, block_q=block_q, elem=elem)["FlashAttention (fused)"]
    return flash_backward_intensity(n, n, d_qk, d_v, block_q=block_q, elem=elem)


def estimated_bytes(case: Case) -> int:
    """Rough peak memory of ``case`` (inputs included), to skip what cannot fit.

    Score matrices of ``B H N^2`` float32: numpy naive holds one (plus a ``B H N^2`` bool
    mask when causal); torch's math path a few more, with slack (the factors below); flashlab and
    torch's flash path O(N).
    """
    scores = 4 * case.batch * case.heads * case.n ** 2
    # inputs q, k, v, dO and outputs of the same sizes, twice over for slack
    linear = 2 * 4 * case.batch * case.heads * case.n * (2 * (case.d_qk + case.d_rope) + 3 * case.d_v)
    if case.impl == "numpy_naive":
        return scores + (scores // 4 if case.causal else 0) + linear
    if case.impl == "torch_sdpa" and torch_uses_math_path(case.d_qk, case.d_v):
        return int(scores * (2.6 if case.direction == "forward" else 3.6)) + linear
    return linear


def mla_model_peak(case: Case) -> int:
    """Peak extra memory of an MLA case predicted by :mod:`flashlab.ledgers` (float32): every
    step's output held to the end, plus the step's workspace (:func:`flashlab.mla.ledger_peak`);
    the backward's is the training step's (forward steps, then backward steps)."""
    from flashlab.mla import ledger_peak

    args = (case.batch, case.heads, case.n, case.d_qk, case.d_rope, case.d_v)
    kw: dict[str, Any] = dict(dataflow=case.impl.split(":", 1)[1], causal=case.causal, elem=4)
    steps = mla_forward_steps(*args, **kw)
    if case.direction == "backward":
        steps = steps + mla_backward_steps(*args, block_q=case.block[0], **kw)
    return ledger_peak(steps)
