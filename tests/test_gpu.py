"""The CUDA twin (flashlab.gpu) against the float64 reference, in Numba's CUDA simulator.

Without a GPU the kernels run in the simulator (flashlab.gpu.target picks it); with one, on
the GPU. Shapes are small (the simulator runs every CUDA thread as a Python thread): N <= 128,
odd lengths, Sq != Sk, causal, GQA, Dqk != Dv (192/128), forward and backward. The forward is
judged by the suite's tolerance rule (conftest), the backward against twice the error of the
CPU kernel (flashlab.flash_attention_backward) on the same float32 inputs plus a floor.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_close_to_reference, make_qkv, max_abs_err

from flashlab import attention_naive, attention_reference, attention_reference_backward, flash_attention_backward
from flashlab.gpu import flash_attention_backward_gpu, flash_attention_gpu, standard_attention_gpu
from flashlab.tiling import cdiv

# (B, H, Hkv, Sq, Sk, Dqk, Dv, causal, block_q, block_k)
CASES = {
    "length 1": (1, 1, 1, 1, 1, 4, 4, False, 4, 4),
    "odd 7x33 causal GQA": (1, 2, 1, 7, 33, 8, 8, True, 4, 8),
    "odd 33x7 causal": (2, 2, 2, 33, 7, 8, 4, True, 8, 4),
    "N=128 causal": (1, 1, 1, 128, 128, 16, 16, True, 32, 32),
    "192/128 GQA": (1, 2, 1, 9, 11, 192, 128, False, 4, 4),
    "GQA 4/2 19x45 causal, 2 warps": (1, 4, 2, 19, 45, 16, 8, True, 8, 32),
    "N=64 causal 32x32": (1, 1, 1, 64, 64, 16, 16, True, 32, 32),
}
BACKWARD_CASES = ("odd 7x33 causal GQA", "odd 33x7 causal", "192/128 GQA",
                  "GQA 4/2 19x45 causal, 2 warps", "N=64 causal 32x32")


def inputs(case: str) -> tuple[dict, dict]:
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = CASES[case]
    return make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=3), dict(causal=causal, block_q=bq, block_k=bk)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_reference(case):
    x, opts = inputs(case)
    o, lse = flash_attention_gpu(**x, **opts)
    assert o.dtype == lse.dtype == np.float32
    ref_o, ref_lse = attention_reference(**x, causal=opts["causal"])
    naive_o, naive_lse = attention_naive(**x, causal=opts["causal"])
    assert_close_to_reference(o, lse, naive_o, naive_lse, ref_o, ref_lse, what=case,
                              updates=cdiv(x["k"].shape[2], opts["block_k"]))


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_matches_reference(case):
    x, opts = inputs(case)
    o, lse = flash_attention_gpu(**x, **opts)
    do = np.random.default_rng(7).standard_normal(o.shape).astype(np.float32)
    got = flash_attention_backward_gpu(do, **x, o=o, lse=lse, **opts)
    ref = attention_reference_backward(do, **x, causal=opts["causal"])
    cpu = flash_attention_backward(do, **x, o=o, lse=lse, **opts)
    for name, g, r, c in zip(("dq", "dk", "dv"), got, ref, cpu):
        assert g.shape == r.shape and g.dtype == np.float32, name
        tol = 2.0 * max_abs_err(c, r) + 1e-6 * max(1.0, float(np.abs(r).max()))
        assert max_abs_err(g, r) <= tol, f"{case}: {name} error {max_abs_err(g, r):.3g} > {tol:.3g}"


def test_standard_matches_reference():
    x, opts = inputs("odd 7x33 causal GQA")
    for causal in (False, True):
        o = standard_attention_gpu(**x, causal=causal)
        ref_o, _ = attention_reference(**x, causal=causal)
        naive_o, _ = attention_naive(**x, causal=causal)
        assert max_abs_err(o, ref_o) <= 2 * max_abs_err(naive_o, ref_o) + 1e-6


def test_causal_row_zero_gets_exact_zero_dq():
    # row 0 sees one key: its softmax does not depend on the scores, dQ_0 = 0 exactly
    x, opts = inputs("odd 33x7 causal")
    o, lse = flash_attention_gpu(**x, **opts)
    dq, _, _ = flash_attention_backward_gpu(np.ones_like(o), **x, o=o, lse=lse, **opts)
    assert (dq[:, :, 0] == 0).all()


def test_bad_arguments_name_the_argument():
    x, opts = inputs("length 1")
    with pytest.raises(TypeError, match="float32"):
        flash_attention_gpu(**{n: a.astype(np.float64) for n, a in x.items()})
    with pytest.raises(ValueError, match="block_q"):
        flash_attention_gpu(**x, block_q=0)
    with pytest.raises(ValueError, match="block_q"):
        flash_attention_gpu(**make_qkv(1, 1, 1, 1100, 4, 4, 4), block_q=1100)
    with pytest.raises(TypeError, match="count_traffic"):
        flash_attention_gpu(**x, count_traffic="yes")
    with pytest.raises(TypeError, match="causal"):
        standard_attention_gpu(**x, causal="no")
    with pytest.raises(ValueError, match="k must have shape"):
        flash_attention_gpu(x["q"], x["k"][..., :2], x["v"])
    o, lse = flash_attention_gpu(**x)
    with pytest.raises(ValueError, match="lse must have shape"):
        flash_attention_backward_gpu(o, **x, o=o, lse=lse[..., None])
    with pytest.raises(TypeError, match="do must"):
        flash_attention_backward_gpu(list(o), **x, o=o, lse=lse)


def _python(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=environ, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_flashlab_never_imports_numba_cuda():
    code = ("import sys, flashlab, flashlab.gpu, flashlab.gpu.traffic, flashlab.traffic\n"
            "print('numba.cuda' in sys.modules, 'flashlab.gpu.forward' in sys.modules)")
    assert _python(code) == "False False"


def test_simulator_chosen_without_a_gpu_after_numba_was_imported():
    from flashlab.gpu.target import driver_device_count
    if driver_device_count():
        pytest.skip("a CUDA GPU is present: the real target is chosen")
    # numba is imported (and its config read) long before flashlab.gpu picks the target
    code = ("import os, numba, flashlab\n"
            "from flashlab.gpu import target\n"
            "print(target.is_simulator(), os.environ['NUMBA_ENABLE_CUDASIM'], target.describe())")
    assert _python(code) == "True 1 Numba CUDA simulator (on the CPU; no GPU)"


def test_user_setting_is_obeyed():
    code = "from flashlab.gpu import target\nprint(target.is_simulator())"
    assert _python(code, NUMBA_ENABLE_CUDASIM="1") == "True"
    from flashlab.gpu.target import driver_device_count
    if not driver_device_count():
        # asked for the real driver on a machine without a GPU: a clear error, not a crash later
        environ = {k: v for k, v in os.environ.items()}
        environ["NUMBA_ENABLE_CUDASIM"] = "0"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=environ, timeout=120)
        assert out.returncode != 0 and "NUMBA_ENABLE_CUDASIM=1" in out.stderr


def test_choosing_the_simulator_keeps_flashlabs_cache_folder(tmp_path):
    # numba_cache may set numba's CACHE_DIR in code; re-reading the environment must not undo it
    code = ("import flashlab\nfrom numba.core import config\n"
            f"config.CACHE_DIR = {str(tmp_path)!r}\n"
            "from flashlab.gpu import target\ntarget.cuda()\nprint(config.CACHE_DIR)")
    assert _python(code) == str(tmp_path)


@pytest.mark.parametrize("d", [64, 128])
def test_backward_shared_tiles_are_conflict_free(d):
    """Every warp access of the backward's products to its padded shared tiles hits distinct
    banks (words of one bank are broadcast when equal), at the tiles the inspection compiles."""
    from flashlab.gpu.backward import _shapes, backward_shared_bytes, backward_tiling
    from flashlab.gpu.inspect import fitting_tile
    from flashlab.gpu.tiles import LANE_COLS, _conflicts
    bq, bk = fitting_tile(backward_shared_bytes, d)
    t, sh = backward_tiling(bq, bk, d, d), _shapes(bq, bk, d, d)
    lanes = [(lane // LANE_COLS, lane % LANE_COLS) for lane in range(32)]
    tm, tmq = t["tm"], t["tmq"]
    width = {name: sh[name][1] for name in ("q", "do", "k", "v", "p", "ds")}
    for col in range(4):
        for name in ("k", "v"):       # A operand of S^T = K Q^T, dP^T = V dO^T: rows r0 + r
            assert _conflicts(ty * tm * width[name] + col for ty, tx in lanes) == 1, name
        for name in ("q", "do"):      # B operand: rows tx + 8 c
            assert _conflicts(tx * width[name] + col for ty, tx in lanes) == 1, name
        for name in ("p", "ds"):      # P^T, dS^T written at (r0 + r, tx + 8 c), read at (r0 + r, c)
            assert _conflicts(ty * tm * width[name] + tx + 8 * col for ty, tx in lanes) == 1, name
            assert _conflicts(ty * tm * width[name] + col for ty, tx in lanes) == 1, name
        # dQ: the dS^T tile read transposed, (c, a0 + r); K read along a row (c, tx + 8 e)
        assert _conflicts(col * width["ds"] + ty * tmq for ty, tx in lanes) == 1
        assert _conflicts(col * width["k"] + tx + 8 * col for ty, tx in lanes) == 1


def test_launches_over_static_shared_memory_are_refused_on_a_gpu(monkeypatch):
    """On a real GPU (faked here: the check is skipped in the simulator, which has no limit) a
    block over 48 KiB of static shared memory is refused with the way out; the default tiles fit."""
    from flashlab.gpu import attention
    monkeypatch.setattr(attention, "is_simulator", lambda: False)
    x = make_qkv(1, 1, 1, 64, 64, 64, 64, seed=1)   # lengths >= the tiles (prepare clamps them)
    with pytest.raises(ValueError, match="shared memory per block.*choose smaller block_q, block_k"):
        flash_attention_gpu(**x, block_q=64, block_k=64)
    o, lse = np.zeros_like(x["q"]), np.zeros(x["q"].shape[:3], np.float32)
    with pytest.raises(ValueError, match="shared memory per block"):
        flash_attention_backward_gpu(o, **x, o=o, lse=lse, block_q=64, block_k=64)
    # the default tiles (None): the first of TILE_CHOICES that fits, checked before any launch
    from flashlab.gpu.backward import backward_shared_bytes
    from flashlab.gpu.forward import forward_shared_bytes
    from flashlab.validation import prepare
    for shared in (forward_shared_bytes, backward_shared_bytes):
        p = attention._tiles(prepare(**x, block_q=1, block_k=1), None, None, shared)
        assert shared(p.block_q, p.block_k, 64, 64) <= attention.STATIC_SHARED_LIMIT
        assert (p.block_q, p.block_k) != (1, 1)
    wide = make_qkv(1, 1, 1, 9, 9, 192, 128, seed=1)
    with pytest.raises(ValueError, match="one fixed tile: use head dims <= 128"):
        standard_attention_gpu(**wide)
