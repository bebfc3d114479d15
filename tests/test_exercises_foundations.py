"""The Foundations chapters' exercise checkers: a right answer passes, each planted mistake is named.

Every wrong function below is a mistake a reader could make; the checker must fail it with
the expected ``Feedback.mistake`` and a message containing the key phrase of its hint. The
generic failures (raising, the wrong shape, NaN, returning None) are checked once per checker.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashlab import exercises
from flashlab.exercises import (
    Feedback,
    check_arithmetic_intensity,
    check_attention,
    check_backward_delta,
    check_band_mask,
    check_online_softmax,
    check_softmax,
    check_softmax_grad,
    check_tile_class,
)
from flashlab.masks import PARTIAL, tile_class


def assert_caught(feedback: Feedback, mistake: str, phrase: str) -> None:
    assert isinstance(feedback, Feedback)
    assert not feedback.passed, f"a planted mistake passed: {feedback}"
    assert feedback.mistake == mistake, f"expected {mistake!r}, got {feedback.mistake!r}: {feedback.message}"
    assert phrase in feedback.message, f"{phrase!r} not in {feedback.message!r}"


def raises(*args):
    raise NotImplementedError("your code here")


def test_exported():
    for name in ("check_arithmetic_intensity", "check_softmax", "check_attention",
                 "check_online_softmax", "check_backward_delta", "check_softmax_grad",
                 "check_band_mask", "check_tile_class"):
        assert callable(getattr(exercises, name))


def test_not_callable_is_a_type_error():
    with pytest.raises(TypeError, match="callable"):
        check_softmax(np.zeros(3))


# ------------------------------------------------------------------------- memory hierarchy
def intensity(m, n, k, e):
    return 2 * m * n * k / (e * (m * k + k * n + m * n))


INTENSITY_MISTAKES = {
    "no_factor_2": (lambda m, n, k, e: m * n * k / (e * (m * k + k * n + m * n)), "2 FLOPs"),
    "c_not_counted": (lambda m, n, k, e: 2 * m * n * k / (e * (m * k + k * n)), "not of C"),
    "c_counted_twice": (lambda m, n, k, e: 2 * m * n * k / (e * (m * k + k * n + 2 * m * n)), "C twice"),
    "elements_not_bytes": (lambda m, n, k, e: 2 * m * n * k / (m * k + k * n + m * n), "bytes_per_element"),
    "integer_division": (lambda m, n, k, e: 2 * m * n * k // (e * (m * k + k * n + m * n)), "true division"),
    "inverted": (lambda m, n, k, e: e * (m * k + k * n + m * n) / (2 * m * n * k), "bytes per FLOP"),
}


def test_arithmetic_intensity_right():
    fb = check_arithmetic_intensity(intensity)
    assert fb.passed and fb.mistake is None and "Correct" in str(fb)
    # a numpy scalar or a 0-d array is a number too
    assert check_arithmetic_intensity(lambda *a: np.float32(intensity(*a)))


@pytest.mark.parametrize("name", INTENSITY_MISTAKES)
def test_arithmetic_intensity_mistakes(name):
    fn, phrase = INTENSITY_MISTAKES[name]
    assert_caught(check_arithmetic_intensity(fn), name, phrase)


def test_arithmetic_intensity_generic():
    assert_caught(check_arithmetic_intensity(raises), "raised", "NotImplementedError")
    assert_caught(check_arithmetic_intensity(lambda *a: (1.0, 2.0)), "shape", "shape (2,)")
    assert_caught(check_arithmetic_intensity(lambda *a: float("nan")), "non_finite", "non-finite")
    assert_caught(check_arithmetic_intensity(lambda *a: None), "returned_none", "returned None")
    fb = check_arithmetic_intensity(lambda m, n, k, e: intensity(m, n, k, e) + (m == 1))
    assert_caught(fb, "wrong_value", "(m, n, k, bytes) = (1, 4096, 4096, 2)")


# ----------------------------------------------------------------------- standard attention
def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


SOFTMAX_MISTAKES = {
    "no_max_subtraction": (lambda s: np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True), "overflows"),
    "global_max": (lambda s: np.exp(s - s.max()) / np.exp(s - s.max()).sum(axis=-1, keepdims=True),
                   "whole matrix"),
    "wrong_axis": (lambda s: softmax(s.T).T, "each column"),
    "not_normalised": (lambda s: np.exp(s - s.max(axis=-1, keepdims=True)), "row sum"),
    "normalised_globally": (lambda s: np.exp(s - s.max(axis=-1, keepdims=True))
                            / np.exp(s - s.max(axis=-1, keepdims=True)).sum(), "whole matrix"),
}


def test_softmax_right():
    assert check_softmax(softmax).passed
    # the input must not be modified for the checker's own answer: an in-place solution passes
    def in_place(s):
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return s
    assert check_softmax(in_place).passed


@pytest.mark.parametrize("name", SOFTMAX_MISTAKES)
def test_softmax_mistakes(name):
    fn, phrase = SOFTMAX_MISTAKES[name]
    with np.errstate(all="ignore"):
        assert_caught(check_softmax(fn), name, phrase)


def test_softmax_generic():
    assert_caught(check_softmax(raises), "raised", "NotImplementedError")
    fb = check_softmax(lambda s: np.exp(s - s.max(axis=-1)))      # no keepdims: broadcast error
    assert_caught(fb, "raised", "keepdims=True")
    assert_caught(check_softmax(lambda s: softmax(s)[:, :-1]), "shape", "expected (4, 6)")
    assert_caught(check_softmax(lambda s: softmax(s) * np.nan), "non_finite", "non-finite")
    assert_caught(check_softmax(lambda s: "p"), "not_an_array", "array of numbers")


def attention(q, k, v):
    return softmax(q @ k.T / np.sqrt(q.shape[1])) @ v


ATTENTION_MISTAKES = {
    "no_scale": (lambda q, k, v: softmax(q @ k.T) @ v, "sqrt(d)"),
    "scale_by_d": (lambda q, k, v: softmax(q @ k.T / q.shape[1]) @ v, "divided the scores by d"),
    "wrong_axis": (lambda q, k, v: softmax((q @ k.T / np.sqrt(q.shape[1])).T).T @ v, "over the queries"),
    "no_max_subtraction": (lambda q, k, v: SOFTMAX_MISTAKES["no_max_subtraction"][0](
        q @ k.T / np.sqrt(q.shape[1])) @ v, "overflowed"),
    "returned_p": (lambda q, k, v: softmax(q @ k.T / np.sqrt(q.shape[1])), "O = P V"),
    "scale_after_softmax": (lambda q, k, v: softmax(q @ k.T) @ v / np.sqrt(q.shape[1]), "after the softmax"),
}


def test_attention_right():
    assert check_attention(attention).passed


@pytest.mark.parametrize("name", ATTENTION_MISTAKES)
def test_attention_mistakes(name):
    fn, phrase = ATTENTION_MISTAKES[name]
    with np.errstate(all="ignore"):
        assert_caught(check_attention(fn), name, phrase)


def test_attention_generic():
    # K not transposed: q @ k fails for Sk != d, and the message says how to fix it
    assert_caught(check_attention(lambda q, k, v: softmax(q @ k) @ v), "raised", "q @ k.T")
    assert_caught(check_attention(raises), "raised", "NotImplementedError")
    assert_caught(check_attention(lambda q, k, v: attention(q, k, v)[:3]), "shape", "expected (5, 3)")
    assert_caught(check_attention(lambda q, k, v: attention(q, k, v) / 0.0), "non_finite", "non-finite")
    assert_caught(check_attention(lambda q, k, v: attention(q, k, v) + 0.1), "wrong_value", "largest error")


# --------------------------------------------------------------------- tiling: online softmax
def online_step(m, l, acc, s, v, *, rescale_l=True, rescale_acc=True, block_max=False,
                inverted=False, keep_m=False, normalise=False, old_max=False, guard=True):
    """The right step by default; each keyword plants one mistake (guard=False: no special
    case for a row whose keys are all masked, which then gives NaN)."""
    m_new = s.max(axis=1) if block_max else np.maximum(m, s.max(axis=1))
    m_safe = np.where(np.isneginf(m_new), 0.0, m_new) if guard else m_new
    p = np.exp(s - (m if old_max else m_safe)[:, None])
    alpha = np.exp(m_safe - m) if inverted else np.exp(m - m_safe)
    l_new = (alpha * l if rescale_l else l) + p.sum(axis=1)
    acc_new = (alpha[:, None] * acc if rescale_acc else acc) + p @ v
    if normalise:
        acc_new = acc_new / l_new[:, None]
    return (m if keep_m else m_new), l_new, acc_new


ONLINE_MISTAKES = {
    "l_not_rescaled": (dict(rescale_l=False), "l must be rescaled"),
    "acc_not_rescaled": (dict(rescale_acc=False), "rescale the old accumulator"),
    "no_rescale": (dict(rescale_l=False, rescale_acc=False), "neither l nor acc"),
    "block_max_only": (dict(block_max=True), "running max"),
    "alpha_inverted": (dict(inverted=True), "inverted"),
    "m_not_updated": (dict(keep_m=True), "still the old m"),
    "acc_divided_by_l": (dict(normalise=True), "unnormalised"),
    "p_old_max": (dict(old_max=True), "against the old max"),
    "nan_fully_masked_row": (dict(guard=False), "no allowed key yet"),
}


def test_online_softmax_right():
    assert check_online_softmax(online_step).passed
    assert check_online_softmax(lambda *a: list(online_step(*a))).passed   # a list is fine


@pytest.mark.parametrize("name", ONLINE_MISTAKES)
def test_online_softmax_mistakes(name):
    options, phrase = ONLINE_MISTAKES[name]
    with np.errstate(all="ignore"):
        fb = check_online_softmax(lambda *a: online_step(*a, **options))
    assert_caught(fb, name, phrase)


# (an inverted alpha, exp(m_new - m), is inf wherever m = -inf: NaN in rows 0 and 4 with or
# without the guard, so that slip alone explains the NaN)
@pytest.mark.parametrize("name", [n for n in ONLINE_MISTAKES
                                  if n not in ("nan_fully_masked_row", "alpha_inverted")])
def test_online_softmax_mistake_and_nan_row_both_named(name):
    """A slip made together with the NaN of the fully masked row: both are named."""
    options, phrase = ONLINE_MISTAKES[name]
    with np.errstate(all="ignore"):
        fb = check_online_softmax(lambda *a: online_step(*a, **options, guard=False))
    assert_caught(fb, name, phrase)
    assert "no allowed key yet" in fb.message


def test_online_softmax_nan_row_with_unknown_slip():
    """NaN only in the fully masked row, plus a slip the checker does not know: the NaN is named."""
    def step(*a):
        m, l, acc = online_step(*a, guard=False)
        return m, l, acc * 1.5
    with np.errstate(all="ignore"):
        fb = check_online_softmax(step)
    assert_caught(fb, "nan_fully_masked_row", "exp(-inf - (-inf))")


def test_online_softmax_generic():
    assert_caught(check_online_softmax(raises), "raised", "NotImplementedError")
    # updated in place and forgot to return
    assert_caught(check_online_softmax(lambda *a: None), "not_a_tuple", "returned a NoneType")
    assert_caught(check_online_softmax(lambda *a: online_step(*a)[:2]), "not_a_tuple", "of length 2")
    fb = check_online_softmax(lambda *a: (online_step(*a)[0], online_step(*a)[1], online_step(*a)[2][:, :2]))
    assert_caught(fb, "shape", "acc_new has shape (5, 2)")
    fb = check_online_softmax(lambda *a: (online_step(*a)[0], online_step(*a)[1] * np.nan, online_step(*a)[2]))
    assert_caught(fb, "non_finite", "l_new has a non-finite value")
    fb = check_online_softmax(lambda *a: (online_step(*a)[0], online_step(*a)[1] + 1, online_step(*a)[2]))
    assert_caught(fb, "wrong_value", "l_new is not the answer, nor one of the slips")


# --------------------------------------------------------------------------------- backward
def test_backward_delta_right():
    assert check_backward_delta(lambda do, o: (do * o).sum(axis=-1)).passed
    assert check_backward_delta(lambda do, o: np.einsum("ic,ic->i", do, o)).passed


BACKWARD_DELTA_MISTAKES = {
    "wrong_axis": (lambda do, o: (do * o).sum(axis=0), "one value per query row"),
    "kept_dims": (lambda do, o: (do * o).sum(axis=1, keepdims=True), "(rows, 1)"),
    "sum_all": (lambda do, o: (do * o).sum(), "summed over everything"),
    "product_of_sums": (lambda do, o: do.sum(axis=1) * o.sum(axis=1), "multiplied the row sums"),
    "matrix_product": (lambda do, o: do @ o.T, "diagonal"),
}


@pytest.mark.parametrize("name", BACKWARD_DELTA_MISTAKES)
def test_backward_delta_mistakes(name):
    fn, phrase = BACKWARD_DELTA_MISTAKES[name]
    assert_caught(check_backward_delta(fn), name, phrase)


def test_backward_delta_generic():
    assert_caught(check_backward_delta(raises), "raised", "NotImplementedError")
    assert_caught(check_backward_delta(lambda do, o: (do * o).sum(axis=-1)[:2]), "shape", "expected (4,)")
    assert_caught(check_backward_delta(lambda do, o: np.log(-(do * o).sum(axis=-1) ** 2)),
                  "non_finite", "non-finite")


def softmax_grad(p, dp):
    return p * (dp - (p * dp).sum(axis=-1, keepdims=True))


SOFTMAX_GRAD_MISTAKES = {
    "d_not_subtracted": (lambda p, dp: p * dp, "subtract"),
    "d_from_rowsum_dp": (lambda p, dp: p * (dp - dp.sum(axis=-1, keepdims=True)), "weighted by P"),
    "d_wrong_axis": (lambda p, dp: p * (dp - (p * dp).sum(axis=0, keepdims=True)), "axis 0"),
    "sign_flipped": (lambda p, dp: p * ((p * dp).sum(axis=-1, keepdims=True) - dp), "sign is flipped"),
    "missing_p": (lambda p, dp: dp - (p * dp).sum(axis=-1, keepdims=True), "factor P"),
    "d_from_rowsum_p": (lambda p, dp: p * (dp - p.sum(axis=-1, keepdims=True)), "rowsum(P), which is 1"),
}


def test_softmax_grad_right():
    assert check_softmax_grad(softmax_grad).passed
    # the Jacobian, row by row, is the same thing
    assert check_softmax_grad(lambda p, dp: np.stack(
        [(np.diag(pi) - np.outer(pi, pi)) @ dpi for pi, dpi in zip(p, dp)])).passed


@pytest.mark.parametrize("name", SOFTMAX_GRAD_MISTAKES)
def test_softmax_grad_mistakes(name):
    fn, phrase = SOFTMAX_GRAD_MISTAKES[name]
    assert_caught(check_softmax_grad(fn), name, phrase)


def test_softmax_grad_generic():
    fb = check_softmax_grad(lambda p, dp: p * (dp - (p * dp).sum(axis=-1)))   # D without keepdims
    assert_caught(fb, "raised", "keepdims=True")
    assert_caught(check_softmax_grad(raises), "raised", "NotImplementedError")
    assert_caught(check_softmax_grad(lambda p, dp: softmax_grad(p, dp).T), "shape", "expected (4, 6)")
    assert_caught(check_softmax_grad(lambda p, dp: softmax_grad(p, dp) / 0.0), "non_finite", "non-finite")


# ------------------------------------------------------------------------------------ masks
def band_mask(sq, sk, left, right):
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return ~((j >= i - left) & (j <= i + right))


def band_with(lo, hi, *, shift=0):
    """A band mask whose allowed keys are lo(i, L, R) <= j - shift <= hi(i, L, R)."""
    def fn(sq, sk, left, right):
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :] - (sk - sq if shift else 0)
        return ~((j >= lo(i, left, right)) & (j <= hi(i, left, right)))
    return fn


BAND_MISTAKES = {
    "inverted": (lambda sq, sk, left, right: ~band_mask(sq, sk, left, right), "allowed"),
    "right_edge_excluded": (band_with(lambda i, L, R: i - L, lambda i, L, R: i + R - 1), "diagonal"),
    "left_edge_excluded": (band_with(lambda i, L, R: i - L + 1, lambda i, L, R: i + R), "left edge"),
    "both_edges_excluded": (band_with(lambda i, L, R: i - L + 1, lambda i, L, R: i + R - 1), "both edges"),
    "right_edge_extra": (band_with(lambda i, L, R: i - L, lambda i, L, R: i + R + 1), "right edge"),
    "left_edge_extra": (band_with(lambda i, L, R: i - L - 1, lambda i, L, R: i + R), "left edge"),
    "sides_swapped": (band_with(lambda i, L, R: i - R, lambda i, L, R: i + L), "swapped"),
    "bottom_right": (band_with(lambda i, L, R: i - L, lambda i, L, R: i + R, shift=1), "bottom-right"),
    "transposed": (lambda sq, sk, left, right: band_mask(sq, sk, left, right).T, "transposed"),
}


def test_band_mask_right():
    assert check_band_mask(band_mask).passed
    # through the package's own model
    from flashlab.masks import allowed
    assert check_band_mask(lambda *a: ~allowed(*a)).passed


@pytest.mark.parametrize("name", BAND_MISTAKES)
def test_band_mask_mistakes(name):
    fn, phrase = BAND_MISTAKES[name]
    assert_caught(check_band_mask(fn), name, phrase)


def test_band_mask_generic():
    assert_caught(check_band_mask(lambda *a: band_mask(*a).astype(np.int8)), "not_bool", "bool array")
    assert_caught(check_band_mask(raises), "raised", "NotImplementedError")
    assert_caught(check_band_mask(lambda sq, sk, left, right: band_mask(sq, sk, left, right)[:-1]),
                  "shape", "expected (6, 6)")
    wrong = band_mask(6, 6, 6, 0)
    wrong[5, 0] = True
    fb = check_band_mask(lambda *a: wrong if a == (6, 6, 6, 0) else band_mask(*a))
    assert_caught(fb, "wrong_value", "entry (i=5, j=0) is masked in your mask but must be allowed")


def tile_with(mistake):
    """tile_class with one planted mistake: the checker's own variant (``None``: no mistake),
    so the planted function and the answer the checker predicts for it are one definition;
    ``test_tile_class_right`` checks the mistake-free variant against the Numba original."""
    from flashlab.exercises.foundations import tile_class_variant

    def fn(i0, i1, j0, j1, left, right):
        return tile_class_variant(i0, i1, j0, j1, left, right, mistake)
    return fn


TILE_MISTAKES = {
    "empty_exclusive_ends": "exclusive",
    "empty_wrong_corners": "most permissive row",
    "full_exclusive_ends": "exclusive",
    "full_wrong_corners": "strictest corners",
    "no_negative_band": "left + right < 0",
}


def test_tile_class_right():
    assert check_tile_class(tile_class).passed          # the package's own (Numba) function
    assert check_tile_class(tile_with(None)).passed     # the same rules in Python


@pytest.mark.parametrize("name", TILE_MISTAKES)
def test_tile_class_mistakes(name):
    assert_caught(check_tile_class(tile_with(name)), name, TILE_MISTAKES[name])


def test_tile_class_generic():
    assert_caught(check_tile_class(raises), "raised", "NotImplementedError")
    assert_caught(check_tile_class(lambda *a: "FULL"), "not_a_class", "returned 'FULL'")
    assert_caught(check_tile_class(lambda *a: None), "not_a_class", "returned None")

    def one_wrong(i0, i1, j0, j1, left, right):
        c = tile_class(i0, i1, j0, j1, left, right)
        # one FULL tile of the causal band reported as PARTIAL
        return PARTIAL if (i0, j0, right) == (16, 0, 0) and left > 1000 else c
    fb = check_tile_class(one_wrong)
    assert_caught(fb, "wrong_value", "rows [16, 24) x cols [0, 6) is PARTIAL in your answer but FULL")


def test_float32_answers_are_judged_within_float32_rounding():
    """A correct answer computed in float32 passes; a float32 slip is still named."""
    def attention32(q, k, v):
        return attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)).astype(np.float32)
    assert check_attention(attention32).passed
    fb = check_attention(lambda q, k, v: ATTENTION_MISTAKES["no_scale"][0](
        *(x.astype(np.float32) for x in (q, k, v))).astype(np.float32))
    assert_caught(fb, "no_scale", "sqrt(d)")
    # precision, not dtype: a correct float32 answer that numpy promoted to float64 passes
    assert check_attention(lambda q, k, v: attention(*(x.astype(np.float32) for x in (q, k, v)))
                           .astype(np.float64)).passed
    # an error of 1e-3 is float16's, not float32's: rejected whatever the dtype
    assert_caught(check_attention(lambda q, k, v: attention(q, k, v) * (1 + 1e-3)), "low_precision",
                  "only to float16 precision")
    # a clearly wrong float64 answer is still the generic failure
    assert_caught(check_attention(lambda q, k, v: attention(q, k, v) * 1.1), "wrong_value", "largest error")


def test_float16_answers_are_rejected_with_the_reason():
    """An answer computed in float16, or an online softmax whose running state is float16, was
    accepted when the tolerance followed the returned dtype: it is rejected, saying why."""
    def attention16(q, k, v):
        return attention(*(x.astype(np.float16) for x in (q, k, v)))
    fb = check_attention(attention16)
    assert_caught(fb, "low_precision", "only to float16 precision")

    def state16(m, l, acc, s, v):       # the running state kept in float16, returned as float64
        m, l, acc = (x.astype(np.float16) for x in (m, l, acc))
        return tuple(np.asarray(x, dtype=np.float64) for x in online_step(m, l, acc, s, v))
    with np.errstate(all="ignore"):
        assert_caught(check_online_softmax(state16), "low_precision", "float16 computation")
        assert_caught(check_online_softmax(lambda *a: tuple(x.astype(np.float16) for x in online_step(*a))),
                      "low_precision", "it is float16")


def _post_guarded(**options):
    """online_step computed as written, then the rows with no allowed key set to l = 0, acc = 0."""
    def fn(m, l, acc, s, v):
        m_new, l_new, acc_new = online_step(m, l, acc, s, v, guard=False, **options)
        dead = np.isneginf(np.maximum(m, s.max(axis=1)))
        return m_new, np.where(dead, 0.0, l_new), np.where(dead[:, None], 0.0, acc_new)
    return fn


@pytest.mark.parametrize("name", [n for n in ONLINE_MISTAKES if n != "nan_fully_masked_row"])
def test_online_softmax_slips_named_with_a_post_guard(name):
    """Each slip is named also when the answer guards the fully masked row after the fact."""
    options, phrase = ONLINE_MISTAKES[name]
    with np.errstate(all="ignore"):
        fb = check_online_softmax(_post_guarded(**options))
    assert_caught(fb, name, phrase)


def test_online_softmax_post_guard_right():
    with np.errstate(all="ignore"):
        assert check_online_softmax(_post_guarded()).passed


# ------------------------------------------------------------------------ flash_attn's window
def _window_band(shift_sign=1, literal=False, causal_drops_left=False, swap=False, top_left=False):
    """The exercise's answer with one planted slip (no argument: the right answer)."""
    def fn(sq, sk, causal, window_size):
        wl, wr = window_size[::-1] if swap else window_size
        if causal:
            wl, wr = (-1 if causal_drops_left else wl), 0
        shift = 0 if top_left else shift_sign * (sk - sq)
        left = None if wl == -1 and not literal else wl - shift
        right = None if wr == -1 and not literal else wr + shift
        return left, right
    return fn


def test_flash_attn_window_right():
    from flashlab.compat import band_from_window
    from flashlab.exercises import check_flash_attn_window
    assert check_flash_attn_window(band_from_window).passed
    assert check_flash_attn_window(_window_band()).passed


@pytest.mark.parametrize("name, fn, phrase", [
    ("no_shift", _window_band(top_left=True), "aligned top-left"),
    ("shift_sign", _window_band(shift_sign=-1), "wrong sign"),
    ("minus_one_literal", _window_band(literal=True), "-1 means unbounded"),
    ("causal_drops_left", _window_band(causal_drops_left=True), "a left window given with it"),
    ("sides_swapped", _window_band(swap=True), "sides are swapped"),
])
def test_flash_attn_window_mistakes(name, fn, phrase):
    from flashlab.exercises import check_flash_attn_window
    assert_caught(check_flash_attn_window(fn), name, phrase)


def test_flash_attn_window_generic():
    from flashlab.exercises import check_flash_attn_window
    assert_caught(check_flash_attn_window(lambda *a: 3), "not_a_band", "return a pair (left, right)")
    assert_caught(check_flash_attn_window(raises), "raised", "NotImplementedError")
