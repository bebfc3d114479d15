"""One set of checks: the same bad input through the four entry points gives the same error.

Each case below spoils one argument of a good problem and feeds it to the kernel API
(:func:`flashlab.flash_attention`, (B, H, S, D)), :mod:`flashlab.compat` (flash_attn's
(B, S, H, D)), the CANN operator (:func:`flashlab.cann.flash_attention_score`, layout BNSD)
and the torch door (:mod:`flashlab.torch_attention`, when torch is installed). Every door
must raise the same exception type, with a message that starts with the argument **as that
door spells it** (CANN's ``query``, flash_attn's ``softmax_scale``, CANN's ``keep_prob`` for a
dropout probability) and has the same stem as the others: the text up to its first ";" or
" (", with each door's names mapped back to the kernel API's, one stem a prefix of the other
(CANN's ``scale`` may not be None, so it says "a real number" where the others say "a real
number or None").
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import flashlab
from flashlab import cann, compat

B, H, S, D = 1, 2, 5, 4

#: each door's names for the kernel API's arguments (the rest are spelled alike)
DOOR_NAMES = {
    "kernel": {},
    "compat": {"scale": "softmax_scale", "window": "window_size"},
    "cann": {"q": "query", "k": "key", "v": "value", "dropout_p": "keep_prob"},
    "torch": {"scale": "softmax_scale", "window": "window_size"},
}


def good() -> dict:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in ("q", "k", "v")}


def _bshd(x):
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)) if isinstance(x, np.ndarray) and x.ndim == 4 else x


def _kernel(x, scale=None, causal=False, dropout_p=0.0, window=None, alibi_slopes=None, seed=0):
    return flashlab.flash_attention(x["q"], x["k"], x["v"], scale=scale, causal=causal, window=window,
                                    dropout_p=dropout_p, alibi_slopes=alibi_slopes, seed=seed)


def _compat(x, scale=None, causal=False, dropout_p=0.0, window=(-1, -1), alibi_slopes=None, seed=0):
    q, k, v = (_bshd(x[n]) for n in ("q", "k", "v"))
    return compat.flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=scale, causal=causal,
                                  window_size=window, alibi_slopes=alibi_slopes, seed=seed)


def _cann(x, scale=None, causal=False, dropout_p=0.0, window=None, alibi_slopes=None, seed=0):
    # keep_prob = 1 - dropout_p where that is a number, else the bad value as given
    keep = 1.0 - dropout_p if isinstance(dropout_p, float) else dropout_p
    return cann.flash_attention_score(x["q"], x["k"], x["v"], H, "BNSD", keep_prob=keep, seed=seed,
                                      scale=1.0 if scale is None else scale)


def _torch(x, scale=None, causal=False, dropout_p=0.0, window=(-1, -1), alibi_slopes=None, seed=0):
    torch = pytest.importorskip("torch", reason="the torch door needs torch")
    from flashlab.torch_attention import flash_attn_func
    q, k, v = (torch.from_numpy(_bshd(x[n])) if isinstance(x[n], np.ndarray) else x[n]
               for n in ("q", "k", "v"))
    slopes = None if alibi_slopes is None else torch.from_numpy(alibi_slopes)
    return flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=scale, causal=causal,
                           window_size=window, alibi_slopes=slopes)


DOORS = {"kernel": _kernel, "compat": _compat, "cann": _cann, "torch": _torch}


def spoil(name: str, how) -> dict:
    x = good()
    x[name] = how(x[name])
    return x


def _with(value):
    def set_first(a):
        a = a.copy()
        a[0, 0, 0, 0] = value
        return a
    return set_first


def _resize(axis: int, size: int):
    def resize(a):
        shape = list(a.shape)
        shape[axis] = size
        return np.random.default_rng(1).standard_normal(shape).astype(a.dtype)
    return resize


#: case -> (make: () -> (operands, options), exception type, doors it does not apply to)
CASES: dict = {}


def case(name, make, exc, skip=()):
    CASES[name] = (make, exc, frozenset(skip))


for _n in ("q", "k", "v"):
    for _dt in (np.int32, np.int64, np.bool_, np.complex64):
        case(f"{_n}-{np.dtype(_dt).name}", lambda n=_n, dt=_dt: (spoil(n, lambda a: a.astype(dt)), {}),
             TypeError)
    for _bad in (np.nan, np.inf, -np.inf):
        case(f"{_n}-has-{_bad}", lambda n=_n, b=_bad: (spoil(n, _with(b)), {}), ValueError)
    # the torch door's own words for a non-tensor ("q must be a torch.Tensor"): not this stem
    case(f"{_n}-nested-list", lambda n=_n: (spoil(n, lambda a: a.tolist()), {}), TypeError, {"torch"})
    case(f"{_n}-rank3", lambda n=_n: (spoil(n, lambda a: a[0]), {}), ValueError)
for _n in ("k", "v"):
    for _dt in (np.float64, np.float16):
        case(f"{_n}-{np.dtype(_dt).name}-with-q-float32",
             lambda n=_n, dt=_dt: (spoil(n, lambda a: a.astype(dt)), {}), TypeError)
# shapes that do not fit together (axes of the kernel's (B, H, S, D))
case("q-empty-seq", lambda: (spoil("q", _resize(2, 0)), {}), ValueError)
case("k-batch", lambda: (spoil("k", _resize(0, B + 1)), {}), ValueError)
case("k-headdim", lambda: (spoil("k", _resize(3, D + 1)), {}), ValueError)
case("k-heads-not-dividing", lambda: ({**good(), "k": _resize(1, 3)(good()["k"]),
                                        "v": _resize(1, 3)(good()["v"])}, {}), ValueError)
case("v-seqlen", lambda: (spoil("v", _resize(2, S + 1)), {}), ValueError)
case("v-heads", lambda: (spoil("v", _resize(1, 1)), {}), ValueError)
for _label, _scale, _exc in (("nan", float("nan"), ValueError), ("inf", float("inf"), ValueError),
                             ("-inf", float("-inf"), ValueError), ("str", "0.5", TypeError),
                             ("bool", True, TypeError), ("complex", 1j, TypeError),
                             ("overflows-float32", 1e39, ValueError)):
    case(f"scale-{_label}", lambda s=_scale: (good(), {"scale": s}), _exc)
# the CANN operator has no causal flag (sparse_mode), no window pair (pre/next tokens, the
# vendor's ranges) and takes ALiBi slopes as a float32 pse (its own contract); torch has no seed
for _label, _causal in (("str", "yes"), ("int", 1), ("none", None)):
    case(f"causal-{_label}", lambda c=_causal: (good(), {"causal": c}), TypeError, {"cann"})
for _label, _p, _exc in (("one", 1.0, ValueError), ("negative", -0.1, ValueError),
                         ("str", "0.1", TypeError), ("nan", float("nan"), ValueError)):
    case(f"dropout_p-{_label}", lambda p=_p: (good(), {"dropout_p": p}), _exc)
for _label, _w, _exc in (("int", 4, TypeError), ("str", "ab", TypeError), ("triple", (1, 2, 3), ValueError),
                         ("single", [1], ValueError)):
    case(f"window-{_label}", lambda w=_w: (good(), {"window": w}), _exc, {"cann"})
for _label, _s, _exc in (("shape", np.ones(H + 1, np.float32), ValueError),
                         ("int", np.ones(H, np.int32), TypeError),
                         ("nan", np.full(H, np.nan, np.float32), ValueError)):
    case(f"alibi_slopes-{_label}", lambda s=_s: (good(), {"alibi_slopes": s}), _exc, {"cann"})
for _label, _seed, _exc in (("negative", -1, ValueError), ("float", 1.5, TypeError),
                            ("too-big", 2**64, ValueError)):
    case(f"seed-{_label}", lambda s=_seed: (good(), {"seed": s, "dropout_p": 0.1}), _exc, {"torch"})


def stem(message: str, door: str) -> str:
    """The message up to its first ';' (or ' ('), with the door's names mapped to the kernel API's."""
    for name, door_name in DOOR_NAMES[door].items():
        message = re.sub(rf"\b{door_name}\b", name, message)
    return re.split(r";| \(", message, maxsplit=1)[0]


def test_at_least_30_cases_through_all_four_doors():
    assert sum(1 for _, _, skip in CASES.values() if not skip) >= 30
    assert len(CASES) >= 60


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_error_through_every_door(name):
    make, exc, skip = CASES[name]
    argument = name.split("-")[0]
    stems = {}
    for door, call in DOORS.items():
        if door in skip:
            continue
        x, opts = make()
        with pytest.raises(exc) as info:
            call(x, **opts)
        message = str(info.value)
        spelled = DOOR_NAMES[door].get(argument, argument)
        assert re.match(rf"{spelled}\b", message), f"{name}: {door}'s message {message!r} does not start with {spelled}"
        stems[door] = stem(message, door)
    shortest = min(stems.values(), key=len)
    for door, s in stems.items():
        assert s.startswith(shortest), f"{name}: {door} says {s!r}, another door {shortest!r}"


def test_float16_alibi_slopes_same_answer_in_every_door_that_takes_slopes():
    """float16 slopes are accepted by the kernel API, compat and torch alike (computed as the
    float32 slopes they round to); the CANN operator's pse_type 2/3 takes float32 slopes only,
    its documented contract, and says so."""
    x = good()
    s16 = np.array([0.5, 0.25], dtype=np.float16)
    want = flashlab.flash_attention(**x, alibi_slopes=s16.astype(np.float32))[0]
    np.testing.assert_allclose(_kernel(x, alibi_slopes=s16)[0], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_compat(x, alibi_slopes=s16).transpose(0, 2, 1, 3), want, rtol=1e-6, atol=1e-6)
    torch = pytest.importorskip("torch", reason="the torch door needs torch")
    got = _torch(x, alibi_slopes=s16)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy().transpose(0, 2, 1, 3), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="must be float32"):
        cann.flash_attention_score(x["q"], x["k"], x["v"], H, "BNSD", pse=s16, pse_type=2)


def test_window_not_a_pair_is_the_same_exception_in_every_door_that_takes_one():
    """The pair rule is one (validation.check_pair); a side's domain is each window's own (the
    kernel's top-left ``window``: an int or None; flash_attn's bottom-right ``window_size``: an
    int >= -1), but a float side is a TypeError in both."""
    for door in ("kernel", "compat", "torch"):
        for bad, exc in ((4, TypeError), ((1, 2, 3), ValueError), ([1], ValueError),
                         ((1.5, 2), TypeError)):
            with pytest.raises(exc):
                DOORS[door](good(), window=bad)


@pytest.mark.parametrize("bad,exc,match", [
    (lambda do: do.tolist(), TypeError, "do must be a numpy.ndarray"),
    (lambda do: do[..., :-1], ValueError, r"do must have shape \(B, H, Sq, Dv\)"),
    (lambda do: np.full_like(do, np.nan), ValueError, "do contains NaN or inf"),
    (lambda do: do.astype(np.int64), TypeError, "do must"),
], ids=["nested-list", "shape", "nan", "int"])
def test_reference_backward_refuses_what_the_kernel_backward_refuses(bad, exc, match):
    x = good()
    o, lse = flashlab.flash_attention(**x)
    do = bad(np.ones_like(o))
    with pytest.raises(exc, match=match):
        flashlab.flash_attention_backward(do, **x, o=o, lse=lse)
    with pytest.raises(exc, match=match):
        flashlab.attention_reference_backward(do, **x)


def test_backward_gradient_operands_named_as_each_door_spells_them():
    """NaN in the incoming gradient: ``do`` (kernel API), ``dout`` (flash_attn), ``dy`` (CANN),
    one rule (validation.check_output_like via the kernel API's backward), one message stem."""
    x = good()
    o, lse = flashlab.flash_attention(**x)
    bad = np.full_like(o, np.nan)
    with pytest.raises(ValueError, match=r"^do contains NaN or inf"):
        flashlab.flash_attention_backward(bad, **x, o=o, lse=lse)
    q, k, v = (_bshd(x[n]) for n in ("q", "k", "v"))
    out, slse = compat.flash_attn_func(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"^dout contains NaN or inf"):
        compat.flash_attn_func_backward(np.full_like(out, np.nan), q, k, v, out, slse)
    with pytest.raises(ValueError, match=r"^softmax_lse contains NaN"):
        compat.flash_attn_func_backward(out, q, k, v, out, np.full_like(slse, np.nan))
    ao, smax, ssum = cann.flash_attention_score(x["q"], x["k"], x["v"], H, "BNSD")
    with pytest.raises(ValueError, match=r"^dy contains NaN or inf"):
        cann.flash_attention_score_grad(x["q"], x["k"], x["v"], np.full_like(ao, np.nan), H, "BNSD",
                                        softmax_max=smax, softmax_sum=ssum, attention_in=ao)
