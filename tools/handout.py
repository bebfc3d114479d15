"""Make the students' copy of the chapters: every solution removed, every output cleared.

A teacher hands out the notebooks without answers and keeps the book (or the repository) as
the answer key. For each chapter notebook of ``_toc.yml`` this writes
``_build/handout/<chapter>.ipynb`` where

* the collapsed solution code cells (tagged ``hide-cell``, after the line
  "Solution (click to expand):") are removed, and that line with them;
* the solution admonitions of the markdown cells (``:::{admonition} Solution`` with
  ``:class: dropdown``, up to their closing ``:::``) are removed;
* all outputs and execution counts are cleared, so students run every cell themselves.

The exercise starter cells stay: they call the checkers of :mod:`flashlab.exercises`, which
tell a student whether the answer is right and, for the common mistakes, what is wrong.
Usage: ``python tools/handout.py [--out _build/handout]`` (``make handout``).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLUTION_LINE = "Solution (click to expand):"
# a MyST colon-fence admonition titled "Solution", up to the ':::' line that closes it
SOLUTION_ADMONITION = re.compile(r"\n?:::\{admonition\} Solution[^\n]*\n.*?\n:::[ \t]*(?=\n|$)", re.S)


def strip_solutions(nb: dict) -> tuple[dict, int]:
    """Return ``(handout, n_removed)``: ``nb`` without its solutions and outputs."""
    cells, removed = [], 0
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "hide-cell" in cell["metadata"].get("tags", []):
            removed += 1
            continue
        if cell["cell_type"] == "markdown":
            source, n = SOLUTION_ADMONITION.subn("", source)
            removed += n
            source = source.replace(SOLUTION_LINE, "").rstrip() + "\n"
        cell = {**cell, "source": source.splitlines(True)}
        if cell["cell_type"] == "code":
            cell.update(outputs=[], execution_count=None)
            cell["metadata"] = {k: v for k, v in cell["metadata"].items() if k != "execution"}
        cells.append(cell)
    return {**nb, "cells": cells}, removed


def main(argv: list[str] | None = None) -> int:
    from tools.check_site import toc_pages
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "handout")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for page in toc_pages(ROOT / "_toc.yml"):
        src = ROOT / f"{page}.ipynb"
        if not src.exists() or page.endswith("api"):
            continue
        handout, removed = strip_solutions(json.loads(src.read_text()))
        (args.out / src.name).write_text(json.dumps(handout, indent=1, ensure_ascii=False) + "\n")
        print(f"{src.name}: {removed} solutions removed -> {args.out / src.name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
