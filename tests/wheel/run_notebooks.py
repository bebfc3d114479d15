"""Execute notebooks where they lie, with nbclient, in this Python's kernel (the wheel venv's).

Usage: python run_notebooks.py [--jobs N] NOTEBOOK...  Each runs top to bottom with its own
folder as the working directory, in its own kernel; ``--jobs`` of them at a time (default: the
CPU count), all with this one Python. A cell tagged ``raises-exception`` (a handout's exercise
starter) may raise. Prints "<folder>/<name> <seconds>" per notebook as it finishes and the wall time at
the end; exits 1 naming every failing notebook and its failing cell.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path


def execute(path: Path) -> tuple[str, float, str | None]:
    """Run one notebook in place; ``(name, seconds, None or the failing cell's error)``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    error = None
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except CellExecutionError as exc:
        error = str(exc)[-1500:]
    nbformat.write(nb, path)
    return f"{path.parent.name}/{path.name}", time.perf_counter() - start, error


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="notebooks run at a time")
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    start = time.perf_counter()
    failed = []
    # spawn: each worker is a fresh interpreter (no zmq state inherited by a fork)
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(execute, p.resolve()) for p in args.notebooks]
        for future in as_completed(futures):
            name, seconds, error = future.result()
            print(f"{name} {seconds:.1f}", flush=True)
            if error is not None:
                failed.append(f"{name}: {error}")
    print(f"{len(args.notebooks)} notebooks in {time.perf_counter() - start:.0f} s, {args.jobs} at a time")
    if failed:
        print("\n".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
