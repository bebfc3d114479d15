"""Measure how long each chapter's cells take on a cold and on a warm Numba cache.

A student who opens a chapter first waits while Numba compiles flashlab's kernels. This runs
every chapter notebook of ``_toc.yml`` twice, each time alone in a fresh kernel: first with
``NUMBA_CACHE_DIR`` pointing at an empty temporary folder (**cold**: every kernel the chapter
calls is compiled), then again with the same folder (**warm**: every kernel is loaded). Each
cell's time is nbclient's execution record (``iopub.execute_input`` to ``shell.execute_reply``).
The result, with the machine's description (CPU count, load average, the BLAS kernels
OpenBLAS chose), goes to ``flashlab/data/compile_times.json``: the instructor guide quotes it
and ``tests/test_notices.py`` checks that every cell above :data:`NOTICE_SECONDS` on a cold
cache has the book's one-line notice before it.

Usage: ``python tools/compile_times.py [notebook stems...]`` (default: every chapter). Slow:
each chapter compiles its kernels from nothing. ``--notices [stems...]`` measures nothing: it
writes (or refreshes, or removes) the one-line notice cell before every cell whose compile time
(cold minus warm) exceeds :data:`NOTICE_SECONDS`, from the committed measurements.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "flashlab" / "data" / "compile_times.json"
#: a cell slower than this on a cold cache gets a notice before it (issue 34 point 2)
NOTICE_SECONDS = 5.0


def compiling(chapter: dict) -> list[dict]:
    """The cells of one chapter's measurement that wait on Numba: cold minus warm above
    :data:`NOTICE_SECONDS`."""
    return [c for c in chapter["cells"] if c["seconds"] - c["warm_seconds"] > NOTICE_SECONDS]


def notice(seconds: float) -> str:
    """The notice before a cell that took ``seconds`` on a cold cache (rounded to 5 s)."""
    about = max(5, 5 * round(seconds / 5))
    return (f"*The first run compiles the kernels: about {about} s (measured on a 2-core machine); "
            "later runs load them from Numba's cache.*")


def notice_id(cell_id: str) -> str:
    return f"compile-notice-{cell_id}"


def write_notices(path: Path, chapter: dict) -> bool:
    """Insert, refresh or remove the notice cells of ``path``; True if the file changed."""
    nb = json.loads(path.read_text())
    wanted = {c["id"]: notice(c["seconds"]) for c in compiling(chapter)}
    cells, changed = [], False
    for cell in nb["cells"]:
        if cell.get("id", "").startswith("compile-notice-"):
            continue                                     # re-made below, before its cell
        if cell.get("id") in wanted:
            cells.append({"cell_type": "markdown", "id": notice_id(cell["id"]), "metadata": {},
                          "source": [wanted[cell["id"]]]})
        cells.append(cell)
    changed = cells != nb["cells"]
    if changed:
        nb["cells"] = cells
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


def _seconds(cell: dict) -> float:
    rec = cell.get("metadata", {}).get("execution", {})
    start, end = rec.get("iopub.execute_input"), rec.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = lambda s: dt.datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def run(path: Path, cache: str) -> list[dict]:
    """Execute ``path`` in a fresh kernel with ``NUMBA_CACHE_DIR=cache``: one row per code cell."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    os.environ["NUMBA_CACHE_DIR"] = cache
    os.environ["PYTHONPATH"] = str(ROOT)
    NotebookClient(nb, timeout=1800, kernel_name="python3", record_timing=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return [{"cell": i, "id": c.get("id"), "first_line": "".join(c["source"]).splitlines()[0] if c["source"] else "",
             "seconds": round(_seconds(c), 2)}
            for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def _blas() -> str:
    try:
        from threadpoolctl import threadpool_info
        return "; ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})"
                         for i in threadpool_info() if i.get("user_api") == "blas")
    except ImportError:                                   # threadpoolctl is optional
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    from tools.colab_cell import chapter_notebooks
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stems", nargs="*")
    ap.add_argument("--notices", action="store_true", help="write the notices from the measurements")
    args = ap.parse_args(argv)
    paths = [p for p in chapter_notebooks() if not args.stems or p.stem in args.stems]
    if args.notices:
        chapters = json.loads(OUT.read_text())["chapters"]
        for path in paths:
            if path.stem in chapters and write_notices(path, chapters[path.stem]):
                print(f"notices written: {path.relative_to(ROOT)}")
        return 0
    data = json.loads(OUT.read_text()) if OUT.exists() else {"chapters": {}}
    import numpy as np  # noqa: F401  (loads OpenBLAS, so that threadpoolctl can name its kernels)
    data["machine"] = {"cpus": os.cpu_count(), "processor": platform.machine(), "blas": _blas(),
                       "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "(OpenBLAS's own choice)")}
    data["notice_seconds"] = NOTICE_SECONDS
    for path in paths:
        with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
            load0 = os.getloadavg()[0]
            cold = run(path, cache)
            warm = run(path, cache)
            load1 = os.getloadavg()[0]
        data["chapters"][path.stem] = {
            "measured": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average": [round(load0, 1), round(load1, 1)],
            "cold_total": round(sum(c["seconds"] for c in cold), 1),
            "warm_total": round(sum(c["seconds"] for c in warm), 1),
            "cells": [{**c, "warm_seconds": w["seconds"]} for c, w in zip(cold, warm)]}
        print(f"{path.stem}: cold {data['chapters'][path.stem]['cold_total']} s, "
              f"warm {data['chapters'][path.stem]['warm_total']} s", flush=True)
        OUT.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
