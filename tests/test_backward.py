"""flashlab.flash_attention_backward against the analytic float64 backward and finite differences.

The tolerance rule is flash-attention's (see conftest): the float32 kernel's max abs error
against :func:`flashlab.attention_reference_backward` (float64) may be at most twice the error
of a naive float32 backward (:func:`naive_backward` below: the same formulas, whole matrices,
in float32) plus a floor of ``GRAD_FLOOR * max(1, max|reference gradient|)`` (1e-6 relative),
for each of dq, dk, dv (and dq_rope, dk_rope). The float32 kernel gets ``o`` and ``lse`` from
the float32 forward kernel, as a training step would. Like the kernel, the naive backward
recomputes P from an LSE stored in ``lse``'s dtype (float32): at large logits (|LSE| ~ 100)
the rounding of the stored LSE alone moves P by up to ~4e-6 relative, an error the interface
imposes on any backward. Where the forward ran the split-KV (decode) kernel, its scores come
from gemms of other shapes than the backward's recomputation, and a BLAS may round them
differently by shape (OpenBLAS on AMD Zen 5 does): there the yardstick is the larger error of
the naive backward and of one whose recomputed scores are summed in two halves of the head
dim, i.e. round differently from the scores its LSE came from. float64 inputs get the float64
reference's ``lse`` (the forward's float32 ``lse`` would limit them to ~1e-7 relative, as
flash_attention_backward documents)
and the kernel's float64 ``o``.

The grid, as in test_forward.py, is a set of products:

* lengths x a rotating choice of heads/dims/masks (every ordered pair ``Sq != Sk`` of
  {1, 7, 64, 129, 1000});
* every mask kind x two length pairs, with GQA 8/2 and non-dividing blocks;
* the forward's lengths x every mask kind (Dqk 24 / Dv 16), equal lengths, 1 x 1 tiles;
* dtypes (float16/32/64) x ordinary and large-magnitude (|scores| ~ 50..100) logits;
* head dims x head counts;
* block sizes (dividing and not);
* float64 against the analytic backward to ~1e-10 and central finite differences;
* determinism (runs, 1/2 threads here and 1/3/4 threads in a subprocess), tile skipping equal
  to the forward's, the rope operands against concatenation, rows with no allowed key, dtypes
  and bad inputs;
* the forward's hypothesis strategy of random problems.
"""
from __future__ import annotations

import conftest as grid  # the shared grid: lengths, dims, heads, dtypes, masks
import numba
import numpy as np
import pytest
from conftest import (
    dense_allowed,
    hashes_at_1_3_4_threads,
    make_qkv,
    mask_options,
    max_abs_err,
    pair_id,
    sha256_of,
)
from hypothesis import given, settings
from test_forward import problems  # the forward's hypothesis strategy

import flashlab
from flashlab import api
from flashlab.kernels.backward import flash_backward_kernel
from flashlab.tiling import q_splits
from flashlab.validation import prepare

GRAD_NAMES = ("dq", "dk", "dv", "dq_rope", "dk_rope")
#: relative floor of the tolerance: 1e-6 * max(1, max|reference gradient|)
GRAD_FLOOR = 1e-6


# ------------------------------------------------------------------------------ helpers
def naive_backward(do, q, k, v, *, scale=None, causal=False, window=None, mask=None,
                   q_rope=None, k_rope=None, lse_dtype=None, resum_scores=False, **_):
    """The analytic backward with whole (B, H, Sq, Sk) matrices in the inputs' dtype.

    Written here from the formulas (no flashlab code but :func:`dense_allowed`), so that the
    tolerance's yardstick does not share a bug with the kernel. With ``lse_dtype``, P is
    recomputed as the backward does, ``exp(S - LSE)`` from its own ``LSE = m + log(l)`` stored
    in ``lse_dtype``; P itself is kept in the inputs' dtype.
    """
    dt = q.dtype.type
    B, H, Sq, Dqk = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    if scale is None:
        scale = 1.0 / np.sqrt(Dqk + (0 if q_rope is None else q_rope.shape[3]))
    scale = dt(scale)

    def expand(x):
        return np.repeat(x, H // x.shape[1], axis=1)

    def group_sum(x, heads):
        return x.reshape(B, heads, H // heads, *x.shape[2:]).sum(axis=2)

    kx, vx = expand(k), expand(v)
    s = q @ kx.swapaxes(-1, -2)
    if q_rope is not None:
        s = s + q_rope @ expand(k_rope).swapaxes(-1, -2)
    s = s * scale
    ok = dense_allowed(B, H, Sq, Sk, causal, window, mask)
    s = np.where(ok, s, dt(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, dt(0))
    e = np.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)
    if lse_dtype is None:
        p = e / np.where(l > 0, l, dt(1))
    else:
        if resum_scores:
            # recompute S with its dim summed in two halves: the same scores, rounded differently
            # from the S the LSE was taken from (as when the backward's tiles are not the forward's)
            half = Dqk // 2
            s = (q[..., :half] @ kx[..., :half].swapaxes(-1, -2)
                 + q[..., half:] @ kx[..., half:].swapaxes(-1, -2))
            if q_rope is not None:
                s = s + q_rope @ expand(k_rope).swapaxes(-1, -2)
            s = np.where(ok, s * scale, dt(-np.inf))
        with np.errstate(divide="ignore", invalid="ignore"):
            lse = m.astype(lse_dtype) + np.log(l.astype(lse_dtype))
            p = np.where(np.isneginf(lse), 0.0, np.exp(s - lse)).astype(q.dtype)
    o = p @ vx
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ vx.swapaxes(-1, -2)
    d = (do * o).sum(axis=-1, keepdims=True)
    ds = p * (dp - d)
    grads = [scale * (ds @ kx), group_sum(scale * (ds.swapaxes(-1, -2) @ q), Hkv), group_sum(dv, Hkv)]
    if q_rope is not None:
        grads.append(scale * (ds @ expand(k_rope)))
        grads.append(group_sum(scale * (ds.swapaxes(-1, -2) @ q_rope), k_rope.shape[1]))
    return tuple(g.astype(q.dtype) for g in grads)


def make_do(inputs: dict, seed: int = 7) -> np.ndarray:
    """A random upstream gradient dO of the output's shape (B, H, Sq, Dv), inputs' dtype."""
    q, v = inputs["q"], inputs["v"]
    rng = np.random.default_rng(seed)
    return rng.standard_normal(q.shape[:3] + v.shape[3:]).astype(q.dtype)


def check_backward(inputs: dict, **options) -> tuple[np.ndarray, ...]:
    """float32 (or float16, float64) kernel vs the float64 analytic backward under the tolerance rule.

    ``o`` and ``lse`` come from the forward kernel (float64 inputs: ``lse`` from the float64
    reference, see the module docstring); the naive yardstick stores its LSE in ``lse``'s dtype.
    Also checks dtypes, shapes, NaN-freeness and that rows with no allowed key get dq = 0
    exactly. Returns the kernel's gradients.
    """
    do = make_do(inputs)
    o, lse = flashlab.flash_attention(**inputs, **options)
    if inputs["q"].dtype == np.float64:
        lse = flashlab.attention_reference(**inputs, **options)[1]
    grads = api.flash_attention_backward(do, **inputs, o=o, lse=lse, **options)
    refs = flashlab.attention_reference_backward(do, **inputs, **options)
    naive = naive_backward(do, **inputs, **options, lse_dtype=lse.dtype)
    naive_errs = [max_abs_err(nv, ref) for nv, ref in zip(naive, refs)]
    if inputs["q"].dtype != np.float64 and api.uses_decode(prepare(**inputs, **options)):
        # the forward ran the split-KV kernel: its scores come from gemms of other shapes (the
        # group's rows stacked, whole tiles) than the backward's recomputation, and BLAS may
        # round a score differently by shape (OpenBLAS on AMD Zen 5 does; on Zen 4 it did
        # not). At large logits P = e^{S - LSE} moves with that rounding; the yardstick is then
        # a naive backward whose recomputed scores round differently from its LSE's, too.
        resummed = naive_backward(do, **inputs, **options, lse_dtype=lse.dtype, resum_scores=True)
        naive_errs = [max(e, max_abs_err(nv, ref)) for e, nv, ref in zip(naive_errs, resummed, refs)]
    operands = [inputs[n] for n in ("q", "k", "v", "q_rope", "k_rope") if n in inputs]
    assert len(grads) == len(refs) == len(operands)
    what = ", ".join(f"{name}{val.shape}" if isinstance(val, np.ndarray) else f"{name}={val!r}"
                     for name, val in options.items())
    for name, g, ref, naive_err, x in zip(GRAD_NAMES, grads, refs, naive_errs, operands):
        assert g.dtype == x.dtype and g.shape == x.shape, f"{what}: {name} {g.dtype}{g.shape}"
        assert np.isfinite(g).all(), f"{what}: {name} not finite"
        err = max_abs_err(g, ref)
        tol = 2.0 * naive_err + GRAD_FLOOR * max(1.0, float(np.abs(ref).max()))
        assert err <= tol, f"{what}: {name} max abs error {err:.3g} > tolerance {tol:.3g}"
    empty = np.isneginf(flashlab.attention_reference(**inputs, **options)[1])
    assert (grads[0][empty] == 0).all(), "rows with no allowed key must give dq = 0"
    return grads


def backward64(inputs: dict, do: np.ndarray, **options) -> tuple[np.ndarray, ...]:
    """float64 kernel backward fed the float64 reference's o and lse (lse kept in float64)."""
    o, lse = flashlab.attention_reference(**inputs, **options)
    return api.flash_attention_backward(do, **inputs, o=o, lse=lse, **options)


# ------------------------------------------------------------------------ lengths
@pytest.mark.parametrize("sq_sk", grid.LENGTH_PAIRS, ids=pair_id)
def test_lengths(sq_sk):
    """Every ordered pair of unequal lengths; heads, dims, mask and blocks rotate with the case."""
    Sq, Sk = sq_sk
    n = grid.LENGTH_PAIRS.index(sq_sk)
    H, Hkv = grid.HEADS[n % 3]
    Dqk, Dv = grid.DIMS[(n // 3) % 3]
    kind = ["none", "causal", "window(40,-3)", "mask(B,1,Sq,Sk)"][n % 4]
    blocks = [(64, 64), (32, 48), (17, 5)][n % 3]
    inputs = make_qkv(1, H, Hkv, Sq, Sk, Dqk, Dv, seed=n)
    check_backward(inputs, block_q=blocks[0], block_k=blocks[1], **mask_options(kind, 1, H, Sq, Sk))


# ------------------------------------------------------------------------ mask kinds
@pytest.mark.parametrize("kind", grid.MASK_KINDS)
@pytest.mark.parametrize("sq_sk", [(129, 64), (64, 129)], ids=pair_id)
def test_mask_kinds(sq_sk, kind):
    """Every mask kind (windows with None/negative sides, dense masks of every broadcast
    shape, with fully masked rows), GQA 8/2, blocks that do not divide the lengths."""
    Sq, Sk = sq_sk
    B, H, Hkv = 2, 8, 2
    inputs = make_qkv(B, H, Hkv, Sq, Sk, 24, 16, seed=Sq + Sk)
    check_backward(inputs, block_q=32, block_k=24, **mask_options(kind, B, H, Sq, Sk))


# ------------------------------------------------------------------------ lengths x mask kinds
@pytest.mark.parametrize("kind", grid.MASK_KINDS)
@pytest.mark.parametrize("sq_sk", grid.LENGTH_PAIRS, ids=pair_id)
def test_lengths_x_masks(sq_sk, kind):
    """The forward's grid: every ordered pair of unequal lengths under every mask kind
    (B=2, H=4, Hkv=2 as in test_forward; small head dims 24/16 to keep it fast)."""
    Sq, Sk = sq_sk
    B, H, Hkv = 2, 4, 2
    inputs = make_qkv(B, H, Hkv, Sq, Sk, 24, 16, seed=Sq * 7 + Sk)
    check_backward(inputs, block_q=64, block_k=48, **mask_options(kind, B, H, Sq, Sk))


@pytest.mark.parametrize("kind", ["none", "causal", "window(40,-3)", "mask(B,H,Sq,Sk)", "causal+mask"])
@pytest.mark.parametrize("n", [1, 129, 1000])
def test_equal_lengths(n, kind):
    """Square problems too (Sq == Sk), where causal is the usual lower triangle."""
    inputs = make_qkv(1, 2, 1, n, n, 24, 16, seed=n)
    check_backward(inputs, **mask_options(kind, 1, 2, n, n))


@pytest.mark.parametrize("kind", grid.ONE_BY_ONE_KINDS)
@pytest.mark.parametrize("sq_sk", grid.ONE_BY_ONE_PAIRS, ids=pair_id)
def test_block_one_by_one(sq_sk, kind):
    """1 x 1 tiles: every score is its own tile (as the forward's test_block_one_by_one)."""
    Sq, Sk = sq_sk
    inputs = make_qkv(2, 2, 1, Sq, Sk, 8, 5, seed=3)
    check_backward(inputs, block_q=1, block_k=1, **mask_options(kind, 2, 2, Sq, Sk))


# --------------------------------------------------------- dtypes and large-magnitude logits
@pytest.mark.parametrize("q_scale", grid.Q_SCALES, ids=grid.Q_SCALE_IDS)
@pytest.mark.parametrize("kind", grid.DTYPE_KINDS)
@pytest.mark.parametrize("sq_sk", grid.DTYPE_PAIRS, ids=pair_id)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
def test_dtypes_and_large_logits(dtype, sq_sk, kind, q_scale):
    """float16/32/64 inputs with ordinary and large (|scores| ~ 50..100) logits, as the
    forward's test of the same name, under check_backward's rule (naive in the inputs' dtype)."""
    Sq, Sk = sq_sk
    inputs = make_qkv(2, 2, 2, Sq, Sk, 64, 32, dtype=dtype, seed=Sk, q_scale=q_scale)
    if q_scale > 1:
        # the test is about what it says: the largest logits really are ~ 50..100 or more
        q, k = (inputs[n].astype(np.float64) for n in ("q", "k"))
        top = np.abs(q @ k.swapaxes(-1, -2)).max() / 8.0
        assert 50 <= top <= 400, top
    check_backward(inputs, block_q=32, block_k=48, **mask_options(kind, 2, 2, Sq, Sk))


# ------------------------------------------------------------------------ dims x heads
@pytest.mark.parametrize("heads", grid.HEADS, ids=lambda h: f"H{h[0]}-Hkv{h[1]}")
@pytest.mark.parametrize("dims", grid.DIMS, ids=lambda d: f"Dqk{d[0]}-Dv{d[1]}")
def test_dims_x_heads(dims, heads):
    """QK dim != V dim (no padding) and GQA/MQA: dk, dv summed over each group of heads."""
    H, Hkv = heads
    inputs = make_qkv(1, H, Hkv, 64, 129, *dims, seed=dims[0] + H + Hkv)
    check_backward(inputs, causal=True, window=(70, None))


# ------------------------------------------------------------------------ block sizes
@pytest.mark.parametrize("kind", ["none", "causal+mask"])
@pytest.mark.parametrize("blocks", [(64, 64), (32, 16), (128, 128), (7, 13), (1, 1), (1000, 3)],
                         ids=lambda b: f"bq{b[0]}-bk{b[1]}")
def test_block_sizes(blocks, kind):
    """Blocks that divide the lengths and blocks that do not (also 1x1 and one huge q-block)."""
    Sq, Sk = (64, 129) if blocks != (1, 1) else (7, 13)
    inputs = make_qkv(1, 2, 1, Sq, Sk, 16, 8, seed=blocks[0])
    check_backward(inputs, block_q=blocks[0], block_k=blocks[1], **mask_options(kind, 1, 2, Sq, Sk))


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=lambda d: d.__name__)
def test_dtypes(dtype):
    """Gradients come back in the inputs' dtype (float16 is computed in float32)."""
    inputs = make_qkv(1, 2, 2, 64, 129, 32, 16, dtype=dtype, seed=3)
    do = make_do(inputs)
    o, lse = flashlab.flash_attention(**inputs, causal=True)
    grads = api.flash_attention_backward(do, **inputs, o=o, lse=lse, causal=True)
    refs = flashlab.attention_reference_backward(do, **inputs, causal=True)
    assert all(g.dtype == dtype for g in grads)
    # float16: the rounding of the inputs, o and the outputs dominates; float64: lse is float32
    rtol = 2e-2 if dtype == np.float16 else 1e-5
    for g, ref in zip(grads, refs):
        assert max_abs_err(g, ref) <= rtol * np.abs(ref).max()
    # one compiled signature per accumulation dtype (float32, float64), whatever the inputs
    assert len(flash_backward_kernel.signatures) <= 2


# ------------------------------------------------------------------------ float64 exactness
FLOAT64_CASES = {
    "none-mha": dict(heads=(4, 4), dims=(64, 64), sq_sk=(129, 64), opts={}),
    "causal-gqa-192/128": dict(heads=(4, 1), dims=(192, 128), sq_sk=(64, 129),
                               opts=dict(causal=True, block_q=32, block_k=48)),
    "window-8/2": dict(heads=(8, 2), dims=(72, 40), sq_sk=(1000, 7),
                       opts=dict(window=(3, -1), block_q=100)),
    "mask-rope-Hr1": dict(heads=(4, 2), dims=(32, 24), sq_sk=(7, 129), Dr=8, Hr=1,
                          opts=dict(mask="mask(1,H,Sq,Sk)", block_k=17)),
    "causal-rope-Hr2-B1H1": dict(heads=(2, 1), dims=(16, 16), sq_sk=(129, 129), Dr=4, Hr=2,
                                 opts=dict(causal=True, block_q=16)),
}


@pytest.mark.parametrize("case", FLOAT64_CASES.values(), ids=FLOAT64_CASES.keys())
def test_float64_matches_analytic(case):
    """float64 kernel (fed float64 o and lse) vs the analytic backward: ~1e-12 relative."""
    (H, Hkv), (Dqk, Dv), (Sq, Sk) = case["heads"], case["dims"], case["sq_sk"]
    B = 2
    inputs = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, dtype=np.float64, seed=Sq,
                      Dr=case.get("Dr", 0), Hr=case.get("Hr", 1))
    opts = dict(case["opts"])
    if "mask" in opts:
        opts.update(mask_options(opts.pop("mask"), B, H, Sq, Sk))
    do = make_do(inputs)
    grads = backward64(inputs, do, **opts)
    refs = flashlab.attention_reference_backward(do, **inputs, **opts)
    for name, g, ref in zip(GRAD_NAMES, grads, refs):
        assert g.dtype == np.float64
        err = max_abs_err(g, ref)
        assert err <= 1e-10 * max(1.0, np.abs(ref).max()), f"{name}: {err:.3g}"


FD_CASES = {
    "causal-gqa-rope": dict(opts=dict(causal=True, block_q=2, block_k=3), Hr=1),
    "window-mask-rope-Hr2": dict(opts=dict(window=(2, 1), mask="mask(Sq,Sk)", block_q=3, block_k=2), Hr=2),
}


@pytest.mark.parametrize("case", FD_CASES.values(), ids=FD_CASES.keys())
def test_finite_differences(case):
    """Central differences of f = sum(o * dO), o from the float64 forward kernel, for every
    element of q, k, v, q_rope, k_rope; error O(eps^2) ~ 1e-10."""
    B, H, Hkv, Sq, Sk, Dqk, Dv, Dr = 1, 2, 1, 5, 7, 4, 3, 2
    inputs = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, dtype=np.float64, seed=11, Dr=Dr, Hr=case["Hr"])
    opts = dict(case["opts"])
    if "mask" in opts:
        opts.update(mask_options(opts.pop("mask"), B, H, Sq, Sk, seed=4))
    do = make_do(inputs)
    grads = backward64(inputs, do, **opts)

    def f(x: dict) -> float:
        return float((flashlab.flash_attention(**x, **opts)[0] * do).sum())

    eps = 1e-5
    for name, g in zip(("q", "k", "v", "q_rope", "k_rope"), grads):
        fd = np.zeros_like(g)
        for idx in np.ndindex(g.shape):
            plus = {n: a.copy() for n, a in inputs.items()}
            minus = {n: a.copy() for n, a in inputs.items()}
            plus[name][idx] += eps
            minus[name][idx] -= eps
            fd[idx] = (f(plus) - f(minus)) / (2 * eps)
        assert np.abs(fd).max() > 0.01, f"d{name}: a degenerate case tests nothing"
        np.testing.assert_allclose(g, fd, atol=1e-8, err_msg=f"d{name}")


# ------------------------------------------------------------------------ rope vs concatenation
@pytest.mark.parametrize("kind", ["none", "causal", "mask(B,H,Sq,Sk)"])
@pytest.mark.parametrize("Hr", [1, 2, 4], ids=lambda h: f"Hr{h}")
def test_rope_grads_equal_concatenation(Hr, kind):
    """(q_rope, k_rope) as split operands give the gradients of the concatenated q = [q, q_rope],
    k = [k, k_rope]: dq_rope, dk_rope are the tail columns (dk_rope summed over the kv heads
    that shared its k_rope head)."""
    B, H, Hkv, Sq, Sk, Dr = 2, 4, 4, 64, 129, 8
    inputs = make_qkv(B, H, Hkv, Sq, Sk, 24, 16, dtype=np.float64, seed=Hr, Dr=Dr, Hr=Hr)
    opts = dict(mask_options(kind, B, H, Sq, Sk), block_q=32, block_k=48)
    do = make_do(inputs)
    dq, dk, dv, dq_rope, dk_rope = backward64(inputs, do, **opts)
    cat = dict(q=np.concatenate([inputs["q"], inputs["q_rope"]], axis=-1),
               k=np.concatenate([inputs["k"], np.repeat(inputs["k_rope"], Hkv // Hr, axis=1)], axis=-1),
               v=inputs["v"])
    cq, ck, cv = backward64(cat, do, **opts)
    np.testing.assert_allclose(dq, cq[..., :24], atol=1e-12)
    np.testing.assert_allclose(dq_rope, cq[..., 24:], atol=1e-12)
    np.testing.assert_allclose(dk, ck[..., :24], atol=1e-12)
    np.testing.assert_allclose(dv, cv, atol=1e-12)
    ck_rope = ck[..., 24:].reshape(B, Hr, Hkv // Hr, Sk, Dr).sum(axis=2)
    np.testing.assert_allclose(dk_rope, ck_rope, atol=1e-12)


# ------------------------------------------------------------------------ rows without keys
EMPTY_ROW_CASES = {
    "window(-2,30)": dict(window=(-2, 30)),          # the last rows see no key
    "window(40,-3)": dict(window=(40, -3)),          # the first 3 rows see no key
    "band-empty": dict(window=(-5, -3)),             # no row sees a key
    "mask-all-true": dict(mask=np.ones((1, 1), dtype=bool)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("opts", EMPTY_ROW_CASES.values(), ids=EMPTY_ROW_CASES.keys())
def test_rows_without_keys_give_zero_gradient(opts, dtype):
    """lse = -inf rows contribute nothing and never NaN; the rest still matches."""
    inputs = make_qkv(1, 2, 1, 20, 9, 8, 8, dtype=dtype, seed=5, Dr=4)
    do = make_do(inputs)
    o, lse = flashlab.flash_attention(**inputs, **opts, block_q=4, block_k=4)
    grads = api.flash_attention_backward(do, **inputs, o=o, lse=lse, **opts, block_q=4, block_k=4)
    refs = flashlab.attention_reference_backward(do, **inputs, **opts)
    empty = np.isneginf(lse)
    assert empty.any()
    for g, ref in zip(grads, refs):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, ref, atol=1e-5 if dtype == np.float32 else 1e-6)
    dq, dq_rope = grads[0], grads[3]
    assert (dq[empty] == 0).all() and (dq_rope[empty] == 0).all()
    if empty.all():
        assert all((g == 0).all() for g in grads)


# ------------------------------------------------------------------------ tile skipping
@pytest.mark.parametrize("kind", ["none", "causal", "window(40,17)", "window(-2,30)", "causal+mask",
                                  "mask(Sq,Sk)"])
def test_backward_visits_the_forwards_tiles(kind):
    """The backward visits exactly the tiles the forward computes, per (b, h, q-block)."""
    B, H, Sq, Sk = 1, 2, 200, 129
    inputs = make_qkv(B, H, 1, Sq, Sk, 8, 8, seed=2)
    opts = dict(mask_options(kind, B, H, Sq, Sk), block_q=16, block_k=32)
    if "mask" in opts:       # make some tiles fully masked so the dense-mask skip is exercised
        opts["mask"][..., :40, :] = True
    o, lse = flashlab.flash_attention(**inputs, **opts)
    p = prepare(**inputs, **opts)
    _, tiles = flashlab.flash_attention_backward(make_do(inputs), o=o, lse=lse, problem=p,
                                                 block_q=16, block_k=32, tiles=True)
    fwd = flashlab.tiles_computed(**inputs, **opts)
    np.testing.assert_array_equal(tiles.reshape(fwd.shape), fwd)
    if kind != "none":
        assert fwd.sum() < B * H * -(-Sq // 16) * -(-Sk // 32)


# ------------------------------------------------------------------------ determinism
DETERMINISM_CASES = {
    "B1-H1-causal (4 q-chunks)": dict(shape=(1, 1, 1), opts=dict(causal=True)),
    "B1-H2-Hkv1-mask (2 q-chunks)": dict(shape=(1, 2, 1), opts=dict(mask="mask(1,H,Sq,Sk)")),
    "B2-H4-Hkv2-rope": dict(shape=(2, 4, 2), opts=dict(window=(50, 10)), Dr=8),
}


@pytest.mark.parametrize("case", DETERMINISM_CASES.values(), ids=DETERMINISM_CASES.keys())
def test_deterministic_across_runs_and_thread_counts(case):
    """The same bits on every run and with 1 or 2 Numba threads."""
    B, H, Hkv = case["shape"]
    Sq, Sk = 300, 257
    inputs = make_qkv(B, H, Hkv, Sq, Sk, 32, 24, seed=9, Dr=case.get("Dr", 0))
    opts = dict(case["opts"], block_q=32, block_k=32)
    if "mask" in opts:
        opts.update(mask_options(opts.pop("mask"), B, H, Sq, Sk))
    do = make_do(inputs)
    o, lse = flashlab.flash_attention(**inputs, **opts)
    saved = numba.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 2, 1):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            runs.append(api.flash_attention_backward(do, **inputs, o=o, lse=lse, **opts))
    finally:
        numba.set_num_threads(saved)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert np.array_equal(a, b), "gradients differ between runs / thread counts"


def test_split_depends_on_shape_only():
    """The parallel split is a function of the shape (never the thread count)."""
    assert q_splits(1, 8, 32) == 1          # enough heads: one chunk per head
    assert q_splits(1, 1, 32) == 4          # a single head: its q-blocks in 4 chunks
    assert q_splits(1, 1, 2) == 2           # never more chunks than q-blocks
    assert q_splits(2, 1, 9) == 2


def test_deterministic_with_4_threads_in_a_subprocess(tmp_path):
    """Beyond the 2 threads of this machine: a subprocess with NUMBA_NUM_THREADS=4 computes the
    gradients at 1, 3 and 4 threads (3 threads for 4 work items in the first case); the sha256 of
    dq, dk, dv (and dq_rope, dk_rope) must be identical across thread counts and equal to this
    process's result at its default thread count."""
    problems = {}
    for name, (B, H, Hkv, Dr, opts) in {
        "causal-gqa2": (1, 2, 1, 0, dict(causal=True)),             # 2 q-chunks per head
        "causal-gqa3-mask-rope": (2, 6, 2, 8, dict(causal=True, mask="mask(1,H,Sq,Sk)")),
    }.items():
        Sq, Sk = 300, 257
        inputs = make_qkv(B, H, Hkv, Sq, Sk, 32, 24, seed=21, Dr=Dr)
        opts = dict(opts, block_q=32, block_k=32)
        if "mask" in opts:
            opts.update(mask_options(opts.pop("mask"), B, H, Sq, Sk))
        do = make_do(inputs)
        o, lse = flashlab.flash_attention(**inputs, **opts)
        problems[name] = dict(inputs=inputs, opts=opts, do=do, o=o, lse=lse)
    expected = {name: sha256_of(api.flash_attention_backward(p["do"], **p["inputs"], o=p["o"],
                                                              lse=p["lse"], **p["opts"]))
                for name, p in problems.items()}
    hashes = hashes_at_1_3_4_threads(
        problems, 'flashlab.flash_attention_backward(p["do"], **p["inputs"], o=p["o"], lse=p["lse"], '
                  '**p["opts"])', tmp_path, timeout=120)
    for name, h in hashes.items():
        assert set(h) == {"1", "3", "4"}
        assert set(h.values()) == {expected[name]}, f"{name}: {h} vs in-process {expected[name]}"


# ------------------------------------------------------------------------ bad inputs
def _bad_cases():
    inputs = make_qkv(2, 4, 2, 5, 6, 8, 3, seed=0)
    do = make_do(inputs)
    o, lse = flashlab.flash_attention(**inputs)
    good = dict(do=do, o=o, lse=lse)
    nan_lse = lse.copy()
    nan_lse[0, 0, 0] = np.nan
    inf_do = do.copy()
    inf_do[0, 0, 0, 0] = np.inf
    return inputs, {
        "do-shape": (dict(good, do=do[..., :2]), ValueError, r"do must have shape \(B, H, Sq, Dv\)"),
        "do-dtype": (dict(good, do=do.astype(np.float64)), TypeError, "do must have q's dtype"),
        "do-list": (dict(good, do=do.tolist()), TypeError, "do must be a numpy.ndarray"),
        "do-inf": (dict(good, do=inf_do), ValueError, "do contains NaN or inf"),
        "o-shape": (dict(good, o=o[:, :2]), ValueError, r"o must have shape \(B, H, Sq, Dv\)"),
        "o-dtype": (dict(good, o=o.astype(np.float16)), TypeError, "o must have q's dtype"),
        "lse-shape": (dict(good, lse=lse[..., None]), ValueError, r"lse must have shape \(B, H, Sq\)"),
        "lse-dtype": (dict(good, lse=lse.astype(np.float16)), TypeError, "lse must be float32"),
        "lse-nan": (dict(good, lse=nan_lse), ValueError, "lse contains NaN"),
        "lse-none": (dict(good, lse=None), TypeError, "lse must be a numpy.ndarray"),
    }


@pytest.mark.parametrize("name", ["do-shape", "do-dtype", "do-list", "do-inf", "o-shape", "o-dtype",
                                  "lse-shape", "lse-dtype", "lse-nan", "lse-none"])
def test_bad_inputs_raise(name):
    inputs, cases = _bad_cases()
    args, error, match = cases[name]
    with pytest.raises(error, match=match):
        api.flash_attention_backward(args["do"], **inputs, o=args["o"], lse=args["lse"])


def test_bad_options_raise_as_in_the_forward():
    """q, k, v and the options go through the forward's checks (same messages)."""
    inputs = make_qkv(1, 4, 2, 5, 6, 8, 3, seed=0)
    do = make_do(inputs)
    o, lse = flashlab.flash_attention(**inputs)
    with pytest.raises(ValueError, match=r"k must have shape \(B, Hkv, Sk, Dqk\) with q's heads H=3 a multiple "
                                         r"of k's heads Hkv"):
        api.flash_attention_backward(do, inputs["q"][:, :3], inputs["k"], inputs["v"], o[:, :3], lse[:, :3])
    with pytest.raises(TypeError, match="block_q must be an int"):
        api.flash_attention_backward(do, **inputs, o=o, lse=lse, block_q=2.0)
    with pytest.raises(ValueError, match="q_rope and k_rope must be given together"):
        api.flash_attention_backward(do, **inputs, o=o, lse=lse, q_rope=inputs["q"])


# ------------------------------------------------------------------- hypothesis property test
@settings(max_examples=30, deadline=None, derandomize=True)
@given(problems())
def test_property_random_problems(problem):
    """test_forward's random problems (shapes, heads, dims, blocks, dtype, rope, masks) under
    check_backward's rule; rows with no allowed key give dq = 0 (checked there)."""
    inputs, opts = problem
    check_backward(inputs, **opts)


# ---------------------------------------------------------------------------------------------
# issue 22.7: float32 dV over many single-key rows (varlen 511 x 1, GQA)
# ---------------------------------------------------------------------------------------------

def _varlen_511x1(dtype=np.float32):
    """flash_attn varlen with one sequence of 511 queries and 1 key, 32 query / 8 kv heads,
    D=64: every row has P = 1 on the key, so dV[key] sums 511 x 4 rows of dO."""
    rng = np.random.default_rng(0)
    Tq, Tk, H, Hkv, D = 511, 1, 32, 8, 64
    q = rng.standard_normal((Tq, H, D)).astype(dtype)
    k = rng.standard_normal((Tk, Hkv, D)).astype(dtype)
    v = rng.standard_normal((Tk, Hkv, D)).astype(dtype)
    do = rng.standard_normal((Tq, H, D)).astype(dtype)
    cu_q, cu_k = np.array([0, Tq], np.int32), np.array([0, Tk], np.int32)
    return q, k, v, do, cu_q, cu_k


def _dv64(q, k, v, do):
    # float64 truth, (1, H, S, D) layout
    ref = flashlab.reference.attention_reference_backward(
        *(x.astype(np.float64).transpose(1, 0, 2)[None] for x in (do, q, k, v)))
    return ref[2][0].transpose(1, 0, 2)


def test_dv_over_single_key_rows_is_summed_in_short_chains():
    """dV is added in gemms of DV_SLICE_ROWS query rows whatever the tile: the default
    512 x 256 tile gives the 64 x 64 tile's bits (before: 7.8e-5 against 2.5e-5), and the
    float32 error stays at the level of a 64-long chain."""
    from flashlab.compat import flash_attn_varlen_func, flash_attn_varlen_func_backward
    q, k, v, do, cu_q, cu_k = _varlen_511x1()
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 511, 1, return_lse=True)
    _, _, dv = flash_attn_varlen_func_backward(do, q, k, v, out, lse, cu_q, cu_k, 511, 1)
    q4, k4, v4, do4 = (x.transpose(1, 0, 2)[None] for x in (q, k, v, do))
    o4, lse4 = flashlab.flash_attention(q4, k4, v4)
    _, _, dv_small = flashlab.flash_attention_backward(do4, q4, k4, v4, o4, lse4, block_q=64,
                                                       block_k=64)
    assert np.array_equal(dv, dv_small[0].transpose(1, 0, 2))
    # 2044 terms of |dO| ~ 1 per entry: a 512-long float32 chain gave 7.8e-5
    assert np.abs(dv - _dv64(q, k, v, do)).max() < 4e-5


def test_dv_over_single_key_rows_within_2x_torch():
    """Issue 22.7: float32 dV within 2x torch's float32 SDPA error on varlen 511 x 1, GQA
    (torch's dV of the same K/V repeated per query head, and with enable_gqa)."""
    torch = pytest.importorskip("torch", reason="the baseline is torch's float32 SDPA")
    from flashlab.compat import flash_attn_varlen_func, flash_attn_varlen_func_backward
    q, k, v, do, cu_q, cu_k = _varlen_511x1()
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 511, 1, return_lse=True)
    _, _, dv = flash_attn_varlen_func_backward(do, q, k, v, out, lse, cu_q, cu_k, 511, 1)
    dv64 = _dv64(q, k, v, do)
    group = q.shape[1] // k.shape[1]
    errs = []
    for gqa in (False, True):
        tq, tk, tv = (torch.tensor(x.transpose(1, 0, 2)[None], requires_grad=True)
                      for x in (q, k, v))
        kk, vv = (tk, tv) if gqa else (tk.repeat_interleave(group, 1),
                                       tv.repeat_interleave(group, 1))
        o = torch.nn.functional.scaled_dot_product_attention(tq, kk, vv, enable_gqa=gqa)
        o.backward(torch.tensor(do.transpose(1, 0, 2)[None]))
        errs.append(np.abs(tv.grad[0].numpy().transpose(1, 0, 2) - dv64).max())
    assert np.abs(dv - dv64).max() <= 2 * min(errs)


def test_one_key_rows_get_p_one_whatever_the_forwards_tiles():
    """Each row sees only its own key (window (0, 0)), the forward tiled 7 x 9 and the backward
    512 x 256: P = 1 exactly on the key (backward.one_key_probs), so dV = the group's sum of
    dO bit for bit and dQ = dK = 0 (issue 22.7)."""
    rng = np.random.default_rng(11)
    B, H, Hkv, S, D = 1, 4, 2, 100, 16
    q = rng.standard_normal((B, H, S, D)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, S, D)).astype(np.float32) * 4
    v = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    do = rng.standard_normal((B, H, S, D)).astype(np.float32)
    o, lse = flashlab.flash_attention(q, k, v, window=(0, 0), block_q=7, block_k=9)
    dq, dk, dv = flashlab.flash_attention_backward(do, q, k, v, o, lse, window=(0, 0))
    assert np.array_equal(dv, do.reshape(B, Hkv, H // Hkv, S, D).sum(axis=2, dtype=np.float32))
    assert not dq.any() and not dk.any()
