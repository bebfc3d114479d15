r"""The BLAS ceiling of the backward: its five tile products, timed alone.

Every matrix product of a :func:`~flashlab.kernels.backward.flash_backward_kernel` tile goes
to BLAS (:mod:`flashlab.kernels.blas`); what the kernel adds between them — $P = e^{S -
\mathrm{LSE}}$, $dS = P \circ (dP - D)$, masks, bookkeeping — is elementwise work on the
tile. :func:`backward_products` runs the same five products on the same tiles in the same
order, with nothing in between, so timing it against the kernel splits a backward into BLAS
time and the rest. The products alone are the fastest this kernel could be with this BLAS:
a target above them needs a faster BLAS, not a better kernel.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import numba
import numpy as np
from numba import njit, prange

from flashlab.bench.report import _blas_lines
from flashlab.flops import attention_backward_flops
from flashlab.kernels import blas  # noqa: F401  (pins the tile BLAS to one thread)
from flashlab.kernels.blas import gemm_nn, gemm_nt, gemm_tn
from flashlab.numba_cache import CACHE
from flashlab.tiling import BACKWARD_BLOCK

__all__ = ["backward_products", "backward_ceiling", "CEILING_PROBLEMS", "ceiling_run",
           "ceiling_lines"]


@njit(parallel=True, cache=CACHE)
def backward_products(q, k, v, do, block_q, block_k, dq, dk, dv):
    """The backward kernel's five products per tile and nothing else (no mask, no softmax).

    q, k, do (H, N, Dqk or Dv); v (H, N, Dv) float32, C-contiguous, one kv head per head;
    dq (H, N, Dqk), dk (H, N, Dqk), dv (H, N, Dv) zero-initialised outputs. The values are
    not gradients (P and dS are the raw products); only the work is the kernel's.
    """
    H, N = q.shape[0], q.shape[1]
    for h in prange(H):
        s_buf = np.empty(block_q * block_k, dtype=q.dtype)
        dp_buf = np.empty(block_q * block_k, dtype=q.dtype)
        for i0 in range(0, N, block_q):
            i1 = min(i0 + block_q, N)
            for j0 in range(0, N, block_k):
                j1 = min(j0 + block_k, N)
                s = s_buf[: (i1 - i0) * (j1 - j0)].reshape((i1 - i0, j1 - j0))
                dp = dp_buf[: (i1 - i0) * (j1 - j0)].reshape((i1 - i0, j1 - j0))
                # S = Q_i K_j^T
                gemm_nt(q[h, i0:i1], k[h, j0:j1], s, 1.0, 0.0)
                # dP = dO_i V_j^T
                gemm_nt(do[h, i0:i1], v[h, j0:j1], dp, 1.0, 0.0)
                # dV_j += P^T dO_i
                gemm_tn(s, do[h, i0:i1], dv[h, j0:j1], 1.0, 1.0)
                # dQ_i += dS K_j
                gemm_nn(dp, k[h, j0:j1], dq[h, i0:i1], 1.0, 1.0)
                # dK_j += dS^T Q_i
                gemm_tn(dp, q[h, i0:i1], dk[h, j0:j1], 1.0, 1.0)


def backward_ceiling(n: int = 2048, heads: int = 8, d_qk: int = 128, d_v: int = 128, *,
                     block: tuple[int, int] = BACKWARD_BLOCK, rounds: int = 5,
                     threads: int | None = None, with_torch: bool = True,
                     matmul_n: int | None = 2048) -> dict:
    """Time the backward, its five products alone and PyTorch's backward, in turn.

    The suite's backward case (:func:`flashlab.bench.make_runner`: its inputs, the backward
    timed alone with its forward done untimed), non-causal float32, B = 1; ``rounds`` rounds of
    one call each after an untimed one; torch's SDPA backward too when ``with_torch`` and it is
    installed; ``threads``: Numba's threads (default: as set; torch keeps its own setting);
    ``matmul_n``: also the numpy matmul peak of :func:`flashlab.bench.matmul_gflops`, the larger
    of two measurements, before and after (``None``: skip).

    Returns medians ``{"flashlab": s, "products": s, "torch_sdpa": s}`` under ``"seconds"``,
    the same as GFLOP/s of the backward's FLOPs
    (:func:`flashlab.flops.attention_backward_flops`) under ``"gflops"``,
    ``"other_fraction"``: the share of the backward's time spent outside the five products,
    ``1 - products / flashlab``, ``"matmul_gflops"`` and ``"problem"``.
    """
    from flashlab.bench.config import Case
    from flashlab.bench.inputs import grad_output, make_inputs
    from flashlab.bench.measure import matmul_gflops
    from flashlab.bench.runners import call_seconds, make_runner, torch_available

    case = Case("flashlab", "backward", n, d_qk, d_v, False, 1, heads, block=block)
    q, k, v = (x[0] for x in make_inputs(n, batch=1, heads=heads, d=d_qk, d_v=d_v))
    do = grad_output(case)[0]
    grads = [np.zeros_like(x) for x in (q, k, v)]
    calls = {"flashlab": make_runner(case).once,
             "products": lambda: call_seconds(
                 lambda: backward_products(q, k, v, do, block[0], block[1], *grads))}
    if with_torch and torch_available():
        calls["torch_sdpa"] = make_runner(replace(case, impl="torch_sdpa")).once
    old = numba.get_num_threads()
    numba.set_num_threads(threads or old)
    try:
        peaks = [matmul_gflops(matmul_n)["gflops"]] if matmul_n else []
        for once in calls.values():
            once()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, once in calls.items():
                times[name].append(once())
        if matmul_n:
            peaks.append(matmul_gflops(matmul_n)["gflops"])
    finally:
        numba.set_num_threads(old)
    seconds = {name: float(np.median(t)) for name, t in times.items()}
    flops = attention_backward_flops(n, n, d_qk, d_v, heads=heads)
    return {"seconds": seconds,
            "gflops": {name: flops / t / 1e9 for name, t in seconds.items()},
            "other_fraction": 1 - seconds["products"] / seconds["flashlab"],
            "matmul_gflops": max(peaks) if peaks else None,
            "problem": f"N = {n}, H = {heads}, {d_qk}/{d_v}, {block[0]} x {block[1]} tiles, "
                       f"{threads or old} thread(s)"}


#: the problems of :func:`ceiling_run`: those of the benchmark's backward targets
CEILING_PROBLEMS: tuple[tuple[int, int, int], ...] = ((2048, 128, 128), (4096, 128, 128),
                                                      (4096, 192, 128))


def ceiling_run(problems=None, **kwargs) -> dict:
    """:func:`backward_ceiling` for each ``(n, d_qk, d_v)`` of ``problems`` (default
    ``CEILING_PROBLEMS``; ``kwargs`` passed on), with the date and
    :func:`flashlab.bench.machine_info` (which names the BLAS kernels).
    """
    from flashlab.bench.suite import machine_info

    problems = CEILING_PROBLEMS if problems is None else problems
    rows = [{"n": n, "d_qk": d_qk, "d_v": d_v, **backward_ceiling(n, d_qk=d_qk, d_v=d_v, **kwargs)}
            for n, d_qk, d_v in problems]
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(), "rows": rows}


def ceiling_lines(run: dict) -> list[str]:
    """One line per problem of a :func:`ceiling_run`: its GFLOP/s (and the BLAS kernels)."""
    lines = _blas_lines(run["machine"])[:1]          # the suite report's BLAS line
    for r in run["rows"]:
        g = r["gflops"]
        torch = f", torch {g['torch_sdpa']:.0f}" if "torch_sdpa" in g else ""
        lines.append(f"{r['problem']}: GFLOP/s flashlab {g['flashlab']:.0f}, its products alone "
                     f"{g['products']:.0f}{torch}; matmul peak {r['matmul_gflops']:.0f}")
    return lines
