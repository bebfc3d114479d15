"""The CANN door checks a call once: one whole-call validation, one finiteness scan per operand.

``flash_attention_score`` runs one kernel call per planned piece (a TND sequence, a batch of
a prefix mode); each piece is cut from the problem that
:func:`flashlab.validation.prepare_parts` checked for the whole call, never checked again.
Counted here by wrapping validation's entry and its finiteness scan: a per-call re-check
(``prepare`` of each piece) makes these counts the number of pieces.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flashlab import cann, validation
from flashlab.cann import operator
from flashlab.cann.sparse_modes import prefix_mask

#: (T, N, D) TND operands of three sequences (lengths 3, 5, 4; keys 4, 5, 6): three kernel calls
Q_ENDS, K_ENDS = [3, 8, 12], [4, 9, 15]
N, D = 2, 8


@pytest.fixture
def counts(monkeypatch) -> dict[str, int]:
    """Calls of validation's whole-call entry (``entry``), of the kernel API (``kernel``) and
    scans of each operand by name."""
    seen: dict[str, int] = {}
    entry, finite, kernel = operator.prepare_parts, validation._finite, operator.api.flash_attention

    def counted(key: str, f):
        def call(*args, **kwargs):
            seen[key] = seen.get(key, 0) + 1
            return f(*args, **kwargs)
        return call

    def counting_finite(door=None, **arrays):
        for name in arrays:
            seen[name] = seen.get(name, 0) + 1
        return finite(door, **arrays)

    monkeypatch.setattr(operator.api, "flash_attention", counted("kernel", kernel))
    monkeypatch.setattr(operator, "prepare_parts", counted("entry", entry))
    monkeypatch.setattr(validation, "_finite", counting_finite)
    return seen


def _tnd(rng: np.random.Generator, dropout: bool) -> tuple[tuple, dict]:
    q = rng.standard_normal((Q_ENDS[-1], N, D))
    k = rng.standard_normal((K_ENDS[-1], N, D))
    v = rng.standard_normal((K_ENDS[-1], N, D))
    kw = dict(actual_seq_qlen=Q_ENDS, actual_seq_kvlen=K_ENDS, scale=D ** -0.5, block_q=4,
              block_k=4)
    if dropout:
        kw.update(keep_prob=0.75, seed=3, offset=11)
    return (q, k, v, N, "TND"), kw


@pytest.mark.parametrize("dropout", [False, True])
def test_forward_checks_the_whole_call_once(counts, dropout):
    args, kw = _tnd(np.random.default_rng(0), dropout)
    out, _, _ = cann.flash_attention_score(*args, **kw)
    assert np.isfinite(out).all()
    assert counts == {"entry": 1, "kernel": 3, "q": 1, "k": 1, "v": 1}


def test_forward_rope_operands_are_scanned_once(counts):
    rng = np.random.default_rng(1)
    B, S, DR = 3, 6, 8
    q, k, v = (rng.standard_normal((B, N, S, D)) for _ in range(3))
    qr, kr = rng.standard_normal((B, N, S, DR)), rng.standard_normal((B, 1, S, DR))
    # sparse_mode 5 (prefix) plans one kernel call per batch; its atten_mask is the prefix rule's
    prefix = [2, 3, 4]
    mask = np.stack([prefix_mask(S, S, p)[None] for p in prefix])
    cann.flash_attention_score(q, k, v, N, "BNSD", atten_mask=mask, sparse_mode=5, prefix=prefix,
                               query_rope=qr, key_rope=kr, scale=(D + DR) ** -0.5)
    assert counts == {"entry": 1, "kernel": B, "q": 1, "k": 1, "v": 1, "q_rope": 1, "k_rope": 1}


def test_parts_match_a_problem_prepared_per_part():
    """A part cut from the whole is the problem :func:`~flashlab.validation.prepare` makes of
    the same rows and options (its own band, mask, tiles, dropout offset)."""
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 2, 6, 4)), rng.standard_normal((2, 1, 7, 4)), rng.standard_normal((2, 1, 7, 3))
    mask = rng.random((1, 1, 6, 7)) < 0.2
    part = validation.Part((slice(1, 2),), (slice(1, 2),), window=(2, None), mask=mask, offset=5)
    (cut,) = validation.prepare_parts(q, k, v, parts=[part], scale=0.5, dropout_p=0.1, seed=9,
                                      block_q=4, block_k=16)
    want = validation.prepare(q[1:2], k[1:2], v[1:2], scale=0.5, window=(2, None), mask=mask,
                              dropout_p=0.1, seed=9, offset=5, block_q=4, block_k=16)
    for f in dataclasses.fields(validation.Problem):
        a, b = getattr(cut, f.name), getattr(want, f.name)
        if f.name.endswith("_sq_norm") and a is not None:
            assert a >= b            # the whole's: a bound of the part's
        elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            assert np.array_equal(a, b) and a.flags.c_contiguous, f.name
        else:
            assert a == b, f.name
    assert validation.prepare_parts(q, k, v, parts=[], scale=0.5) == []


def test_a_part_checks_what_is_new():
    rng = np.random.default_rng(3)
    q = k = v = rng.standard_normal((1, 1, 4, 4))
    bad = validation.Part((slice(None),), (slice(None),), mask=np.zeros((1, 1, 4, 5), dtype=bool))
    with pytest.raises(ValueError, match=r"mask must be broadcastable to \(B, H, Sq, Sk\) = \(1, 1, 4, 4\)"):
        validation.prepare_parts(q, k, v, parts=[bad])
    with pytest.raises(TypeError, match="parts must be a list of flashlab.validation.Part"):
        validation.prepare_parts(q, k, v, parts=[(slice(None), slice(None))])
    with pytest.raises(TypeError, match="window left must be an int or None"):
        validation.prepare_parts(q, k, v, parts=[validation.Part((slice(None),), (slice(None),), window=(1.5, 0))])


def test_grad_checks_the_whole_call_once(counts):
    args, kw = _tnd(np.random.default_rng(4), dropout=True)
    out, smax, ssum = cann.flash_attention_score(*args, **kw)
    dy = np.random.default_rng(5).standard_normal(out.shape)
    counts.clear()
    q, k, v, n, layout = args
    grads = cann.flash_attention_score_grad(q, k, v, dy, n, layout, softmax_max=smax, softmax_sum=ssum,
                                            attention_in=out, **kw)
    assert all(np.isfinite(g).all() for g in grads)
    assert {name: counts.get(name) for name in ("entry", "q", "k", "v")} == dict(entry=1, q=1, k=1, v=1)
