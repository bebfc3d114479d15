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
    return assignments.solutions()


def test_every_code_it_exercise_is_exported_once():
    names = [ex.name for ex in assignments.exercises()]
    # 13 chapter exercises and the capstone
    assert sorted(names) == sorted(grading.CHECKERS) and len(names) == 14
    assert sorted(grading.PRECISION) == sorted(grading.CHECKERS) == sorted(grading.INPUTS)


def test_every_exercise_of_a_chapter_is_in_its_assignment(tmp_path):
    """Bug A of issue 34: the gpu chapter's two exercises went to one file, the second overwriting
    the first. Now a chapter is one assignment holding each of its exercises."""
    paths = assignments.write_course(tmp_path, seed=1)
    graded = {}
    for path in paths:
        cells = json.loads(path.read_text())["cells"]
        ids = [c["metadata"]["nbgrader"]["grade_id"] for c in cells if c["metadata"]["nbgrader"]["grade"]]
        # the book's exercises (each followed by its graded variant: tests/test_variants.py)
        graded[path.stem] = [i.removesuffix("-test") for i in ids if i.removesuffix("-test") in grading.CHECKERS]
    assert graded["gpu"] == ["forward_read_bytes", "shared_bytes"]
    assert graded["capstone"] == ["flash_tile_loop"]
    assert sorted(n for names in graded.values() for n in names) == sorted(grading.CHECKERS)


def _float32(fn):
    """``fn`` computed in float32: its float inputs cast to float32 (an answer 1e-7 off)."""
    def cast(x):
        return x.astype(np.float32) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x

    def run(*args):
        out = fn(*(cast(a) for a in args))
        return tuple(map(cast, out)) if isinstance(out, tuple) else cast(out)
    return run


@pytest.mark.parametrize("name", sorted(n for n, tol in grading.PRECISION.items() if tol[0] > 1e-9))
def test_a_float32_answer_passes_the_hidden_tests(solutions, name):
    """Bug B of issue 34: the book accepts float32 precision; the hidden tests compared to 1e-9."""
    fn = solutions[name]
    feedback = grading.grade(name, _float32(fn), reference=fn, seed=4)
    assert feedback.passed, feedback.message


def test_a_float16_answer_fails_the_hidden_tests_as_a_precision_problem(solutions):
    fn = solutions["attention"]

    def attention(q, k, v):
        return fn(q, k, v).astype(np.float16).astype(np.float64)  # right to ~3 digits only
    # only the hidden comparison is asked here (the book's checker says it too)
    assert grading._same(attention(*grading.INPUTS["attention"](np.random.default_rng(0))),
                         fn(*grading.INPUTS["attention"](np.random.default_rng(0))), *grading.FLOAT16_PRECISION)
    rng = np.random.default_rng(9)
    want = fn(*(args := grading.INPUTS["attention"](rng)))
    assert not grading._same(attention(*args), want, *grading.PRECISION["attention"])
    feedback = grading.grade("attention", attention)
    assert not feedback.passed and feedback.mistake == "low_precision"


def test_the_hidden_tests_name_a_precision_slip_as_one(solutions, monkeypatch):
    """A result right to float16 precision on the instructor's inputs (the book's checks passed)."""
    fn = solutions["attention"]
    monkeypatch.setitem(grading.CHECKERS, "attention", lambda f: grading.Feedback("attention", True, "ok"))

    def attention(q, k, v):
        return fn(q, k, v).astype(np.float16)
    feedback = grading.grade("attention", attention, reference=fn, seed=2)
    assert not feedback.passed and feedback.mistake == "low_precision"
    assert "precision" in feedback.message and "1e-05" in feedback.message


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
        assert len(cells) % 3 == 0
        answer, test = ("".join(c["source"]) for c in cells[1:3])
        assert cells[1]["metadata"]["nbgrader"]["solution"] and not cells[1]["metadata"]["nbgrader"]["locked"]
        points = 5 if path.stem == assignments.CAPSTONE else 1
        assert cells[2]["metadata"]["nbgrader"]["grade"] and cells[2]["metadata"]["nbgrader"]["points"] == points
        assert assignments.BEGIN in answer and assignments.END in answer
        # feedback printed before the assert; the seeded comparison hidden from students
        assert test.index("print(feedback)") < test.index("assert feedback.passed")
        assert "### BEGIN HIDDEN TESTS" in test and "seed=11" in test.split("### BEGIN HIDDEN TESTS")[1]


def test_the_guides_autograded_exercises_are_the_course(tmp_path):
    """Every exercise the instructor guide lists as autograded is in the generated course, and
    nothing else is (issue 34: the guide said 13 where the course had 12)."""
    import re
    from pathlib import Path
    guide = (Path(__file__).resolve().parent.parent / "book" / "instructor.md").read_text()
    table = guide.split("## Every exercise", 1)[1].split("\n## ", 1)[0]
    listed = []
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[5].startswith("yes"):
            (name,) = re.findall(r"\(`(\w+)`\)", cells[2])
            listed.append(name)
    course = []
    for path in assignments.write_course(tmp_path, seed=1):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["metadata"]["nbgrader"]["grade"]:
                course.append(cell["metadata"]["nbgrader"]["grade_id"].removesuffix("-test"))
    book = [n for n in course if n in grading.CHECKERS]
    assert sorted(listed) == sorted(book) and len(book) == 14
    # the guide's count agrees, and its table of graded variants is the course's
    assert "14 code (all 14 autograded" in guide
    variants = guide.split("### Graded variants", 1)[1].split("\n## ", 1)[0]
    listed_variants = re.findall(r"^\| `\w+` \| `(\w+)` \|", variants, flags=re.M)
    assert sorted(listed_variants) == sorted(set(course) - set(book)) and len(listed_variants) == 13


def test_every_explore_exercise_has_a_rubric():
    """Issue 34: the guide gives each exploration a short rubric (chapter and number as listed)."""
    import re
    from pathlib import Path
    guide = (Path(__file__).resolve().parent.parent / "book" / "instructor.md").read_text()
    table = guide.split("## Every exercise", 1)[1].split("\n## ", 1)[0]
    explore, chapter = [], None
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[1].isdigit():
            chapter = cells[0] or chapter
            if cells[3] == "explore":
                explore.append(f"{chapter} {cells[1]}, {cells[2]}")
    rubrics = guide.split("## Rubrics for the explore exercises", 1)[1].split("\n## ", 1)[0]
    rows = [r.split("|")[1].strip() for r in rubrics.splitlines() if re.match(r"\| \{doc\}", r)]
    assert len(explore) == 13 and sorted(rows) == sorted(explore)


def test_the_capstone_may_not_call_the_books_own_tile_loop():
    """The capstone's solution ships in flashlab.exercises._capstone: calling it is refused, named
    statically or reached at run time."""
    import importlib

    from flashlab.exercises._capstone import tile_loop

    def flash_tile_loop(q, k, v, do, block_q, block_k, causal):
        return tile_loop(q, k, v, do, block_q, block_k, causal)

    feedback = grading.grade("flash_tile_loop", flash_tile_loop)
    assert not feedback.passed and feedback.mistake == "calls_flashlab"
    assert "flashlab.exercises._capstone.tile_loop" in feedback.message

    def sneaky(q, k, v, do, block_q, block_k, causal):
        loop = importlib.import_module("flashlab.exercises._cap" + "stone").tile_loop
        return loop(q, k, v, do, block_q, block_k, causal)
    feedback = grading.grade("flash_tile_loop", sneaky)
    assert not feedback.passed and feedback.mistake == "calls_flashlab"
    assert "tile_loop" in feedback.message
