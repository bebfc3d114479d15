"""One set of checks: the same bad input through the four entry points gives the same error.

Each case below spoils one argument of a good problem and feeds it to the kernel API
(:func:`flashlab.flash_attention`, (B, H, S, D)), :mod:`flashlab.compat` (flash_attn's
(B, S, H, D)), the CANN operator (:func:`flashlab.cann.flash_attention_score`, layout BNSD)
and the torch door (:mod:`flashlab.torch_attention`, when torch is installed). Every door
must raise the same exception type, with a message that names the argument and has the
same stem: the text up to its first ";" with each door's argument names mapped to the
kernel API's (CANN's ``query`` is ``q``, flash_attn's ``softmax_scale`` is ``scale``), one
stem a prefix of the other (CANN's ``scale`` may not be None, so it says "a real number"
where the others say "a real number or None").
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import flashlab
from flashlab import cann, compat

B, H, S, D = 1, 2, 5, 4
NAMES = {"query": "q", "key": "k", "value": "v", "softmax_scale": "scale"}


def good() -> dict:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in ("q", "k", "v")}


def _kernel(x, scale=None, causal=False, dropout_p=0.0):
    return flashlab.flash_attention(x["q"], x["k"], x["v"], scale=scale, causal=causal,
                                    dropout_p=dropout_p)


def _compat(x, scale=None, causal=False, dropout_p=0.0):
    q, k, v = (np.ascontiguousarray(x[n].transpose(0, 2, 1, 3)) if x[n].ndim == 4 else x[n]
               for n in ("q", "k", "v"))
    return compat.flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=scale, causal=causal)


def _cann(x, scale=None, causal=False, dropout_p=0.0):
    return cann.flash_attention_score(x["q"], x["k"], x["v"], H, "BNSD",
                                      scale=1.0 if scale is None else scale)


def _torch(x, scale=None, causal=False, dropout_p=0.0):
    torch = pytest.importorskip("torch", reason="the torch door needs torch")
    from flashlab.torch_attention import flash_attn_func
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x[n].transpose(0, 2, 1, 3)))
               for n in ("q", "k", "v"))
    return flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=scale, causal=causal)


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


CASES = {}
for _n in ("q", "k", "v"):
    for _dt in (np.int32, np.int64, np.bool_, np.complex64):
        CASES[f"{_n}-{np.dtype(_dt).name}"] = (
            lambda n=_n, dt=_dt: (spoil(n, lambda a: a.astype(dt)), {}), TypeError)
    for _bad in (np.nan, np.inf, -np.inf):
        CASES[f"{_n}-has-{_bad}"] = (lambda n=_n, b=_bad: (spoil(n, _with(b)), {}), ValueError)
for _n in ("k", "v"):
    CASES[f"{_n}-float64-with-q-float32"] = (
        lambda n=_n: (spoil(n, lambda a: a.astype(np.float64)), {}), TypeError)
for _label, _scale, _exc in (("nan", float("nan"), ValueError), ("inf", float("inf"), ValueError),
                             ("-inf", float("-inf"), ValueError), ("str", "0.5", TypeError),
                             ("bool", True, TypeError), ("complex", 1j, TypeError),
                             ("overflows-float32", 1e39, ValueError)):
    CASES[f"scale-{_label}"] = (lambda s=_scale: (good(), {"scale": s}), _exc)
#: options the CANN operator names otherwise (keep_prob) or has not (causal)
NOT_CANN = set()
for _label, _causal in (("str", "yes"), ("int", 1), ("none", None)):
    CASES[f"causal-{_label}"] = (lambda c=_causal: (good(), {"causal": c}), TypeError)
    NOT_CANN.add(f"causal-{_label}")
for _label, _p, _exc in (("one", 1.0, ValueError), ("negative", -0.1, ValueError),
                         ("str", "0.1", TypeError), ("nan", float("nan"), ValueError)):
    CASES[f"dropout_p-{_label}"] = (lambda p=_p: (good(), {"dropout_p": p}), _exc)
    NOT_CANN.add(f"dropout_p-{_label}")


def stem(message: str) -> str:
    """The message up to its first ';' (or ' ('), with every door's names mapped to the kernel API's."""
    for door_name, name in NAMES.items():
        message = re.sub(rf"\b{door_name}\b", name, message)
    message = message.replace("the q's", "q's")
    return re.split(r";| \(", message, maxsplit=1)[0]


def test_at_least_30_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_error_through_every_door(case):
    make, exc = CASES[case]
    stems = {}
    for door, call in DOORS.items():
        if door == "cann" and case in NOT_CANN:
            continue
        x, opts = make()
        with pytest.raises(exc) as info:
            call(x, **opts)
        stems[door] = stem(str(info.value))
    argument = case.split("-")[0]
    shortest = min(stems.values(), key=len)
    for door, s in stems.items():
        assert s.startswith(shortest), f"{case}: {door} says {s!r}, another door {shortest!r}"
        assert re.match(rf"{argument}\b", s), f"{case}: {door}'s message {s!r} does not name {argument}"


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
