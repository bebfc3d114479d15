"""flashlab installed as a wheel, not editable, into a fresh venv (issue #21 point 1, #25 point 2).

Slow, so behind the ``wheel`` marker (pyproject.toml): plain ``pytest`` and ``make test`` leave
these out, ``make test-wheel`` (``pytest -m wheel``) runs them, as CI does in a step of its own.

One venv for the module (built once from pip's cache): ``requirements-student.txt`` (what a
student installs: it must be enough to run every chapter) and the wheel ``pip wheel .`` builds,
with ``--no-deps``. Then, each from a folder outside the repository:

* ``tests/wheel/smoke.py``: every function of ``flashlab.__all__``, the vendor tables and the
  package data, the explorers' static rendering;
* every notebook of the book, each copied alone into an empty folder, and every handout
  (``tools/handout.py``) where it is written: all of them by one ``tests/wheel/run_notebooks.py``,
  with the one venv's Python, as many kernels at a time as there are CPUs.

Numba compiles once: the kernels are cached beside the installed package (site-packages of the
venv is writable); the smoke test compiles them, the notebooks and handouts load them.
Each phase prints its wall time (``pytest -s`` shows them).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import handout

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent / "wheel"

pytestmark = pytest.mark.wheel


def _run(cmd: list, cwd: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NUMBA_CACHE_DIR")}
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    start = time.perf_counter()
    work = tmp_path_factory.mktemp("wheel")
    # built from a copy of what the wheel is made of, so that setuptools' build/ stays out of the tree
    src = work / "src"
    shutil.copytree(ROOT / "flashlab", src / "flashlab", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-TEXT"):
        shutil.copy(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", work / "dist", src], cwd=work)
    (wheel,) = (work / "dist").glob("flashlab-*.whl")
    _run([sys.executable, "-m", "venv", work / "venv"], cwd=work)
    python = work / "venv" / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", "-r", ROOT / "requirements-student.txt"], cwd=work)
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", wheel], cwd=work)
    print(f"\nwheel venv ready in {time.perf_counter() - start:.0f} s")
    return python


def test_wheel_ships_the_data_and_licences(venv_python):
    out = _run([venv_python, "-c", "import importlib.metadata as m, flashlab.data as d; "
                "print(m.version('flashlab'), m.metadata('flashlab')['License-Expression'], "
                "sorted(f.name for f in m.files('flashlab') if 'licenses' in str(f)), d.names())"],
               cwd=venv_python.parent)
    import flashlab
    assert out.stdout.split()[:2] == [flashlab.__version__, "MIT"]
    assert "LICENSE-TEXT" in out.stdout and "train_tiny.json" in out.stdout


def test_smoke_from_an_empty_folder(venv_python, tmp_path):
    start = time.perf_counter()
    out = _run([venv_python, HERE / "smoke.py"], cwd=tmp_path)
    print(f"smoke (with the cold Numba compile) in {time.perf_counter() - start:.0f} s")
    # every check smoke.py lists printed its "ok" line, and the count it prints says as many
    oks = [line for line in out.stdout.splitlines() if line.startswith("ok ")]
    assert len(oks) >= 10 and f"smoke: {len(oks)} checks passed" in out.stdout, out.stdout


def test_every_notebook_and_handout_runs(venv_python, tmp_path):
    """The chapters, each alone in an empty folder, and the handouts, where tools/handout.py
    writes them: one run_notebooks.py, one venv."""
    start = time.perf_counter()
    chapters = sorted((ROOT / "book").glob("*.ipynb"))
    copies = []
    for nb in chapters:
        folder = tmp_path / "chapters" / nb.stem
        folder.mkdir(parents=True)
        copies.append(Path(shutil.copy(nb, folder)))
    handouts = handout.write_handouts(tmp_path / "handout")
    assert chapters and handouts
    out = _run([venv_python, HERE / "run_notebooks.py", *copies, *handouts], cwd=tmp_path)
    print(out.stdout)
    names = [line.partition(" ")[0] for line in out.stdout.splitlines()]   # "<folder>/<name> <seconds>"
    ran = [name for name in names if name.endswith(".ipynb")]
    assert sorted(ran) == sorted([f"{p.parent.name}/{p.name}" for p in copies + handouts])
    print(f"notebooks and handouts in {time.perf_counter() - start:.0f} s")
