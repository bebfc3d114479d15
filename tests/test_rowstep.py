"""The online softmax's per-row update (:mod:`flashlab.kernels.rowstep`): one scalar source,
compiled with ``numba.njit`` for the CPU kernels and with ``numba.cuda.jit(device=True)`` for a
GPU kernel. Without a GPU the CUDA build runs on Numba's simulator (:mod:`flashlab.gpu.target`
picks it), so this checks that the source is accepted as a device function and gives the CPU
build's numbers.
"""
from __future__ import annotations

import math

import numpy as np

from flashlab.gpu.target import cuda
from flashlab.kernels import rowstep, tile

#: (m, l, tile_max): a first tile (m = -inf), a max that moves, one that does not, an empty row
CASES = np.array([[-np.inf, 0.0, 2.5], [1.0, 3.0, 4.0], [4.0, 2.0, 1.5], [-np.inf, 0.0, -np.inf],
                  [0.25, 7.0, 0.25]])


def _expected(m, l, t):
    if max(m, t) == -math.inf:
        return m, 1.0, l
    m_new = max(m, t)
    alpha = math.exp(m - m_new)
    return m_new, alpha, alpha * l


def test_python_and_cpu_builds_agree_with_the_formula():
    for m, l, t in CASES:
        want = _expected(m, l, t)
        assert rowstep.online_row_step(m, l, t) == want
        assert tile.online_row_step(m, l, t) == want
    # alpha = 0 on the first tile: nothing accumulated under m = -inf survives
    assert tile.online_row_step(-np.inf, 0.0, 1.0)[1] == 0.0


#: ``numba.cuda`` (the simulator without a GPU); a module global, which the simulator's kernels
#: see as its fake ``cuda`` module
CUDA = cuda()


def test_the_same_source_compiles_as_a_cuda_device_function():
    step = CUDA.jit(device=True)(rowstep.online_row_step)

    @CUDA.jit
    def rows(state, out):
        i = CUDA.grid(1)
        if i < state.shape[0]:
            m_new, alpha, l_scaled = step(state[i, 0], state[i, 1], state[i, 2])
            out[i, 0] = m_new
            out[i, 1] = alpha
            out[i, 2] = l_scaled

    out = np.zeros_like(CASES)
    rows[1, 32](CASES, out)
    cpu = np.array([tile.online_row_step(*row) for row in CASES])
    np.testing.assert_array_equal(out, cpu)


def test_rescale_rows_uses_it():
    """The CPU tile update is the per-row step plus the row's exp and sum: m, l, O~ as written out."""
    rng = np.random.default_rng(0)
    s = rng.standard_normal((3, 5))
    s[2] = -np.inf                                   # a row with no allowed key
    m = np.array([0.5, 3.0, -np.inf])
    l = np.array([2.0, 1.0, 0.0])
    acc = rng.standard_normal((3, 4))
    acc[2] = 0.0
    m0, l0, acc0, s0 = m.copy(), l.copy(), acc.copy(), s.copy()
    tile.rescale_rows(s, m, l, acc)
    for r in range(2):
        m_new, alpha, l_scaled = rowstep.online_row_step(m0[r], l0[r], s0[r].max())
        np.testing.assert_allclose(s[r], np.exp(s0[r] - m_new), rtol=1e-15)
        np.testing.assert_allclose(l[r], l_scaled + np.exp(s0[r] - m_new).sum(), rtol=1e-15)
        np.testing.assert_allclose(acc[r], alpha * acc0[r], rtol=1e-15)
        assert m[r] == m_new
    assert m[2] == -np.inf and l[2] == 0.0 and (s[2] == 0.0).all() and (acc[2] == 0.0).all()


def test_the_source_is_scalar_code():
    """The simulator runs any Python: what keeps the source compilable for a real GPU is that it
    imports nothing but ``math`` (no NumPy array code in a device function)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(rowstep))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "math"}


def test_float32_arguments_give_float32_results():
    """A float32 GPU kernel must not be widened to float64 by the update: every branch returns the
    arguments' type (the "nothing yet" branch included; a literal 1.0 would be float64)."""
    from numba import float32, njit, types

    step = njit(rowstep.online_row_step)
    step.compile((float32, float32, float32))
    (sig,) = step.nopython_signatures
    assert sig.return_type == types.UniTuple(float32, 3)


def test_the_gpu_twin_compiles_this_source():
    """The device function the GPU kernels call (forward, the standard softmax) is built from this
    module's function, not from a copy; and the kernels call it."""
    import inspect

    from flashlab.gpu import forward, standard, tiles

    assert tiles.online_row_step.py_func is rowstep.online_row_step
    assert tile.online_row_step.py_func is rowstep.online_row_step
    for module in (forward, standard):
        assert module.online_row_step is tiles.online_row_step
        assert "online_row_step(" in inspect.getsource(module)
