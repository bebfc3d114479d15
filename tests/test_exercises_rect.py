"""The RECT-FA chapters' exercise checkers (flashlab.exercises.rect).

For every checker: a correct solution (written from first principles with numpy, as a reader
would) passes; every planted mistake is caught with its name and a message containing the
key phrase; a function that raises, returns the wrong shape / not a number, or returns NaN
gets its own message.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashlab.exercises import (
    Feedback,
    check_attention_flops,
    check_concat_bytes,
    check_mla_scores,
    check_pipeline_time,
    check_rope,
)


def assert_caught(fb: Feedback, mistake: str, phrase: str) -> None:
    assert isinstance(fb, Feedback)
    assert not fb.passed, fb.message
    assert fb.mistake == mistake, (fb.mistake, fb.message)
    assert phrase in fb.message, fb.message


# ------------------------------------------------------------------------------- MLA scores
def mla_scores(q_nope, k_nope, q_rope, k_rope, scale_dim=None, rope=True, scale_rope=True, sqrt=True):
    d = q_nope.shape[-1] + q_rope.shape[-1] if scale_dim is None else scale_dim
    scale = 1 / np.sqrt(d) if sqrt else 1 / d
    s = scale * (q_nope @ k_nope.swapaxes(-1, -2))
    if rope:
        # k_rope (B, 1, Sk, Dr) broadcasts over the H query heads
        s = s + (scale if scale_rope else 1.0) * (q_rope @ k_rope.swapaxes(-1, -2))
    return s


def test_mla_scores_correct_passes():
    fb = check_mla_scores(mla_scores)
    assert fb.passed and fb.mistake is None, fb.message
    assert "1/sqrt(192)" in fb.message
    assert str(fb).startswith("[MLA scores] Correct")


def test_mla_scores_loop_over_heads_passes():
    def per_head(q_nope, k_nope, q_rope, k_rope):
        B, H, Sq, _ = q_nope.shape
        out = np.empty((B, H, Sq, k_nope.shape[2]))
        for h in range(H):
            out[:, h] = (q_nope[:, h] @ k_nope[:, h].swapaxes(-1, -2)
                         + q_rope[:, h] @ k_rope[:, 0].swapaxes(-1, -2)) / np.sqrt(192)
        return out
    assert check_mla_scores(per_head).passed


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (lambda *a: mla_scores(*a, rope=False), "rope_forgotten", "RoPE product is missing"),
    (lambda *a: mla_scores(*a, scale_dim=128), "scale_nope_dim", "1/sqrt(128)"),
    (lambda *a: mla_scores(*a, sqrt=False), "scale_without_sqrt", "square root is missing"),
    (lambda *a: mla_scores(*a, scale_rope=False), "scale_on_nope_only", "only the NoPE product is scaled"),
    (lambda *a: mla_scores(*a, scale_dim=1), "no_scale", "not scaled"),
])
def test_mla_scores_mistakes(wrong, mistake, phrase):
    assert_caught(check_mla_scores(wrong), mistake, phrase)


def test_mla_scores_k_rope_per_head():
    def per_head(q_nope, k_nope, q_rope, k_rope):
        H = q_nope.shape[1]
        return np.stack([q_nope[:, h] @ k_nope[:, h].swapaxes(-1, -2)
                         + q_rope[:, h] @ k_rope[:, h].swapaxes(-1, -2) for h in range(H)], axis=1) / np.sqrt(192)
    assert_caught(check_mla_scores(per_head), "k_rope_per_head", "ONE RoPE key head")


def test_mla_scores_raises_shape_nan():
    def raises(*a):
        raise NotImplementedError
    assert_caught(check_mla_scores(raises), "raised", "NotImplementedError")
    assert_caught(check_mla_scores(lambda *a: mla_scores(*a)[0]), "shape", "expected (1, 3, 5, 7)")
    assert_caught(check_mla_scores(lambda *a: mla_scores(*a)[..., :6]), "shape", "has shape")

    def nan(*a):
        s = mla_scores(*a)
        s[0, 1, 2, 3] = np.nan
        return s
    assert_caught(check_mla_scores(nan), "non_finite", "(0, 1, 2, 3)")
    assert_caught(check_mla_scores(lambda *a: None), "returned_none", "returned None")


def test_mla_scores_unrecognised_error_is_located():
    def off(*a):
        s = mla_scores(*a)
        s[0, 2, 4, 6] += 1.0
        return s
    assert_caught(check_mla_scores(off), "wrong_value", "(0, 2, 4, 6)")


# -------------------------------------------------------------------------------------- RoPE
def rope(x, positions, interleaved=False, sign=1.0, exponent=2.0):
    d = x.shape[-1]
    theta = 10000.0 ** (-exponent * np.arange(d // 2) / d)
    angle = sign * positions[:, None] * theta
    cos, sin = np.cos(angle), np.sin(angle)
    out = np.empty_like(x)
    ia, ib = (np.arange(0, d, 2), np.arange(1, d, 2)) if interleaved else (np.arange(d // 2), np.arange(d // 2, d))
    a, b = x[:, ia], x[:, ib]
    out[:, ia] = a * cos - b * sin
    out[:, ib] = a * sin + b * cos
    return out


def test_rope_correct_passes():
    fb = check_rope(rope)
    assert fb.passed, fb.message
    assert "positions 5..10" in fb.message


def test_rope_rotate_half_form_passes():
    def rotate_half_form(x, positions):
        d = x.shape[-1]
        theta = 10000.0 ** (-np.arange(0, d, 2) / d)
        angle = np.concatenate([positions[:, None] * theta] * 2, axis=-1)
        rotated = np.concatenate([-x[:, d // 2:], x[:, :d // 2]], axis=-1)
        return x * np.cos(angle) + rotated * np.sin(angle)
    assert check_rope(rotate_half_form).passed


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (lambda x, p: rope(x, p, interleaved=True), "interleaved", "interleaved"),
    (lambda x, p: rope(x, p, sign=-1.0), "rotation_sign", "-m theta_i"),
    (lambda x, p: rope(x, np.arange(len(p))), "positions_ignored", "use the `positions`"),
    (lambda x, p: rope(x, p + 1), "positions_off_by_one", "(m + 1) theta_i"),
    (lambda x, p: rope(x, p - 1), "positions_off_by_one", "(m - 1) theta_i"),
    (lambda x, p: rope(x, p, exponent=1.0), "frequency_exponent", "-2i/D"),
])
def test_rope_mistakes(wrong, mistake, phrase):
    assert_caught(check_rope(wrong), mistake, phrase)


def test_rope_float32_answer_passes():
    """A correct rotation computed in float32 differs from the float64 truth by float32 rounding
    (the student's 'got 0.949838, expected 0.949838'): it passes; float32 slips are still named."""
    def rope32(x, positions):
        return rope(x.astype(np.float32), positions.astype(np.float32))
    assert rope32(np.ones((6, 8)), np.arange(5, 11)).dtype == np.float32
    fb = check_rope(rope32)
    assert fb.passed, fb.message
    assert_caught(check_rope(lambda x, p: rope(x.astype(np.float32), (p + 1).astype(np.float32))),
                  "positions_off_by_one", "(m + 1) theta_i")
    # precision, not dtype: the float32 answer promoted to float64 passes too; float16 does not
    assert check_rope(lambda x, p: rope32(x, p).astype(np.float64)).passed
    assert_caught(check_rope(lambda x, p: rope(x.astype(np.float16), p.astype(np.float16))),
                  "low_precision", "float16")


def test_counts_are_not_excused_as_low_precision():
    """A count is judged to 1e-9: an answer off by 1e-3 is wrong, not 'low precision'."""
    assert_caught(check_concat_bytes(lambda *c: 1.001 * concat_bytes(*c)), "wrong_value", "cases are right")


def test_rope_cos_sin_swapped():
    def swapped(x, positions):
        d = x.shape[-1]
        angle = positions[:, None] * 10000.0 ** (-np.arange(0, d, 2) / d)
        a, b = x[:, : d // 2], x[:, d // 2:]
        return np.concatenate([a * np.sin(angle) - b * np.cos(angle),
                               a * np.cos(angle) + b * np.sin(angle)], axis=-1)
    assert_caught(check_rope(swapped), "cos_sin_swapped", "cos and sin are swapped")


def test_rope_raises_shape_nan():
    assert_caught(check_rope(lambda x, p: x[:, :4] * 1.0), "shape", "expected (6, 8)")
    assert_caught(check_rope(lambda x, p: 1 / 0), "raised", "ZeroDivisionError")
    assert_caught(check_rope(lambda x, p: np.full_like(x, np.nan)), "non_finite", "non-finite")
    assert_caught(check_rope(lambda x, p: x), "wrong_value", "largest error")


# --------------------------------------------------------------------------------- pipeline
def pipeline_time(n_tiles, t_load, t_compute, buffers):
    if buffers == 1:
        return n_tiles * (t_load + t_compute)
    return t_load + t_compute + (n_tiles - 1) * max(t_load, t_compute)


def test_pipeline_correct_passes():
    fb = check_pipeline_time(pipeline_time)
    assert fb.passed, fb.message
    assert "all 6 cases" in fb.message


def two(rule):
    # a planted mistake in the two-buffer formula; the one-buffer formula stays right
    return lambda n, a, b, k: n * (a + b) if k == 1 else rule(n, a, b)


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (two(lambda n, a, b: n * (a + b)), "sum_instead_of_max", "nothing overlaps"),
    (two(lambda n, a, b: n * max(a, b)), "fill_drain_forgotten", "fill and drain"),
    (two(lambda n, a, b: a + n * max(a, b)), "drain_when_copy_slower", "copies are slower"),
    (two(lambda n, a, b: a + b + n * max(a, b)), "one_step_too_many", "one step too many"),
    (two(lambda n, a, b: a + b + (n - 1) * min(a, b)), "min_instead_of_max", "min(a, b)"),
    (lambda n, a, b, k: a + b + (n - 1) * max(a, b), "one_buffer_overlaps", "With one buffer"),
])
def test_pipeline_mistakes(wrong, mistake, phrase):
    assert_caught(check_pipeline_time(wrong), mistake, phrase)


def test_pipeline_raises_not_a_number_nan():
    def raises(n, a, b, k):
        if n == 1:
            raise ValueError("n must be > 1")
        return pipeline_time(n, a, b, k)
    assert_caught(check_pipeline_time(raises), "raised", "for n_tiles=1, t_load=2, t_compute=7, buffers=2")
    assert_caught(check_pipeline_time(lambda *c: [pipeline_time(*c)]), "not_a_number", "one number")
    assert_caught(check_pipeline_time(lambda *c: "33"), "not_a_number", "one number")
    assert_caught(check_pipeline_time(lambda *c: None), "returned_none", "returned None")
    assert_caught(check_pipeline_time(lambda *c: float("nan")), "non_finite", "returned nan")
    # a wrong value no mistake explains names the first case it is wrong in
    assert_caught(check_pipeline_time(lambda n, a, b, k: pipeline_time(n, a, b, k) + (k == 2 and a > b)),
                  "wrong_value", "for n_tiles=6, t_load=5, t_compute=3, buffers=2 your function returned 34")


# ---------------------------------------------------------------------------- concat bytes
def concat_bytes(batch, heads, seq, d_nope, d_rope, elem, expand=True, read=True, write=True):
    d = d_nope + d_rope
    rows, shared = batch * heads * seq, batch * seq
    k_rope_rows = rows if expand else shared
    reads = (shared * d_rope if expand else 0) + rows * d + rows * d_nope + k_rope_rows * d_rope
    writes = (rows * d_rope if expand else 0) + 2 * rows * d
    return elem * ((reads if read else 0) + (writes if write else 0))


def test_concat_bytes_correct_passes():
    fb = check_concat_bytes(concat_bytes)
    assert fb.passed, fb.message
    # the chapter's number: expand + concats of one DeepSeek-V3 layer, S = 4096, bf16
    assert concat_bytes(1, 128, 4096, 128, 64, 2) == 2 * 4096 * (64 + 128 * 64 + 4 * 128 * 192)


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (lambda *c: concat_bytes(*c, expand=False), "k_rope_not_expanded", "copied to every head"),
    (lambda *c: concat_bytes(*c) - c[-1] * (c[0] * c[2] * c[4] + c[0] * c[1] * c[2] * c[4]),
     "expand_not_counted", "expand step is missing"),
    (lambda *c: concat_bytes(*c, write=False), "writes_not_counted", "only the bytes read"),
    (lambda *c: concat_bytes(*c, read=False), "reads_not_counted", "only the bytes written"),
    (lambda *c: concat_bytes(*c) // c[-1], "elements_not_bytes", "in elements"),
])
def test_concat_bytes_mistakes(wrong, mistake, phrase):
    assert_caught(check_concat_bytes(wrong), mistake, phrase)


def test_concat_bytes_raises_and_wrong():
    assert_caught(check_concat_bytes(lambda *c: c[9]), "raised", "IndexError")
    assert_caught(check_concat_bytes(lambda *c: concat_bytes(*c) + 1), "wrong_value", "0 of 4 cases are right")
    assert_caught(check_concat_bytes(lambda *c: np.array([1.0, 2.0])), "not_a_number", "one number")
    assert_caught(check_concat_bytes(lambda *c: float("nan")), "non_finite", "returned nan")


# -------------------------------------------------------------------------- attention FLOPs
def attention_flops(b, h, sq, sk, d_qk, d_v, causal, pairs=None, factor=2):
    if pairs is None:
        # top-left causal: row i attends min(i + 1, sk) keys
        pairs = sum(min(i + 1, sk) for i in range(sq)) if causal else sq * sk
    return factor * b * h * pairs * (d_qk + d_v)


def test_attention_flops_correct_passes():
    fb = check_attention_flops(attention_flops)
    assert fb.passed, fb.message
    assert fb.message.startswith("the FLOPs match")


def test_attention_flops_integer_numpy_result_passes():
    assert check_attention_flops(lambda *c: np.int64(attention_flops(*c))).passed


@pytest.mark.parametrize("wrong, mistake, phrase", [
    (lambda *c: attention_flops(*c, factor=1), "factor_2_forgotten", "2 FLOPs"),
    (lambda b, h, sq, sk, dq, dv, c: attention_flops(b, h, sq, sk, dq, dq, c), "d_v_ignored", "head dim d_v"),
    (lambda b, h, sq, sk, dq, dv, c: attention_flops(b, h, sq, sk, dq, dv, False), "causal_ignored",
     "full Sq x Sk"),
    (lambda b, h, sq, sk, dq, dv, c: attention_flops(b, h, sq, sk, dq, dv, c, pairs=sq * sk / 2 if c else None),
     "causal_half_square", "misses the diagonal"),
    (lambda b, h, sq, sk, dq, dv, c: attention_flops(b, h, sq, sk, dq, dv, c,
                                                     pairs=sum(min(i, sk) for i in range(sq)) if c else None),
     "causal_diagonal_excluded", "off by one"),
    (lambda b, h, sq, sk, dq, dv, c: attention_flops(b, h, sq, sk, dq, dv, c,
                                                     pairs=sq * (sq + 1) // 2 if c else None),
     "causal_rows_past_keys", "Rows i >= Sk"),
])
def test_attention_flops_mistakes(wrong, mistake, phrase):
    assert_caught(check_attention_flops(wrong), mistake, phrase)


def test_attention_flops_raises_and_nan():
    def raises(*c):
        raise NotImplementedError
    fb = check_attention_flops(raises)
    assert_caught(fb, "raised", "NotImplementedError")
    assert "b=1, h=8, sq=1024" in fb.message
    assert_caught(check_attention_flops(lambda *c: float("inf")), "non_finite", "returned inf")


def test_feedback_is_deterministic():
    # the notebooks store the feedback as output: the same function must give the same text
    assert str(check_rope(lambda x, p: x)) == str(check_rope(lambda x, p: x))
    assert check_mla_scores(mla_scores)._repr_markdown_().startswith("✓ **Correct**")


def test_checkers_reject_a_non_callable():
    with pytest.raises(TypeError, match="callable"):
        check_pipeline_time(42)
