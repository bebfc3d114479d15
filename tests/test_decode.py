"""The split-KV decode forward (:mod:`flashlab.kernels.decode`) against the float64 reference.

``flash_attention`` runs it automatically for a short query (``Sq <= DECODE_MAX_SQ``, one
q-block, no RoPE operands); these tests pin that dispatch, then check the decode path over
Sk, head layouts (GQA 32/8, MQA, MHA), masks, bias/ALiBi/dropout and dtypes with the shared
tolerance rule of ``conftest.check_forward``; that it computes the tiles the tiled forward
does; and that its bits do not depend on the thread count.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import check_forward, hashes_at_1_3_4_threads, make_qkv, random_mask, sha256_of

import flashlab
from flashlab import api
from flashlab.kernels.decode import DECODE_MAX_SQ, kv_splits
from flashlab.validation import prepare, scan_kv

SKS = [1, 7, 129, 1000, 5000]
#: (H, Hkv): GQA 32/8, MQA, MHA
HEADS = {"gqa32/8": (32, 8), "mqa4/1": (4, 1), "mha4": (4, 4)}
D = 32


def _options(kind: str, B: int, H: int, Sq: int, Sk: int) -> dict:
    """Named masks and extras. flashlab's causal is top-left: row i sees keys j <= i, so with
    Sq = 1 the one row sees key 0 only (decode's 'all the cache' is no mask, or a window)."""
    rng = np.random.default_rng(5)
    if kind == "none":
        return {}
    if kind == "causal":
        return {"causal": True}
    if kind == "window":
        # the last 100 keys before i + Sk - 1 ... as a band around row i: j in [i - 3, i + 300]
        return {"window": (3, 300)}
    if kind == "key-padding":
        m = random_mask((B, 1, 1, Sk), seed=3, full_rows=0)
        m[..., 0] = False          # every row keeps at least one key
        return {"mask": m}
    if kind == "bias":
        return {"bias": rng.standard_normal((B, H, Sq, Sk)).astype(np.float32)}
    if kind == "alibi":
        return {"alibi_slopes": 2.0 ** -np.arange(1, H + 1, dtype=np.float64)}
    if kind == "dropout":
        return {"dropout_p": 0.25, "seed": 11, "offset": 3}
    raise ValueError(kind)


KINDS = ["none", "causal", "window", "key-padding", "bias", "alibi", "dropout"]


def test_dispatch():
    """Decode runs for short queries in one q-block without RoPE; the tiled forward otherwise."""
    x = make_qkv(1, 8, 2, 4, 300, D, D)
    assert api.uses_decode(prepare(**x))
    assert not api.uses_decode(prepare(**x, block_q=2))               # two q-blocks
    y = make_qkv(1, 8, 2, DECODE_MAX_SQ + 1, 300, D, D)
    assert not api.uses_decode(prepare(**y))
    z = make_qkv(1, 8, 2, 4, 300, D, D, Dr=8)
    assert not api.uses_decode(prepare(**z))                          # RoPE operands


@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("sk", SKS, ids=lambda s: f"Sk{s}")
@pytest.mark.parametrize("sq", [1, 3], ids=lambda s: f"Sq{s}")
def test_decode_grid(sq, sk, heads):
    H, Hkv = HEADS[heads]
    B = 2
    x = make_qkv(B, H, Hkv, sq, sk, D, 24, seed=sk + sq)
    for kind in KINDS:
        check_forward(x, **_options(kind, B, H, sq, sk))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", ["none", "window", "key-padding", "bias", "dropout"])
def test_decode_dtypes_and_large_logits(dtype, kind):
    B, H, Hkv, Sq, Sk = 1, 8, 2, 2, 1000
    for q_scale in (1.0, 25.0):
        x = make_qkv(B, H, Hkv, Sq, Sk, D, D, dtype=dtype, seed=2, q_scale=q_scale)
        opts = _options(kind, B, H, Sq, Sk)
        if "bias" in opts:
            opts["bias"] = opts["bias"].astype(dtype)
        check_forward(x, **opts)


def _tiled(x: dict, **opts) -> tuple:
    """The tiled forward on the same problem (the decode dispatch switched off)."""
    p = prepare(**x, **opts)
    saved = api.uses_decode
    api.uses_decode = lambda p: False
    try:
        return api.flash_attention(problem=p, stats=True)
    finally:
        api.uses_decode = saved


@pytest.mark.parametrize("kind", ["none", "causal", "window", "key-padding", "dropout"])
def test_same_tiles_and_result_as_the_tiled_forward(kind):
    """Decode computes exactly the tiles the tiled forward does (per head) and the same o,
    lse, row max up to rounding (the sums are taken in another order)."""
    B, H, Hkv, Sq, Sk = 2, 8, 2, 3, 1000
    x = make_qkv(B, H, Hkv, Sq, Sk, D, D, seed=4)
    opts = dict(_options(kind, B, H, Sq, Sk), block_k=64)
    if kind == "key-padding":
        # whole kv-blocks masked for one batch: those tiles are skipped
        opts["mask"][1, ..., 64:256] = True
    p = prepare(**x, **opts)
    assert api.uses_decode(p)
    o, lse, row_max, tiles = api.flash_attention(problem=p, stats=True)
    o2, lse2, row_max2, tiles2 = _tiled(x, **opts)
    np.testing.assert_array_equal(tiles, tiles2)
    np.testing.assert_allclose(o, o2, atol=2e-6)
    np.testing.assert_allclose(lse, lse2, atol=2e-6)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse2))
    np.testing.assert_allclose(row_max, row_max2, atol=1e-6)


def test_rows_with_no_allowed_key():
    """A row whose keys are all masked gives o = 0, lse = -inf in every chunk and the merge."""
    B, H, Hkv, Sq, Sk = 1, 4, 1, 2, 5000
    x = make_qkv(B, H, Hkv, Sq, Sk, D, D)
    mask = np.zeros((B, 1, 1, Sk), dtype=bool)
    mask[...] = True
    o, lse = flashlab.flash_attention(**x, mask=mask)
    assert (o == 0).all() and np.isneginf(lse).all()
    # window j in [i + 2, i + 3]: row 0 sees keys 2, 3 (one chunk), row 1 keys 3, 4
    check_forward(x, window=(-2, 3))


def test_split_depends_on_shape_only():
    assert kv_splits(1, 8, 1024) == 2           # 8 kv heads: 2 chunks give 16 work items
    assert kv_splits(1, 1, 1024) == 16          # MQA: the key axis in 16 chunks
    assert kv_splits(1, 1, 8) == 2              # never chunks shorter than 4 kv-blocks
    assert kv_splits(16, 8, 1024) == 1          # enough (batch, kv head) items already
    assert kv_splits(1, 1, 1) == 1


def test_errors_are_the_forwards():
    """NaN inputs and overflowing scores raise on the decode path as on the tiled one."""
    x = make_qkv(1, 4, 1, 1, 300, D, D)
    x["k"][0, 0, 17, 3] = np.nan
    with pytest.raises(ValueError, match="k contains NaN or inf"):
        flashlab.flash_attention(**x)
    y = make_qkv(1, 4, 1, 1, 300, D, D)
    y["q"] *= 1e20
    y["k"] *= 1e20
    with pytest.raises(ValueError, match="overflow"):
        flashlab.flash_attention(**y)


#: where a NaN or inf is planted in k or v: (name, key row, value), for Sk = 300, block_k = 32
PLANTS = [("k", 17, np.nan), ("k", 299, -np.inf), ("v", 0, np.inf), ("v", 150, np.nan),
          ("k", 260, np.inf), ("v", 290, -np.inf)]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("kind", ["none", "window(3,200)", "key-padding", "masked-tile"])
@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: f"{p[0]}[{p[1]}]={p[2]}")
def test_nonfinite_k_or_v_raises_without_a_separate_scan(plant, kind, dtype):
    """The decode path checks K and V as it reads them (flash_attention skips prepare's scan of
    k and v for it): a NaN or inf anywhere in k or v still raises the forward's ValueError,
    naming the array, whether the kernel read that key row (its scores or partial output turn
    non-finite), the band kept it from reading it (window: rows 204.. are never visited) or a
    dense mask hides it from every head."""
    name, row, value = plant
    x = make_qkv(1, 8, 2, 1, 300, D, D, dtype=dtype)
    x[name][0, 1, row, 5] = value
    opts = {"block_k": 32}
    if kind == "window(3,200)":
        opts["window"] = (3, 200)
    elif kind == "key-padding":
        m = np.zeros((1, 1, 1, 300), dtype=bool)
        m[..., 100:] = True
        opts["mask"] = m
    elif kind == "masked-tile":
        m = np.zeros((1, 1, 1, 300), dtype=bool)
        m[..., row // 32 * 32:row // 32 * 32 + 32] = True       # the planted row's whole tile
        opts["mask"] = m
    p = prepare(**x, block_k=32, lazy_kv=True)
    assert api.uses_decode(p) and p.lazy_kv and p.k_sq_norm is None
    with pytest.raises(ValueError, match=f"{name} contains NaN or inf"):
        flashlab.flash_attention(**x, **opts)


def test_decode_skips_the_kv_scan_and_the_tiled_forward_does_it():
    """The lazy K/V scan is the problem's kind, fixed when it is made: the API forward's
    prepare leaves k and v of a short query (``Problem.lazy_kv``) to the kernel and scans
    every longer one, and the default prepare scans all; the frozen Problem is never changed:
    scan_kv returns a scanned copy (with k's norm for the overflow bound); a tiled forward
    (block_q < Sq) and the backward scan a lazy problem before they run (a NaN in v is
    found), decode inside its kernel."""
    x = make_qkv(1, 4, 2, 1, 300, D, D)
    assert not prepare(**x).lazy_kv and prepare(**x).k_sq_norm is not None
    p = prepare(**x, lazy_kv=True)
    assert p.lazy_kv and p.k_sq_norm is None
    api.flash_attention(problem=p, stats=True)
    assert p.k_sq_norm is None                                # decode: checked in the kernel
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.k_sq_norm = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.lazy_kv = False                                     # the kind never changes
    scanned = scan_kv(p)
    assert scanned.k_sq_norm == pytest.approx(
        float((x["k"].astype(np.float64) ** 2).sum(-1).max()), rel=1e-12)
    y = make_qkv(1, 4, 2, 40, 300, D, D)                      # Sq = 40 > DECODE_MAX_SQ: scanned
    p = prepare(**y, lazy_kv=True)
    assert not p.lazy_kv and p.k_sq_norm is not None
    y["v"][0, 0, 3, 3] = np.nan
    with pytest.raises(ValueError, match="v contains NaN or inf"):
        prepare(**y, lazy_kv=True)
    z = make_qkv(1, 4, 2, 4, 300, D, D)                       # lazy, but run tiled or backward
    z["v"][0, 0, 3, 3] = np.nan
    with pytest.raises(ValueError, match="v contains NaN or inf"):
        flashlab.flash_attention(**z, block_q=2)
    do = np.ones((1, 4, 4, D), dtype=z["q"].dtype)
    with pytest.raises(ValueError, match="v contains NaN or inf"):
        flashlab.flash_attention_backward(do, **z, o=do, lse=np.zeros((1, 4, 4), np.float32))


def test_deterministic_across_thread_counts(tmp_path):
    """A subprocess with NUMBA_NUM_THREADS=4 runs the decode forward at 1, 3 and 4 threads:
    the sha256 of (o, lse) must be identical and equal to this process's result (16 chunks
    for MQA, so 3 and 4 threads split the chunks differently)."""
    problems = {}
    for name, (H, Hkv, Sq, opts) in {
        "mqa-16-chunks": (4, 1, 1, {}),
        "gqa-dropout-padding": (8, 2, 3, dict(dropout_p=0.2, seed=5,
                                              mask=random_mask((1, 1, 1, 5000), full_rows=0))),
    }.items():
        problems[name] = dict(inputs=make_qkv(1, H, Hkv, Sq, 5000, D, D, seed=9), opts=opts)
    expected = {name: sha256_of(flashlab.flash_attention(**p["inputs"], **p["opts"]))
                for name, p in problems.items()}
    hashes = hashes_at_1_3_4_threads(problems, 'flashlab.flash_attention(**p["inputs"], **p["opts"])',
                                     tmp_path)
    for name, h in hashes.items():
        assert set(h.values()) == {expected[name]}, f"{name}: {h} vs {expected[name]}"


# ---------------------------------------------------------------------------------------------
# issue 22.7: a row with one allowed key gets P = 1 exactly in the backward of the decode path
# ---------------------------------------------------------------------------------------------

def _one_key_grads(B, H, Hkv, Sq, Sk, D, dtype, **opts):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((B, H, Sq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Sk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Sk, D)).astype(dtype)
    do = rng.standard_normal((B, H, Sq, D)).astype(dtype)
    o, lse = flashlab.flash_attention(q, k, v, **opts)
    grads = flashlab.flash_attention_backward(do, q, k, v, o, lse, **opts)
    return q, k, v, do, o, lse, grads


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decode_lse_is_the_backwards_scores(dtype):
    """Sq=1, Sk=239, causal (top-left: the row sees key 0 only; torch SDPA's case in the issue):
    the forward ran the decode kernel; the backward's P on the one allowed key is exactly 1:
    dV[key 0] = sum over the group's heads of dO and O = V[key 0], bit for bit. Before, the LSE
    came from the decode's stacked-rows BLAS gemm and the backward's score from a 1 x 1 one:
    P = 1 - 2.4e-7 and a dV error of 1.7e-6 in float32."""
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 1, 239, 64
    q, k, v, do, o, lse, (dq, dk, dv) = _one_key_grads(B, H, Hkv, Sq, Sk, D, dtype, causal=True)
    p = prepare(q, k, v, causal=True)
    assert api.uses_decode(p)
    # O = P V = V[key 0] exactly (P = 1 / 1)
    assert np.array_equal(o, np.repeat(v[:, :, :1], H // Hkv, axis=1))
    # LSE = the score of key 0 (l = e^0 = 1, log 1 = 0)
    # dV[key 0] = sum_{heads g of the group} P dO = sum_g dO_g, exactly; no other key gets any
    want = do.reshape(B, Hkv, H // Hkv, D).sum(axis=2, dtype=dtype)
    assert np.array_equal(dv[:, :, 0], want)
    assert not dv[:, :, 1:].any()
    # the softmax of one key does not depend on the scores: dQ = 0 and dK = 0 exactly
    assert not dq.any() and not dk.any()


@pytest.mark.parametrize("kind", ["window", "mask", "bias"])
def test_decode_rows_with_one_allowed_key_get_p_one(kind):
    """Rows with one allowed key among many (band, dense mask, -inf bias), Sq=5 with GQA,
    several kv chunks: the backward's recomputed P on that key is 1, so dV of a key seen
    only by one-key rows is exactly the sum of their dO."""
    B, H, Hkv, Sq, Sk, D, at = 1, 4, 1, 5, 4096, 32, 2500
    rng = np.random.default_rng(3)
    opts = {}
    if kind == "window":
        # row i sees key i + at only
        opts["window"] = (-at, at)
    allowed = np.zeros((Sq, Sk), dtype=bool)
    allowed[np.arange(Sq), at + np.arange(Sq)] = True
    if kind == "mask":
        opts["mask"] = ~allowed            # True = masked
    if kind == "bias":
        bias = np.where(allowed, rng.standard_normal((Sq, Sk)), -np.inf)
        opts["bias"] = bias.astype(np.float32)[None, None]
    q, k, v, do, o, lse, (dq, dk, dv) = _one_key_grads(B, H, Hkv, Sq, Sk, D, np.float32,
                                                        **opts)
    assert kv_splits(B, Hkv, -(-Sk // api.FORWARD_BLOCK[1])) > 1
    # O = V[its key]; dV[at + i] = sum over heads of dO[:, :, i]
    assert np.array_equal(o[0], np.broadcast_to(v[0, 0, at:at + Sq], (H, Sq, D)))
    assert np.array_equal(dv[0, 0, at:at + Sq], do[0].sum(axis=0, dtype=np.float32))
    assert not dq.any() and not dk.any()
