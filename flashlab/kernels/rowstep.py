r"""The online softmax's per-row update, written once as scalar code for every target.

One row of a query block keeps a running maximum $m$ and a running denominator $\ell$. Meeting
a new tile whose row maximum is $\tilde m$:

$$
m' = \max(m, \tilde m), \qquad \alpha = e^{m - m'}, \qquad \ell \leftarrow \alpha\,\ell
\;(+ \operatorname{rowsum} e^{S - m'}), \qquad \tilde O \leftarrow \alpha\,\tilde O \;(+ \tilde P V_j).
$$

:func:`online_row_step` is that update on one row's numbers. It uses plain Python arithmetic and
``math`` only (no NumPy), so the same source compiles with ``numba.njit`` for the CPU
kernels (:func:`flashlab.kernels.tile.rescale_rows` calls it once per row) and with
``numba.cuda.jit(device=True)`` for a GPU kernel (one thread per row): tests/test_rowstep.py
compiles it for both and runs it on the CUDA simulator.
"""
from __future__ import annotations

import math

__all__ = ["online_row_step"]


def online_row_step(m, l, tile_max):
    """``(m_new, alpha, l_scaled)`` for a row with running max ``m`` and denominator ``l`` that
    meets a tile whose row maximum is ``tile_max``.

    ``m_new = max(m, tile_max)``, ``alpha = e^{m - m_new}`` (0 when ``m = -inf``: nothing
    accumulated yet) and ``l_scaled = alpha * l``; the caller adds the tile's
    ``rowsum(e^{S - m_new})`` to ``l_scaled`` and multiplies the row of ``O~`` by ``alpha``.
    A row that has seen no allowed key yet (``m_new = -inf``) keeps its state: ``(m, 1, l)``.

    >>> online_row_step(1.0, 2.0, 3.0) == (3.0, math.exp(-2.0), 2.0 * math.exp(-2.0))
    True
    >>> online_row_step(-math.inf, 0.0, -math.inf)
    (-inf, 1.0, 0.0)
    """
    # m' = max(m, rowmax(S))
    m_new = tile_max if tile_max > m else m
    if m_new == -math.inf:
        # no allowed key yet: P~ = 0 and the state stays (m = -inf, l = 0, O~ = 0); alpha = 1,
        # written e^{l - l} so that it has l's type (a literal 1.0 is float64 and would widen a
        # float32 kernel's alpha, and every O~ rescale after it, to double precision)
        return m, math.exp(l - l), l
    # alpha = e^{m - m'}   (0 when m was -inf)
    alpha = math.exp(m - m_new)
    # l <- alpha l   (the caller adds rowsum(P~))
    return m_new, alpha, alpha * l
