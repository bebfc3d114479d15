"""The small-shape path (issue 22, point 3): serial kernel builds, the backward that reuses the
forward's validated problem, and the torch door's eager path.

* :func:`flashlab.api.kernels_for` runs problems of at most ``SMALL_WORK`` multiply-adds on
  the serial builds (:func:`~flashlab.numba_cache.serial_twin`): checked against the float64 reference
  over odd shapes (1, 7, 129 ...), causal / window / GQA / dropout / rope, forward and
  backward, and bit for bit against the parallel builds of the same functions.
  Tolerances: float32 ``o`` and ``lse`` within ``1e-5 * max(1, max|ref|)`` of the float64
  reference, gradients within ``2e-5 * max(1, max|ref|)``; float64 within ``1e-10``.
* ``flash_attn_func(return_state=True)`` / ``flash_attn_func_backward(state=...)`` give
  the bits of :func:`~flashlab.compat.flash_attn_func` / ``flash_attn_func_backward``.
* The torch door's eager path (:class:`flashlab.torch_attention._EagerAttention`) gives the
  bits of the registered op with its autograd formula.

Speed is not asserted here (it is the benchmark's: ``python -m flashlab.bench.overhead``).
"""
from __future__ import annotations

import numbers

import numpy as np
import pytest
from conftest import make_qkv

import flashlab
from flashlab import api, compat
from flashlab.kernels import backward as kb
from flashlab.kernels import decode as kd
from flashlab.kernels import forward as kf
from flashlab.numba_cache import serial_twin
from flashlab.validation import prepare, prepare_like

#: (B, H, Hkv, Sq, Sk, Dqk, Dv): odd lengths, GQA/MQA, Dv != Dqk, decode-sized and tiled queries
SHAPES = [
    (1, 1, 1, 1, 1, 8, 8),
    (1, 1, 1, 16, 16, 8, 8),       # the overhead row's (1, 16, 1, 8)
    (1, 2, 1, 7, 129, 16, 8),      # MQA, decode-sized query (Sq <= 16)
    (2, 4, 2, 129, 7, 8, 16),      # GQA, Sq > Sk
    (1, 3, 3, 33, 129, 4, 4),
    (1, 4, 2, 129, 129, 8, 8),     # tiled forward, GQA partial sums
]
#: the mask/option kinds, each with every shape
OPTIONS = {
    "none": {},
    "causal": {"causal": True},
    "window": {"window": (3, 1)},
    "window-empty-rows": {"window": (None, -3)},
    "dropout": {"causal": True, "dropout_p": 0.25, "seed": 7},
}


def _id(shape):
    return "x".join(map(str, shape))


def _work(shape) -> int:
    B, H, _, Sq, Sk, Dqk, Dv = shape
    return B * H * Sq * Sk * (Dqk + Dv)


def test_every_shape_here_takes_the_serial_path():
    for shape in SHAPES:
        assert _work(shape) <= api.SMALL_WORK, shape
        B, H, Hkv, Sq, Sk, Dqk, Dv = shape
        assert api.kernels_for(prepare(**make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv))) is api.SERIAL


def test_kernels_for_picks_parallel_above_the_threshold():
    # 1 * 1 * 256 * 256 * 128 = 2^23 multiply-adds > SMALL_WORK = 2^22
    p = prepare(**make_qkv(1, 1, 1, 256, 256, 64, 64))
    assert api.kernels_for(p) is api.PARALLEL
    p = prepare(**make_qkv(1, 1, 1, 128, 256, 64, 64))       # 2^22: still serial
    assert api.kernels_for(p) is api.SERIAL


def test_serial_twins_are_serial_and_cached_apart():
    """Each twin is its kernel's function, compiled without parallel, under its own name (Numba's
    cache keys entries by name and bytecode, not by the parallel flag)."""
    pairs = [(kf.flash_forward_kernel, kf.flash_forward_serial),
             (kd.flash_decode_kernel, kd.flash_decode_serial),
             (kd.merge_splits, kd.merge_splits_serial),
             (kb.flash_backward_kernel, kb.flash_backward_serial),
             (kb.sum_partials, kb.sum_partials_serial)]
    for kernel, twin in pairs:
        assert kernel.targetoptions.get("parallel") is True
        assert not twin.targetoptions.get("parallel")
        assert twin.py_func.__code__ is kernel.py_func.__code__
        assert twin.py_func.__qualname__ == kernel.py_func.__qualname__ + "_serial"
    assert serial_twin(kf.flash_forward_kernel).py_func.__name__ == "flash_forward_kernel_serial"


@pytest.mark.parametrize("kind", list(OPTIONS))
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_small_path_against_reference(shape, kind):
    """Forward and backward of the small path against the float64 reference."""
    B, H, Hkv, Sq, Sk, Dqk, Dv = shape
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=sum(shape))
    opts = OPTIONS[kind]
    o, lse = flashlab.flash_attention(**x, **opts)
    ro, rlse = flashlab.attention_reference(**x, **opts)
    floor = 1e-5
    assert np.abs(o - ro).max() <= floor * max(1.0, np.abs(ro).max())
    finite = np.isfinite(rlse)
    assert np.array_equal(np.isfinite(lse), finite)            # empty rows: -inf in both
    lse_err = np.abs(lse[finite] - rlse[finite]).max(initial=0.0)
    assert lse_err <= floor * max(1.0, np.abs(rlse[finite]).max(initial=0.0))
    do = np.random.default_rng(1).standard_normal(o.shape).astype(np.float32)
    grads = flashlab.flash_attention_backward(do, **x, o=o, lse=lse, **opts)
    refs = flashlab.attention_reference_backward(do, **x, **opts)
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        assert g.dtype == np.float32 and g.shape == r.shape
        assert np.abs(g - r).max() <= 2e-5 * max(1.0, np.abs(r).max()), name


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3]], ids=_id)
def test_small_path_float64_and_rope(shape):
    B, H, Hkv, Sq, Sk, Dqk, Dv = shape
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, dtype=np.float64, seed=3, Dr=4, Hr=1)
    o, lse = flashlab.flash_attention(**x, causal=True)
    ro, rlse = flashlab.attention_reference(**x, causal=True)
    np.testing.assert_allclose(o, ro, atol=1e-10)
    np.testing.assert_allclose(lse, rlse, atol=1e-10)
    do = np.random.default_rng(2).standard_normal(o.shape)
    grads = flashlab.flash_attention_backward(do, **x, o=o, lse=lse, causal=True)
    refs = flashlab.attention_reference_backward(do, **x, causal=True)
    assert len(grads) == len(refs) == 5
    for g, r in zip(grads, refs):
        np.testing.assert_allclose(g, r, atol=1e-10)


def _both_builds(monkeypatch, run):
    """``run()`` with every kernel parallel, then with every kernel serial."""
    out = []
    for kernels in (api.PARALLEL, api.SERIAL):
        monkeypatch.setattr(api, "kernels_for", lambda p, kernels=kernels: kernels)
        out.append(run())
    return out


@pytest.mark.parametrize("kind", list(OPTIONS))
@pytest.mark.parametrize("shape", SHAPES + [(1, 8, 2, 300, 70, 8, 8)], ids=_id)
def test_serial_and_parallel_builds_give_the_same_bits(monkeypatch, shape, kind):
    """One thread running the work items in order is one of the thread counts every kernel is
    deterministic over: the serial build gives the parallel build's bits (forward, decode,
    merge, backward, partial sums; the last shape has several q-blocks and chunks)."""
    B, H, Hkv, Sq, Sk, Dqk, Dv = shape
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=5)
    opts = OPTIONS[kind]
    block = {"block_q": 64, "block_k": 32}
    p = prepare(**x, **opts, **block)
    do = np.random.default_rng(1).standard_normal((B, H, Sq, Dv)).astype(np.float32)

    def run():
        o, lse, row_max, tiles = api.flash_attention(problem=p, stats=True)
        grads, btiles = api.flash_attention_backward(do, o=o, lse=lse, problem=p, tiles=True,
                                                     block_q=p.block_q, block_k=p.block_k)
        return (o, lse, row_max, tiles, btiles) + tuple(grads)

    par, ser = _both_builds(monkeypatch, run)
    for a, b in zip(par, ser):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("kind", ["none", "causal", "dropout"])
def test_backward_from_a_state_matches_the_public_backward(kind):
    """flash_attn_func(return_state=True) + flash_attn_func_backward(state=) (no second
    check of q, k, v) give the bits of flash_attn_func + flash_attn_func_backward, and refuse
    a non-finite dout the same way."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 9, 4, 8), dtype=np.float32)
    k, v = (rng.standard_normal((2, 13, 2, 8), dtype=np.float32) for _ in range(2))
    opts = {"none": {}, "causal": {"causal": True},
            "dropout": {"causal": True, "dropout_p": 0.3, "seed": 11}}[kind]
    out, lse, state = compat.flash_attn_func(q, k, v, **opts, return_state=True)
    out2, lse2 = compat.flash_attn_func(q, k, v, **opts, return_lse=True)
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)
    dout = rng.standard_normal(out.shape, dtype=np.float32)
    grads = compat.flash_attn_func_backward(dout, softmax_lse=lse, state=state)
    grads2 = compat.flash_attn_func_backward(dout, q, k, v, out, lse, **opts)
    for g, g2 in zip(grads, grads2):
        assert g.shape == g2.shape and np.array_equal(g, g2)
    bad = dout.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="do contains NaN or inf"):
        compat.flash_attn_func_backward(bad, softmax_lse=lse, state=state)


def test_torch_eager_path_gives_the_op_path_bits():
    """The eager autograd.Function and the registered op (with its autograd formula) compute
    the same out and gradients, bit for bit, dropout included (the same seed drawn)."""
    torch = pytest.importorskip("torch", reason="the torch door")
    from flashlab import torch_attention as ta

    g = torch.Generator().manual_seed(0)
    for shape, causal, p_drop in [((1, 16, 1, 8), True, 0.0), ((2, 7, 4, 8), False, 0.2),
                                  ((1, 129, 2, 16), True, 0.0)]:
        q, k, v = (torch.randn(*shape, generator=g, requires_grad=True) for _ in range(3))
        results = []
        args = (q, k, v, p_drop, None, causal, -1, 0 if causal else -1, 0.0, None, False)
        for attention in (lambda *a: ta._EagerAttention.apply(*a, False),
                          lambda *a: ta._EagerAttention.apply(*a, True)[0],
                          lambda *a: ta._forward_op(*a)[0]):
            torch.manual_seed(3)
            out = attention(*args)
            dq, dk, dv = torch.autograd.grad((out * out).sum(), (q, k, v))
            results.append((out.detach(), dq, dk, dv))
        for other in results[1:]:
            for a, b in zip(results[0], other):
                assert torch.equal(a, b)


# ----------------------------------------------------------------- compat's cache of checked calls
def _outcome(fn):
    """``("ok", results)`` or ``(exception type, message)`` of ``fn()``."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the outcome itself is compared
        return type(e), str(e)


def test_cached_checks_give_the_same_bits_and_still_scan_the_values(monkeypatch):
    """A repeated call (same shapes, dtypes, options) skips the shape/option checks and gives the
    bits of the first call; the values are still scanned (NaN in q, k or v) and the seed's
    range still checked, with the messages of a first call."""
    monkeypatch.setattr(compat, "_PLANS", {})
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 9, 4, 8), dtype=np.float32)
    k, v = (rng.standard_normal((2, 13, 2, 8), dtype=np.float32) for _ in range(2))
    opts = dict(causal=True, dropout_p=0.1)
    first = compat.flash_attn_func(q, k, v, **opts, seed=3, return_lse=True)
    assert len(compat._PLANS) == 1
    again = compat.flash_attn_func(q, k, v, **opts, seed=3, return_lse=True)
    other_seed = compat.flash_attn_func(q, k, v, **opts, seed=4, return_lse=True)
    assert len(compat._PLANS) == 1
    for a, b in zip(first, again):
        assert np.array_equal(a, b)
    monkeypatch.setattr(compat, "_PLANS", {})
    fresh = compat.flash_attn_func(q, k, v, **opts, seed=4, return_lse=True)
    for a, b in zip(other_seed, fresh):
        assert np.array_equal(a, b)
    for name in ("q", "k", "v"):
        bad = {"q": q, "k": k, "v": v}
        bad[name] = bad[name].copy()
        bad[name][1, 2, 1, 3] = np.inf
        cached = _outcome(lambda bad=bad: compat.flash_attn_func(**bad, **opts))
        monkeypatch.setattr(compat, "_PLANS", {})
        uncached = _outcome(lambda bad=bad: compat.flash_attn_func(**bad, **opts))
        assert cached[0] is ValueError and cached == uncached, name
        compat.flash_attn_func(q, k, v, **opts)          # the key cached again
    cached = _outcome(lambda: compat.flash_attn_func(q, k, v, **opts, seed=-1))
    monkeypatch.setattr(compat, "_PLANS", {})
    assert cached[0] is ValueError and cached == _outcome(
        lambda: compat.flash_attn_func(q, k, v, **opts, seed=-1))


@pytest.mark.parametrize("first, then", [
    (dict(causal=True), dict(causal=1)),
    (dict(dropout_p=0.0), dict(dropout_p=0)),
    (dict(window_size=(-1, -1)), dict(window_size=(-1.0, -1))),
    (dict(window_size=(2, 0)), dict(window_size=[2, 0])),
    (dict(softmax_scale=0.5), dict(softmax_scale=np.float32(0.5))),
])
def test_an_argument_of_another_type_is_checked_as_on_a_first_call(monkeypatch, first, then):
    """The cache keys every scalar with its type: ``then`` after ``first`` behaves exactly as
    ``then`` alone (accepted with the same bits, or refused with the same error)."""
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 5, 2, 4), dtype=np.float32) for _ in range(3))
    monkeypatch.setattr(compat, "_PLANS", {})
    compat.flash_attn_func(q, k, v, **first)
    after_first = _outcome(lambda: compat.flash_attn_func(q, k, v, **then))
    monkeypatch.setattr(compat, "_PLANS", {})
    alone = _outcome(lambda: compat.flash_attn_func(q, k, v, **then))
    assert after_first[0] == alone[0]
    if alone[0] == "ok":
        assert np.array_equal(after_first[1], alone[1])
    else:
        assert after_first[1] == alone[1]


def test_the_cache_is_bounded_and_skips_alibi(monkeypatch):
    monkeypatch.setattr(compat, "_PLANS", {})
    rng = np.random.default_rng(9)
    for s in range(1, compat._PLANS_MAX + 3):
        q = rng.standard_normal((1, s, 1, 4), dtype=np.float32)
        compat.flash_attn_func(q, q, q)
        assert 1 <= len(compat._PLANS) <= compat._PLANS_MAX
    monkeypatch.setattr(compat, "_PLANS", {})
    q = rng.standard_normal((1, 5, 2, 4), dtype=np.float32)
    compat.flash_attn_func(q, q, q, alibi_slopes=np.array([0.5, 0.25]))
    assert compat._PLANS == {}


# ----------------------------------------------------------------- what a training step no longer repeats
def test_scalar_options_remembers_only_accepted_options(monkeypatch):
    """``remember=True`` (the torch door in eager mode) returns an accepted set of options
    without checking it again; a refused set is refused every time (never remembered), and
    a value of another type is checked as on a first call (``causal=1.5`` after ``True``)."""
    monkeypatch.setattr(compat, "_SCALARS", {})
    args = (0.0, None, True, (-1, 0), 0.0, False)
    first = compat.scalar_options(*args, remember=True)
    assert first == (0.0, None, True, (-1, 0), 0.0) and len(compat._SCALARS) == 1
    assert compat.scalar_options(*args, remember=True) is first
    assert compat.scalar_options(*args) == first and len(compat._SCALARS) == 1
    for bad, error in [((0.0, None, 1.5, (-1, 0), 0.0, False), TypeError),
                       (("0.1", None, True, (-1, 0), 0.0, False), TypeError),
                       ((0.0, None, True, (-1, 0, 1), 0.0, False), ValueError),
                       ((0.0, None, True, (-1, 0), -0.5, False), ValueError)]:
        for _ in range(2):
            with pytest.raises(error):
                compat.scalar_options(*bad, remember=True)
    assert len(compat._SCALARS) == 1
    for _ in range(compat._PLANS_MAX + 2):          # bounded as compat's plans
        compat.scalar_options(np.random.rand() * 0.5, None, True, (-1, 0), 0.0, False,
                              remember=True)
    assert 1 <= len(compat._SCALARS) <= compat._PLANS_MAX


class _Knob(numbers.Real):
    """A ``numbers.Real`` whose value changes between calls and that hashes by identity (as
    any object without ``__hash__``/``__eq__`` of its own): a cache keyed by the object would
    hand back the first call's value."""

    def __init__(self, value: float):
        self.value = value

    def __float__(self):
        return float(self.value)

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    # the rest of numbers.Real's abstract methods, none of which the doors call
    def _no(self, *_):
        raise AssertionError("not used by flashlab")

    (__abs__, __add__, __ceil__, __floor__, __floordiv__, __le__, __lt__, __mod__, __mul__,
     __neg__, __pos__, __pow__, __radd__, __rfloordiv__, __rmod__, __rmul__, __rpow__,
     __rtruediv__, __round__, __truediv__, __trunc__) = (_no,) * 21


def test_cached_scalar_options_are_keyed_by_value_not_identity(monkeypatch):
    """A ``numbers.Real`` softmax_scale changed between two calls gives the second call the new
    value: through :func:`flashlab.compat.scalar_options` (``remember=True``, the torch door's
    cache) and through compat's cache of checked calls (same shapes, same object)."""
    monkeypatch.setattr(compat, "_SCALARS", {})
    monkeypatch.setattr(compat, "_PLANS", {})
    knob = _Knob(0.5)
    args = (0.0, knob, True, (-1, 0), 0.0, False)
    assert compat.scalar_options(*args, remember=True)[1] == 0.5
    knob.value = 0.25
    assert compat.scalar_options(*args, remember=True)[1] == 0.25
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 6, 2, 4), dtype=np.float32) for _ in range(3))
    knob.value = 0.5
    compat.flash_attn_func(q, k, v, softmax_scale=knob, causal=True)
    knob.value = 0.25
    got = compat.flash_attn_func(q, k, v, softmax_scale=knob, causal=True)
    want = compat.flash_attn_func(q, k, v, softmax_scale=0.25, causal=True)
    np.testing.assert_array_equal(got, want)


def test_problem_shape_and_threshold_follow_every_copy():
    """``Problem.shape`` and ``drop_threshold`` are worked out once per problem, and again for
    every copy that changes what they depend on (new operands, a new ``dropout_p``)."""
    import dataclasses

    from flashlab.dropout import keep_threshold
    x = make_qkv(1, 2, 1, 7, 129, 16, 8)
    p = prepare(**x, dropout_p=0.25, seed=1)
    assert p.shape == (1, 2, 1, 7, 129, 16, 8) and p.drop_threshold == keep_threshold(0.25)
    assert dataclasses.replace(p, dropout_p=0.5).drop_threshold == keep_threshold(0.5)
    y = make_qkv(1, 2, 1, 7, 33, 16, 4)
    copy = prepare_like(p, y["q"], y["k"], y["v"])
    assert copy.shape == (1, 2, 1, 7, 33, 16, 4) and p.shape == (1, 2, 1, 7, 129, 16, 8)
    assert p.with_blocks(4, 8).shape == p.shape
    assert api.scan_kv(p).shape == p.shape


def test_backward_from_a_state_uses_its_own_lse_unless_given_one():
    """Without ``softmax_lse`` the backward reads the forward's own LSE (the torch door's,
    which its caller never saw): the same bits as passing it; a given LSE is still checked."""
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((2, 9, 2, 8), dtype=np.float32) for _ in range(3))
    out, lse, state = compat.flash_attn_func(q, k, v, causal=True, return_state=True)
    dout = rng.standard_normal(out.shape, dtype=np.float32)
    for a, b in zip(compat.flash_attn_func_backward(dout, state=state),
                    compat.flash_attn_func_backward(dout, softmax_lse=lse, state=state)):
        assert np.array_equal(a, b)
    bad = lse.copy()
    bad[1, 0, 3] = np.nan
    with pytest.raises(ValueError, match=r"lse contains NaN or \+inf"):
        compat.flash_attn_func_backward(dout, softmax_lse=bad, state=state)


def test_a_backward_after_a_decode_forward_tests_every_tile():
    """A decode forward checks K as it reads it and leaves no norm of K: a kernel run on that
    problem tests every recomputed tile for overflow, while a scanned problem (the default
    prepare, or scan_kv's copy, which the backward makes of a lazy problem) keeps the bound."""
    x = make_qkv(1, 2, 1, 4, 300, 8, 8)
    p = prepare(**x, lazy_kv=True)
    p_after = api._forward(p, None)[4]
    assert api.uses_decode(p) and p_after.k_sq_norm is None
    assert api._check_every_tile(p_after, np.float32)
    # small values: bounded
    assert not api._check_every_tile(prepare(**x), np.float32)
    assert not api._check_every_tile(api.scan_kv(p_after), np.float32)


def test_kernels_carry_no_formatted_error_messages(monkeypatch):
    """Assigning an array to a slice (``a[i:j] = b``, ``a[i:j] *= c``) makes Numba compile a
    shape-mismatch error whose message is built with its string functions: a third of a
    kernel's LLVM module, which every new process parses again when it loads the kernel from
    the cache (issue 22, the first call). The kernels write such copies as loops
    (:func:`flashlab.kernels.tile.store_scaled`); their modules hold none of that code."""
    rng = np.random.default_rng(13)
    for work_limit in (api.SMALL_WORK, -1):              # the serial builds, then the parallel
        monkeypatch.setattr(api, "SMALL_WORK", work_limit)
        for sq in (4, 40):                                # decode, then the tiled forward
            # GQA (two query heads share k, v): the backward sums their partials
            q = rng.standard_normal((1, 2, sq, 8)).astype(np.float32)
            k, v = (rng.standard_normal((1, 1, sq, 8)).astype(np.float32) for _ in range(2))
            o, lse = flashlab.flash_attention(q, k, v, causal=True, dropout_p=0.1, seed=1)
            flashlab.flash_attention_backward(np.ones_like(o), q, k, v, o, lse, causal=True,
                                              dropout_p=0.1, seed=1)
    for kernel in (*api.SERIAL, *api.PARALLEL):
        assert kernel.overloads, kernel
        for cres in kernel.overloads.values():
            # the module kept for linking (what a cache load parses); Numba's attribute
            names = [f.name for f in cres.library._shared_module.functions]
            assert not [n for n in names if "unicode" in n or "shape_context" in n], kernel


def test_the_torch_door_runs_numbas_one_time_setup_at_import():
    """``import flashlab.torch_attention`` runs :func:`flashlab.numba_cache.numba_setup` (Numba's
    typing and lowering tables, which import ``numba.np.arraymath``), as it imports
    torch._dynamo, so that the first training step does not; ``import flashlab`` does not."""
    pytest.importorskip("torch", reason="the torch door")
    import subprocess
    import sys
    probe = "import sys, {}; print('numba.np.arraymath' in sys.modules)"
    for module, expected in (("torch, flashlab.torch_attention", "True"),
                             ("flashlab, flashlab.api", "False")):
        out = subprocess.run([sys.executable, "-c", probe.format(module)], capture_output=True,
                             text=True, check=True).stdout.split()
        assert out[-1] == expected, module
