"""The scores stage's scalar steps (:mod:`flashlab.kernels.scorestep`): one source, compiled with
``numba.njit`` for the CPU tile stage and with ``numba.cuda.jit(device=True)`` for the GPU twin's
kernels (the simulator without a GPU, :mod:`flashlab.gpu.target`), taking the options record
:class:`~flashlab.kernels.options.ScoresStage` as one argument.
"""
from __future__ import annotations

import ast
import inspect
import math

import numpy as np
import pytest
from numba import float32, njit, types

from flashlab.gpu.target import cuda
from flashlab.kernels import scorestep, tile
from flashlab.kernels.options import ScoresStage, scores_stage

#: scaled products: zero, both signs, beyond the cap (tanh saturates), tiny
S = np.array([0.0, 1.5, -3.0, 80.0, -200.0, 1e-6])
OFF, GEMMA2 = ScoresStage(), ScoresStage(softcap=50.0)


def test_off_is_the_identity():
    assert not scorestep.transforms(OFF)
    for s in S:
        assert scorestep.score(s, OFF) == s


def test_the_cap_and_its_slope_against_the_formula():
    assert scorestep.transforms(GEMMA2)
    for s in S:
        t = math.tanh(s / 50.0)
        assert scorestep.score(s, GEMMA2) == pytest.approx(50.0 * t, rel=1e-15, abs=1e-300)
        assert scorestep.slope(scorestep.score(s, GEMMA2), GEMMA2) == pytest.approx(1 - t * t, rel=1e-12)
        # the slope is the derivative: a central difference of the score agrees
        h = 1e-5
        fd = (scorestep.score(s + h, GEMMA2) - scorestep.score(s - h, GEMMA2)) / (2 * h)
        assert scorestep.slope(scorestep.score(s, GEMMA2), GEMMA2) == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_the_cpu_build_is_this_source_and_agrees():
    assert tile.score_step.py_func is scorestep.score
    assert tile.score_slope.py_func is scorestep.slope
    assert tile.stage_transforms.py_func is scorestep.transforms
    for stage in (OFF, GEMMA2):
        for s in S:
            assert tile.score_step(s, stage) == scorestep.score(s, stage)


def test_the_tile_stage_writes_scores_and_slopes():
    tile_s = S.reshape(2, 3).copy()
    ds = np.zeros_like(tile_s)
    tile.stage_scores(tile_s, GEMMA2, ds, True)
    np.testing.assert_allclose(tile_s.ravel(), 50.0 * np.tanh(S / 50.0), rtol=1e-15)
    np.testing.assert_allclose(ds.ravel(), 1 - np.tanh(S / 50.0) ** 2, rtol=1e-12)


CUDA = cuda()


def test_the_same_source_compiles_as_cuda_device_functions():
    from flashlab.gpu import backward, forward, tiles

    assert tiles.score_step.py_func is scorestep.score
    assert tiles.score_slope.py_func is scorestep.slope
    assert tiles.stage_transforms.py_func is scorestep.transforms
    # the kernels call them and nothing else of the stage
    assert "score_step(" in inspect.getsource(forward)
    assert "score_slope(" in inspect.getsource(backward)
    step, slope = CUDA.jit(device=True)(scorestep.score), CUDA.jit(device=True)(scorestep.slope)

    @CUDA.jit
    def apply(x, stage, out, grad):
        i = CUDA.grid(1)
        if i < x.shape[0]:
            out[i] = step(x[i], stage)
            grad[i] = slope(out[i], stage)

    x = S.astype(np.float32)
    out, grad = np.zeros_like(x), np.zeros_like(x)
    apply[1, 32](x, GEMMA2.in_dtype(np.float32), out, grad)
    np.testing.assert_allclose(out, 50.0 * np.tanh(S / 50.0), rtol=1e-6)
    np.testing.assert_allclose(grad, 1 - np.tanh(S / 50.0) ** 2, rtol=1e-5, atol=1e-6)


def test_float32_in_float32_out():
    """A float32 GPU kernel is not widened to float64 by the stage: score and slope keep the
    arguments' type (no float64 literal in the source)."""
    record = types.NamedUniTuple(float32, 1, ScoresStage)
    for fn in (scorestep.score, scorestep.slope):
        jitted = njit(fn)
        jitted.compile((float32, record))
        (sig,) = jitted.nopython_signatures
        assert sig.return_type == float32, fn.__name__


def test_the_source_is_scalar_code():
    tree = ast.parse(inspect.getsource(scorestep))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "math"}


def test_the_record_checks_its_fields():
    assert scores_stage() == OFF and scores_stage(softcap=50) == GEMMA2
    with pytest.raises(ValueError, match=r"softcap must be >= 0.0; got -1.0"):
        scores_stage(softcap=-1.0)
    with pytest.raises(ValueError, match=r"my_cap=1e\+39 overflows float32"):
        scores_stage(lambda n: "my_cap", softcap=1e39)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) sofcap; the scores stage takes softcap"):
        scores_stage(softcap=1.0, sofcap=2.0)
    assert GEMMA2.in_dtype(np.float32).softcap.dtype == np.float32


def test_the_kernels_record_carries_the_stage_flat():
    """The CPU kernels read the stage from their options record (a parallel kernel takes no nested
    tuple), so it has every field of the stage's record; api fills them from the checked problem."""
    from flashlab.kernels.options import TileOptions
    assert set(ScoresStage._fields) <= set(TileOptions._fields)


def test_doors_that_pass_the_stage_on_show_its_keywords():
    """``help()`` of a function that takes the stage as ``**scores`` lists each field with its
    default, as if spelled out; the call still goes through the record's rule."""
    from flashlab.gpu.attention import flash_attention_backward_gpu, flash_attention_gpu
    from flashlab.validation import prepare
    for fn in (prepare, flash_attention_gpu, flash_attention_backward_gpu):
        params = inspect.signature(fn).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), fn.__name__
        for field, default in ScoresStage._field_defaults.items():
            assert params[field].kind is inspect.Parameter.KEYWORD_ONLY
            assert params[field].default == default
    x = np.ones((1, 1, 3, 4))
    assert prepare(x, x, x, softcap=2.0).scores == ScoresStage(softcap=2.0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) sofcap"):
        prepare(x, x, x, sofcap=2.0)
