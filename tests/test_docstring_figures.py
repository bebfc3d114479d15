"""Docstrings state behaviour; measured figures live in committed data or the book.

A timing, a throughput or a measured speed ratio written into a docstring (or a ``#:`` comment,
which autodoc renders as one) goes stale the day the code or the machine changes, and nothing
would notice. Such figures belong in ``flashlab/data`` (benchmark runs) or in the book
(``book/design_measurements.md`` records the ones that chose a default). This test reads every
docstring and ``#:`` comment of the package and fails on the patterns of a measured figure:

- a number with a unit of time or rate (``0.21 ms``, ``~5 us``, ``4-6 s``, ``129 GFLOP/s``);
- a decimal speed ratio (``1.07x``, ``0.95-0.98x``);
- the word "measured" followed by a number in the same sentence, or "on this machine".

The rule is narrow on purpose (a dimension ``128 x 256`` or an integer ratio is not matched).
:data:`EXCEPTIONS` lists the figures that are not measurements, each with its reason.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flashlab"

UNIT = r"(?:ns|us|µs|ms|s|seconds|GFLOP/s|TFLOP/s|Gexp/s|MB/s|GB/s)"
#: the patterns of a measured figure (module docstring)
FIGURE = re.compile(rf"~?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?{UNIT}(?![\w/])"
                    r"|\b\d+\.\d+(?:-\d+\.\d+)?x\b"
                    r"|\bmeasured\b[^.]*\d"
                    r"|\bon this (?:2-core )?machine\b")

#: (module path, text of the line) -> why the figures on the lines of that module holding that
#: text are not measurements
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("flashlab/bench/__init__.py", "1 s"): "a parameter: the suite's settle_seconds default",
    ("flashlab/bench/__init__.py", "1.1x"): "a target of the benchmark, not a result",
    ("flashlab/bench/__init__.py", "1.2x"): "targets of the benchmark (1.2x, 0.55x), not results",
    ("flashlab/bench/__init__.py", "1.5x"): "a target of the benchmark, not a result",
    ("flashlab/bench/__init__.py", "0.1 s"): "a target of the explorers, not a result",
    ("flashlab/bench/config.py", "1 s"): "a parameter: the settle pause of make bench",
    ("flashlab/bench/measure.py", "1 s"): "a parameter: the settle pause of the full suite",
    ("flashlab/bench/overhead.py", "0.25 ms"): "targets of issue 22 (0.25 ms, 1.2x SDPA), not results",
    ("flashlab/bench/overhead.py", "150 ms"): "a target of issue 22, not a result",
    ("flashlab/flops.py", "2.5x"): "derived: (3 + 2) / (1 + 1) products at equal head dims",
    ("flashlab/gpu/bench.py", "2.5x"): "derived: the backward's five products against two",
    ("flashlab/kernels/backward.py", "2.5x"): "derived: the backward's five products against two",
    ("flashlab/ledgers.py", "1.5x"): "an example of how a factor reads",
    ("flashlab/gpu/bench.py", "312 TFLOP/s"): "published: NVIDIA's A100 bf16 peak (SMs x clock x rate)",
    ("flashlab/pipeline/profiles.py", "2039 GB/s"): "published: the A100 80GB that a cited article quotes",
    ("flashlab/vendor.py", "2.89x"): "published: a vendor figure with its citation",
    ("flashlab/pipeline/calibrated.py", "measured 3262.6 µs"): "published: the vendor's measured 910B2 time, "
                                                               "the model's one calibration point",
    ("flashlab/pipeline/calibrated.py", "measured 910B2"): "published: the same calibration point",
    ("flashlab/rect.py", "measured 910B2"): "published: the same calibration point",
}


def documentation(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring line and ``#:`` comment of one module."""
    src = path.read_text()
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and isinstance(node.body[0], ast.Expr):
                out += [(node.body[0].lineno + i, line) for i, line in enumerate(doc.splitlines())]
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT and tok.string.startswith("#:"):
            out.append((tok.start[0], tok.string))
    return out


def figures(path: Path) -> list[tuple[int, str, str]]:
    """``(line, matched figure, the line)`` of every measured-figure pattern in ``path``."""
    return [(n, m.group(0), line.strip()) for n, line in documentation(path)
            for m in FIGURE.finditer(line)]


def test_no_measured_figure_in_a_docstring():
    found = []
    used = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for n, figure, line in figures(path):
            excused = {k for k in EXCEPTIONS if k[0] == rel and k[1] in line}
            used |= excused
            if not excused:
                found.append(f"{rel}:{n}: {figure!r} in: {line}")
    assert not found, ("measured figures in docstrings (move them to the book's "
                       "design_measurements page or to committed data):\n" + "\n".join(found))
    assert used == set(EXCEPTIONS), f"exceptions that match nothing any more: {set(EXCEPTIONS) - used}"


@pytest.mark.parametrize("text", [
    "decode 0.21 ms vs tiled forward 1.6 ms", "(~5 us of the step)", "compiling for 4-6 s per kernel",
    "ran at 129 GFLOP/s", "512x256 1.02-1.07x", "measured at Sk=131072", "fastest measured on this machine",
])
def test_the_rule_catches_a_measured_figure(text):
    assert FIGURE.search(text)


@pytest.mark.parametrize("text", [
    "a 128 x 256 tile", "(B, H, S, D) float32", "2 P (d_qk + d_v) FLOPs", "measured ledger",
    "the time in seconds", "3 x 4 tiles",
])
def test_the_rule_leaves_behaviour_alone(text):
    assert not FIGURE.search(text)
