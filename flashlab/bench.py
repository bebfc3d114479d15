"""Benchmarks: ``python -m flashlab.bench`` (or ``make bench``). Never run as unit tests.

Times ``flashlab.flash_attention`` and the NumPy naive implementation
(:func:`flashlab.attention_naive`, one ``(B, H, Sq, Sk)`` score matrix in memory) **in the
same run**, and reports throughput as ratios between them: this machine is shared and noisy,
so an absolute figure from one run says little on its own.

* time: median of ``--repeats`` runs after one warm-up call (which also pays Numba's
  compile or cache load, reported separately as the first-call latency);
* GFLOP/s: the matmul FLOPs over time: ``4 B H Sq Sk D`` forward
  (:func:`flashlab.cost.attention_flops`), ``2 B H Sq Sk (3 Dqk + 2 Dv)`` backward
  (:func:`flashlab.cost.attention_backward_flops`);
* the backward (recomputation from the LSE) is timed beside the forward at the same shape;
* peak extra memory: measured in a **fresh process per case**: inputs are allocated and the
  kernel warmed up first, then the kernel's resident-set high-water mark is reset
  (``/proc/self/clear_refs``) and read back after one call (``VmHWM - VmRSS`` before the call).
  This counts every allocation, Numba's included, which ``tracemalloc`` would miss.

Results go to ``bench-results/bench.json`` and ``bench-results/bench.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from flashlab.cost import attention_backward_flops, attention_flops

IMPLEMENTATIONS = ("flashlab", "numpy_naive")


def make_inputs(n: int, *, batch: int = 1, heads: int = 8, d: int = 128, d_v: int | None = None,
                seed: int = 0):
    """Random float32 (q, k, v): q, k (batch, heads, n, d), v (batch, heads, n, d_v or d)."""
    rng = np.random.default_rng(seed)
    dims = (d, d, d if d_v is None else d_v)
    return tuple(rng.standard_normal((batch, heads, n, dd), dtype=np.float32) for dd in dims)


def _median_time(fn, repeats: int) -> tuple[float, float]:
    """(median seconds over ``repeats`` calls, seconds of the first call before them)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), first


def _function(impl: str):
    import flashlab

    if impl == "flashlab":
        return lambda q, k, v: flashlab.flash_attention(q, k, v, block_q=64, block_k=64)
    if impl == "numpy_naive":
        return flashlab.attention_naive
    raise ValueError(f"impl must be one of {IMPLEMENTATIONS}; got {impl!r}")


def time_forward(impl: str, n: int, *, repeats: int = 3, heads: int = 8, d: int = 128) -> dict:
    """Median forward time (s), GFLOP/s and the first-call latency for one implementation."""
    fn = _function(impl)
    q, k, v = make_inputs(n, heads=heads, d=d)
    t, first = _median_time(lambda: fn(q, k, v), repeats)
    return {"impl": impl, "n": n, "heads": heads, "d": d, "seconds": t,
            "gflops": attention_flops(n, n, d, d, heads=heads) / t / 1e9,
            "first_call_seconds": first}


def time_backward(n: int, d: int, d_v: int, *, repeats: int = 3, heads: int = 8) -> dict:
    """flashlab forward and backward at one shape, measured back to back: times, GFLOP/s and
    the backward/forward time ratio (5 matmuls against 2: ~2.5x when Dqk = Dv)."""
    import flashlab

    q, k, v = make_inputs(n, heads=heads, d=d, d_v=d_v)
    o, lse = flashlab.flash_attention(q, k, v)
    do = make_inputs(n, heads=heads, d=d_v, seed=1)[0]
    t_fwd, _ = _median_time(lambda: flashlab.flash_attention(q, k, v), repeats)
    t_bwd, first = _median_time(lambda: flashlab.flash_attention_backward(do, q, k, v, o, lse), repeats)
    return {"n": n, "heads": heads, "d_qk": d, "d_v": d_v,
            "forward_seconds": t_fwd, "backward_seconds": t_bwd,
            "forward_gflops": attention_flops(n, n, d, d_v, heads=heads) / t_fwd / 1e9,
            "backward_gflops": attention_backward_flops(n, n, d, d_v, heads=heads) / t_bwd / 1e9,
            "backward_over_forward": t_bwd / t_fwd, "backward_first_call_seconds": first}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_memory_here(impl: str, n: int, heads: int = 8, d: int = 128) -> int:
    """Bytes by which one forward call raises this process's peak resident set (see module doc)."""
    fn = _function(impl)
    small = make_inputs(8, heads=1, d=d)
    fn(*small)  # compile / load the kernels before measuring
    q, k, v = make_inputs(n, heads=heads, d=d)
    rss_before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    out = fn(q, k, v)
    del out
    return (_status_kib("VmHWM") - rss_before) * 1024


def peak_extra_memory(impl: str, n: int, heads: int = 8, d: int = 128) -> int:
    """:func:`peak_extra_memory_here` in a fresh Python process."""
    code = (f"from flashlab.bench import peak_extra_memory_here as p; "
            f"print(p({impl!r}, {n}, {heads}, {d}))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1])


def run(sizes=(1024, 4096), memory_n: int = 8192, backward_n: int = 2048, repeats: int = 3,
        heads: int = 8, d: int = 128) -> dict:
    """Run every case; returns the JSON-ready result dict."""
    timings = [time_forward(impl, n, repeats=repeats, heads=heads, d=d)
               for n in sizes for impl in IMPLEMENTATIONS]
    backward = [time_backward(backward_n, dqk, dv, repeats=repeats, heads=heads)
                for dqk, dv in ((d, d), (192, 128))]
    for row in timings:
        base = next(r for r in timings if r["n"] == row["n"] and r["impl"] == "numpy_naive")
        row["speed_vs_numpy_naive"] = base["seconds"] / row["seconds"]
    memory = [{"impl": impl, "n": memory_n, "heads": heads, "d": d,
               "peak_extra_bytes": peak_extra_memory(impl, memory_n, heads, d)}
              for impl in IMPLEMENTATIONS]
    return {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {"batch": 1, "heads": heads, "d": d, "dtype": "float32", "causal": False},
        "forward": timings,
        "backward": backward,
        "memory": memory,
    }


def to_markdown(res: dict) -> str:
    """A markdown report of :func:`run`'s result."""
    lines = [f"# flashlab benchmark ({res['date']}, {res['machine']['cpus']} CPUs)", "",
             "Forward, B=1, H={heads}, D={d}, float32, non-causal.".format(**res["config"]), "",
             "| N | implementation | time (ms) | GFLOP/s | speed vs numpy naive | first call (s) |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in res["forward"]:
        lines.append(f"| {r['n']} | {r['impl']} | {r['seconds'] * 1e3:.1f} | {r['gflops']:.1f} "
                     f"| {r['speed_vs_numpy_naive']:.2f}x | {r['first_call_seconds']:.2f} |")
    lines += ["", "Backward with recomputation (flashlab), forward measured beside it:", "",
              "| N | Dqk / Dv | forward (ms) | backward (ms) | forward GFLOP/s | backward GFLOP/s "
              "| backward / forward |", "|---:|---|---:|---:|---:|---:|---:|"]
    for r in res["backward"]:
        lines.append(f"| {r['n']} | {r['d_qk']} / {r['d_v']} | {r['forward_seconds'] * 1e3:.1f} "
                     f"| {r['backward_seconds'] * 1e3:.1f} | {r['forward_gflops']:.1f} "
                     f"| {r['backward_gflops']:.1f} | {r['backward_over_forward']:.2f}x |")
    lines += ["", "Peak extra memory of one forward call (fresh process per case):", "",
              "| N | implementation | peak extra (MiB) |", "|---:|---|---:|"]
    for r in res["memory"]:
        lines.append(f"| {r['n']} | {r['impl']} | {r['peak_extra_bytes'] / 2**20:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashlab.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--memory-n", type=int, default=8192)
    ap.add_argument("--backward-n", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    args = ap.parse_args(argv)
    res = run(tuple(args.sizes), args.memory_n, args.backward_n, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(res, indent=2))
    md = to_markdown(res)
    (args.out / "bench.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
