"""The data the book reads, shipped inside the package: committed benchmark runs and curves.

Each file records the command that wrote it, its date, machine and versions:

=========================  ==========================================================================
``bench.json``             ``python -m flashlab.bench --no-mla --no-decode --naive-max-n 8192``
``bench_mla.json``         ``python -m flashlab.bench --mla-only --mla-sizes S`` for S = 1024 and 4096 (one
                           thread's CPU time, ``OPENBLAS_CORETYPE`` unset), joined with ``--merge``
``bench_fused_cpu.json``   ``python -m flashlab.bench --fused-only`` (numpy naive and flashlab's forward at
                           N = 4096: the fused vendor rows' CPU cells; one thread's user-mode CPU time)
``decode.json``            ``python -m flashlab.bench --decode-only``
``ceiling.json``           ``python -m flashlab.bench --ceiling-only`` (``OPENBLAS_CORETYPE=Haswell``)
``ceiling_avx512.json``    the same with ``OPENBLAS_CORETYPE`` unset (AVX-512 kernels)
``train_tiny.json``        ``python examples/train_tiny.py``
``performance_live.json``  ``python -m flashlab.bench._page flashlab/data/performance_live.json``
``backward_ratio.json``    ``python tools/backward_ratio.py`` (one thread, N = 1024, quiet machine)
``gpu_bench.json``         ``tools/gpu_device_run.sh OUT`` (``python -m flashlab.gpu.bench``) on an H200 (old kernels)
``gpu_bench_more.json``    the same H200 session: the run before the bank-conflict fix, a tile sweep, d = 128
``npu_fa_measured.json``   copied by hand from pto-isa (commit 3186c381): the fit inputs and held-out timings
``gpu_inspect.json``       ``python -m flashlab.gpu.inspect --json ... --label before|after`` (sm_90, no GPU needed)
=========================  ==========================================================================

They are package data (``[tool.setuptools.package-data]`` in ``pyproject.toml``), read through
``importlib.resources``, so a notebook finds them from any working folder and from a wheel
install as well as from the repository. To refresh one, run its command and copy the result
over ``flashlab/data/<name>``.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["names", "path", "load_json"]


def names() -> list[str]:
    """The data files shipped with the package, sorted (e.g. ``["bench.json", ...]``)."""
    return sorted(p.name for p in resources.files(__name__).iterdir() if p.name.endswith(".json"))


def path(name: str) -> Path:
    """The file ``name`` (e.g. ``"bench.json"``) of the package's data, as a filesystem path.

    Raises ``ValueError`` naming the shipped files if there is none of that name.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a file name (str), got {type(name).__name__}")
    res = resources.files(__name__) / name
    if "/" in name or "\\" in name or not res.is_file():
        raise ValueError(f"name={name!r}: flashlab.data ships {', '.join(names())}")
    # setuptools installs package data as plain files (no zip import), so this is a real path
    return Path(str(res))


def load_json(name: str) -> Any:
    """The parsed JSON file ``name`` of the package's data (see :func:`path`)."""
    return json.loads(path(name).read_text(encoding="utf-8"))
