"""Make the students' copy of the chapters: every answer removed, MyST turned into plain Markdown.

A teacher hands out the notebooks without answers and keeps the book (or the repository) as
the answer key. For each chapter notebook of ``_toc.yml`` this writes
``_build/handout/<chapter>.ipynb`` where

* the collapsed solution code cells (tagged ``hide-cell``) are removed, and with them every line
  that points at a removed solution ("Solution (click to expand):", "The simulation behind the
  solution (click to expand):");
* the solution admonitions of the markdown cells (``:::{admonition} Solution`` up to their
  closing ``:::``) are removed;
* the answers of the in-text questions are removed and the question kept
  (``:::{admonition} Question: <the question>`` keeps its title; an untitled ``Question`` keeps
  its text up to ``**Answer.**``);
* the MyST the book's HTML renders but JupyterLab and Colab show as raw text is converted to
  plain Markdown: the other admonitions become block quotes with a bold title, ``{doc}`` roles
  links to the other handouts (or the page's name, for a page that is not a notebook),
  ``{term}`` emphasis, ``{cite}`` the bibliography key in brackets, ``{func}``/``{data}`` code,
  ``{ref}`` its text, and ``(label)=`` lines are dropped;
* all outputs, execution counts, empty cells and the notebook's saved widget state
  (``metadata.widgets``) are removed, so students run every cell themselves;
* each exercise's starter cell (it raises ``NotImplementedError`` until the student writes the
  code) is tagged ``raises-exception``, so "Run All" and ``nbclient`` go on past it.

The exercise starter cells stay: they call the checkers of :mod:`flashlab.exercises`, which
tell a student whether the answer is right and, for the common mistakes, what is wrong. The
data the chapters read ships inside the package (:mod:`flashlab.data`), so a handout runs in any
folder where flashlab is installed. Usage: ``python tools/handout.py [--out _build/handout]``
(``make handout``).

**The launch folder.** The book's Colab and Binder buttons open ``<path_to_book>/<page>.ipynb``
in the repository (``_config.yml``: ``repository.path_to_book`` is ``handout``), so they open
the committed handout of the chapter, ``handout/book/<chapter>.ipynb``, never the book's
notebook (whose solutions a notebook interface shows as raw MyST). ``python tools/handout.py
--launch`` rewrites that folder from the chapters (every notebook of ``_toc.yml``, the API page
included, so that every page's button opens a file); ``tests/test_launch.py`` checks that it is
current: run it after changing a chapter.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the committed handouts the launch buttons open (``_config.yml``'s ``repository.path_to_book``)
LAUNCH = ROOT / "handout"
#: a line that only points at a solution cell removed from the handout
SOLUTION_POINTER = re.compile(r"^[^\n]*\bsolution\b[^\n]*\(click to expand\):[ \t]*\n?", re.I | re.M)
#: a MyST colon-fence admonition: its title, its options (":class: ..."), its body, its closing ':::'
ADMONITION = re.compile(r"^:::\{admonition\}[ \t]*(?P<title>[^\n]*)\n(?P<opts>(?::[a-z-]+:[^\n]*\n)*)"
                        r"(?P<body>.*?)^:::[ \t]*$\n?", re.S | re.M)
ROLE = re.compile(r"\{(?P<role>[a-z]+)\}`(?P<text>[^`]*)`")
LABEL_LINE = re.compile(r"^\([A-Za-z0-9_\-]+\)=[ \t]*\n", re.M)


def _admonition(m: re.Match) -> tuple[str, int]:
    """Plain Markdown for one admonition, and 1 if an answer was removed from it."""
    title, body = m.group("title").strip(), m.group("body").rstrip()
    if title == "Solution" or title.startswith("Solution "):
        return "", 1
    if title == "Question" or title.startswith("Question:"):
        question = title.partition(":")[2].strip()
        if not question:                     # untitled: the question is the body before its answer
            question = body.split("**Answer.**")[0].strip()
        return f"**Question.** {question}\n\n", 1
    quoted = "\n".join(f"> {line}" if line else ">" for line in body.splitlines())
    return f"> **{title}**\n>\n{quoted}\n", 0


def _role(m: re.Match, notebooks: set[str]) -> str:
    role, text = m.group("role"), m.group("text").replace("\n", " ")
    label, target = text, text
    if (lt := re.fullmatch(r"(.*?)\s*<([^>]+)>", text)):
        label, target = lt.group(1), lt.group(2)
    if role == "doc":
        name = target.rsplit("/", 1)[-1]
        return f"[{label}]({name}.ipynb)" if name in notebooks else f"*{label}* (a page of the book)"
    if role == "term":
        return f"*{label}*"
    if role == "cite":
        return "[" + ", ".join(k.strip() for k in text.split(",")) + "]"
    if role in ("func", "data", "class", "mod", "meth", "attr"):
        return f"`{label}`"
    return label                                 # ref, eq, ...: the text the reader sees


def to_markdown(source: str, notebooks: set[str]) -> tuple[str, int]:
    """A markdown cell's source in plain Markdown, without answers: ``(text, n_answers_removed)``."""
    removed = 0

    def admonition(m: re.Match) -> str:
        nonlocal removed
        text, n = _admonition(m)
        removed += n
        return text
    source = ADMONITION.sub(admonition, source)
    source, n = SOLUTION_POINTER.subn("", source)
    removed += n
    source = LABEL_LINE.sub("", source)
    source = ROLE.sub(lambda m: _role(m, notebooks), source)
    return source.strip() + "\n" if source.strip() else "", removed


def strip_solutions(nb: dict, notebooks: set[str] | None = None) -> tuple[dict, int]:
    """Return ``(handout, n_removed)``: ``nb`` without its answers, outputs, empty cells and
    widget state, its MyST as plain Markdown. ``notebooks``: the chapter names a ``{doc}`` link
    may point to (other handouts)."""
    notebooks = notebooks or set()
    cells, removed = [], 0
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "hide-cell" in cell["metadata"].get("tags", []):
            removed += 1
            continue
        metadata = {k: v for k, v in cell["metadata"].items() if k != "execution"}
        if cell["cell_type"] == "markdown":
            source, n = to_markdown(source, notebooks)
            removed += n
        if not source.strip():
            continue
        cell = {**cell, "source": source.splitlines(True), "metadata": metadata}
        if cell["cell_type"] == "code":
            cell.update(outputs=[], execution_count=None)
            if "raise NotImplementedError" in source:       # an exercise's starter cell
                tags = metadata.get("tags", [])
                metadata["tags"] = tags + ["raises-exception"] * ("raises-exception" not in tags)
        cells.append(cell)
    metadata = {k: v for k, v in nb["metadata"].items() if k != "widgets"}
    return {**nb, "metadata": metadata, "cells": cells}, removed


def chapters() -> list[Path]:
    """The chapter notebooks of ``_toc.yml`` that become handouts (not the API reference)."""
    from tools.colab_cell import chapter_notebooks
    return [p for p in chapter_notebooks() if p.stem != "api"]


def write_handouts(out: Path) -> list[Path]:
    """Write every chapter's handout into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    sources = chapters()
    names = {p.stem for p in sources}
    written = []
    for src in sources:
        handout, removed = strip_solutions(json.loads(src.read_text()), names)
        dest = out / src.name
        dest.write_text(json.dumps(handout, indent=1, ensure_ascii=False) + "\n")
        print(f"{src.name}: {removed} answers removed -> {dest}")
        written.append(dest)
    return written


def launch_handouts() -> dict[str, str]:
    """``path relative to the launch folder -> the handout's JSON text`` for every notebook of
    ``_toc.yml``: what ``handout/`` must hold."""
    from tools.colab_cell import chapter_notebooks
    sources = chapter_notebooks()
    names = {p.stem for p in sources}
    return {str(src.relative_to(ROOT)): json.dumps(strip_solutions(json.loads(src.read_text()), names)[0],
                                                   indent=1, ensure_ascii=False) + "\n"
            for src in sources}


def write_launch(out: Path = LAUNCH) -> list[Path]:
    """Rewrite the launch folder ``out`` (:func:`launch_handouts`), removing stale notebooks."""
    wanted = launch_handouts()
    for old in out.rglob("*.ipynb"):
        if str(old.relative_to(out)) not in wanted:
            old.unlink()
    written = []
    for rel, text in wanted.items():
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists() or dest.read_text() != text:
            dest.write_text(text)
        written.append(dest)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "handout")
    ap.add_argument("--launch", action="store_true",
                    help="rewrite the committed launch folder handout/ (what Colab and Binder open)")
    args = ap.parse_args(argv)
    if args.launch:
        for path in write_launch():
            print(f"launch handout: {path.relative_to(ROOT)}")
        return 0
    write_handouts(args.out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
