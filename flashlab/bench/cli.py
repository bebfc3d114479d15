"""Benchmarks: ``python -m flashlab.bench`` (``make bench``; ``make bench-quick`` for a subset).

The command line: :func:`main` (``--help`` lists the options).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from flashlab.bench.ceiling import ceiling_lines, ceiling_run
from flashlab.bench.config import CLOCKS, FULL, QUICK
from flashlab.bench.measure import run_worker
from flashlab.bench.report import load_results, merge_results, save_results, to_markdown
from flashlab.bench.suite import run_suite

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashlab.bench",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the make bench-quick subset: N 1024 and 2048, memory at 1024 (< 2 min)")
    ap.add_argument("--sizes", type=int, nargs="+", help="attention N values")
    ap.add_argument("--repeats", type=int, help="timed calls per case after the warm-up")
    ap.add_argument("--naive-max-n", type=int, help="skip numpy naive above this N "
                    "(N=16384 needs 8+ GB)")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch SDPA baseline")
    ap.add_argument("--no-mla", action="store_true", help="skip the MLA section")
    ap.add_argument("--mla-only", action="store_true", help="only the MLA section (its dataflows, "
                    "and flashlab and torch SDPA at the concatenated 192/128)")
    ap.add_argument("--mla-sizes", type=int, nargs="+", help="MLA S values")
    ap.add_argument("--clock", choices=CLOCKS, help="time by wall time, each library on its "
                    "own threads (the default), by the process's CPU time on one thread, rounds "
                    "until the paired ratios resolve ±5 %% (cpu, the default of --mla-only), or by "
                    "its user-mode part (user, the default of --fused-only)")
    ap.add_argument("--fused-only", action="store_true", help="only the fused vendor rows' CPU "
                    "cells: numpy naive and flashlab forward, D = 128, non-causal, N = the vendor "
                    "case's S (or --sizes), on the user-mode CPU clock, each timed call right after "
                    "one of the same case")
    ap.add_argument("--min-rounds", type=int, help="--clock cpu: rounds before the first check")
    ap.add_argument("--max-rounds", type=int, help="--clock cpu: rounds at most")
    ap.add_argument("--max-timed-seconds", type=float, help="timed seconds per case at most")
    ap.add_argument("--settle-seconds", type=float, help="an untimed pause before each timed call")
    ap.add_argument("--decode-only", action="store_true", help="only the decode section "
                    "(split-KV against the tiled forward, torch SDPA and reads of K and V)")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode section")
    ap.add_argument("--decode-sizes", type=int, nargs="+", help="decode Sk values")
    ap.add_argument("--ceiling-only", action="store_true", help="only the backward's BLAS "
                    "ceiling (bench.ceiling_run: the backward, its five products alone and torch's "
                    "backward at the backward targets' problems), into OUT/ceiling.json")
    ap.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead "
                    "rows (bench.overhead: small shapes and a fresh process's first call, "
                    "through the torch door against SDPA; needs torch)")
    ap.add_argument("--overhead-only", action="store_true", help="only the per-call overhead "
                    "rows, into OUT/overhead.json")
    ap.add_argument("--out", type=Path, help="results folder (default bench-results, "
                    "bench-results/quick with --quick, so a quick run never overwrites a full one)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="BENCH_JSON", help="merge runs of one "
                    "configuration at different sizes (bench.merge_results) into OUT/bench.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        run_worker(args.worker)
        return 0
    out = args.out or Path("bench-results/quick" if args.quick else "bench-results")
    if args.merge:
        merged = merge_results([load_results(p) for p in args.merge])
        json_path, md_path = save_results(merged, out)
        print(f"wrote {json_path} and {md_path}", file=sys.stderr)
        return 0
    if args.ceiling_only and (args.mla_only or args.decode_only or args.sizes):
        ap.error("--ceiling-only runs its own problems: it excludes --mla-only, --decode-only "
                 "and --sizes")
    if args.ceiling_only:
        run = ceiling_run(rounds=args.repeats or 5)
        out.mkdir(parents=True, exist_ok=True)
        (out / "ceiling.json").write_text(json.dumps(run, indent=1) + "\n")
        print("\n".join(ceiling_lines(run)))
        print(f"wrote {out / 'ceiling.json'}", file=sys.stderr)
        return 0
    if args.overhead_only and args.no_overhead:
        ap.error("--overhead-only and --no-overhead exclude each other")
    if args.overhead_only:
        return 0 if _overhead(out, args.repeats or (100 if args.quick else 300)) else 1
    config = QUICK if args.quick else FULL
    changes: dict[str, Any] = {}
    if args.sizes:
        changes["sizes"] = tuple(args.sizes)
    if args.repeats:
        changes["repeats"] = args.repeats
    if args.naive_max_n:
        changes["naive_max_n"] = args.naive_max_n
    if args.no_torch:
        changes["baselines"] = ("numpy_naive",)
    if args.no_mla and args.mla_only:
        ap.error("--no-mla and --mla-only exclude each other")
    if args.no_mla:
        changes["mla_sizes"] = ()
    if args.mla_only:
        # the MLA ratios feed the vendor table's CPU column: timed on the CPU clock by default
        changes.update(sizes=(), first_call=None, simulator_tasks=None, tile_explorer=False,
                       pipeline_explorer=False, decode_sizes=(), clock="cpu")
    if args.fused_only and (args.mla_only or args.decode_only):
        ap.error("--fused-only excludes --mla-only and --decode-only")
    if args.fused_only:
        # N: the vendor table's fused case (its S), unless --sizes says otherwise
        from flashlab.vendor import FUSED_CASE
        changes.update(sizes=changes.get("sizes", (FUSED_CASE["seq"],)), shapes=((128, 128),), causal=(False,),
                       directions=("forward",), baselines=("numpy_naive",), mla_sizes=(),
                       decode_sizes=(), memory_sizes=(), first_call=None, simulator_tasks=None,
                       tile_explorer=False, pipeline_explorer=False, clock="user", warm_each=True,
                       settle_seconds=0.0)
    for name in ("mla_sizes", "clock", "min_rounds", "max_rounds", "max_timed_seconds", "settle_seconds"):
        value = getattr(args, name)
        if value is not None:
            changes[name] = tuple(value) if isinstance(value, list) else value
    if args.decode_only and (args.no_decode or args.mla_only):
        ap.error("--decode-only excludes --no-decode and --mla-only")
    if args.decode_only:
        changes.update(sizes=(), mla_sizes=(), first_call=None, simulator_tasks=None,
                       tile_explorer=False, pipeline_explorer=False)
    if args.no_decode:
        changes["decode_sizes"] = ()
    if args.decode_sizes:
        changes["decode_sizes"] = tuple(args.decode_sizes)
    config = replace(config, **changes)
    result = run_suite(config, progress=lambda line: print(line, file=sys.stderr, flush=True))
    json_path, md_path = save_results(result, out)
    print(to_markdown(result))
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    if not (args.no_overhead or args.no_torch or args.mla_only or args.decode_only or args.fused_only):
        lines = _overhead(out, args.repeats or (100 if args.quick else 300))
        if lines:
            # the overhead section goes at the end of the suite's report
            with md_path.open("a") as f:
                f.write("\n" + "\n".join(lines) + "\n")
    return 0


def _overhead(out: Path, repeats: int) -> list[str] | None:
    """Run :mod:`flashlab.bench.overhead` in a fresh process (``OMP_WAIT_POLICY=PASSIVE`` unless
    set: it must be set before torch starts, and this process has started torch; with torch's
    default busy-wait its threads spin on the cores Numba's need), write OUT/overhead.json,
    print its markdown and return the lines; None (and a note) when torch is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"overhead rows skipped: torch is not installed ({exc})", file=sys.stderr)
        return None
    from flashlab.bench.overhead import overhead_lines
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    subprocess.run([sys.executable, "-m", "flashlab.bench.overhead", "--repeats", str(repeats),
                    "--out", str(out / "overhead.json")], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    lines = overhead_lines(json.loads((out / "overhead.json").read_text()))
    print("\n".join(lines))
    print(f"wrote {out / 'overhead.json'}", file=sys.stderr)
    return lines
