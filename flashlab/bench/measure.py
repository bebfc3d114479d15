"""Measurements of one case or of the machine. Memory: :func:`available_bytes`,
:func:`peak_extra_memory`, :func:`measure_memory` and :func:`measure_fresh` (a fresh process per
case, through ``python -m flashlab.bench --worker``). Timing: :func:`time_interleaved` (the
implementations of a shape in turn), :func:`time_paired` (in turn on one thread's CPU time, until
their paired ratios resolve), :func:`matmul_gflops` (the practical peak) and
:func:`numba_first_call`.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np

from flashlab.bench.config import Case
from flashlab.bench.runners import Clock, Runner, make_runner
from flashlab.bench.runners import call_seconds as _seconds
from flashlab.paired import paired_ratio

__all__ = ["available_bytes", "peak_extra_memory", "measure_memory", "CaseFailed", "measure_fresh",
           "run_worker", "time_interleaved", "time_paired", "single_thread", "matmul_gflops", "numba_first_call",
           "user_time", "PAIRED_CLOCKS"]


def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not in /proc/meminfo")


def _nbytes(x) -> int:
    """Bytes of a numpy array or a torch tensor."""
    if isinstance(x, np.ndarray):
        return x.nbytes
    return x.numel() * x.element_size()


def peak_extra_memory(step: Callable[[], tuple]) -> dict:
    """Call ``step`` once; return ``{"peak_extra_bytes", "output_bytes", "workspace_bytes"}``.

    peak extra = VmHWM after the call - VmRSS before it (the high-water mark is reset just
    before the call); output = the bytes of the arrays ``step`` returns; workspace = peak extra
    - output (at least 0). Meaningful in a process whose kernels are already loaded.
    """
    rss_before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    outputs = step()
    extra = (_status_kib("VmHWM") - rss_before) * 1024
    out_bytes = sum(_nbytes(x) for x in outputs)
    del outputs
    return {"peak_extra_bytes": extra, "output_bytes": out_bytes,
            "workspace_bytes": max(0, extra - out_bytes)}


def measure_memory(case: Case) -> dict:
    """First-call latency and peak extra memory of ``case``, measured in this process, which
    should be fresh (:func:`measure_fresh`).

    Returns ``{"first_call_seconds", "peak_extra_bytes", "output_bytes", "workspace_bytes"}``:
    the seconds of a tiny first call (Numba's cache load, torch's start-up), then
    :func:`peak_extra_memory` of one full-size ``step``.
    """
    # (32 rows: above DECODE_MAX_SQ, so the tiny call loads the kernel the full call runs)
    tiny = replace(case, n=min(case.n, 32), batch=1, heads=1)
    tiny_step = make_runner(tiny).step
    out = {"first_call_seconds": _seconds(tiny_step)}
    if case.impl != "torch_sdpa":
        _load_parallel_builds(tiny_step)
    out.update(peak_extra_memory(make_runner(case).step))
    return out


def _load_parallel_builds(step: Callable[[], tuple]) -> None:
    """Call ``step`` once more (untimed) with the parallel build of every kernel, and load the
    parallel input scan: a tiny call runs the serial builds (:func:`flashlab.api.kernels_for`,
    :data:`flashlab.validation.SMALL_SCAN`), a full-size one the parallel builds, and a build
    loaded from Numba's cache inside the measured call would count as its workspace."""
    from flashlab import api
    from flashlab.input_scan import finite_and_max_sq_norm

    finite_and_max_sq_norm(np.zeros((2, 2), dtype=np.float32))
    saved = api.kernels_for
    api.kernels_for = lambda p: api.PARALLEL
    try:
        step()
    finally:
        api.kernels_for = saved


class CaseFailed(RuntimeError):
    """A worker process failed (crashed, was killed, or timed out)."""


def measure_fresh(case: Case, *, timeout: float = 3600.0, env: dict | None = None) -> dict:
    """:func:`measure_memory` in a fresh Python process.

    Raises :class:`CaseFailed` with the reason if the process fails.
    """
    cmd = [sys.executable, "-m", "flashlab.bench", "--worker", json.dumps(asdict(case))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise CaseFailed(f"worker timed out after {timeout:.0f} s") from None
    if proc.returncode != 0:
        why = (f"killed by signal {-proc.returncode}" + (" (out of memory?)" if proc.returncode == -9
                                                        else "")
               if proc.returncode < 0 else f"exit status {proc.returncode}")
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise CaseFailed(f"worker {why}: {tail}".rstrip(": "))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_worker(case_json: str) -> None:
    """Entry point of :func:`measure_fresh`'s process: print the measurement as JSON."""
    print(json.dumps(measure_memory(Case.from_dict(json.loads(case_json)))))


def _matmul_operands(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    return a, b


def _warm_runners(cases: list[Case], clock: Clock) -> tuple[dict[Case, Runner], dict[Case, dict]]:
    """A runner per case on ``clock``, each called once untimed (the warm-up); a case that raised
    ``MemoryError`` gets no runner and ``{"error": reason}`` in the second dict."""
    out: dict[Case, dict] = {}
    runners: dict[Case, Runner] = {}
    for c in cases:
        try:
            runners[c] = make_runner(c, clock)
            runners[c].once()  # warm-up
        except MemoryError as e:
            runners.pop(c, None)
            out[c] = {"error": f"MemoryError: {e}"}
    return runners, out


def _time_round(order: list[Case], runners: dict[Case, Runner], times: dict[Case, list[float]],
                out: dict[Case, dict], settle_seconds: float, warm_each: bool = False) -> None:
    """One round: each case of ``order`` timed once, after an untimed pause of ``settle_seconds``
    (and, with ``warm_each``, right after an untimed call of the same case); a case that raises
    ``MemoryError`` leaves ``runners`` and ``times`` with its reason in ``out``."""
    for c in order:
        time.sleep(settle_seconds)
        try:
            if warm_each:
                runners[c].once()
            times[c].append(runners[c].once())
        except MemoryError as e:
            del runners[c], times[c]
            out[c] = {"error": f"MemoryError: {e}"}


def time_interleaved(cases: list[Case], *, repeats: int = 3, max_timed_seconds: float = 30.0,
                     matmul_n: int = 4096, settle_seconds: float = 0.0
                     ) -> tuple[dict[Case, dict], dict]:
    """Time ``cases`` (one shape, several implementations) together in this process.

    Every case, and numpy's float32 ``(matmul_n)^2`` matmul, gets one warm-up call; then
    rounds in which each case is timed once, in turn, followed by the matmul: up to
    ``repeats`` rounds, none once the cases' timed calls add up to ``max_timed_seconds`` per
    case (at least one round). Interleaved this way, a change of load on a shared machine
    hits every implementation and the matmul alike, so their ratios stay meaningful.

    ``settle_seconds``: an untimed pause before every timed call. A call pays for what the
    call before it left behind (right after numpy naive's N=8192 forward, GBs allocated and
    returned to the OS, flashlab's next forward is slower by about the same absolute time,
    causal or not, which inflates the causal/non-causal ratio, a target). The full suite
    pauses 1 s.

    Returns ``({case: {"seconds": median, "times": [...]}}, {"n", "seconds", "gflops"})``,
    the second the matmul's; a case that raised ``MemoryError`` gets ``{"error": reason}``.
    """
    runners, out = _warm_runners(cases, time.perf_counter)
    a, b = _matmul_operands(matmul_n)
    a @ b
    times: dict[Case, list[float]] = {c: [] for c in runners}
    matmul_times: list[float] = []
    while len(matmul_times) < repeats and (
            not matmul_times or sum(map(sum, times.values())) < max_timed_seconds * len(times)):
        _time_round(list(runners), runners, times, out, settle_seconds)
        time.sleep(settle_seconds)
        matmul_times.append(_seconds(lambda: a @ b))
    out.update({c: {"seconds": statistics.median(t), "times": t} for c, t in times.items()})
    t = statistics.median(matmul_times)
    return out, {"n": matmul_n, "seconds": t, "gflops": 2.0 * matmul_n ** 3 / t / 1e9}


def user_time() -> float:
    """Seconds of user-mode CPU time of this process (``getrusage``'s ``ru_utime``): the CPU
    time ``time.process_time()`` reads, without what the kernel did on the process's behalf
    (system time: page faults and the zeroing and finding of fresh pages for large arrays)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


#: the clocks of :func:`time_paired` by :class:`BenchConfig` ``clock`` name
PAIRED_CLOCKS: dict[str, Clock] = {"cpu": time.process_time, "user": user_time}


def single_thread() -> None:
    """Run this process's compute on one thread from now on: Numba's parallel loops
    (``numba.set_num_threads(1)``), every BLAS (``threadpoolctl``: NumPy's and the SciPy copy
    flashlab's tiles call, :mod:`flashlab.kernels.blas`) and torch's intra-op pool if torch is
    loaded. With one thread computing, the process's CPU time is that thread's."""
    import numba
    from threadpoolctl import threadpool_limits

    import flashlab.kernels.blas  # noqa: F401  (loads SciPy's BLAS, so the limit below reaches it)

    numba.set_num_threads(1)
    threadpool_limits(1)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def time_paired(cases: list[Case], *, min_rounds: int = 10, max_rounds: int = 60,
                max_timed_seconds: float = 120.0, settle_seconds: float = 0.0,
                clock: Clock = time.process_time, matmul_n: int = 4096, matmul_repeats: int = 1,
                warm_each: bool = False) -> tuple[dict[Case, dict], dict, dict]:
    """Time ``cases`` (one shape, several implementations) call by call until every paired ratio
    resolves (``flashlab.paired``).

    Each case gets one warm-up call; then rounds in which each case is timed once, in turn, the
    order reversed every other round (A B C, C B A, ...), so that no case always follows the same
    one. ``clock`` is the process's CPU time by default: on a shared machine a neighbour that
    takes the core stops this process's clock rather than adding to its time (call
    :func:`single_thread` first, so that it is one thread's time). After ``min_rounds`` rounds,
    and after each one from then on, the median ratio of every pair of cases gets its bootstrap
    interval; the rounds stop when every interval is within ``paired.RESOLUTION`` of its median,
    or at ``max_rounds``, or once the timed calls add up to ``max_timed_seconds`` per case.

    ``warm_each``: every timed call comes right after an untimed call of the same case, so that
    what a case pays does not depend on the case before it. A call that allocates large arrays
    (numpy naive's (N, N) scores) pays for fresh memory on the clock (system time), and how much
    depends on what ran just before and how long ago: after a pause (``settle_seconds``) or
    another case's call the pages must be found again, after its own call they are at hand. With
    ``warm_each`` and no pause, each case is timed in its own steady state.

    Returns ``({case: {"seconds", "times", "paired_vs"}}, matmul, {"rounds", "resolved",
    "stopped"})``: ``paired_vs[other impl]`` is :func:`~flashlab.paired.paired_ratio` of
    the other's times over this one's (its speed against the other, as ``speed_vs``), as a dict;
    ``matmul``: numpy's float32 ``matmul_n`` cubed on the same clock after the rounds; a case that
    raised ``MemoryError`` gets ``{"error": reason}``.
    """
    if not 2 <= min_rounds <= max_rounds:
        raise ValueError(f"need 2 <= min_rounds <= max_rounds; got {min_rounds}, {max_rounds}")
    runners, out = _warm_runners(cases, clock)
    times: dict[Case, list[float]] = {c: [] for c in runners}

    def pairs():
        live = list(times)
        return [(a, b) for i, a in enumerate(live) for b in live[i + 1:]]

    stopped = "max_rounds"
    for rnd in range(max_rounds):
        order = list(times) if rnd % 2 == 0 else list(reversed(times))
        _time_round(order, runners, times, out, settle_seconds, warm_each)
        if not times:
            break
        # every case has rnd + 1 times here (a failed one is gone)
        if rnd + 1 >= min_rounds:
            if all(paired_ratio(times[a], times[b]).resolved for a, b in pairs()):
                stopped = "resolved"
                break
            if statistics.mean(map(sum, times.values())) >= max_timed_seconds:
                stopped = "max_timed_seconds"
                break
    for c, t in times.items():
        out[c] = {"seconds": statistics.median(t), "times": t,
                  "paired_vs": {o.impl: paired_ratio(times[o], t).to_dict() for o in times if o != c}}
    a, b = _matmul_operands(matmul_n)
    a @ b
    mm = statistics.median(_seconds(lambda: a @ b, clock) for _ in range(matmul_repeats))
    rounds = min((len(ts) for ts in times.values()), default=0)
    resolved = rounds > 1 and all(paired_ratio(times[x], times[y]).resolved for x, y in pairs())
    return (out, {"n": matmul_n, "seconds": mm, "gflops": 2.0 * matmul_n ** 3 / mm / 1e9},
            {"rounds": rounds, "resolved": resolved, "stopped": stopped})


def matmul_gflops(n: int = 4096, repeats: int = 3) -> dict:
    """numpy float32 ``(n x n) @ (n x n)``: median seconds after a warm-up, and GFLOP/s
    (``2 n^3`` FLOPs): the machine's practical peak for the kernels' matmuls."""
    a, b = _matmul_operands(n)
    a @ b
    t = statistics.median(_seconds(lambda: a @ b) for _ in range(repeats))
    return {"n": n, "seconds": t, "gflops": 2.0 * n ** 3 / t / 1e9}


_FIRST_CALL_CODE = """
import json, time
t0 = time.perf_counter(); import flashlab; from flashlab.bench import make_inputs
t1 = time.perf_counter()
q, k, v = make_inputs(32, heads=1)
o, lse = flashlab.flash_attention(q, k, v); t2 = time.perf_counter()
flashlab.flash_attention_backward(v, q, k, v, o, lse); t3 = time.perf_counter()
flashlab.flash_attention(q[:, :, :1], k, v); t4 = time.perf_counter()
print(json.dumps({"import_seconds": t1 - t0, "forward_seconds": t2 - t1,
                  "backward_seconds": t3 - t2, "decode_seconds": t4 - t3}))
"""


def numba_first_call(compile: bool = True) -> dict:
    """Seconds of the first forward and backward call in a fresh process.

    ``{"cache_load": {...}, "compile": {...} or None}``, each ``{"import_seconds",
    "forward_seconds", "backward_seconds", "decode_seconds"}`` (the tiled forward at N=32,
    its backward, then a one-row query: the decode kernel). With ``compile``: a process with an empty
    ``NUMBA_CACHE_DIR`` compiles (and fills it), a second one loads from it. Without: two
    processes on the default cache, the second one's times (the first may recompile stale
    entries).
    """
    def run(env):
        proc = subprocess.run([sys.executable, "-c", _FIRST_CALL_CODE], capture_output=True,
                              text=True, env=env, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    if not compile:
        run(None)
        return {"cache_load": run(None), "compile": None}
    with tempfile.TemporaryDirectory(prefix="flashlab-numba-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        compiled = run(env)
        return {"cache_load": run(env), "compile": compiled}
