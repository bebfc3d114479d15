"""`make assignments` end to end with nbgrader: generate the students' version of one exercise,
autograde a correct, a wrong and a flashlab-calling submission, and read the scores from the
gradebook (issue #25 point 4). nbgrader is optional (requirements-grading.txt; .ci/run installs
it); without it this test is skipped."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

nbgrader_api = pytest.importorskip(
    "nbgrader.api", reason="nbgrader is optional: pip install -r requirements-grading.txt (make assignments)")

from tools import assignments  # noqa: E402

CHAPTER, NAME = "standard_attention", "attention"
STUB = "    # YOUR CODE HERE\n    raise NotImplementedError()"
SUBMISSIONS = {
    "alice": ("    s = q @ k.T / np.sqrt(q.shape[1])\n"
              "    p = np.exp(s - s.max(axis=-1, keepdims=True))\n"
              "    return p / p.sum(axis=-1, keepdims=True) @ v"),
    "bob": ("    s = q @ k.T\n"                                      # the scale forgotten
            "    p = np.exp(s - s.max(axis=-1, keepdims=True))\n"
            "    return p / p.sum(axis=-1, keepdims=True) @ v"),
    "dave": ("    q, k, v = (x.astype(np.float32) for x in (q, k, v))\n"   # right, in float32 (issue 34 bug B)
             "    s = q @ k.T / np.float32(np.sqrt(q.shape[1]))\n"
             "    p = np.exp(s - s.max(axis=-1, keepdims=True))\n"
             "    return p / p.sum(axis=-1, keepdims=True) @ v"),
    "carol": ("    import flashlab\n"                                # the answer key called
              "    return flashlab.attention_reference(q[None, None], k[None, None], v[None, None])[0][0, 0]"),
}


def _nbgrader(course: Path, *args: str) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_generate_and_autograde_a_right_a_wrong_and_a_cheating_submission(tmp_path):
    course = tmp_path / "course"
    assignments.write_course(course, seed=20261127)
    _nbgrader(course, "generate_assignment", CHAPTER, "--force")
    release = json.loads((course / "release" / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    answer = "".join(release["cells"][1]["source"])
    test = "".join(release["cells"][2]["source"])
    # the students' copy: no solution, no hidden inputs or seed
    assert STUB in answer and "### BEGIN SOLUTION" not in answer
    assert "HIDDEN" not in test and "seed=" not in test and "_reference_" not in test
    for student, body in SUBMISSIONS.items():
        sub = json.loads(json.dumps(release))
        sub["cells"][1]["source"] = answer.replace(STUB, body).splitlines(True)
        folder = course / "submitted" / student / CHAPTER
        folder.mkdir(parents=True)
        (folder / f"{CHAPTER}.ipynb").write_text(json.dumps(sub))
    _nbgrader(course, "autograde", CHAPTER, "--create", "--force")

    with nbgrader_api.Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission(CHAPTER, s).score for s in SUBMISSIONS}
    # the exercise's point (its graded variant, left unanswered, scores 0 of 2)
    assert scores == {"alice": 1.0, "bob": 0.0, "dave": 1.0, "carol": 0.0}

    def printed(student: str) -> str:
        nb = json.loads((course / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb").read_text())
        return "".join("".join(o.get("text", "")) for o in nb["cells"][2]["outputs"])
    # the checker's feedback is printed before the assert: the student reads why
    assert "Also right on 5 inputs chosen by the instructor" in printed("alice")
    assert "you left out the scale" in printed("bob")
    assert "flashlab.reference.attention_reference" in printed("carol")


def test_the_gpu_chapter_and_the_capstone_are_graded_assignments(tmp_path):
    """Issue 34: the gpu chapter's two exercises in one assignment (2 points), and the capstone
    graded with seeded hidden tests: the book's solution scores 5 of 5, a tile loop without the
    rescale 0."""
    import inspect

    from flashlab.exercises._capstone import TILE_LOOP_MISTAKES, tile_loop
    course = tmp_path / "course"
    assignments.write_course(course, seed=20261128)
    _nbgrader(course, "generate_assignment", "gpu", "--force")
    release = json.loads((course / "release" / "gpu" / "gpu.ipynb").read_text())
    ids = [c["metadata"]["nbgrader"]["grade_id"] for c in release["cells"] if c["metadata"]["nbgrader"]["grade"]]
    # each exercise followed by its graded variant (2 points)
    assert ids == ["forward_read_bytes-test", "window_read_bytes-test", "shared_bytes-test", "largest_block_q-test"]
    # a student who answers only the variant, right: 2 of the 6 points
    from flashlab.exercises._variants import window_read_bytes
    cell = next(i for i, c in enumerate(release["cells"])
                if c["metadata"]["nbgrader"]["grade_id"] == "window_read_bytes-answer")
    body = "".join(inspect.getsource(window_read_bytes).splitlines(True)[1:])
    sub = json.loads(json.dumps(release))
    sub["cells"][cell]["source"] = "".join(sub["cells"][cell]["source"]).replace(STUB, body.rstrip()).splitlines(True)
    (course / "submitted" / "frank" / "gpu").mkdir(parents=True)
    (course / "submitted" / "frank" / "gpu" / "gpu.ipynb").write_text(json.dumps(sub))
    _nbgrader(course, "autograde", "gpu", "--create", "--force")
    with nbgrader_api.Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assert gb.find_assignment("gpu").max_score == 6
        assert gb.find_submission("gpu", "frank").score == 2.0

    _nbgrader(course, "generate_assignment", "capstone", "--force")
    release = json.loads((course / "release" / "capstone" / "capstone.ipynb").read_text())
    answer = "".join(release["cells"][1]["source"])
    assert STUB in answer and "HIDDEN" not in "".join(release["cells"][2]["source"])
    # the student's own copy of the book's loop (with its switches), in the answer cell
    src = (f"TILE_LOOP_MISTAKES = {TILE_LOOP_MISTAKES!r}\n\n\n"
           + inspect.getsource(tile_loop).replace("def tile_loop(", "def _tile_loop(", 1))
    bodies = {"dana": f"    return _tile_loop(q, k, v, do, block_q, block_k, causal)\n\n\n{src}",
              "erin": f"    return _tile_loop(q, k, v, do, block_q, block_k, causal, 'no_rescale')\n\n\n{src}"}
    for student, body in bodies.items():
        sub = json.loads(json.dumps(release))
        sub["cells"][1]["source"] = answer.replace(STUB, body).splitlines(True)
        folder = course / "submitted" / student / "capstone"
        folder.mkdir(parents=True)
        (folder / "capstone.ipynb").write_text(json.dumps(sub))
    _nbgrader(course, "autograde", "capstone", "--create", "--force")
    with nbgrader_api.Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission("capstone", s).score for s in bodies}
        assert gb.find_assignment("capstone").max_score == 5
    assert scores == {"dana": 5.0, "erin": 0.0}
