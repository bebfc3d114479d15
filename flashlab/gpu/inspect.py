r"""Static report on the CUDA twin's kernels, compiled for sm_90 on the CPU (no GPU needed).

``python -m flashlab.gpu.inspect [--json PATH]`` compiles every kernel of
:mod:`flashlab.gpu.forward`, :mod:`flashlab.gpu.backward` and :mod:`flashlab.gpu.standard`
at ``d = 64`` and ``d = 128`` (Numba-CUDA writes PTX with libNVVM), assembles the PTX with
``ptxas -arch=sm_90 -v`` and disassembles the cubin with ``nvdisasm``, both from the CUDA
wheels of ``requirements-gpu-tools.txt``. Per kernel it reports

- ``registers``: registers per thread (ptxas);
- ``spill_stores`` / ``spill_loads``: bytes spilled to local memory (ptxas);
- ``stack``: bytes of per-thread stack frame, i.e. local memory (a local array indexed at run
  time lives there even without spills);
- ``local_ops``: ``LDL`` / ``STL`` instructions in the SASS;
- ``loops``: for every innermost loop of the SASS (a backward branch and the instructions
  between its target and it) that contains an ``FFMA``, its instruction count, its FFMAs and
  their ratio ``per_ffma``: the instructions the SM issues per fused multiply-add in that loop
  (1 is a pure FFMA stream; a loop whose operand lives in local memory costs ~20).

:func:`table` renders a report (the dict :func:`inspect_all` returns, or the committed
``flashlab/data/gpu_inspect.json``) as a markdown table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["tool_paths", "inspect_all", "sass_loops", "ptxas_resources", "table", "KERNEL_NAMES",
           "DIMS", "TILE_CHOICES", "fitting_tile", "main"]

#: head dims the report compiles every kernel at
DIMS = (64, 128)
#: the kernels, in report order
KERNEL_NAMES = ("forward", "backward_dot", "backward", "standard_scores", "standard_softmax",
                "standard_pv")
#: (block_q, block_k) candidates for the fused kernels, first the bench's; each kernel is
#: compiled at the first that fits in 48 KiB of static shared memory at its head dim
TILE_CHOICES = ((64, 32), (32, 32), (32, 16), (16, 16))
_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-nvdisasm", "nvidia-nvvm", "nvidia-cuda-nvrtc",
           "numba-cuda", "numba", "cuda-bindings")


def tool_paths() -> dict[str, str] | None:
    """``{"ptxas": path, "nvdisasm": path}`` from the CUDA wheels (or PATH); None if either is missing."""
    out = {}
    for tool in ("ptxas", "nvdisasm"):
        path = None
        try:
            import nvidia  # the wheels install nvidia/cu13/bin/<tool>
            for root in getattr(nvidia, "__path__", []):
                hits = sorted(Path(root).glob(f"*/bin/{tool}"))
                if hits:
                    path = str(hits[-1])
        except ImportError:
            pass
        path = path or shutil.which(tool)
        if path is None:
            return None
        out[tool] = path
    return out


def fitting_tile(shared_bytes, d: int, d_v: int | None = None) -> tuple[int, int]:
    """The first of :data:`TILE_CHOICES` whose ``shared_bytes(bq, bk, d, d_v)`` fits in 48 KiB
    (``d_v`` defaults to ``d``)."""
    from flashlab.gpu.target import STATIC_SHARED_LIMIT  # imports no CUDA package
    dv = d if d_v is None else d_v
    for bq, bk in TILE_CHOICES:
        if shared_bytes(bq, bk, d, dv) <= STATIC_SHARED_LIMIT:
            return bq, bk
    raise ValueError(f"d must leave room for a {TILE_CHOICES[-1]} tile in {STATIC_SHARED_LIMIT} bytes "
                     f"of shared memory; got d={d}, d_v={dv}")


def _signature(*args: str) -> tuple:
    """The argument types of a kernel: each a Numba type expression (``"float32[:, ::1]"``), or
    ``"scores"``, the scores stage's record of float32 (a named tuple, which no expression
    names)."""
    import numba
    from numba.core import sigutils

    from flashlab.kernels.options import ScoresStage
    scores = numba.typeof(ScoresStage().in_dtype(numba.float32))
    return tuple(scores if a == "scores" else sigutils.normalize_signature(f"void({a})")[0][0]
                 for a in args)


def _kernels(d: int) -> list[tuple[str, Any, tuple, tuple[int, int]]]:
    """(name, kernel, argument types, tile) of every kernel at head dim ``d``."""
    from flashlab.gpu.backward import DOT_ROWS, backward_kernel, backward_shared_bytes, dot_kernel
    from flashlab.gpu.forward import forward_kernel, forward_shared_bytes
    from flashlab.gpu.standard import STANDARD_TILE, pv_kernel, scores_kernel, softmax_kernel
    from flashlab.gpu.tiles import LANE_COLS
    a4, a3, i2, c = "float32[:, :, :, ::1]", "float32[:, :, ::1]", "int64[:, ::1]", "int64[::1]"
    band = ("float32", "int64", "int64")
    fused = band + ("scores",)      # the fused kernels' band and scores stage
    sig = _signature
    T = STANDARD_TILE
    fq, fk = fitting_tile(forward_shared_bytes, d)
    bq, bk = fitting_tile(backward_shared_bytes, d)
    return [
        ("forward", forward_kernel(fq, fk, d, d, False), sig(a4, a4, a4, i2, *fused, a4, a3, c), (fq, fk)),
        ("backward_dot", dot_kernel(d, False), sig(a4, a4, a3, c), (DOT_ROWS, LANE_COLS)),
        ("backward", backward_kernel(bq, bk, d, d, False),
         sig(a4, a4, a4, a4, a3, a3, i2, *fused, a4, a4, a4, c), (bq, bk)),
        ("standard_scores", scores_kernel(T, d, False), sig(a4, a4, *band, a4, c), (T, T)),
        ("standard_softmax", softmax_kernel(T, False), sig(a4, c), (T, T)),
        ("standard_pv", pv_kernel(T, d, False), sig(a4, a4, a4, c), (T, T)),
    ]


_RES = re.compile(r"Used (\d+) registers")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_resources(log: str) -> dict[str, int]:
    """registers, stack, spill_stores, spill_loads from ``ptxas -v``'s log (one kernel)."""
    regs, frame = _RES.search(log), _FRAME.search(log)
    if regs is None or frame is None:
        raise ValueError(f"log must be ptxas -v output with a register and a stack line; got {log!r}")
    return {"registers": int(regs.group(1)), "stack": int(frame.group(1)),
            "spill_stores": int(frame.group(2)), "spill_loads": int(frame.group(3))}


_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_TARGET = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)\)?")


def sass_loops(sass: str) -> tuple[list[dict[str, Any]], int]:
    """Innermost loops of ``nvdisasm`` output that contain FFMAs, and the LDL/STL count.

    Each loop is ``{"insns": n, "ffma": f, "per_ffma": n / f}``: the instructions from a
    label to a later branch back to it (the branch included), when no other such loop lies
    inside. ``NOP`` instructions (alignment padding) are not counted.
    """
    insns: list[str] = []
    labels: dict[str, int] = {}
    for line in sass.splitlines():
        lab = _LABEL.match(line)
        if lab:
            labels[lab.group(1)] = len(insns)
            continue
        found = _INSN.search(line)
        if found:
            insns.append(found.group(2).strip())
    spans = []
    for end, ins in enumerate(insns):
        tgt = _TARGET.search(ins)
        if tgt and tgt.group(1) in labels and labels[tgt.group(1)] <= end:
            spans.append((labels[tgt.group(1)], end))
    inner = [s for s in spans
             if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    loops = []
    for lo, hi in sorted(set(inner)):
        body = [i for i in insns[lo:hi + 1] if not i.split()[0].startswith("NOP")]
        ffma = sum(1 for i in body if re.search(r"(^|\s)FFMA(\.\S+)?\s", i + " "))
        if ffma:
            loops.append({"insns": len(body), "ffma": ffma, "per_ffma": round(len(body) / ffma, 2)})
    local_ops = sum(1 for i in insns if re.search(r"(^|\s)(LDL|STL)(\.\S+)?\s", i + " "))
    return loops, local_ops


def _inspect_one(kernel, sig: tuple, tools: dict[str, str], work: Path, name: str) -> dict[str, Any]:
    from numba import cuda
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    src, cubin = work / f"{name}.ptx", work / f"{name}.cubin"
    src.write_text(ptx)
    run = subprocess.run([tools["ptxas"], "-arch=sm_90", "-v", "-o", str(cubin), str(src)],
                         capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"ptxas failed on {name}: {run.stderr.strip()}")
    log = run.stderr
    sass = subprocess.run([tools["nvdisasm"], "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    loops, local_ops = sass_loops(sass)
    return {**ptxas_resources(log), "local_ops": local_ops, "loops": loops}


def _versions(tools: dict[str, str]) -> dict[str, str]:
    out = {}
    for wheel in _WHEELS:
        try:
            out[wheel] = metadata.version(wheel)
        except metadata.PackageNotFoundError:
            pass
    for tool, path in tools.items():
        text = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        out[tool] = text.strip().splitlines()[-1] if text.strip() else "unknown"
    return out


def inspect_all(dims: tuple[int, ...] = DIMS) -> dict[str, Any]:
    """Compile every kernel at every head dim in ``dims``; the report (see the module docstring).

    ``{"date", "arch", "versions", "kernels": {"<name> d=<d>": {"tile": [bq, bk], ...}}}``. Needs the
    tools of :func:`tool_paths`; selects the real ``numba.cuda`` for compiling
    (:func:`flashlab.gpu.target.compile_only`), so call it in a process that runs no kernel.
    """
    tools = tool_paths()
    if tools is None:
        raise RuntimeError("ptxas and nvdisasm not found: pip install -r requirements-gpu-tools.txt")
    from flashlab.gpu import target
    target.compile_only()
    # device functions compile for "the current device": with no GPU there is none, so name
    # sm_90 (the kernel they are linked into is compiled for sm_90 anyway)
    import types

    import numba.cuda.dispatcher as dispatcher
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    kernels: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for d in dims:
            for name, kernel, sig, tile in _kernels(d):
                kernels[f"{name} d={d}"] = {"tile": list(tile),
                                            **_inspect_one(kernel, sig, tools, Path(tmp), f"{name}{d}")}
    return {"date": datetime.date.today().isoformat(), "arch": "sm_90",
            "versions": _versions(tools), "kernels": kernels}


def _worst(loops: list[dict[str, Any]]) -> str:
    return f"{max(x['per_ffma'] for x in loops):.1f}" if loops else "–"


def table(report: dict[str, Any]) -> str:
    """A markdown table of a report: one row per kernel and head dim.

    ``report`` is :func:`inspect_all`'s dict, or the committed JSON with ``"before"`` and
    ``"after"`` reports (then one column group per report, side by side).
    """
    if not isinstance(report, dict):
        raise TypeError(f"report must be a dict (inspect_all() or the committed JSON); got {type(report).__name__}")
    runs: dict[str, Any] = {k: report[k] for k in ("before", "after") if k in report} or {"": report}
    for label, run in runs.items():
        if "kernels" not in run:
            raise ValueError(f"report{'[' + repr(label) + ']' if label else ''} must have a 'kernels' entry")
    cols = ["registers", "spills (B)", "local mem (B)", "LDL/STL", "insns/FFMA (worst loop)"]
    head = ["kernel"] + [f"{c} {label}".strip() for label in runs for c in cols]
    def order(name: str) -> tuple[int, int, str]:
        kernel, _, d = name.partition(" d=")
        known = kernel in KERNEL_NAMES
        return (KERNEL_NAMES.index(kernel) if known else len(KERNEL_NAMES),
                int(d) if d.isdigit() else 0, name)
    names = sorted({n for run in runs.values() for n in run["kernels"]}, key=order)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        row = [name]
        for run in runs.values():
            k = run["kernels"].get(name)
            if k is None:
                row += ["–"] * len(cols)
            else:
                row += [str(k["registers"]), str(k["spill_stores"] + k["spill_loads"]),
                        str(k["stack"]), str(k["local_ops"]), _worst(k["loops"])]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashlab.gpu.inspect", description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--label", help="store the report under this key of the JSON file (before/after), "
                        "keeping its other keys")
    args = parser.parse_args(argv)
    if tool_paths() is None:
        print("ptxas / nvdisasm not found: pip install -r requirements-gpu-tools.txt", file=sys.stderr)
        return 2
    report = inspect_all()
    print(table(report))
    if args.json:
        path = Path(args.json)
        out: dict[str, Any] = report
        if args.label:
            out = json.loads(path.read_text()) if path.exists() else {}
            out[args.label] = report
        path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
