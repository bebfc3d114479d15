"""The suite: its cases (:func:`attention_cases`, :func:`mla_cases`), the machine it runs on,
the skip rules (:func:`skip_reason`), one shape's group of cases (:func:`run_group`) and the
whole run (:func:`run_suite`).
"""
from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from flashlab.bench.config import BASELINES, DATAFLOWS, DIRECTIONS, FULL, HAS_BACKWARD, SCHEMA, BenchConfig, Case
from flashlab.bench.decode import decode_bench, decode_ratios
from flashlab.bench.estimates import case_flops, estimated_bytes, mla_model_peak, tile_fraction
from flashlab.bench.explorers import pipeline_explorer_timing, tile_explorer_step
from flashlab.bench.measure import (
    PAIRED_CLOCKS,
    CaseFailed,
    available_bytes,
    matmul_gflops,
    measure_fresh,
    numba_first_call,
    single_thread,
    time_interleaved,
    time_paired,
)
from flashlab.bench.report import backward_over_forward
from flashlab.bench.runners import torch_available
from flashlab.bench.targets import evaluate_targets

__all__ = ["SINGLE_THREAD_ENV", "CPU_CLOCK_NOTE", "WARM_EACH_NOTE",
           "attention_cases", "mla_cases", "machine_info", "blas_info", "skip_reason", "shape_key",
           "run_group", "run_suite"]


def attention_cases(config: BenchConfig) -> list[Case]:
    """The main section's cases, by N, then shape, causal, implementation and direction."""
    impls = ("flashlab",) + tuple(b for b in BASELINES if b in config.baselines)
    return [Case(impl, direction, n, d_qk, d_v, causal, config.batch, config.heads,
                 block=config.block_for(direction))
            for n in config.sizes for d_qk, d_v in config.shapes for causal in config.causal
            for impl in impls for direction in config.directions
            if direction == "forward" or impl in HAS_BACKWARD]


def mla_cases(config: BenchConfig) -> list[Case]:
    """The MLA section's cases: each dataflow forward and backward, then flashlab's native
    192/128 kernel and torch SDPA on the concatenated operands (non-causal)."""
    dn, dr, dv = config.mla_dims
    cases = [Case(f"mla:{flow}", direction, s, dn, dv, False, config.batch, config.mla_heads,
                  d_rope=dr,
                  block=config.block_for(direction))
             for s in config.mla_sizes for flow in DATAFLOWS for direction in DIRECTIONS]
    impls = ("flashlab",) + (("torch_sdpa",) if "torch_sdpa" in config.baselines else ())
    cases += [Case(impl, direction, s, dn + dr, dv, False, config.batch, config.mla_heads,
                   block=config.block_for(direction))
              for s in config.mla_sizes for impl in impls for direction in DIRECTIONS]
    return cases


def machine_info() -> dict:
    """Platform, CPU, versions and thread counts (torch's if installed)."""
    import numba

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info = {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "memory_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "python": platform.python_version(), "numpy": np.__version__,
            "numba": numba.__version__, "numba_threads": numba.get_num_threads(),
            "torch": None, "torch_threads": None}
    if torch_available():
        import torch
        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    info.update(blas_info())
    return info


def blas_info() -> dict:
    """The BLAS kernels in use: NumPy's (the matmul peak) and SciPy's (flashlab's tiles).

    OpenBLAS picks its kernels by CPU at load time unless ``OPENBLAS_CORETYPE`` names them.
    It matters (OpenBLAS's AVX-512 ``SkylakeX`` kernels against ``OPENBLAS_CORETYPE=Haswell``
    change both the matmul peak and flashlab's speed against PyTorch, which uses MKL and
    ignores the variable), so a report names the kernels its figures were measured with.
    """
    from threadpoolctl import threadpool_info

    from flashlab.kernels.blas import LIMITED  # importing it loads SciPy's BLAS (lazily loaded)

    tiles = {lib.filepath for lib in LIMITED}   # the BLAS Numba's tile gemms call

    def role(path: str) -> str:
        if path in tiles:
            return "scipy (flashlab tiles)"
        # wheels keep their bundled libraries in <package>.libs
        return "numpy (matmul peak)" if "numpy.libs" in path else "other"

    libs = [{"role": role(i["filepath"]), "library": i["internal_api"],
             "version": i["version"], "architecture": i.get("architecture")}
            for i in threadpool_info() if i["user_api"] == "blas"]
    return {"blas": libs, "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}


def skip_reason(case: Case, config: BenchConfig, has_torch: bool, done: dict) -> str | None:
    """Why ``case`` is not run, or None. ``done``: the rows measured so far, by case."""
    if case.impl == "torch_sdpa" and not has_torch:
        return "torch is not installed (pip install -r requirements-bench.txt)"
    if case.impl == "numpy_naive" and config.naive_max_n is not None and case.n > config.naive_max_n:
        return f"numpy naive above naive_max_n={config.naive_max_n} (--naive-max-n)"
    need, avail = estimated_bytes(case), available_bytes()
    if need > config.memory_headroom * avail:
        return (f"would not fit in memory: needs ~{need / 1e9:.1f} GB (estimated), "
                f"{avail / 1e9:.1f} GB available, at most {config.memory_headroom:.0%} used")
    smaller = [row for c, row in done.items() if row["status"] == "ok" and c.n < case.n
               and replace(c, n=case.n) == case]
    if smaller:
        prev = max(smaller, key=lambda r: r["n"])
        predicted = prev["seconds"] * (case.n / prev["n"]) ** 2
        if predicted > config.max_call_seconds:
            return (f"would take ~{predicted:.0f} s per call (from N={prev['n']}), over "
                    f"max_call_seconds={config.max_call_seconds:.0f}")
    return None


def shape_key(case: Case) -> tuple:
    """What the cases timed together share: everything but the implementation and ``causal``.

    Causal and non-causal cases of a shape share a group, so the causal/non-causal time ratio
    (a target) compares timings of the same rounds: timed in separate groups, minutes apart on a
    shared machine, it drifted from 0.51 (interleaved) to 0.57-0.66 in two full runs.
    """
    return (case.section, case.direction, case.n, case.d_qk, case.d_v, case.d_rope,
            case.batch, case.heads, case.block)


def _measures_memory(case: Case, config: BenchConfig) -> bool:
    if case.section == "mla":
        return config.mla_memory_sizes is None or case.n in config.mla_memory_sizes
    return ((config.memory_sizes is None or case.n in config.memory_sizes)
            and case.causal in config.memory_causal)


def run_group(cases: list[Case], config: BenchConfig, *, has_torch: bool,
              done: dict) -> tuple[dict[Case, dict], dict | None]:
    """Measure the cases of one shape: skip what cannot run, measure memory (fresh process
    per case) where configured, then :func:`time_interleaved` the rest.

    ``done``: the rows measured so far (for the time prediction of :func:`skip_reason`).
    Returns ``({case: row}, the matmul timed with them or None)``; a row holds the case's
    fields, ``status`` ("ok", "skipped", "failed"), ``reason``, and the measurements.
    """
    rows: dict[Case, dict] = {}
    to_time = []
    for c in cases:
        row = {**asdict(c), "status": "ok", "reason": None, "fresh_process": False}
        reason = skip_reason(c, config, has_torch, done)
        if reason:
            rows[c] = {**row, "status": "skipped", "reason": reason}
            continue
        if _measures_memory(c, config):
            try:
                timeout = 3 * config.max_call_seconds + 300
                row.update(measure_fresh(c, timeout=timeout, env=_worker_env(config)), fresh_process=True)
            except CaseFailed as e:
                rows[c] = {**row, "status": "failed", "reason": f"memory measurement: {e}"}
                continue
        rows[c] = row
        to_time.append(c)
    if not to_time:
        return rows, None
    if config.paired:
        timed, matmul, rounds = time_paired(to_time, min_rounds=config.min_rounds,
                                            max_rounds=config.max_rounds,
                                            max_timed_seconds=config.max_timed_seconds,
                                            settle_seconds=config.settle_seconds,
                                            matmul_n=config.matmul_n, warm_each=config.warm_each,
                                            clock=PAIRED_CLOCKS[config.clock])
        for c in timed:
            rows[c]["rounds"] = rounds
    else:
        timed, matmul = time_interleaved(to_time, repeats=config.repeats,
                                         max_timed_seconds=config.max_timed_seconds,
                                         matmul_n=config.matmul_n,
                                         settle_seconds=config.settle_seconds)
    for c, t in timed.items():
        if "error" in t:
            rows[c].update(status="failed", reason=t["error"])
        else:
            rows[c].update(t, matmul_gflops=matmul["gflops"])
    return rows, matmul


#: the environment of a worker process when the run times on the CPU clock: every thread pool
#: of one thread (set before the libraries load, as their pools are sized then)
SINGLE_THREAD_ENV = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                     "MKL_NUM_THREADS": "1"}


def _worker_env(config: BenchConfig) -> dict | None:
    """The environment of :func:`measure_fresh`'s processes: this one's, one thread per pool on
    the CPU clock (so the memory is measured with the threads the times are)."""
    return {**os.environ, **SINGLE_THREAD_ENV} if config.paired else None


CPU_CLOCK_NOTE = (
    "Clock: CPU time of the process (time.process_time) with Numba, every BLAS and torch on one "
    "thread, so it is one thread's CPU time. Why: the machine is shared, and wall time counts the "
    "time a neighbour holds the core, which CPU time does not. What it does not remove: the "
    "neighbours still share the memory bandwidth and the caches, which slow the thread while it "
    "runs. Rounds: each case timed once per round, in turn, the order reversed every other round, "
    "from min_rounds until every paired ratio (the median over rounds of one case's time over "
    "another's) has a 95 % bootstrap interval (rounds resampled, fixed seed) within ±5 % of its "
    "median, or max_rounds, or max_timed_seconds per case; each row's paired_vs holds them and "
    "its rounds how the rounds stopped.")


WARM_EACH_NOTE = (
    "warm_each: every timed call came right after an untimed call of the same case (settle_seconds "
    "after the case before), so that no case pays for what another left behind. A call that "
    "allocates large arrays (numpy naive's (N, N) scores) pays for fresh memory in system time, and "
    "how much depends on what ran before it and how long ago; right after its own call the memory "
    "is at hand.")


def _derive(rows: list[dict]) -> None:
    """Add FLOPs, GFLOP/s, the fraction of the matmul timed with the case, and the ratios
    against the baselines (``speed_vs``: baseline time / this time; ``memory_vs``: this peak
    extra / the baseline's)."""
    by_key = {}
    for r in rows:
        if r["status"] == "ok":
            by_key[(r["section"], r["impl"], r["direction"], r["n"], r["d_qk"], r["d_v"],
                    r["d_rope"], r["causal"], r["heads"])] = r
    for r in rows:
        if r["status"] != "ok":
            continue
        r["flops"] = case_flops(Case.from_dict(r))
        block_q, block_k = r["block"]
        r["tile_fraction"] = tile_fraction(r["n"], block_q, block_k, r["causal"])
        r["gflops"] = r["flops"] / r["seconds"] / 1e9
        r["fraction_of_matmul_peak"] = r["gflops"] / r["matmul_gflops"]
        if r["impl"].startswith("mla:"):
            r["model_peak_bytes"] = mla_model_peak(Case.from_dict(r))
        bases: tuple[str, ...]
        if r["impl"] == "flashlab":
            bases = BASELINES
        elif r["impl"].startswith("mla:") and r["impl"] != "mla:baseline":
            bases = ("mla:baseline",)
        else:
            continue
        r["speed_vs"], r["memory_vs"] = {}, {}
        for name in bases:
            base = by_key.get((r["section"], name, r["direction"], r["n"], r["d_qk"], r["d_v"],
                               r["d_rope"], r["causal"], r["heads"]))
            if base is None:
                continue
            r["speed_vs"][name] = base["seconds"] / r["seconds"]
            if "peak_extra_bytes" in r and "peak_extra_bytes" in base:
                r["memory_vs"][name] = r["peak_extra_bytes"] / max(base["peak_extra_bytes"], 1)


def run_suite(config: BenchConfig = FULL, *, progress: Callable[[str], None] | None = None) -> dict:
    """Run every case of ``config``; returns the JSON-ready result (see :func:`to_markdown`).

    Cases are grouped by shape (:func:`shape_key`) and each group timed together
    (:func:`time_interleaved`). ``progress`` (e.g. ``print``) receives a line per case.
    """
    say = progress or (lambda line: None)
    t_start = time.perf_counter()
    has_torch = "torch_sdpa" in config.baselines and torch_available()
    if config.paired:
        single_thread()
    result: dict[str, Any] = {
        "schema": SCHEMA, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(), "config": asdict(config),
        "timing": "paired" if config.paired else "interleaved",
        "load_average_start": os.getloadavg(),
    }
    result["notes"] = [
        "Time: the implementations of one shape are timed in turn, round by round, with a "
        "numpy matmul after each round (% matmul peak is against that matmul).",
        "numpy naive backward: not measured (flashlab's naive backward, "
        "attention_reference_backward, computes in float64); torch SDPA is the backward baseline.",
        "GFLOP/s: matmul FLOPs of the case (flashlab.flops), the same for every implementation; "
        "causal cases count the fraction of tiles flashlab computes.",
        "Memory: peak extra resident set of one call in a fresh process; backward rows: a "
        "training step (forward + backward) above q, k, v, dO. Workspace = peak extra minus "
        "the returned arrays. MB = 10^6 bytes.",
    ]
    if config.paired:
        result["notes"][0] = CPU_CLOCK_NOTE
    if config.paired and config.warm_each:
        result["notes"].append(WARM_EACH_NOTE)
    if "torch_sdpa" in config.baselines and not has_torch:
        result["notes"].append("torch is not installed: torch SDPA cases skipped "
                               "(pip install -r requirements-bench.txt).")
    say(f"matmul peak (numpy float32 {config.matmul_n}^3) ...")
    matmul: dict[str, Any] = {"start": matmul_gflops(config.matmul_n, config.matmul_repeats), "groups": []}
    if config.first_call:
        say(f"numba first call ({'compile and ' if config.first_call == 'compile' else ''}cache load) ...")
    result["numba_first_call"] = (numba_first_call(config.first_call == "compile")
                                  if config.first_call else None)
    if config.simulator_tasks:
        from flashlab.pipeline.timing import bench_simulator
        say(f"pipeline simulator ({config.simulator_tasks} tasks) ...")
        result["simulator"] = bench_simulator(config.simulator_tasks)
    if config.tile_explorer:
        say("tile explorer steps ...")
        result["tile_explorer"] = tile_explorer_step()
    if config.pipeline_explorer:
        say("pipeline explorer changes ...")
        result["pipeline_explorer"] = pipeline_explorer_timing()
    att, mla = attention_cases(config), mla_cases(config)
    # MLA-shape attention cases the main section also has are measured once
    unique = list(dict.fromkeys(att + mla))
    groups: dict[tuple, list[Case]] = {}
    for c in unique:
        groups.setdefault(shape_key(c), []).append(c)
    done: dict[Case, dict] = {}
    for group in groups.values():
        measured, mm = run_group(group, config, has_torch=has_torch, done=done)
        if mm:
            matmul["groups"].append(mm)
        for c, row in measured.items():
            done[c] = row
            what = (f"{row['seconds'] * 1e3:.1f} ms" if row["status"] == "ok"
                    else f"{row['status']}: {row['reason']}")
            say(f"[{len(done)}/{len(unique)}, {time.perf_counter() - t_start:.0f} s] "
                f"{c.label}: {what}")
    result["decode"] = []
    for sk in config.decode_sizes:
        h, hkv = config.decode_heads
        if 3 * 4 * hkv * sk * config.decode_dim > config.memory_headroom * available_bytes():
            say(f"decode Sk={sk}: skipped (memory)")
            continue
        row = decode_bench(sk, heads=h, kv_heads=hkv, d=config.decode_dim, sq=config.decode_sq,
                           repeats=config.decode_repeats, torch=has_torch)
        row.update(decode_ratios(row))
        result["decode"].append(row)
        say(f"[{time.perf_counter() - t_start:.0f} s] decode Sk={sk}: flashlab "
            f"{row['seconds']['flashlab'] * 1e3:.1f} ms")
    matmul["end"] = matmul_gflops(config.matmul_n, config.matmul_repeats)
    matmul["peak_gflops"] = max(m["gflops"] for m in [matmul["start"], matmul["end"],
                                                      *matmul["groups"]])
    result["matmul"] = matmul
    rows = ([{**done[c], "section": "attention"} for c in att]
            + [{**done[c], "section": "mla"} for c in mla])
    _derive(rows)
    result["cases"] = rows
    result["backward_over_forward"] = backward_over_forward(result)
    result["targets"] = evaluate_targets(result)
    result["load_average_end"] = os.getloadavg()
    result["duration_seconds"] = time.perf_counter() - t_start
    return result
