"""The graded variants of the "Code it" exercises (issue 34 point 1): each reference agrees with
the book's own solution where the two problems meet, a wrong answer fails, and the nbgrader
course carries each variant beside its exercise."""
from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

from flashlab.exercises import grading
from flashlab.exercises._capstone import _truth
from flashlab.exercises._variants import PUBLIC_SEED, VARIANTS
from tools import assignments


@pytest.fixture(scope="module")
def book() -> dict:
    return assignments.solutions()


def test_every_code_exercise_of_a_chapter_has_a_variant():
    chapters = {ex.name for ex in assignments.exercises() if ex.chapter != assignments.CAPSTONE}
    assert set(VARIANTS) == chapters
    for v in VARIANTS.values():
        assert v.signature.startswith(f"def {v.name}(") and f"`{v.name}(" in v.statement


@pytest.mark.parametrize("name", sorted(v.name for v in VARIANTS.values()))
def test_the_reference_passes_the_public_and_the_hidden_grading(name):
    # the reference's source, run as the student's own code (calling flashlab's copy is refused)
    scope: dict = {"np": np}
    exec(inspect.getsource(next(v.reference for v in VARIANTS.values() if v.name == name)), scope)  # noqa: S102
    ref = scope[name]
    for seed in (PUBLIC_SEED, 1, 2, 3):
        feedback = grading.grade_variant(name, ref, seed=seed, trials=20)
        assert feedback.passed, feedback.message


def _args(name, seed=0):
    v = next(v for v in VARIANTS.values() if v.name == name)
    return v.inputs(np.random.default_rng(seed))


def test_variants_meet_the_book_solutions(book):
    rng = np.random.default_rng(5)
    v = {x.name: x.reference for x in VARIANTS.values()}
    # one product without accumulation is the book's intensity
    assert v["gemm_intensity"](1, 64, 32, 16, 2, False) == pytest.approx(book["arithmetic_intensity"](64, 32, 16, 2))
    assert v["gemm_intensity"](3, 64, 32, 16, 2, True) < v["gemm_intensity"](3, 64, 32, 16, 2, False)
    q, k, val = rng.standard_normal((5, 4)), rng.standard_normal((7, 4)), rng.standard_normal((7, 3))
    np.testing.assert_allclose(v["attention_batched"](q[None], k[None], val[None], False)[0],
                               book["attention"](q, k, val))
    # split-K: the merge of two halves is the whole attention
    s = q @ k.T / 2.0
    def part(cols):
        m = s[:, cols].max(axis=1)
        e = np.exp(s[:, cols] - m[:, None])
        return e @ val[cols] / e.sum(axis=1)[:, None], m + np.log(e.sum(axis=1))
    o, lse = v["merge_partials"](*part(slice(0, 3)), *part(slice(3, 7)))
    np.testing.assert_allclose(o, book["attention"](q, k, val))
    # the backward agrees with the capstone's dense truth
    do = rng.standard_normal((5, 3))
    for got, want in zip(v["attention_backward"](q, k, val, do), _truth(q, k, val, do, False)[2:]):
        np.testing.assert_allclose(got, want, atol=1e-12)
    # the tile classes sum to the grid, and the window's counts are the allowed entries of its band
    empty, partial, full = v["band_tile_counts"](13, 17, 2, 3, 4, 5)
    assert empty + partial + full == 4 * 4
    for sq, sk, causal, win in ((5, 9, True, (2, -1)), (9, 5, False, (1, 3)), (7, 7, True, (-1, -1))):
        left, right = book["window_band"](sq, sk, causal, win)
        mask = book["band_mask"](sq, sk, sk if left is None else left, sk if right is None else right)
        np.testing.assert_array_equal(v["window_key_counts"](sq, sk, causal, win), (~mask).sum(axis=1))
    # MLA's output is attention on the concatenated heads with k_rope broadcast
    qn, kn, qr, kr, vv = _args("mla_attention")
    kr_full = np.broadcast_to(kr, kn.shape[:-1] + (kr.shape[-1],))
    np.testing.assert_allclose(v["mla_attention"](qn, kn, qr, kr, vv),
                               v["attention_batched"](np.concatenate([qn, qr], -1), np.concatenate([kn, kr_full], -1),
                                                      vv, False))
    # interleaved RoPE is rotate-half on the features reordered (evens, then odds)
    x, pos = rng.standard_normal((6, 8)), np.arange(6) * 7
    perm = np.r_[0:8:2, 1:8:2]
    np.testing.assert_allclose(v["rope_interleaved"](x, pos, 10000.0)[:, perm],
                               book["rope_rotate_half"](x[:, perm], pos))
    # equal times: the chapter's law, for one and two buffers
    for n, a, b, k_ in ((6, 3.0, 5.0, 1), (6, 3.0, 5.0, 2), (6, 5.0, 3.0, 2), (1, 2.0, 7.0, 2)):
        assert v["pipeline_time_ragged"]([a] * n, [b] * n, k_) == pytest.approx(book["pipeline_time"](n, a, b, k_))
    assert v["pipeline_time_ragged"]([], [], 2) == 0.0
    assert v["concat_bytes_gqa"](2, 16, 16, 512, 512, 128, 64, 2) == book["concat_bytes"](2, 16, 512, 128, 64, 2)
    assert v["attention_flops_band"](2, 3, 50, 70, 192, 128, None, 0, False) == \
        book["attention_flops"](2, 3, 50, 70, 192, 128, True)
    assert v["attention_flops_band"](2, 3, 50, 70, 192, 128, None, None, True) == \
        book["attention_flops"](2, 3, 50, 70, 192, 128, False)
    for case in ((13, 9, 4, 2, 4, 4), (10, 17, 8, 4, 4, 8)):
        assert v["window_read_bytes"](*case, 10**6) == book["forward_read_bytes"](*case, True)
    blk = v["largest_block_q"](100 * 1024, 64, 128, 128, False)
    assert blk % 16 == 0 and book["shared_bytes"](blk, 64, 128, 128) <= 100 * 1024 \
        < book["shared_bytes"](blk + 16, 64, 128, 128)


def test_a_wrong_variant_fails_with_the_input_named():
    def merge_partials(o_a, lse_a, o_b, lse_b):     # raw exponentials: overflow, and NaN for unseen rows
        w_a, w_b = np.exp(lse_a), np.exp(lse_b)
        return (w_a[:, None] * o_a + w_b[:, None] * o_b) / (w_a + w_b)[:, None], np.log(w_a + w_b)
    feedback = grading.grade_variant("merge_partials", merge_partials, seed=7)
    assert not feedback.passed and "instructor's input #" in feedback.message

    scope: dict = {"np": np}
    exec(inspect.getsource(VARIANTS["attention"].reference), scope)  # noqa: S102

    def attention_batched(q, k, v, causal):          # the mask forgotten
        return scope["attention_batched"](q, k, v, False)
    feedback = grading.grade_variant("attention_batched", attention_batched, trials=20)
    assert not feedback.passed and feedback.mistake == "hidden_inputs" and "example input" in feedback.message

    import flashlab

    def attention_backward(q, k, v, do):
        return flashlab.attention_reference(q, k, v)
    feedback = grading.grade_variant("attention_backward", attention_backward)
    assert feedback.mistake == "calls_flashlab"
    with pytest.raises(ValueError, match="name="):
        grading.grade_variant("nope", attention_backward)


def test_each_assignment_holds_the_variant_of_each_exercise(tmp_path):
    for path in assignments.write_course(tmp_path, seed=3):
        cells = json.loads(path.read_text())["cells"]
        graded = [c for c in cells if c["metadata"]["nbgrader"]["grade"]]
        names = [c["metadata"]["nbgrader"]["grade_id"].removesuffix("-test") for c in graded]
        for ex in assignments.assignments()[path.stem]:
            if ex.chapter == assignments.CAPSTONE:
                continue
            variant = VARIANTS[ex.name]
            assert names.index(variant.name) == names.index(ex.name) + 1
            test = "".join(next(c for c in graded if c["metadata"]["nbgrader"]["grade_id"] == f"{variant.name}-test")
                           ["source"])
            public, hidden = test.split("### BEGIN HIDDEN TESTS")
            assert f"grade_variant({variant.name!r}, {variant.name})" in public and "seed=3" in hidden
