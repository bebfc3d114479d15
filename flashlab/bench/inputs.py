"""The benchmark's random float32 operands: attention inputs, MLA inputs and the gradient of
the output.
"""
from __future__ import annotations

import numpy as np

from flashlab.bench.config import Case

__all__ = ["make_inputs", "make_mla_inputs", "grad_output"]


def make_inputs(n: int, *, batch: int = 1, heads: int = 8, d: int = 128, d_v: int | None = None,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random float32 (q, k, v): q, k (batch, heads, n, d), v (batch, heads, n, d_v or d)."""
    rng = np.random.default_rng(seed)
    dims = (d, d, d if d_v is None else d_v)
    q, k, v = (rng.standard_normal((batch, heads, n, dd), dtype=np.float32) for dd in dims)
    return q, k, v


def make_mla_inputs(n: int, *, batch: int = 1, heads: int = 8, d_nope: int = 128,
                    d_rope: int = 64, d_v: int = 128, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Random float32 MLA operands ``(q_nope, k_nope, v, q_rope, k_rope)``: q_nope, k_nope
    (batch, heads, n, d_nope), v (batch, heads, n, d_v), q_rope (batch, heads, n, d_rope) and
    ONE k_rope head shared by all heads (batch, 1, n, d_rope)."""
    rng = np.random.default_rng(seed)
    shapes = [(heads, d_nope), (heads, d_nope), (heads, d_v), (heads, d_rope), (1, d_rope)]
    return tuple(rng.standard_normal((batch, h, n, d), dtype=np.float32) for h, d in shapes)


def grad_output(case: Case) -> np.ndarray:
    """dO (batch, heads, n, d_v), float32."""
    rng = np.random.default_rng(1)
    return rng.standard_normal((case.batch, case.heads, case.n, case.d_v), dtype=np.float32)
