"""Shared helpers for the flashlab tests: random inputs, masks, and the tolerance rule.

Plain functions (import them with ``from conftest import ...``) so that every test module,
including the backward tests, builds inputs and judges errors the same way.

The tolerance rule (:func:`assert_close_to_reference`) is the one flash-attention's own tests
use: a kernel is compared against a float64 reference, and its maximum absolute error may be
at most **twice** the maximum absolute error of a plain naive implementation computed in the
inputs' own dtype (:func:`flashlab.attention_naive`; float16 inputs are compared with the
float16 naive), plus flash-attention's ``atol``: twice the rounding error of one arithmetic
step on the reference in the result's dtype, ``2 max|(ref + 0.3 - 0.3) - ref|`` (about two
ulps at the result's largest magnitude), and never less than ``1e-6``. The atol keeps cases
where the naive result happens to be exact, or off by less than an ulp (an LSE of ~20 in
float32 has an ulp of 1.9e-6), from being judged against zero: a tiled online softmax rounds
its running sum once per tile, the naive once per row, and which of the two lands nearer the
exact value is luck (seen: a 1 x 1-tile forward's LSE 4.9e-6 off at |LSE| = 21.6, the
naive's 1.3e-6, on an AMD Zen 5 machine whose BLAS rounds differently from Zen 4's). With
small tiles a row's sum is built over many tiles, one rounding each: the rule adds Higham's
bound for that recursive summation (see :func:`tolerance`), which is zero for one tile.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys

import numpy as np

import flashlab
from flashlab.tiling import FORWARD_BLOCK

#: the absolute floor added to the tolerance (see the module docstring)
ABS_FLOOR = 1e-6


# ----------------------------------------------------------------------------------- inputs
def make_qkv(B: int, H: int, Hkv: int, Sq: int, Sk: int, Dqk: int, Dv: int, *,
             dtype=np.float32, seed: int = 0, q_scale: float = 1.0,
             Dr: int = 0, Hr: int = 1) -> dict:
    """Random standard-normal attention operands as a dict of keyword arguments.

    Returns ``{"q": (B, H, Sq, Dqk), "k": (B, Hkv, Sk, Dqk), "v": (B, Hkv, Sk, Dv)}`` in
    ``dtype``; with ``Dr > 0`` also ``"q_rope": (B, H, Sq, Dr)`` and ``"k_rope": (B, Hr, Sk, Dr)``.
    ``q_scale`` multiplies q (and q_rope) to push the logits to large magnitudes.
    """
    rng = np.random.default_rng(seed)
    out = {
        "q": rng.standard_normal((B, H, Sq, Dqk)) * q_scale,
        "k": rng.standard_normal((B, Hkv, Sk, Dqk)),
        "v": rng.standard_normal((B, Hkv, Sk, Dv)),
    }
    if Dr:
        out["q_rope"] = rng.standard_normal((B, H, Sq, Dr)) * q_scale
        out["k_rope"] = rng.standard_normal((B, Hr, Sk, Dr))
    return {name: x.astype(dtype) for name, x in out.items()}


def random_mask(shape: tuple, *, seed: int = 1, p_masked: float = 0.3,
                full_rows: int = 1) -> np.ndarray:
    """Bool mask of ``shape`` (True = masked out) with about ``p_masked`` of entries set.

    The first ``full_rows`` query rows of the last two axes are masked completely, so every
    dense-mask test also covers rows with no allowed key.
    """
    rng = np.random.default_rng(seed)
    m = rng.random(shape) < p_masked
    m[..., :full_rows, :] = True
    return m


def mask_options(kind: str, B: int, H: int, Sq: int, Sk: int, seed: int = 1) -> dict:
    """Keyword options (causal / window / mask) for one named mask kind; see :data:`MASK_KINDS`."""
    if kind == "none":
        return {}
    if kind == "causal":
        return {"causal": True}
    if kind == "window+causal":
        return {"window": (10, 5), "causal": True}
    if kind in WINDOWS:
        return {"window": WINDOWS[kind]}
    if kind == "causal+mask":
        return {"causal": True, "mask": random_mask((B, H, Sq, Sk), seed=seed)}
    shapes = {"mask(Sq,Sk)": (Sq, Sk), "mask(B,1,Sq,Sk)": (B, 1, Sq, Sk), "mask(B,1,1,Sk)": (B, 1, 1, Sk),
              "mask(1,H,Sq,Sk)": (1, H, Sq, Sk), "mask(B,H,Sq,Sk)": (B, H, Sq, Sk)}
    # a key-padding mask has one row for all queries: masking it whole would empty every row
    return {"mask": random_mask(shapes[kind], seed=seed, full_rows=0 if kind == "mask(B,1,1,Sk)" else 1)}


#: windows by name: both sides, one side None, negative sides
WINDOWS = {
    "window(40,17)": (40, 17),
    "window(20,None)": (20, None),
    "window(None,10)": (None, 10),
    "window(-2,30)": (-2, 30),      # j in [i+2, i+30]: rows near the end see no key
    "window(40,-3)": (40, -3),      # j in [i-40, i-3]: the first 3 rows see no key
}

#: every mask kind the forward must handle
MASK_KINDS = ["none", "causal", *WINDOWS, "mask(Sq,Sk)", "mask(B,1,Sq,Sk)", "mask(1,H,Sq,Sk)",
              "mask(B,H,Sq,Sk)", "mask(B,1,1,Sk)", "causal+mask", "window+causal"]


# ------------------------------------------------------- the grid the forward and backward share
#: lengths, including ones no block divides; every ordered pair with Sq != Sk
LENGTHS = [1, 7, 64, 129, 1000]
LENGTH_PAIRS = [(sq, sk) for sq in LENGTHS for sk in LENGTHS if sq != sk]
#: (Dqk, Dv) and (H, Hkv) pairs: equal dims, MLA's 192/128, odd dims; MHA, MQA, GQA
DIMS = [(64, 64), (192, 128), (72, 40)]
HEADS = [(4, 4), (4, 1), (8, 2)]
#: 1 x 1 tiles: lengths and mask kinds
ONE_BY_ONE_PAIRS = [(1, 1), (7, 13), (13, 7), (1, 64), (64, 1)]
ONE_BY_ONE_KINDS = ["none", "causal", "window(-2,30)", "mask(Sq,Sk)"]
#: dtypes and large logits: lengths, mask kinds, and the query scale that makes |scores| ~ 50..100
DTYPE_PAIRS = [(7, 64), (129, 64), (64, 129)]
DTYPE_KINDS = ["none", "causal", "window(-2,30)", "mask(B,1,Sq,Sk)"]
Q_SCALES = [1.0, 25.0]
Q_SCALE_IDS = ["logits~N(0,1)", "logits~50-100"]


def pair_id(pair) -> str:
    return f"Sq{pair[0]}-Sk{pair[1]}"

# -------------------------------------------------------------------------------- tolerance
def max_abs_err(x: np.ndarray, ref: np.ndarray) -> float:
    """max |x - ref| in float64 over entries where ``ref`` is finite (0.0 when there are none)."""
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(x.astype(np.float64)[fin] - ref[fin])))


def rounding_atol(ref: np.ndarray, dtype) -> float:
    """flash-attention's ``atol``: ``2 max|(r + 0.3 - 0.3) - r|`` with ``r`` = ``ref`` rounded to
    ``dtype`` (finite entries), i.e. about two rounding steps of ``dtype`` at ``ref``'s magnitude."""
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    r = ref[fin].astype(dtype)
    return 2.0 * float(np.max(np.abs((r + dtype(0.3) - dtype(0.3)) - r)))


def tolerance(naive: np.ndarray, ref: np.ndarray, dtype=None, *, updates: int = 1,
              relative: bool = True) -> float:
    """Allowed max abs error (flash-attention's rule): ``2 * max|naive - ref|`` plus
    :func:`rounding_atol` of ``ref`` in ``dtype`` (the kernel result's; default ``naive``'s),
    at least ``ABS_FLOOR``.

    ``updates``: how many tiles the kernel's online softmax adds into a row one after the
    other (``ceil(Sk / block_k)``). Each update rounds the running sum and output once more,
    where the naive sums a row in one pass; the rule then allows Higham's bound for recursive
    summation, ``(updates - 1) u`` relative (``u`` the compute dtype's epsilon: float32, or
    float64 for float64 results), times ``max|ref|`` (``relative``, for O) or absolute (for
    the LSE, whose error is the running sum's relative error). Nothing is added for one tile.
    """
    dtype = np.dtype(naive.dtype if dtype is None else dtype).type
    tol = 2.0 * max_abs_err(naive, ref) + max(ABS_FLOOR, rounding_atol(ref, dtype))
    if updates > 1:
        u = np.finfo(np.float64 if dtype == np.float64 else np.float32).eps
        fin = np.isfinite(ref)
        size = float(np.abs(ref[fin]).max()) if relative and fin.any() else 1.0
        tol += (updates - 1) * u * size
    return tol


def assert_close_to_reference(o, lse, naive_o, naive_lse, ref_o, ref_lse, *, what: str = "",
                              updates: int = 1) -> None:
    """Apply the tolerance rule to ``o`` and ``lse``; also check NaN-freeness and -inf rows.

    ``lse`` rows that are ``-inf`` in the float64 reference (no allowed key) must be exactly
    ``-inf`` in the kernel's result, the others finite and within the rule. ``updates``: the
    kv tiles per row (see :func:`tolerance`).
    """
    assert not np.isnan(o).any(), f"{what}: NaN in o"
    assert not np.isnan(lse).any(), f"{what}: NaN in lse"
    err_o, tol_o = max_abs_err(o, ref_o), tolerance(naive_o, ref_o, o.dtype, updates=updates)
    assert err_o <= tol_o, f"{what}: o max abs error {err_o:.3g} > tolerance {tol_o:.3g}"
    empty = np.isneginf(ref_lse)
    np.testing.assert_array_equal(np.isneginf(lse), empty, err_msg=f"{what}: -inf rows of lse differ")
    assert np.isfinite(lse[~empty]).all(), f"{what}: non-finite lse on a row with allowed keys"
    err_l, tol_l = max_abs_err(lse, ref_lse), tolerance(naive_lse, ref_lse, lse.dtype,
                                                        updates=updates, relative=False)
    assert err_l <= tol_l, f"{what}: lse max abs error {err_l:.3g} > tolerance {tol_l:.3g}"


def check_forward(inputs: dict, **options) -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel, the same-dtype naive and the float64 reference and apply the rule.

    Also checks the output dtypes (o in the inputs' dtype, lse float64 for float64 inputs and
    float32 otherwise) and shapes, and that
    rows with no allowed key give o = 0 exactly. Returns the kernel's ``(o, lse)``.
    """
    o, lse = flashlab.flash_attention(**inputs, **options)
    naive_o, naive_lse = flashlab.attention_naive(**inputs, **options)
    ref_o, ref_lse = flashlab.attention_reference(**inputs, **options)
    q, v = inputs["q"], inputs["v"]
    assert o.dtype == q.dtype
    assert lse.dtype == (np.float64 if q.dtype == np.float64 else np.float32)
    assert o.shape == q.shape[:3] + v.shape[3:] and lse.shape == q.shape[:3]
    what = ", ".join(f"{name}{val.shape}" if isinstance(val, np.ndarray) else f"{name}={val!r}"
                     for name, val in options.items())
    block_k = options.get("block_k", FORWARD_BLOCK[1])
    assert_close_to_reference(o, lse, naive_o, naive_lse, ref_o, ref_lse, what=what,
                              updates=-(-inputs["k"].shape[2] // block_k))
    assert (o[np.isneginf(ref_lse)] == 0).all(), "rows with no allowed key must give o = 0"
    return o, lse


def dense_allowed(B: int, H: int, Sq: int, Sk: int, causal: bool = False, window=None,
                  mask=None) -> np.ndarray:
    """Brute-force (B, H, Sq, Sk) bool: True where row i may attend key j (no flashlab code)."""
    i = np.arange(Sq)[:, None]
    j = np.arange(Sk)[None, :]
    ok = np.ones((Sq, Sk), dtype=bool)
    if causal:
        ok &= j <= i
    if window is not None:
        left, right = window
        if left is not None:
            ok &= j >= i - left
        if right is not None:
            ok &= j <= i + right
    ok = np.broadcast_to(ok, (B, H, Sq, Sk))
    if mask is not None:
        ok = ok & ~np.broadcast_to(mask, (B, H, Sq, Sk))
    return ok


# ---------------------------------------------------------------- determinism across thread counts
_THREADS_SCRIPT = """
import hashlib, json, pickle, sys
import numba
import flashlab

with open(sys.argv[1], "rb") as f:
    problems = pickle.load(f)
out = {}
for name, p in problems.items():
    out[name] = {}
    for threads in (1, 3, 4):
        numba.set_num_threads(threads)
        arrays = CALL
        out[name][threads] = hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()
print(json.dumps(dict(max_threads=numba.config.NUMBA_NUM_THREADS, hashes=out)))
"""


def sha256_of(arrays) -> str:
    """One hash of the bytes of several arrays, in order."""
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()


def hashes_at_1_3_4_threads(problems: dict, call: str, tmp_path, timeout: float = 180) -> dict:
    """Run ``call`` (an expression of ``p``, one problem of ``problems``, giving arrays) in a
    subprocess with ``NUMBA_NUM_THREADS=4`` at 1, 3 and 4 threads; return
    ``{name: {"1": sha256, "3": ..., "4": ...}}``. More threads than this machine's 2 cores, so
    the work items are split among threads in ways the tests in this process never see."""
    path = tmp_path / "problems.pkl"
    path.write_bytes(pickle.dumps(problems))
    env = dict(os.environ, NUMBA_NUM_THREADS="4", OPENBLAS_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT.replace("CALL", call), str(path)],
                         env=env, capture_output=True, text=True, timeout=timeout,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["max_threads"] == 4 and set(result["hashes"]) == set(problems)
    return result["hashes"]
