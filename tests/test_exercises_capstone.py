"""The capstone checker: a right NumPy tile loop passes, each classic mistake is named."""
from __future__ import annotations

import numpy as np
import pytest

from flashlab.exercises import Feedback, check_flash_tile_loop
from flashlab.exercises._capstone import TILE_LOOP_MISTAKES, tile_loop


def assert_caught(feedback: Feedback, mistake: str, phrase: str) -> None:
    assert not feedback.passed, f"a planted mistake passed: {feedback}"
    assert feedback.mistake == mistake, f"expected {mistake!r}, got {feedback.mistake!r}: {feedback.message}"
    assert phrase in feedback.message, f"{phrase!r} not in {feedback.message!r}"


def test_right_tile_loop_passes():
    fb = check_flash_tile_loop(tile_loop)
    assert fb.passed, fb.message


def test_float32_tile_loop_passes_float16_does_not():
    def in_dtype(dtype):
        def fn(q, k, v, do, bq, bk, causal):
            return tile_loop(*(x.astype(dtype) for x in (q, k, v, do)), bq, bk, causal)
        return fn
    assert check_flash_tile_loop(in_dtype(np.float32)).passed
    assert_caught(check_flash_tile_loop(in_dtype(np.float16)), "low_precision", "float16")


PHRASES = {"no_rescale": "must be rescaled", "delta_from_p": "rowsum(dO_i * O_i)",
           "causal_skip_off_by_one": "off by one", "lse_not_stored": "exp(S - LSE)"}


@pytest.mark.parametrize("mistake", TILE_LOOP_MISTAKES)
def test_each_mistake_is_named(mistake):
    def fn(*a):
        with np.errstate(all="ignore"):
            return tile_loop(*a, mistake=mistake)
    assert_caught(check_flash_tile_loop(fn), mistake, PHRASES[mistake])


def test_every_mistake_changes_the_answer_of_some_case():
    """The checker's inputs tell the mistakes apart: each variant differs from the right loop."""
    rng = np.random.default_rng(0)
    q, k, v, do = rng.standard_normal((10, 5)), rng.standard_normal((10, 5)), rng.standard_normal((10, 3)), \
        rng.standard_normal((10, 3))
    k[:, 0] += np.linspace(0, 3, 10)
    right = tile_loop(q, k, v, do, 4, 3, True)
    for mistake in TILE_LOOP_MISTAKES:
        with np.errstate(all="ignore"):
            wrong = tile_loop(q, k, v, do, 4, 3, True, mistake=mistake)
        assert any(not np.allclose(a, b) for a, b in zip(right, wrong)), mistake


def test_generic_failures():
    assert_caught(check_flash_tile_loop(lambda *a: 3), "not_a_tuple", "(o, lse, dq, dk, dv)")

    def boom(*a):
        raise NotImplementedError("your code here")
    assert_caught(check_flash_tile_loop(boom), "raised", "NotImplementedError")
    assert_caught(check_flash_tile_loop(lambda *a: tuple(1.1 * x for x in tile_loop(*a))), "wrong_value",
                  "largest error")
    with pytest.raises(ValueError, match="mistake"):
        tile_loop(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2)), 1, 1, False, "typo")
