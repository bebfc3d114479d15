"""Export the book's coding exercises as an nbgrader course (``make assignments``).

Every chapter ends with its "Code it" exercises (one, or two in the gpu chapter): a markdown
statement, a starter cell that defines the function (``raise NotImplementedError``) and calls
its checker, and a collapsed solution cell. The exercises page adds the capstone (the whole
forward and backward tile loop, solved by :func:`flashlab.exercises._capstone.tile_loop`).
For each chapter this writes ``_build/assignments/source/<chapter>/<chapter>.ipynb`` (the
capstone: ``capstone``), an nbgrader *source* notebook with, for each of its exercises,

1. the statement (plain Markdown, as in the handouts), a locked cell;
2. ``import numpy as np`` and the function with the book's solution between
   ``### BEGIN SOLUTION`` / ``### END SOLUTION`` (nbgrader puts ``raise NotImplementedError()``
   there in the students' version), the cell students answer in;
3. an autograded test cell (1 point; the capstone 5) that calls :func:`flashlab.exercises.grading.grade`, prints
   the checker's feedback and then asserts it. Between ``### BEGIN HIDDEN TESTS`` / ``### END
   HIDDEN TESTS`` (removed from the students' version) it grades again against the book's
   solution on inputs drawn from the instructor's seed (``--seed``, default: a fresh random one,
   written into the hidden tests; keep your source notebooks private).

After each chapter exercise comes its *graded variant* (:mod:`flashlab.exercises._variants`):
a harder, related task stated without its formula, with the same three cells; its test
(2 points) runs :func:`flashlab.exercises.grading.grade_variant` on example inputs, and its
hidden tests on inputs drawn from the instructor's seed. An instructor who wants only one of
the two deletes the other's cells from the source notebook before ``generate_assignment``.

A solution that calls flashlab's own reference or kernels fails with a message saying so
(:func:`flashlab.exercises.grading.grade`). The course folder gets an ``nbgrader_config.py``;
then, from that folder: ``nbgrader generate_assignment <chapter>``, hand out ``release/``,
collect into ``submitted/<student>/<chapter>/``, ``nbgrader autograde <chapter>``.
nbgrader is optional and pinned in ``requirements-grading.txt`` (``make assignments``
installs it). Usage: ``python tools/assignments.py [--out _build/assignments] [--seed N]``.
"""
from __future__ import annotations

import argparse
import ast
import json
import secrets
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


CAPSTONE = "capstone"       # the capstone's assignment name (its statement: book/exercises.md)


@dataclass(frozen=True)
class Exercise:
    chapter: str          # the notebook's stem, also the assignment's name
    name: str             # the function the student writes (a key of grading.CHECKERS)
    statement: str        # plain Markdown
    signature: str        # "def f(...):" with its docstring, as the starter has it
    solution_body: str    # the book's solution, the function's body only (indented)
    solution: str         # the whole solution function
    imports: str = "import numpy as np"    # what the answer cell imports
    points: int = 1


def _function(source: str, name: str | None = None) -> ast.FunctionDef:
    tree = ast.parse(source)
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and (name is None or n.name == name)]
    if not funcs:
        raise LookupError(f"no function {name or ''} in the cell")
    return funcs[0]


def _lines(source: str, node: ast.AST, start: int | None = None, end: int | None = None) -> str:
    lines = source.splitlines()
    return "\n".join(lines[(start or node.lineno) - 1:(end or node.end_lineno)])


def exercises() -> list[Exercise]:
    """The "Code it" exercise of every chapter, read from the book's notebooks."""
    from tools.colab_cell import chapter_notebooks
    from tools.handout import to_markdown
    found = []
    notebooks = chapter_notebooks()
    names = {p.stem for p in notebooks}
    for path in notebooks:
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or "raise NotImplementedError" not in src:
                continue
            starter = _function(src)
            statement = next("".join(c["source"]) for c in reversed(cells[:i]) if c["cell_type"] == "markdown")
            sol_src = next("".join(c["source"]) for c in cells[i + 1:]
                           if "hide-cell" in c["metadata"].get("tags", []))
            sol = _function(sol_src, starter.name)
            doc_end = starter.body[0].end_lineno if isinstance(starter.body[0], ast.Expr) else starter.lineno
            signature = _lines(src, starter, end=doc_end)
            start, lines = sol.body[0].lineno, sol_src.splitlines()
            while start - 1 > sol.lineno and lines[start - 2].strip().startswith("#"):
                start -= 1                     # the comment above the first statement belongs to it
            body = _lines(sol_src, sol, start=start)
            # the solution's own signature has no type hints: the body keeps its indentation
            found.append(Exercise(path.stem, starter.name, to_markdown(statement, names)[0], signature,
                                  body, _lines(sol_src, sol)))
    return found + [capstone(names)]



def solutions() -> dict:
    """exercise name -> the book's solution function, taken from the chapter's solution cell."""
    out = {}
    for ex in exercises():
        scope: dict = {}
        exec(f"{ex.imports}\n{ex.solution}", scope)  # noqa: S102 (the book's own solution)
        out[ex.name] = scope[ex.name]
    return out

def capstone(names: set[str] | None = None) -> Exercise:
    """The capstone of ``book/exercises.md``: its statement and signature from the page, its
    solution :func:`~flashlab.exercises._capstone.tile_loop` with no mistake planted."""
    import inspect

    from flashlab.exercises._capstone import tile_loop
    from tools.handout import to_markdown
    text = (ROOT / "book" / "exercises.md").read_text()
    section = text.split("## Capstone", 1)[1].split("\n## ", 1)[0]
    statement = section.split("\n", 1)[1].split("```python\nfrom flashlab.exercises")[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    starter = _function(code, "flash_tile_loop")
    signature = _lines(code, starter, end=starter.body[0].end_lineno)
    statement = statement.replace(f"```python\n{signature}\n```", "(the signature is in the cell below)")
    src = inspect.getsource(tile_loop)
    fn = _function(src, "tile_loop")
    # tile_loop's body, its docstring and argument check left out, with no mistake planted
    body = "    mistake = None  # the book's solution: flashlab.exercises._capstone.tile_loop, no slip planted\n" \
        + _lines(src, fn, start=fn.body[2].lineno)
    solution = f"{signature}\n{body}\n"
    return Exercise(CAPSTONE, "flash_tile_loop", to_markdown(statement, names or set())[0].strip() + "\n",
                    signature, body, solution, imports="import math\n\nimport numpy as np", points=5)


def _meta(grade_id: str, *, solution: bool = False, grade: bool = False, locked: bool = True,
          points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _cell(kind: str, source: str, metadata: dict) -> dict:
    cell = {"cell_type": kind, "metadata": metadata, "source": source.rstrip("\n").splitlines(True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def exercise_cells(ex: Exercise, seed: int) -> list[dict]:
    """The three cells of one exercise: its statement, the answer cell, the autograded test."""
    answer = f"{ex.imports}\n\n\n{ex.signature}\n    {BEGIN}\n{ex.solution_body}\n    {END}\n"
    reference = ex.solution.replace(f"def {ex.name}(", f"def _reference_{ex.name}(", 1)
    test = (f"from flashlab.exercises.grading import grade\n\n"
            f"# the book's checker; a function that calls flashlab's own code fails\n"
            f"feedback = grade({ex.name!r}, {ex.name})\n"
            f"print(feedback)\n"
            f"assert feedback.passed, feedback.message\n"
            f"### BEGIN HIDDEN TESTS\n"
            f"# the instructor's inputs: drawn from this seed, compared with the book's solution\n"
            f"{ex.imports}\n\n\n"
            f"{reference}\n\n\n"
            f"feedback = grade({ex.name!r}, {ex.name}, reference=_reference_{ex.name}, seed={seed})\n"
            f"print(feedback)\n"
            f"assert feedback.passed, feedback.message\n"
            f"### END HIDDEN TESTS\n")
    title = "the capstone" if ex.chapter == CAPSTONE else ex.chapter
    return [
        _cell("markdown", f"# {title}: `{ex.name}`\n\n{ex.statement}", _meta(f"{ex.name}-statement")),
        _cell("code", answer, _meta(f"{ex.name}-answer", solution=True, locked=False)),
        _cell("code", test, _meta(f"{ex.name}-test", grade=True, points=ex.points)),
    ]


def variant_cells(ex: Exercise, seed: int) -> list[dict]:
    """The three cells of the graded variant of ``ex`` (:data:`flashlab.exercises._variants.VARIANTS`):
    its statement, the answer cell (the variant's reference as the solution), the test (2 points)."""
    import inspect

    from flashlab.exercises._variants import VARIANTS
    v = VARIANTS[ex.name]
    src = inspect.getsource(v.reference)
    fn = _function(src, v.name)
    start, lines = fn.body[0].lineno, src.splitlines()
    while start - 1 > fn.lineno and lines[start - 2].strip().startswith("#"):
        start -= 1                             # the comment above the first statement belongs to it
    answer = f"import numpy as np\n\n\n{v.signature}\n    {BEGIN}\n{_lines(src, fn, start=start)}\n    {END}\n"
    test = (f"from flashlab.exercises.grading import grade_variant\n\n"
            f"# a few example inputs, compared with the reference; a function that calls flashlab fails\n"
            f"feedback = grade_variant({v.name!r}, {v.name})\n"
            f"print(feedback)\n"
            f"assert feedback.passed, feedback.message\n"
            f"### BEGIN HIDDEN TESTS\n"
            f"# the instructor's inputs, drawn from this seed\n"
            f"feedback = grade_variant({v.name!r}, {v.name}, seed={seed}, trials=10)\n"
            f"print(feedback)\n"
            f"assert feedback.passed, feedback.message\n"
            f"### END HIDDEN TESTS\n")
    return [
        _cell("markdown", f"## Graded variant: `{v.name}`\n\n{v.statement}", _meta(f"{v.name}-statement")),
        _cell("code", answer, _meta(f"{v.name}-answer", solution=True, locked=False)),
        _cell("code", test, _meta(f"{v.name}-test", grade=True, points=2)),
    ]


def source_notebook(exs: list[Exercise], seed: int) -> dict:
    """The nbgrader source notebook of one assignment: the cells of each of its exercises, each
    followed by its graded variant (the capstone has none: it is the hard one)."""
    cells = [cell for ex in exs for cell in exercise_cells(ex, seed)
             + (variant_cells(ex, seed) if ex.chapter != CAPSTONE else [])]
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}}}


def assignments() -> dict[str, list[Exercise]]:
    """assignment name (the chapter, or ``capstone``) -> its exercises, in the book's order."""
    out: dict[str, list[Exercise]] = {}
    for ex in exercises():
        out.setdefault(ex.chapter, []).append(ex)
    return out


CONFIG = '''# nbgrader configuration of the flashlab course (written by tools/assignments.py)
c = get_config()  # noqa: F821 (nbgrader's config loader defines it)
c.CourseDirectory.course_id = "flashlab"
# every chapter's exercises are one assignment, named after the chapter; the capstone is "capstone"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"
# each test cell prints the checker's feedback before asserting: a student's error shows it
c.ExecutePreprocessor.timeout = 300
'''


def write_course(out: Path, seed: int | None = None) -> list[Path]:
    """Write the nbgrader course (config + one source assignment per exercise) into ``out``."""
    seed = secrets.randbelow(2**31) if seed is None else seed
    out.mkdir(parents=True, exist_ok=True)
    (out / "nbgrader_config.py").write_text(CONFIG)
    written = []
    for name, exs in assignments().items():
        folder = out / "source" / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.ipynb"
        path.write_text(json.dumps(source_notebook(exs, seed), indent=1, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "assignments")
    ap.add_argument("--seed", type=int, default=None,
                    help="the instructor's seed of the hidden inputs (default: a random one)")
    args = ap.parse_args(argv)
    for path in write_course(args.out, args.seed):
        print(f"wrote {path.relative_to(args.out)}")
    print(textwrap.dedent(f"""\
        course in {args.out}: cd there, then
          nbgrader generate_assignment <chapter>     # students' copy in release/<chapter>/
          nbgrader autograde <chapter>               # after collecting into submitted/<student>/<chapter>/"""))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
