"""Execute notebooks where they lie, with nbclient, in this Python's kernel (the wheel venv's).

Usage: python run_notebooks.py NOTEBOOK...  Each runs top to bottom with its own folder as the
working directory; a cell tagged ``raises-exception`` (a handout's exercise starter) may raise.
Prints "<name> <seconds>" per notebook; exits 1 naming the first failing cell.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

failed = []
for arg in sys.argv[1:]:
    path = Path(arg).resolve()
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except CellExecutionError as exc:
        failed.append(f"{path.name}: {str(exc)[-1500:]}")
    print(f"{path.name} {time.perf_counter() - start:.1f}", flush=True)
    nbformat.write(nb, path)
if failed:
    print("\n".join(failed))
    sys.exit(1)
