"""The GPU chapter's checkers: a right answer passes, each planted slip is named."""
from __future__ import annotations

import pytest

from flashlab.exercises.gpu import _HINTS, READ_CASES, check_forward_read_bytes, check_shared_memory_bytes
from flashlab.traffic import tiled_attention_traffic


def right(sq, sk, dqk, dv, bq, bk, causal):
    return tiled_attention_traffic(sq, sk, dqk, dv, block_q=bq, block_k=bk, causal=causal).read


def ceil(a, b):
    return -(-a // b)


def keys(sq, sk, bq, bk, causal, whole=True):
    out = []
    for i in range(ceil(sq, bq)):
        i1 = min(sq, (i + 1) * bq)
        if not causal:
            out.append(sk)
        else:
            out.append(min(sk, bk * ceil(min(sk, i1), bk)) if whole else min(sk, i1))
    return sum(out)


SLIPS = {
    "kv_read_once": lambda sq, sk, dqk, dv, bq, bk, c: 4 * (sq * dqk + sk * (dqk + dv)),
    "no_causal_skip": lambda sq, sk, dqk, dv, bq, bk, c: 4 * (sq * dqk + ceil(sq, bq) * sk * (dqk + dv)),
    "allowed_keys_only": lambda sq, sk, dqk, dv, bq, bk, c: 4 * (sq * dqk + keys(sq, sk, bq, bk, c, False) * (dqk + dv)),
    "q_not_counted": lambda sq, sk, dqk, dv, bq, bk, c: 4 * keys(sq, sk, bq, bk, c) * (dqk + dv),
    "elements_not_bytes": lambda sq, sk, dqk, dv, bq, bk, c: sq * dqk + keys(sq, sk, bq, bk, c) * (dqk + dv),
    "writes_included": lambda *a: right(*a) + 4 * (a[0] * a[3] + a[0]),
}


def test_right_prediction_passes():
    fb = check_forward_read_bytes(right)
    assert fb.passed, str(fb)


@pytest.mark.parametrize("slip", list(SLIPS))
def test_each_slip_is_named(slip):
    fb = check_forward_read_bytes(SLIPS[slip])
    assert not fb.passed and fb.mistake == slip, str(fb)
    assert _HINTS[slip] in fb.message


def test_raising_and_non_int():
    def stub(*a):
        raise NotImplementedError("write it")
    assert check_forward_read_bytes(stub).mistake == "raised"
    assert "expected an int" in check_forward_read_bytes(lambda *a: "many").message


def test_cases_tell_every_slip_apart():
    # on some case every slip differs from the truth (else a slip could pass)
    for name, f in SLIPS.items():
        assert any(f(*c) != right(*c) for c in READ_CASES), name


def test_shared_memory_checker():
    assert check_shared_memory_bytes(lambda bq, bk, dqk, dv: 4 * (bq * dqk + bk * dqk + bk * dv))
    fb = check_shared_memory_bytes(lambda bq, bk, dqk, dv: 4 * (bq * dqk + bk * dqk + bk * dv + bq * bk))
    assert not fb and "score tile" in fb.message
    fb = check_shared_memory_bytes(lambda bq, bk, dqk, dv: 4 * (bq * dqk + bk * dqk))
    assert not fb and "forgot V_j" in fb.message
    fb = check_shared_memory_bytes(lambda *a: 1)
    assert not fb and fb.mistake is None
    fb = check_shared_memory_bytes(lambda bq, bk, dqk, dv: 4 * (bq * dqk + bk * dqk + bk * dv + bq * dv))
    assert fb.mistake == "accumulator_shared"
