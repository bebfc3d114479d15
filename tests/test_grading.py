"""flashlab.exercises.grading: the book's solutions pass on the instructor's seeded inputs, a
wrong or flashlab-calling answer fails with its message; tools/assignments.py writes nbgrader
source notebooks (the nbgrader run itself: tests/test_assignments.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import flashlab
from flashlab.exercises import grading
from tools import assignments


@pytest.fixture(scope="module")
def solutions() -> dict:
    """exercise name -> the book's solution function, taken from the chapter's solution cell."""
    out = {}
    for ex in assignments.exercises():
        scope = {"np": np}
        exec(ex.solution, scope)                    # noqa: S102 (the book's own solution)
        out[ex.name] = scope[ex.name]
    return out


def test_every_code_it_exercise_is_exported_once():
    names = [ex.name for ex in assignments.exercises()]
    assert sorted(names) == sorted(grading.CHECKERS) and len(names) == 13


@pytest.mark.parametrize("name", sorted(grading.CHECKERS))
def test_the_book_solution_passes_on_the_instructors_inputs(solutions, name):
    fn = solutions[name]
    for seed in (0, 1, 2):
        feedback = grading.grade(name, fn, reference=fn, seed=seed)
        assert feedback.passed, feedback.message


def test_inputs_change_with_the_seed():
    a = grading.INPUTS["attention"](np.random.default_rng(1))
    b = grading.INPUTS["attention"](np.random.default_rng(2))
    assert [x.shape for x in a] != [x.shape for x in b] or not np.array_equal(a[0], b[0])


def test_a_solution_calling_flashlab_is_rejected_with_a_message():
    def attention(q, k, v):
        return flashlab.attention_reference(q[None, None], k[None, None], v[None, None])[0][0, 0]

    feedback = grading.grade("attention", attention)
    assert not feedback.passed and feedback.mistake == "calls_flashlab"
    assert "flashlab.attention_reference" in feedback.message and "numpy" in feedback.message


def test_a_flashlab_call_hidden_from_the_static_check_is_caught_while_it_runs():
    import importlib

    def attention(q, k, v):
        ref = importlib.import_module("flash" + "lab").attention_reference   # no flashlab name in the code
        return ref(q[None, None], k[None, None], v[None, None])[0][0, 0]

    assert grading.flashlab_calls(attention) == []
    feedback = grading.grade("attention", attention)
    assert not feedback.passed and feedback.mistake == "calls_flashlab"
    assert "flashlab.reference" in feedback.message


def test_a_wrong_answer_fails_with_the_checkers_hint(solutions):
    def attention(q, k, v):                          # no 1/sqrt(d)
        s = q @ k.T
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return p / p.sum(axis=-1, keepdims=True) @ v

    feedback = grading.grade("attention", attention, reference=solutions["attention"], seed=3)
    assert not feedback.passed and feedback.mistake == "no_scale"


def test_an_answer_fitted_to_the_public_inputs_fails_on_the_hidden_ones(solutions):
    """Right on the book's four shapes (memorised), wrong elsewhere: only the seeded inputs see it."""
    right = solutions["arithmetic_intensity"]

    def arithmetic_intensity(m, n, k, bytes_per_element):
        if (m, n, k, bytes_per_element) in PUBLIC:
            return right(m, n, k, bytes_per_element)
        return 2 * m * n * k / (bytes_per_element * (m * k + k * n))    # forgot writing C

    PUBLIC = set()

    def spy(*args):
        PUBLIC.add(args)
        return right(*args)
    assert grading.CHECKERS["arithmetic_intensity"](spy).passed
    assert grading.grade("arithmetic_intensity", arithmetic_intensity).passed
    feedback = grading.grade("arithmetic_intensity", arithmetic_intensity, reference=right, seed=5)
    assert not feedback.passed and feedback.mistake == "hidden_inputs"
    assert "instructor's input #1" in feedback.message


def test_grade_names_its_bad_arguments(solutions):
    with pytest.raises(ValueError, match="exercise="):
        grading.grade("nope", solutions["attention"])
    with pytest.raises(TypeError, match="fn"):
        grading.grade("attention", 3)
    with pytest.raises(ValueError, match="reference and seed"):
        grading.grade("attention", solutions["attention"], seed=1)


def test_source_notebooks_have_nbgrader_cells(tmp_path):
    paths = assignments.write_course(tmp_path, seed=11)
    assert len(paths) == 13 and (tmp_path / "nbgrader_config.py").exists()
    for path in paths:
        cells = json.loads(path.read_text())["cells"]
        answer, test = ("".join(c["source"]) for c in cells[1:])
        assert cells[1]["metadata"]["nbgrader"]["solution"] and not cells[1]["metadata"]["nbgrader"]["locked"]
        assert cells[2]["metadata"]["nbgrader"]["grade"] and cells[2]["metadata"]["nbgrader"]["points"] == 1
        assert assignments.BEGIN in answer and assignments.END in answer
        # feedback printed before the assert; the seeded comparison hidden from students
        assert test.index("print(feedback)") < test.index("assert feedback.passed")
        assert "### BEGIN HIDDEN TESTS" in test and "seed=11" in test.split("### BEGIN HIDDEN TESTS")[1]
