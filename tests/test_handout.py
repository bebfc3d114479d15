"""tools/handout.py: the students' copy hides every answer and reads as plain Markdown (issue
#25 point 3, #20 point 4). Executing every handout where it is written is in tests/test_wheel.py
(against a wheel install, from a folder outside the repository)."""
from __future__ import annotations

import json

import pytest

from tools import handout

#: what a handout must not contain: answers, pointers at removed solutions, raw MyST
LEAKS = (":::", "{doc}`", "{term}`", "{cite}`", "{func}`", "{ref}`", "{data}`", ":class:",
         "**Answer.**", "click to expand", "admonition} Solution")


def _md(text: str, tags: list[str] | None = None) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(True)}


def _code(text: str, tags: list[str] | None = None) -> dict:
    return {"cell_type": "code", "metadata": {"tags": tags or [], "execution": {"x": 1}},
            "execution_count": 3, "outputs": [{"output_type": "stream", "text": "7\n"}],
            "source": text.splitlines(True)}


NB = {"metadata": {"kernelspec": {"name": "python3"}, "widgets": {"state": {"a": 1}}}, "nbformat": 4,
      "nbformat_minor": 5, "cells": [
          _md("(sec-a)=\n## A\n\nSee {doc}`masks`, {doc}`the list <glossary>`, {term}`LSE`, "
              "{cite}`dao2022flashattention`, {func}`flashlab.api.flash_attention` and "
              "{ref}`the ceiling <blas-ceiling>`."),
          _md(":::{admonition} Learning goals\n:class: tip\nYou can\n\n- tile\n:::\n"),
          _md("Text.\n\n:::{admonition} Question: why tiles?\n:class: dropdown\nBECAUSE-1.\n:::\n"),
          _md(":::{admonition} Question\n:class: dropdown\nWhat is 2+2?\n\n**Answer.** BECAUSE-2.\n:::"),
          _md("**1. Derive** x.\n\n:::{admonition} Solution\n:class: dropdown\nBECAUSE-3.\n:::\n"),
          _code("def f():\n    raise NotImplementedError('write f')\n\ncheck(f)\n"),
          _md("Solution (click to expand):"),
          _code("def f():\n    return 'BECAUSE-4'\n", tags=["hide-cell"]),
          _md("The simulation behind the solution (click to expand):\n"),
          _code("print('BECAUSE-5')", tags=["hide-cell"]),
          _md("   \n"),
          _code(""),
      ]}


def test_every_answer_is_removed_and_the_questions_kept():
    out, removed = handout.strip_solutions(json.loads(json.dumps(NB)), {"masks"})
    text = json.dumps(out)
    assert "BECAUSE" not in text
    assert removed == 7       # 2 question answers, 1 solution admonition, 2 cells, 2 pointer lines
    md = "\n".join("".join(c["source"]) for c in out["cells"] if c["cell_type"] == "markdown")
    assert "**Question.** why tiles?" in md and "**Question.** What is 2+2?" in md
    assert "**1. Derive** x." in md
    assert not any(leak in md for leak in LEAKS), md


def test_myst_becomes_plain_markdown():
    out, _ = handout.strip_solutions(json.loads(json.dumps(NB)), {"masks"})
    first = "".join(out["cells"][0]["source"])
    assert first.startswith("## A")                                   # the (label)= line is gone
    assert "[masks](masks.ipynb)" in first                            # another handout: a link
    assert "*the list* (a page of the book)" in first                 # not a notebook: its name
    assert "*LSE*" in first and "[dao2022flashattention]" in first
    assert "`flashlab.api.flash_attention`" in first and "the ceiling" in first
    assert "".join(out["cells"][1]["source"]).startswith("> **Learning goals**\n>\n> You can\n")


def test_outputs_widget_state_and_empty_cells_are_gone_and_starters_may_raise():
    out, _ = handout.strip_solutions(json.loads(json.dumps(NB)), set())
    assert "widgets" not in out["metadata"] and out["metadata"]["kernelspec"]
    assert all("".join(c["source"]).strip() for c in out["cells"])
    code = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert len(code) == 1
    assert code[0]["outputs"] == [] and code[0]["execution_count"] is None
    assert "execution" not in code[0]["metadata"]
    assert code[0]["metadata"]["tags"] == ["raises-exception"]


@pytest.fixture(scope="module")
def handouts(tmp_path_factory):
    out = tmp_path_factory.mktemp("handout")
    return handout.write_handouts(out)


def test_every_chapter_handout_hides_its_answers(handouts):
    assert len(handouts) == len(handout.chapters()) >= 12
    for path in handouts:
        nb = json.loads(path.read_text())
        assert "widgets" not in nb["metadata"], path.name
        md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        leaks = [leak for leak in LEAKS if leak in md]
        assert not leaks, f"{path.name}: {leaks}"
        assert all("hide-cell" not in c["metadata"].get("tags", []) for c in nb["cells"]), path.name
        assert all("".join(c["source"]).strip() for c in nb["cells"]), path.name
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), path.name


def test_the_book_questions_are_all_kept(handouts):
    """25 in-text questions in the book (issue #25) and the 11 guided questions of the four
    explorers (issue 33): each survives as a question, answerless."""
    n = sum("".join(c["source"]).count("**Question.**")
            for p in handouts for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "markdown")
    assert n == 25 + 12
