r"""Benchmarks: ``python -m flashlab.bench`` (``make bench``; ``make bench-quick`` for a subset).

Measures **in one run** flashlab against its baselines and writes ``bench-results/bench.json``
and ``bench-results/bench.md``. This machine is shared and noisy, so an absolute figure from
one run says little on its own: every comparison is a ratio between two implementations
measured in the same run, and the machine's practical peak is measured in that run too.

Implementations (``impl``):

* ``flashlab``: :func:`flashlab.flash_attention` / :func:`flashlab.flash_attention_backward`;
* ``numpy_naive``: :func:`flashlab.attention_naive` (one ``(B, H, N, N)`` score matrix in
  float32; forward only: flashlab's naive backward is the float64 reference);
* ``torch_sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on the CPU, if torch is
  installed (optional: ``pip install -r requirements-bench.txt``); forward under
  ``torch.no_grad()``, backward ``out.backward(dO)`` on ``requires_grad`` leaves;
* ``mla:<dataflow>``: :func:`flashlab.mla.mla_forward` / :func:`flashlab.mla.mla_backward` in
  each dataflow of :data:`flashlab.cost.MLA_DATAFLOWS` (the MLA section).

What is measured for each case
    * **time**: the median of up to ``repeats`` calls after one warm-up call at full size.
      The implementations of one shape are timed **in turn**, round by round, in one process
      (:func:`time_interleaved`), so that a change of load on the shared machine hits them
      alike; rounds stop once the timed calls add up to ``max_timed_seconds`` per case (at
      least one round); the full suite pauses ``settle_seconds`` (1 s) before each timed
      call, so that one implementation's after-effects (GBs returned to the OS) do not land
      in the next one's time. The backward times the backward alone (the forward's outputs
      are ready).
    * **GFLOP/s**: the matmul FLOPs of the case over its time, the same count for every
      implementation of a case, so GFLOP/s ratios are time ratios:
      :func:`flashlab.cost.attention_flops` (forward, ``4 N^2 D`` per head at ``D = Dv``) and
      :func:`flashlab.cost.attention_backward_flops` (``2 N^2 (3 Dqk + 2 Dv)``), scaled for
      ``causal`` by the fraction of tiles flashlab computes (:func:`tile_fraction`, ~1/2).
    * **fraction of the matmul peak**: GFLOP/s over numpy's float32 ``(n x n) @ (n x n)``
      GFLOP/s, the matmul timed after each round of the case's shape (the machine's practical
      peak at that moment); :func:`matmul_gflops` also runs at the start and the end.
    * **peak extra memory**, in a **fresh process per case** (:func:`measure_fresh`, before
      the case is timed; the configured N only, every N in the full suite): the inputs
      are allocated and the kernels loaded by a tiny call first, then the resident-set
      high-water mark is reset (``/proc/self/clear_refs``) and read back after one full-size
      call: ``VmHWM - VmRSS`` before the call. This sees every allocation (Numba's, BLAS's,
      torch's), which ``tracemalloc`` would not. The forward's call is one forward; the
      backward's is a training step (forward + backward) above its inputs ``q, k, v, dO``,
      so that torch's autograd state counts as flashlab's ``o, lse`` do. ``workspace`` is the
      peak extra memory minus the bytes of what the call returns (``o, lse``; and
      ``dq, dk, dv``), which every implementation must hold: the working memory proper.
    * **first call**: in a fresh process, the seconds of the tiny first call (Numba's cache
      load, or compile if the cache is stale; torch's start-up). :func:`numba_first_call`
      times Numba's compile (empty ``NUMBA_CACHE_DIR``) and cache load separately.

Skipped cases (recorded with their reason, never silently): a case whose estimated memory
(:func:`estimated_bytes`) exceeds ``memory_headroom`` of the memory available when it starts;
a case predicted, from the same series at a smaller N, to take more than ``max_call_seconds``
per call; numpy naive above ``naive_max_n``; torch cases when torch is missing. A case whose
worker process fails (e.g. killed for memory) is recorded as failed with the reason.

Targets (:func:`evaluate_targets`, thresholds in :data:`TARGETS`; the report prints them
first, each PASS / MISS with its ratio, or n/a when its cases are not in the run): forward D=128
N=4096 and 8192, causal and not, >= 1.1x torch's throughput and >= 85% of the matmul peak;
forward 192/128 N=8192 >= 2x torch's speed with <= 1/50 of its peak extra memory; backward
D=128 N=2048 and 4096 >= 1.2x torch, 192/128 N=4096 >= 2x; causal forward D=128 N=8192 <= 0.55x
the non-causal time; at N=16384 flashlab's workspace (peak extra memory beyond the returned
arrays, which every implementation must hold) < 100 MB, forward and backward; decode (Sq=1,
H=32/Hkv=8, the largest Sk) >= 1.5x torch's speed and within 1.5x of a plain parallel read of
K and V.

**Decode** (:func:`decode_bench`, ``--decode-only``): one query row per head against Sk keys
(8192 to 131072), flashlab's split-KV kernel against the tiled forward, torch SDPA
(``enable_gqa``) and two reads of K and V (numpy's one-thread ``np.add.reduce`` and a parallel
Numba read), which bound any decode from below since it must read K and V once.

The full suite (:data:`FULL`, ``make bench``) takes about an hour on 2 cores and
needs ~11 GB free for numpy naive at N=16384 (``--naive-max-n 8192`` skips it). The quick
subset (:data:`QUICK`, ``make bench-quick`` or ``--quick``) runs in under 2 minutes: N 1024 and
2048, one timed call per case, memory at N=1024 (non-causal) only, MLA at S=1024, decode at
Sk=8192; it writes to ``bench-results/quick/``. Other options: ``--sizes``, ``--repeats``,
``--no-torch``, ``--no-mla``, ``--decode-only``, ``--no-decode``, ``--decode-sizes``, ``--out``.

From a notebook (small sizes; ``memory_sizes``/``mla_memory_sizes`` name the N measured in
fresh processes, ``()`` for none; ``first_call=None`` skips the Numba first-call timing)::

    from flashlab import bench
    res = bench.run_suite(bench.BenchConfig(sizes=(256, 512), heads=2, repeats=2,
                                            memory_sizes=(256,), mla_sizes=(256,),
                                            matmul_n=1024, first_call=None))
    print(bench.to_markdown(res))
    full = bench.load_results("../bench-results/bench.json")  # a full run, from book/
    rows = bench.case_table(full, direction="forward")       # result rows as dicts, to plot
    bench.evaluate_targets(full)                              # the target lines as dicts
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from flashlab.tiling import BACKWARD_BLOCK, FORWARD_BLOCK
from flashlab.cost import (MLA_DATAFLOWS, attention_backward_flops, attention_flops,
                           flash_backward_intensity, mla_backward_steps, mla_forward_steps,
                           operation_intensities)

#: the attention implementations of the main section
IMPLEMENTATIONS = ("flashlab", "numpy_naive", "torch_sdpa")
#: the baselines flashlab is compared with
BASELINES = ("numpy_naive", "torch_sdpa")
#: implementations with a backward (numpy naive has none in float32, see the module doc)
HAS_BACKWARD = ("flashlab", "torch_sdpa")
DIRECTIONS = ("forward", "backward")
#: version of the JSON layout written by :func:`run_suite`
SCHEMA = 1
MB = 10 ** 6


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class BenchConfig:
    """What :func:`run_suite` measures. The defaults are the full suite (``make bench``).

    - ``sizes``, ``shapes``, ``causal``: attention cases: N (= Sq = Sk), (Dqk, Dv) pairs,
      causal or not;
    - ``batch``, ``heads``: B and H; ``block``, ``backward_block``: flashlab's (block_q,
      block_k) for the forward cases and for the backward cases (the API's defaults);
    - ``baselines``: which of :data:`BASELINES` to run (torch ones are skipped if torch is
      missing);
    - ``repeats``, ``max_timed_seconds``: timed calls per case after the warm-up (see the
      module doc);
    - ``settle_seconds``: a pause before each timed call (see :func:`time_interleaved`);
    - ``max_call_seconds``: skip a case predicted to take longer than this per call;
    - ``memory_sizes``, ``memory_causal``: N (``None``: every N) and causal values of the
      attention cases that run in a fresh process and measure peak extra memory; the other
      cases are timed in this process;
    - ``memory_headroom``: skip a case whose estimated memory exceeds this fraction of
      MemAvailable;
    - ``naive_max_n``: skip numpy naive above this N (``None``: no limit; 16384 needs 8+ GB);
    - ``mla_sizes``, ``mla_heads``, ``mla_dims``, ``mla_memory_sizes``: the MLA section: S, H,
      (NoPE, RoPE, V) head dims, and the S measured in fresh processes (``None``: every S);
    - ``matmul_n``, ``matmul_repeats``: the numpy float32 matmul that sets the practical peak;
    - ``first_call``: :func:`numba_first_call`: ``"compile"`` (compile from an empty cache,
      tens of seconds, then the cache load), ``"cache"`` (the cache load only) or ``None``;
    - ``simulator_tasks``: time :func:`flashlab.pipeline.schedule.bench_simulator` on about
      this many tasks (``None``: skip);
    - ``tile_explorer``: time one step of the tile explorer (:func:`tile_explorer_step`);
    - ``decode_sizes``, ``decode_heads``, ``decode_dim``, ``decode_sq``, ``decode_repeats``:
      the decode section (:func:`decode_bench`): Sk values (none by default: :data:`FULL`
      has 8192, 32768 and 131072), (H, Hkv), head dim, query rows, timed rounds.
    """

    sizes: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    shapes: tuple[tuple[int, int], ...] = ((128, 128), (192, 128))
    causal: tuple[bool, ...] = (False, True)
    batch: int = 1
    heads: int = 8
    block: tuple[int, int] = FORWARD_BLOCK
    backward_block: tuple[int, int] = BACKWARD_BLOCK
    baselines: tuple[str, ...] = BASELINES
    repeats: int = 3
    max_timed_seconds: float = 30.0
    settle_seconds: float = 0.0
    max_call_seconds: float = 300.0
    memory_sizes: tuple[int, ...] | None = None
    memory_causal: tuple[bool, ...] = (False, True)
    memory_headroom: float = 0.75
    naive_max_n: int | None = None
    mla_sizes: tuple[int, ...] = (1024, 4096)
    mla_heads: int = 8
    mla_dims: tuple[int, int, int] = (128, 64, 128)
    mla_memory_sizes: tuple[int, ...] | None = None
    matmul_n: int = 4096
    matmul_repeats: int = 3
    first_call: str | None = "compile"
    simulator_tasks: int | None = 100_000
    tile_explorer: bool = True
    decode_sizes: tuple[int, ...] = ()
    decode_heads: tuple[int, int] = (32, 8)
    decode_dim: int = 128
    decode_sq: int = 1
    decode_repeats: int = 7

    def __post_init__(self):
        for name in ("sizes", "mla_sizes"):
            for n in getattr(self, name):
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise ValueError(f"{name} must hold ints >= 1; got {getattr(self, name)!r}")
        for b in self.baselines:
            if b not in BASELINES:
                raise ValueError(f"baselines must be a subset of {BASELINES}; got {self.baselines!r}")
        if not 0 <= self.settle_seconds <= 60:
            raise ValueError(f"settle_seconds must be in [0, 60]; got {self.settle_seconds}")
        for n in self.decode_sizes:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"decode_sizes must hold ints >= 1; got {self.decode_sizes!r}")
        if self.decode_heads[0] % self.decode_heads[1]:
            raise ValueError(f"decode_heads (H, Hkv) needs H % Hkv == 0; got {self.decode_heads}")
        if self.repeats < 1 or self.decode_repeats < 1:
            raise ValueError(f"repeats and decode_repeats must be >= 1; got {self.repeats}, "
                             f"{self.decode_repeats}")
        if self.first_call not in ("compile", "cache", None):
            raise ValueError(f"first_call must be 'compile', 'cache' or None; got {self.first_call!r}")
        if not 0 < self.memory_headroom <= 1:
            raise ValueError(f"memory_headroom must be in (0, 1]; got {self.memory_headroom}")

    def block_for(self, direction: str) -> tuple[int, int]:
        """flashlab's ``(block_q, block_k)`` for cases of ``direction``."""
        return tuple(self.block if direction == "forward" else self.backward_block)

    @classmethod
    def from_dict(cls, d: dict) -> "BenchConfig":
        """The inverse of ``dataclasses.asdict`` (JSON turns tuples into lists)."""
        def tup(x):
            return tuple(tup(y) for y in x) if isinstance(x, list) else x
        return cls(**{k: tup(v) for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})


#: ``make bench``: B=1, H=8, fp32, N 1024..16384, D=128 and 192/128, causal and not; a 1 s
#: pause before each timed call; decode at Sk 8192, 32768, 131072 (H=32/Hkv=8, D=128)
FULL = BenchConfig(settle_seconds=1.0, decode_sizes=(8192, 32768, 131072))
#: ``make bench-quick`` (under 2 minutes): N 1024 and 2048, one timed call after the warm-up,
#: memory at N=1024 non-causal only, MLA at S=1024 without memory, a 2048^3 matmul, no
#: compile timing, decode at Sk=8192
QUICK = BenchConfig(sizes=(1024, 2048), repeats=1, memory_sizes=(1024,), memory_causal=(False,),
                    mla_sizes=(1024,), mla_memory_sizes=(), matmul_n=2048, matmul_repeats=3,
                    first_call="cache", simulator_tasks=20_000, decode_sizes=(8192,),
                    decode_repeats=3)


@dataclass(frozen=True)
class Case:
    """One measurement: an implementation, a direction and a shape (all float32).

    q, k: (batch, heads, n, d_qk); v, dO: (batch, heads, n, d_v). MLA cases (``impl`` =
    ``"mla:<dataflow>"``): q_nope, k_nope (batch, heads, n, d_qk), q_rope (batch, heads, n,
    d_rope), the shared k_rope (batch, 1, n, d_rope), v (batch, heads, n, d_v).
    """

    impl: str
    direction: str
    n: int
    d_qk: int
    d_v: int
    causal: bool = False
    batch: int = 1
    heads: int = 8
    d_rope: int = 0
    block: tuple[int, int] = FORWARD_BLOCK

    def __post_init__(self):
        known = IMPLEMENTATIONS + tuple(f"mla:{f}" for f in MLA_DATAFLOWS)
        if self.impl not in known:
            raise ValueError(f"impl must be one of {known}; got {self.impl!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}; got {self.direction!r}")
        if self.direction == "backward" and self.impl == "numpy_naive":
            raise ValueError("numpy_naive has no backward (flashlab's naive backward is the "
                             "float64 reference): use impl 'flashlab' or 'torch_sdpa'")
        if self.impl.startswith("mla:") and self.d_rope < 1:
            raise ValueError(f"an MLA case needs d_rope >= 1; got {self.d_rope}")

    @property
    def section(self) -> str:
        return "mla" if self.impl.startswith("mla:") else "attention"

    @property
    def label(self) -> str:
        dims = f"{self.d_qk}+{self.d_rope}/{self.d_v}" if self.d_rope else f"{self.d_qk}/{self.d_v}"
        return (f"{self.impl} {self.direction} N={self.n} {dims}"
                f"{' causal' if self.causal else ''} H={self.heads}")

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        d = {k: d[k] for k in (f.name for f in dataclasses.fields(cls)) if k in d}
        return cls(**{**d, "block": tuple(d.get("block", FORWARD_BLOCK))})


# ------------------------------------------------------------------------------------ inputs
def make_inputs(n: int, *, batch: int = 1, heads: int = 8, d: int = 128, d_v: int | None = None,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random float32 (q, k, v): q, k (batch, heads, n, d), v (batch, heads, n, d_v or d)."""
    rng = np.random.default_rng(seed)
    dims = (d, d, d if d_v is None else d_v)
    return tuple(rng.standard_normal((batch, heads, n, dd), dtype=np.float32) for dd in dims)


def make_mla_inputs(n: int, *, batch: int = 1, heads: int = 8, d_nope: int = 128,
                    d_rope: int = 64, d_v: int = 128, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Random float32 MLA operands ``(q_nope, k_nope, v, q_rope, k_rope)``: q_nope, k_nope
    (batch, heads, n, d_nope), v (batch, heads, n, d_v), q_rope (batch, heads, n, d_rope) and
    ONE k_rope head shared by all heads (batch, 1, n, d_rope)."""
    rng = np.random.default_rng(seed)
    shapes = [(heads, d_nope), (heads, d_nope), (heads, d_v), (heads, d_rope), (1, d_rope)]
    return tuple(rng.standard_normal((batch, h, n, d), dtype=np.float32) for h, d in shapes)


def _grad_output(case: Case) -> np.ndarray:
    """dO (batch, heads, n, d_v), float32."""
    rng = np.random.default_rng(1)
    return rng.standard_normal((case.batch, case.heads, case.n, case.d_v), dtype=np.float32)


# ----------------------------------------------------------------------------------- runners
class Runner(NamedTuple):
    """How to run one case.

    ``step()`` runs what the memory is measured on (a forward; or forward + backward) and
    returns its outputs; ``once()`` runs what is timed (a forward; or the backward alone,
    its forward done untimed) and returns the seconds it took.
    """

    step: Callable[[], tuple]
    once: Callable[[], float]


def _seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _flashlab_runner(case: Case) -> Runner:
    import flashlab

    q, k, v = make_inputs(case.n, batch=case.batch, heads=case.heads, d=case.d_qk, d_v=case.d_v)
    opts = dict(causal=case.causal, block_q=case.block[0], block_k=case.block[1])
    if case.direction == "forward":
        def forward():
            return flashlab.flash_attention(q, k, v, **opts)
        return Runner(forward, lambda: _seconds(forward))
    do = _grad_output(case)
    # the forward's (o, lse), computed once, untimed, on the first timed backward
    saved = functools.cache(lambda: flashlab.flash_attention(q, k, v, **opts))

    def training_step():
        o, lse = flashlab.flash_attention(q, k, v, **opts)
        return (o, lse) + flashlab.flash_attention_backward(do, q, k, v, o, lse, **opts)

    def backward():
        o, lse = saved()
        return _seconds(lambda: flashlab.flash_attention_backward(do, q, k, v, o, lse, **opts))
    return Runner(training_step, backward)


def _naive_runner(case: Case) -> Runner:
    from flashlab import attention_naive

    q, k, v = make_inputs(case.n, batch=case.batch, heads=case.heads, d=case.d_qk, d_v=case.d_v)

    def forward():
        return attention_naive(q, k, v, causal=case.causal)
    return Runner(forward, lambda: _seconds(forward))


def torch_available() -> bool:
    """Whether torch can be imported (it is optional: ``requirements-bench.txt``)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _torch_runner(case: Case) -> Runner:
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.from_numpy(x) for x in
               make_inputs(case.n, batch=case.batch, heads=case.heads, d=case.d_qk, d_v=case.d_v))
    if case.direction == "forward":
        def forward():
            with torch.no_grad():
                return (F.scaled_dot_product_attention(q, k, v, is_causal=case.causal),)
        return Runner(forward, lambda: _seconds(forward))
    do = torch.from_numpy(_grad_output(case))

    def forward_with_graph():
        # new leaves each time, so that gradients never accumulate across calls
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        return leaves, F.scaled_dot_product_attention(*leaves, is_causal=case.causal)

    def training_step():
        leaves, o = forward_with_graph()
        o.backward(do)
        return (o.detach(),) + tuple(x.grad for x in leaves)

    def backward():
        _, o = forward_with_graph()
        return _seconds(lambda: o.backward(do))
    return Runner(training_step, backward)


def _mla_runner(case: Case) -> Runner:
    from flashlab.mla import mla_backward, mla_forward

    q_nope, k_nope, v, q_rope, k_rope = make_mla_inputs(
        case.n, batch=case.batch, heads=case.heads, d_nope=case.d_qk, d_rope=case.d_rope,
        d_v=case.d_v)
    opts = dict(dataflow=case.impl.split(":", 1)[1], causal=case.causal,
                block_q=case.block[0], block_k=case.block[1])

    def forward():
        fwd = mla_forward(q_nope, k_nope, v, q_rope, k_rope, **opts)
        return fwd.o, fwd.lse
    if case.direction == "forward":
        return Runner(forward, lambda: _seconds(forward))
    do = _grad_output(case)
    saved = functools.cache(lambda: mla_forward(q_nope, k_nope, v, q_rope, k_rope, **opts))

    def training_step():
        fwd = mla_forward(q_nope, k_nope, v, q_rope, k_rope, **opts)
        grads, _ = mla_backward(do, fwd)
        return (fwd.o, fwd.lse) + tuple(grads)

    def backward():
        fwd = saved()
        return _seconds(lambda: mla_backward(do, fwd))
    return Runner(training_step, backward)


def make_runner(case: Case) -> Runner:
    """The :class:`Runner` of ``case`` (allocates its inputs)."""
    if case.section == "mla":
        return _mla_runner(case)
    return {"flashlab": _flashlab_runner, "numpy_naive": _naive_runner,
            "torch_sdpa": _torch_runner}[case.impl](case)


# ------------------------------------------------------------------------------- measurement
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
    out = {"first_call_seconds": _seconds(make_runner(tiny).step)}
    out.update(peak_extra_memory(make_runner(case).step))
    return out


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


def _worker(case_json: str) -> None:
    """Entry point of :func:`measure_fresh`'s process: print the measurement as JSON."""
    print(json.dumps(measure_memory(Case.from_dict(json.loads(case_json)))))


def _matmul_operands(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))


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
    call before it left behind: right after numpy naive's N=8192 forward (GBs allocated and
    returned to the OS), flashlab's causal forward took 0.98-1.07 s against 0.94-0.98 s
    three seconds later (three rounds), its non-causal forward +1-3 %: about the same absolute
    cost, so it inflates the causal/non-causal ratio (a target). The full suite pauses 1 s.

    Returns ``({case: {"seconds": median, "times": [...]}}, {"n", "seconds", "gflops"})``,
    the second the matmul's; a case that raised ``MemoryError`` gets ``{"error": reason}``.
    """
    out: dict[Case, dict] = {}
    runners: dict[Case, Runner] = {}
    for c in cases:
        try:
            runners[c] = make_runner(c)
            runners[c].once()  # warm-up
        except MemoryError as e:
            runners.pop(c, None)
            out[c] = {"error": f"MemoryError: {e}"}
    a, b = _matmul_operands(matmul_n)
    a @ b
    times: dict[Case, list[float]] = {c: [] for c in runners}
    matmul_times: list[float] = []
    while len(matmul_times) < repeats and (
            not matmul_times or sum(map(sum, times.values())) < max_timed_seconds * len(times)):
        for c in list(runners):
            time.sleep(settle_seconds)
            try:
                times[c].append(runners[c].once())
            except MemoryError as e:
                del runners[c], times[c]
                out[c] = {"error": f"MemoryError: {e}"}
        time.sleep(settle_seconds)
        matmul_times.append(_seconds(lambda: a @ b))
    out.update({c: {"seconds": statistics.median(t), "times": t} for c, t in times.items()})
    t = statistics.median(matmul_times)
    return out, {"n": matmul_n, "seconds": t, "gflops": 2.0 * matmul_n ** 3 / t / 1e9}


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


# ------------------------------------------------------------------------------- decode
def decode_bench(sk: int, *, heads: int = 32, kv_heads: int = 8, d: int = 128, sq: int = 1,
                 repeats: int = 7, torch: bool = True) -> dict:
    """Decode (``sq`` query rows against ``sk`` keys, GQA ``heads``/``kv_heads``), timed in turn.

    Implementations, each timed once per round, ``repeats`` rounds after a warm-up:
    ``flashlab`` (:func:`flashlab.flash_attention`, which runs the split-KV kernel of
    :mod:`flashlab.kernels.decode`), ``flashlab_tiled`` (the tiled forward on the same
    problem: what ran before the decode kernel), ``torch_sdpa`` (``enable_gqa=True``, K and V
    not expanded) when ``torch``; and two reads of K and V that bound any decode from below,
    as decode reads every byte of K and V once: ``read_numpy`` (``np.add.reduce`` of K then
    V, one thread) and ``read_2threads`` (:func:`flashlab.input_scan.finite_and_max_sq_norm`
    on K then V, a parallel read on every Numba thread).

    Returns ``{"sk", "sq", "heads", "kv_heads", "d", "kv_bytes", "times": {impl: [...]},
    "seconds": {impl: median}, "best": {impl: min}, "gbps": {impl: kv_bytes / median}}``.
    """
    import flashlab
    from flashlab import api
    from flashlab.input_scan import finite_and_max_sq_norm

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, heads, sq, d), dtype=np.float32)
    k = rng.standard_normal((1, kv_heads, sk, d), dtype=np.float32)
    v = rng.standard_normal((1, kv_heads, sk, d), dtype=np.float32)

    def tiled():
        saved = api.uses_decode
        api.uses_decode = lambda p: False
        try:
            return flashlab.flash_attention(q, k, v)
        finally:
            api.uses_decode = saved

    fns: dict[str, Callable[[], Any]] = {
        "flashlab": lambda: flashlab.flash_attention(q, k, v),
        "flashlab_tiled": tiled,
        "read_numpy": lambda: (np.add.reduce(k, axis=None), np.add.reduce(v, axis=None)),
        "read_2threads": lambda: (finite_and_max_sq_norm(k.reshape(-1, d)),
                                  finite_and_max_sq_norm(v.reshape(-1, d))),
    }
    if torch:
        import torch as th
        import torch.nn.functional as F
        tq, tk, tv = (th.from_numpy(x) for x in (q, k, v))

        def sdpa():
            with th.no_grad():
                return F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
        fns["torch_sdpa"] = sdpa
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, f in fns.items():
            times[name].append(_seconds(f))
    kv_bytes = k.nbytes + v.nbytes
    med = {name: statistics.median(t) for name, t in times.items()}
    return {"sk": sk, "sq": sq, "heads": heads, "kv_heads": kv_heads, "d": d,
            "kv_bytes": kv_bytes, "times": times, "seconds": med,
            "best": {name: min(t) for name, t in times.items()},
            "gbps": {name: kv_bytes / t / 1e9 for name, t in med.items()}}


def decode_ratios(row: dict) -> dict:
    """The decode target figures of one :func:`decode_bench` row.

    ``vs_torch``: torch's median time / flashlab's (> 1: faster); ``over_read_numpy`` and
    ``over_read_2threads``: flashlab's median time / the best time of that read of K and V
    (the bandwidth bound: 1.0 would be decode at the speed of a plain read);
    ``vs_tiled``: the tiled forward's time / flashlab's.
    """
    sec, best = row["seconds"], row["best"]
    fl = sec["flashlab"]
    return {"vs_torch": sec["torch_sdpa"] / fl if "torch_sdpa" in sec else None,
            "over_read_numpy": fl / best["read_numpy"],
            "over_read_2threads": fl / best["read_2threads"],
            "vs_tiled": sec["flashlab_tiled"] / fl}


# ------------------------------------------------------------------------ estimates, FLOPs
@functools.cache
def tile_explorer_step(sq: int = 36, sk: int = 36, block: int = 8, mask_kind: str = "causal",
                       dpi: int = 80) -> dict:
    """Seconds per step of the tile explorer: the median over every step of one walk.

    A step is what :meth:`flashlab.widgets.TileExplorer.redraw` does besides the widget
    traffic: :meth:`flashlab.viz.tiles.WalkView.update` and the PNG
    (:meth:`~flashlab.viz.tiles.WalkView.png`). The figure is built once before timing, as
    the explorer builds it once per walk. Returns ``{"problem", "steps", "median_s",
    "max_s", "build_s", "play_interval_s", "target_s"}``.
    """
    from flashlab.viz.tiles import WalkView       # a plain Agg figure: no pyplot, no backend switch
    from flashlab.widgets import PLAY_INTERVAL_MS, walk_demo

    walk, o_ref = walk_demo(sq, sk, block, block, mask_kind=mask_kind)
    t0 = time.perf_counter()
    view = WalkView(walk, o_ref, dpi=dpi)
    view.update(0)
    view.png()
    build = time.perf_counter() - t0
    seconds = []
    for index in range(1, len(walk.steps)):
        t0 = time.perf_counter()
        view.update(index)
        view.png()
        seconds.append(time.perf_counter() - t0)
    return {"problem": f"Sq = Sk = {sq}, {block} x {block} tiles, {mask_kind}, {dpi} dpi",
            "steps": len(seconds), "median_s": float(np.median(seconds)),
            "max_s": float(np.max(seconds)), "build_s": build,
            "play_interval_s": PLAY_INTERVAL_MS / 1e3, "target_s": 0.15}


def tile_fraction(n: int, block_q: int, block_k: int, causal: bool) -> float:
    """Fraction of the ``(n/block_q) x (n/block_k)`` tiles flashlab computes (1.0 unless
    causal; ~1/2 causal), from :func:`flashlab.masks.classify_tiles`."""
    if not causal:
        return 1.0
    from flashlab.masks import EMPTY, band_from, classify_tiles

    left, right = band_from(causal=True)
    return float((classify_tiles(n, n, block_q, block_k, left, right) != EMPTY).mean())


def case_flops(case: Case) -> float:
    """Matmul FLOPs of ``case``, the same for every implementation of a shape: attention at
    ``(d_qk + d_rope, d_v)`` (the useful work; the MLA baseline's padding is not counted),
    times :func:`tile_fraction` for causal cases."""
    f = attention_flops if case.direction == "forward" else attention_backward_flops
    return f(case.n, case.n, case.d_qk + case.d_rope, case.d_v, batch=case.batch,
             heads=case.heads, tile_fraction=tile_fraction(case.n, *case.block, case.causal))


def torch_uses_math_path(d_qk: int, d_v: int) -> bool:
    """Whether torch's CPU SDPA falls back to its math path (an ``N x N`` matrix per head):
    its flash kernel needs equal QK and V head dims (measured with torch 2.13: 192/128 falls
    back). Used only to estimate memory."""
    return d_qk != d_v


def torch_flash_block_q(n: int) -> int:
    """Query-block rows of PyTorch's CPU flash kernel for a sequence of ``n``: 256 once
    ``n >= 768``, 64 from 192, else 32 (``flash_attention_kernel_impl`` in PyTorch's
    ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``)."""
    return 256 if n >= 768 else 64 if n >= 192 else 32


def model_intensity(row: dict, elem: int = 4) -> float:
    """Model arithmetic intensity (FLOP/byte, :mod:`flashlab.cost`) of one result row.

    numpy naive, and torch SDPA on its math path, are standard attention (S and P through
    main memory); flashlab and torch's flash kernel are the fused forward (K, V read once per
    query block of ``block_q`` rows: flashlab's from the row, torch's
    :func:`torch_flash_block_q`) and the recomputation backward.
    """
    n, d_qk, d_v = row["n"], row["d_qk"], row["d_v"]
    if row["impl"] == "numpy_naive" or (row["impl"] == "torch_sdpa" and torch_uses_math_path(d_qk, d_v)):
        return operation_intensities(n, n, d_qk, d_v, elem=elem)["standard attention"]
    block_q = row["block"][0] if row["impl"] == "flashlab" else torch_flash_block_q(n)
    if row["direction"] == "forward":
        return operation_intensities(n, n, d_qk, d_v, block_q=block_q, elem=elem)["FlashAttention (fused)"]
    return flash_backward_intensity(n, n, d_qk, d_v, block_q=block_q, elem=elem)


def estimated_bytes(case: Case) -> int:
    """Rough peak memory of ``case`` (inputs included), to skip what cannot fit.

    Score matrices of ``B H N^2`` float32: numpy naive holds one (plus a ``B H N^2`` bool
    mask when causal); torch's math path ~2.5 in the forward and ~3.4 in a training step
    (measured at N=2048 with torch 2.13); flashlab and torch's flash path O(N).
    """
    scores = 4 * case.batch * case.heads * case.n ** 2
    # inputs q, k, v, dO and outputs of the same sizes, twice over for slack
    linear = 2 * 4 * case.batch * case.heads * case.n * (2 * (case.d_qk + case.d_rope) + 3 * case.d_v)
    if case.impl == "numpy_naive":
        return scores + (scores // 4 if case.causal else 0) + linear
    if case.impl == "torch_sdpa" and torch_uses_math_path(case.d_qk, case.d_v):
        return int(scores * (2.6 if case.direction == "forward" else 3.6)) + linear
    return linear


def mla_model_peak(case: Case) -> int:
    """Peak extra memory of an MLA case predicted by :mod:`flashlab.cost` (float32): every
    step's output held to the end, plus the step's workspace (:func:`flashlab.mla.ledger_peak`);
    the backward's is the training step's (forward steps, then backward steps)."""
    from flashlab.mla import ledger_peak

    args = (case.batch, case.heads, case.n, case.d_qk, case.d_rope, case.d_v)
    kw = dict(dataflow=case.impl.split(":", 1)[1], causal=case.causal, elem=4)
    steps = mla_forward_steps(*args, **kw)
    if case.direction == "backward":
        steps = steps + mla_backward_steps(*args, block_q=case.block[0], **kw)
    return ledger_peak(steps)


# -------------------------------------------------------------------------------- the suite
def attention_cases(config: BenchConfig) -> list[Case]:
    """The main section's cases, by N, then shape, causal, implementation and direction."""
    impls = ("flashlab",) + tuple(b for b in BASELINES if b in config.baselines)
    return [Case(impl, direction, n, d_qk, d_v, causal, config.batch, config.heads,
                 block=config.block_for(direction))
            for n in config.sizes for d_qk, d_v in config.shapes for causal in config.causal
            for impl in impls for direction in DIRECTIONS
            if direction == "forward" or impl in HAS_BACKWARD]


def mla_cases(config: BenchConfig) -> list[Case]:
    """The MLA section's cases: each dataflow forward and backward, then flashlab's native
    192/128 kernel and torch SDPA on the concatenated operands (non-causal)."""
    dn, dr, dv = config.mla_dims
    cases = [Case(f"mla:{flow}", direction, s, dn, dv, False, config.batch, config.mla_heads,
                  d_rope=dr,
                  block=config.block_for(direction))
             for s in config.mla_sizes for flow in MLA_DATAFLOWS for direction in DIRECTIONS]
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
    return info


def _skip_reason(case: Case, config: BenchConfig, has_torch: bool, done: dict) -> str | None:
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

    ``done``: the rows measured so far (for the time prediction of ``_skip_reason``).
    Returns ``({case: row}, the matmul timed with them or None)``; a row holds the case's
    fields, ``status`` ("ok", "skipped", "failed"), ``reason``, and the measurements.
    """
    rows: dict[Case, dict] = {}
    to_time = []
    for c in cases:
        row = {**asdict(c), "status": "ok", "reason": None, "fresh_process": False}
        reason = _skip_reason(c, config, has_torch, done)
        if reason:
            rows[c] = {**row, "status": "skipped", "reason": reason}
            continue
        if _measures_memory(c, config):
            try:
                timeout = 3 * config.max_call_seconds + 300
                row.update(measure_fresh(c, timeout=timeout), fresh_process=True)
            except CaseFailed as e:
                rows[c] = {**row, "status": "failed", "reason": f"memory measurement: {e}"}
                continue
        rows[c] = row
        to_time.append(c)
    if not to_time:
        return rows, None
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
        r["tile_fraction"] = tile_fraction(r["n"], *r["block"], r["causal"])
        r["gflops"] = r["flops"] / r["seconds"] / 1e9
        r["fraction_of_matmul_peak"] = r["gflops"] / r["matmul_gflops"]
        if r["impl"].startswith("mla:"):
            r["model_peak_bytes"] = mla_model_peak(Case.from_dict(r))
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
    result: dict[str, Any] = {
        "schema": SCHEMA, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(), "config": asdict(config), "timing": "interleaved",
        "load_average_start": os.getloadavg(),
    }
    result["notes"] = [
        "Time: the implementations of one shape are timed in turn, round by round, with a "
        "numpy matmul after each round (% matmul peak is against that matmul).",
        "numpy naive backward: not measured (flashlab's naive backward, "
        "attention_reference_backward, computes in float64); torch SDPA is the backward baseline.",
        "GFLOP/s: matmul FLOPs of the case (flashlab.cost), the same for every implementation; "
        "causal cases count the fraction of tiles flashlab computes.",
        "Memory: peak extra resident set of one call in a fresh process; backward rows: a "
        "training step (forward + backward) above q, k, v, dO. Workspace = peak extra minus "
        "the returned arrays. MB = 10^6 bytes.",
    ]
    if "torch_sdpa" in config.baselines and not has_torch:
        result["notes"].append("torch is not installed: torch SDPA cases skipped "
                               "(pip install -r requirements-bench.txt).")
    say(f"matmul peak (numpy float32 {config.matmul_n}^3) ...")
    matmul = {"start": matmul_gflops(config.matmul_n, config.matmul_repeats), "groups": []}
    if config.first_call:
        say(f"numba first call ({'compile and ' if config.first_call == 'compile' else ''}cache load) ...")
    result["numba_first_call"] = (numba_first_call(config.first_call == "compile")
                                  if config.first_call else None)
    if config.simulator_tasks:
        from flashlab.pipeline.schedule import bench_simulator
        say(f"pipeline simulator ({config.simulator_tasks} tasks) ...")
        result["simulator"] = bench_simulator(config.simulator_tasks)
    if config.tile_explorer:
        say("tile explorer steps ...")
        result["tile_explorer"] = tile_explorer_step()
    att, mla = attention_cases(config), mla_cases(config)
    # MLA-shape attention cases the main section also has are measured once
    unique = list(dict.fromkeys(att + mla))
    groups: dict[tuple, list[Case]] = {}
    for c in unique:
        groups.setdefault(shape_key(c), []).append(c)
    done: dict[Case, dict] = {}
    for group in groups.values():
        rows, mm = run_group(group, config, has_torch=has_torch, done=done)
        if mm:
            matmul["groups"].append(mm)
        for c, row in rows.items():
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


# ---------------------------------------------------------------------------------- targets
def find_case(result: dict, impl: str, direction: str, n: int, d_qk: int, d_v: int,
              causal: bool = False, section: str = "attention") -> dict | None:
    """The measured ("ok") row of ``result`` with these fields, or None."""
    for r in result["cases"]:
        if (r["section"], r["impl"], r["direction"], r["n"], r["d_qk"], r["d_v"], r["causal"]) \
                == (section, impl, direction, n, d_qk, d_v, causal) and r["status"] == "ok":
            return r
    return None


def _target(name: str, value: float | None, op: str, threshold: float, detail: str) -> dict:
    """One target line: ``status`` PASS / MISS, or n/a when ``value`` is None."""
    if value is None:
        return {"name": name, "value": None, "op": op, "threshold": threshold,
                "status": "n/a", "detail": detail}
    ok = {">=": value >= threshold, "<=": value <= threshold, "<": value < threshold}[op]
    return {"name": name, "value": value, "op": op, "threshold": threshold,
            "status": "PASS" if ok else "MISS", "detail": detail}


#: the issue's targets (thresholds of :func:`evaluate_targets`)
TARGETS = {"forward_vs_torch": 1.1, "forward_of_peak": 0.85, "mla_forward_vs_torch": 2.0,
           "mla_memory": 1 / 50, "backward_vs_torch": 1.2, "mla_backward_vs_torch": 2.0,
           "causal_over_full": 0.55, "workspace_mb": 100.0, "decode_vs_torch": 1.5,
           "decode_over_read": 1.5}


def evaluate_targets(result: dict) -> list[dict]:
    """The issue's targets (:data:`TARGETS`), each a ratio of two figures of the same run (or a
    memory bound): forward D=128 at N 4096 and 8192, causal and not (throughput against torch
    SDPA and against the matmul peak timed with it); forward 192/128 N=8192 (speed and peak
    extra memory against torch); backward D=128 at N 2048 and 4096 and 192/128 at N=4096
    against torch; causal over non-causal time at N=8192; workspace at N=16384; decode at the
    largest Sk of the run (speed against torch, time over the best plain read of K and V on
    every thread, :func:`decode_bench`)."""
    def get(impl, direction, n, d_qk=128, d_v=128, causal=False):
        return find_case(result, impl, direction, n, d_qk, d_v, causal)

    def ratio(a, b, key="seconds"):
        return None if a is None or b is None or key not in a or key not in b else a[key] / b[key]

    T = TARGETS
    missing = "not measured in this run"
    out = []
    for n in (4096, 8192):
        for causal in (False, True):
            what = f"forward D=128 N={n}{' causal' if causal else ' non-causal'}"
            fl, tr = get("flashlab", "forward", n, causal=causal), get("torch_sdpa", "forward", n, causal=causal)
            out.append(_target(f"{what}: throughput / torch SDPA's", ratio(tr, fl), ">=",
                               T["forward_vs_torch"], missing if fl is None or tr is None else
                               f"flashlab {fl['gflops']:.1f}, torch {tr['gflops']:.1f} GFLOP/s"))
            # the matmul timed with the case (a run before interleaving has only the run's peak)
            peak = None if fl is None else fl.get("matmul_gflops", result["matmul"]["peak_gflops"])
            out.append(_target(f"{what}: GFLOP/s / numpy matmul GFLOP/s",
                               None if fl is None else fl["gflops"] / peak, ">=",
                               T["forward_of_peak"], missing if fl is None else
                               f"flashlab {fl['gflops']:.1f}, matmul {peak:.1f} GFLOP/s"))
    fl, tr = get("flashlab", "forward", 8192, 192), get("torch_sdpa", "forward", 8192, 192)
    out.append(_target("forward 192/128 N=8192 non-causal: speed / torch SDPA's",
                       ratio(tr, fl), ">=", T["mla_forward_vs_torch"],
                       missing if fl is None or tr is None else
                       f"flashlab {fl['seconds']:.2f} s, torch {tr['seconds']:.2f} s"))
    mem = ratio(fl, tr, "peak_extra_bytes")
    out.append(_target("forward 192/128 N=8192 non-causal: peak extra memory / torch SDPA's",
                       mem, "<=", T["mla_memory"], missing if mem is None else
                       f"flashlab {fl['peak_extra_bytes'] / MB:.1f} MB, "
                       f"torch {tr['peak_extra_bytes'] / MB:.1f} MB; 1/{1 / max(mem, 1e-12):.0f}"))
    for n, d_qk, key in ((2048, 128, "backward_vs_torch"), (4096, 128, "backward_vs_torch"),
                         (4096, 192, "mla_backward_vs_torch")):
        fl, tr = get("flashlab", "backward", n, d_qk), get("torch_sdpa", "backward", n, d_qk)
        out.append(_target(f"backward {d_qk}/128 N={n} non-causal: speed / torch SDPA's",
                           ratio(tr, fl), ">=", T[key], missing if fl is None or tr is None else
                           f"flashlab {fl['seconds']:.2f} s, torch {tr['seconds']:.2f} s"))
    c, nc = get("flashlab", "forward", 8192, causal=True), get("flashlab", "forward", 8192)
    out.append(_target("forward D=128 N=8192: causal time / non-causal time",
                       ratio(c, nc), "<=", T["causal_over_full"],
                       missing if c is None or nc is None else
                       f"causal {c['seconds']:.2f} s, non-causal {nc['seconds']:.2f} s"))
    for direction in DIRECTIONS:
        r = get("flashlab", direction, 16384)
        has = r is not None and "workspace_bytes" in r
        out.append(_target(f"{direction} D=128 N=16384: flashlab workspace (MB; peak extra "
                           "minus the returned arrays)",
                           r["workspace_bytes"] / MB if has else None, "<", T["workspace_mb"],
                           f"peak extra {r['peak_extra_bytes'] / MB:.1f} MB, of which returned "
                           f"arrays {r['output_bytes'] / MB:.1f} MB" if has else missing))
    rows = result.get("decode") or []
    d = max(rows, key=lambda r: r["sk"]) if rows else None
    what = "decode" if d is None else (f"decode Sq={d['sq']} Sk={d['sk']} H={d['heads']}/"
                                       f"Hkv={d['kv_heads']}")
    r = None if d is None else decode_ratios(d)
    out.append(_target(f"{what}: speed / torch SDPA's", None if r is None else r["vs_torch"],
                       ">=", T["decode_vs_torch"], missing if r is None or r["vs_torch"] is None
                       else f"flashlab {d['seconds']['flashlab'] * 1e3:.1f} ms, torch "
                       f"{d['seconds']['torch_sdpa'] * 1e3:.1f} ms"))
    out.append(_target(f"{what}: time / a plain read of K and V (every thread)",
                       None if r is None else r["over_read_2threads"], "<=",
                       T["decode_over_read"], missing if r is None else
                       f"flashlab {d['gbps']['flashlab']:.1f} GB/s; read "
                       f"{d['kv_bytes'] / d['best']['read_2threads'] / 1e9:.1f} GB/s on every "
                       f"thread, {d['kv_bytes'] / d['best']['read_numpy'] / 1e9:.1f} GB/s numpy "
                       f"(one thread; flashlab / that: {r['over_read_numpy']:.2f})"))
    return out


# ---------------------------------------------------------------------------- JSON, markdown
def save_results(result: dict, out: Path | str = "bench-results") -> tuple[Path, Path]:
    """Write ``bench.json`` and ``bench.md`` into the folder ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "bench.json", out / "bench.md"
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(to_markdown(result))
    return paths


def load_results(path: Path | str) -> dict:
    """Read a result written by :func:`save_results` (``bench.json``)."""
    res = json.loads(Path(path).read_text())
    if res.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {res.get('schema')!r}, expected {SCHEMA}")
    return res


def case_table(result: dict, *, section: str = "attention", direction: str | None = None,
               status: str | None = "ok") -> list[dict]:
    """The rows of ``result`` of one section (and direction, status), e.g. to plot."""
    return [r for r in result["cases"] if r["section"] == section
            and (direction is None or r["direction"] == direction)
            and (status is None or r["status"] == status)]


def backward_over_forward(result: dict) -> list[dict]:
    """The backward's time over the forward's, per implementation and attention shape.

    One dict per (N, Dqk, Dv, causal, implementation) measured in both directions:
    ``forward_seconds``, ``backward_seconds``, ``ratio`` (backward / forward) and
    ``flop_ratio``, the matmul FLOPs of the backward over the forward's
    (:func:`flashlab.cost.attention_backward_flops` / :func:`~flashlab.cost.attention_flops`:
    ``(3 Dqk + 2 Dv) / (Dqk + Dv)``, 2.5 at equal dims, 2.6 at 192/128; causal cases of flashlab
    also by the two directions' tile fractions, which differ with their block sizes). The
    backward is timed alone (its forward's outputs ready), so ``ratio`` near ``flop_ratio``
    means both directions run their matmuls equally fast.
    """
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in case_table(result):
        key = (r["n"], r["d_qk"], r["d_v"], r["causal"], r["impl"])
        by_key.setdefault(key, {})[r["direction"]] = r
    out = []
    for (n, d_qk, d_v, causal, impl), rows in by_key.items():
        if set(rows) != set(DIRECTIONS):
            continue
        fwd, bwd = rows["forward"], rows["backward"]
        out.append({"n": n, "d_qk": d_qk, "d_v": d_v, "causal": causal, "impl": impl,
                    "forward_seconds": fwd["seconds"], "backward_seconds": bwd["seconds"],
                    "ratio": bwd["seconds"] / fwd["seconds"],
                    "flop_ratio": bwd["flops"] / fwd["flops"]})
    return out


def _backward_over_forward_table(rows: list[dict]) -> list[str]:
    """Markdown lines of :func:`backward_over_forward`'s ``rows``."""
    lines = ["| N | Dqk/Dv | causal | implementation | forward (ms) | backward (ms) "
             "| backward / forward | matmul FLOPs ratio |", "|---:|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['d_qk']}/{r['d_v']} | {'yes' if r['causal'] else 'no'} "
                     f"| {r['impl']} | {r['forward_seconds'] * 1e3:.1f} "
                     f"| {r['backward_seconds'] * 1e3:.1f} | {r['ratio']:.2f} "
                     f"| {r['flop_ratio']:.2f} |")
    return lines


def _fmt(x, spec: str, suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def _mb(r: dict, key: str) -> str:
    """``r[key]`` bytes in MB with one decimal, or a dash if absent."""
    return _fmt(r[key] / MB if key in r else None, ".1f")


def _attention_table(result: dict, direction: str) -> list[str]:
    head = ("| N | Dqk/Dv | causal | implementation | time (ms) | GFLOP/s | % matmul peak "
            "| speed vs numpy naive | speed vs torch | peak extra (MB) | workspace (MB) "
            "| memory vs torch | first call (s) |")
    lines = [head, "|---:|---|---|---|" + "---:|" * 9]
    for r in case_table(result, direction=direction):
        sv, mv = r.get("speed_vs", {}), r.get("memory_vs", {})
        lines.append(
            f"| {r['n']} | {r['d_qk']}/{r['d_v']} | {'yes' if r['causal'] else 'no'} | {r['impl']} "
            f"| {r['seconds'] * 1e3:.1f} | {r['gflops']:.1f} | {r['fraction_of_matmul_peak']:.0%} "
            f"| {_fmt(sv.get('numpy_naive'), '.2f', 'x')} | {_fmt(sv.get('torch_sdpa'), '.2f', 'x')} "
            f"| {_mb(r, 'peak_extra_bytes')} | {_mb(r, 'workspace_bytes')} "
            f"| {_fmt(mv.get('torch_sdpa'), '.3f', 'x')} | {_fmt(r.get('first_call_seconds'), '.2f')} |")
    return lines


def _mla_table(result: dict) -> list[str]:
    head = ("| S | direction | implementation | time (ms) | GFLOP/s (useful) | speed vs baseline "
            "| speed vs torch | peak extra (MB) | modelled peak (MB) | memory vs baseline |")
    lines = [head, "|---:|---|---|" + "---:|" * 7]
    for r in case_table(result, section="mla"):
        sv, mv = r.get("speed_vs", {}), r.get("memory_vs", {})
        name = r["impl"] if r["impl"].startswith("mla:") else f"{r['impl']} (concatenated 192/128)"
        lines.append(
            f"| {r['n']} | {r['direction']} | {name} | {r['seconds'] * 1e3:.1f} | {r['gflops']:.1f} "
            f"| {_fmt(sv.get('mla:baseline'), '.2f', 'x')} | {_fmt(sv.get('torch_sdpa'), '.2f', 'x')} "
            f"| {_mb(r, 'peak_extra_bytes')} | {_mb(r, 'model_peak_bytes')} "
            f"| {_fmt(mv.get('mla:baseline'), '.2f', 'x')} |")
    return lines


def to_markdown(result: dict) -> str:
    """A markdown report of :func:`run_suite`'s result (targets first)."""
    m, cfg = result["machine"], BenchConfig.from_dict(result["config"])
    mm = result["matmul"]
    lines = [f"# flashlab benchmark ({result['date']})", "",
             f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_total_bytes'] / 1e9:.0f} GB; "
             f"Python {m['python']}, numpy {m['numpy']}, numba {m['numba']} "
             f"({m['numba_threads']} threads), torch {m['torch'] or 'not installed'}"
             + (f" ({m['torch_threads']} threads)" if m["torch"] else "") + ". "
             f"Load average {result['load_average_start'][0]:.2f} at the start, "
             f"{result['load_average_end'][0]:.2f} at the end; the run took "
             f"{result['duration_seconds']:.0f} s. Shared machine: compare ratios, not absolute "
             f"figures.", "",
             f"Cases: B={cfg.batch}, H={cfg.heads}, float32, N in {list(cfg.sizes)}, Dqk/Dv in "
             f"{[f'{a}/{b}' for a, b in cfg.shapes]}, causal in {list(cfg.causal)}; flashlab "
             f"blocks {cfg.block[0]}x{cfg.block[1]} forward, "
             f"{cfg.backward_block[0]}x{cfg.backward_block[1]} backward; "
             f"time: the median of up to {cfg.repeats} "
             f"timed call(s) after a warm-up call"
             + ("; the implementations of a shape timed in turn, round by round"
                if result.get("timing") == "interleaved" else
                "; each case timed on its own (a run before interleaved timing)")
             + f"; peak memory (a fresh process per case) at N in "
             f"{'all' if cfg.memory_sizes is None else list(cfg.memory_sizes)}, causal in "
             f"{list(cfg.memory_causal)}.", "",
             "## Machine peak", "",
             f"numpy float32 ({mm['start']['n']}x{mm['start']['n']}) @ ({mm['start']['n']}x"
             f"{mm['start']['n']}): {mm['start']['gflops']:.1f} GFLOP/s at the start, "
             f"{mm['end']['gflops']:.1f} at the end"]
    if mm.get("groups"):
        g = [x["gflops"] for x in mm["groups"]]
        lines[-1] += (f", {min(g):.1f} to {max(g):.1f} when timed with the cases (each case's "
                      f"% matmul peak is against the matmul timed with it)")
    else:
        lines[-1] += "; % matmul peak below is against the best of the two"
    lines[-1] += f". Peak: **{mm['peak_gflops']:.1f} GFLOP/s**."
    lines.append("")
    nb = result["numba_first_call"] or {}
    if nb:
        lines += ["## Numba first call", "", "A fresh process: import flashlab, then the first "
                  "tiny forward and backward calls.", "",
                  "| process | import (s) | first forward (s) | first backward (s) | "
                  "first decode (s) |",
                  "|---|---:|---:|---:|---:|"]
    for what, label in (("compile", "empty cache (compile)"), ("cache_load", "cache load")):
        if nb.get(what):
            t = nb[what]
            lines.append(f"| {label} | {t['import_seconds']:.2f} | {t['forward_seconds']:.2f} "
                         f"| {t['backward_seconds']:.2f} | {_fmt(t.get('decode_seconds'), '.2f')} |")
    if result.get("simulator"):
        lines += ["", "## Pipeline simulator", "",
                  "flashlab.pipeline: building a task graph and simulating it (best of 3). The "
                  "target is the simulation: 10^5 tasks in under a second.", "",
                  "| graph | tasks | build (s) | simulate (s) | tasks/s simulated |",
                  "|---|---:|---:|---:|---:|"]
        for name, t in result["simulator"].items():
            lines.append(f"| {name} | {t['tasks']} | {t['build_s']:.2f} | {t['simulate_s']:.2f} "
                         f"| {t['tasks_per_s']:,.0f} |")
    if result.get("tile_explorer"):
        t = result["tile_explorer"]
        lines += ["", "## Tile explorer", "",
                  f"One step of the tile explorer (flashlab.viz.tiles.WalkView: move the artists, "
                  f"draw and encode the PNG) for {t['problem']}: median {t['median_s'] * 1e3:.0f} ms, "
                  f"slowest {t['max_s'] * 1e3:.0f} ms over {t['steps']} steps (the explorer plays "
                  f"a step every {t['play_interval_s'] * 1e3:.0f} ms; target: median under "
                  f"{t['target_s'] * 1e3:.0f} ms)."]
    lines += ["", "## Targets", "", "```"]
    for t in result["targets"]:
        val = "" if t["value"] is None else f" {t['value']:.3g} {t['op']} {t['threshold']:.3g}:"
        lines.append(f"{t['status']:<4} {t['name']}:{val} {t['detail']}")
    lines += ["```", ""]
    for direction in DIRECTIONS:
        if not case_table(result, direction=direction, status=None):
            continue  # e.g. --mla-only
        lines += [f"## Attention {direction}", "",
                  "Speed vs X = X's time / this time (> 1: faster); memory vs torch = this peak "
                  "extra / torch's."
                  + (" Backward: time of the backward alone; memory of a training step."
                     if direction == "backward" else ""), ""]
        lines += _attention_table(result, direction) + [""]
    if result.get("decode"):
        lines += ["## Decode", "",
                  "One query row per head against a long K/V cache (GQA: H query heads, Hkv kv "
                  "heads), float32, timed in turn (median of the rounds; reads: best). flashlab "
                  "runs the split-KV kernel; 'tiled' is the tiled forward on the same problem. "
                  "Reads of K and V: numpy's one-thread np.add.reduce, and a parallel read "
                  "(flashlab.input_scan) on every thread. Speed vs torch = torch's time / "
                  "flashlab's; over read = flashlab's time / the parallel read's.", "",
                  "| Sk | H/Hkv | K+V (MB) | flashlab (ms) | GB/s | tiled (ms) | torch (ms) | "
                  "read numpy (ms) | read all threads (ms) | speed vs torch | over read |",
                  "|---:|---|---:|" + "---:|" * 8]
        for d in result["decode"]:
            sec, r = d["seconds"], decode_ratios(d)
            lines.append(
                f"| {d['sk']} | {d['heads']}/{d['kv_heads']} | {d['kv_bytes'] / MB:.0f} "
                f"| {sec['flashlab'] * 1e3:.1f} | {d['gbps']['flashlab']:.1f} "
                f"| {sec['flashlab_tiled'] * 1e3:.1f} "
                f"| {_fmt(sec.get('torch_sdpa') and sec['torch_sdpa'] * 1e3, '.1f')} "
                f"| {d['best']['read_numpy'] * 1e3:.1f} | {d['best']['read_2threads'] * 1e3:.1f} "
                f"| {_fmt(r['vs_torch'], '.2f', 'x')} | {r['over_read_2threads']:.2f} |")
        lines.append("")
    bwf = backward_over_forward(result)
    if bwf:
        lines += ["## Backward / forward", "",
                  "The backward's time (alone) over the forward's, and the ratio of their "
                  "matmul FLOPs (2.5 at equal head dims: 5 matmuls per tile against 2).", ""]
        lines += _backward_over_forward_table(bwf) + [""]
    if case_table(result, section="mla", status=None):
        dn, dr, dv = cfg.mla_dims
        lines += ["## MLA", "",
                  f"DeepSeek-V3-like heads (NoPE {dn}, RoPE {dr} with one shared k_rope head, V "
                  f"{dv}), B={cfg.batch}, H={cfg.mla_heads}, non-causal. Dataflows of "
                  "flashlab.mla (baseline: expand, concat, pad V, attention at 192/192, slice; "
                  "native_v: no pad; split_rope: pad V, split accumulation, no concat; rect: "
                  "split accumulation at native dims), timed whole. "
                  "GFLOP/s of the useful work (192/128). Modelled peak: flashlab.cost's ledger. "
                  "The concatenated rows time flashlab and torch SDPA on ready-made 192-dim Q, K.",
                  ""]
        lines += _mla_table(result) + [""]
    skipped = [r for r in result["cases"] if r["status"] != "ok"]
    lines += ["## Skipped and failed cases", ""]
    # an MLA-shape attention case appears in both sections: list it once
    listed = dict.fromkeys(f"- {Case.from_dict(r).label}: {r['status']}: {r['reason']}"
                           for r in skipped)
    lines += list(listed) or ["- none"]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- CLI
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
    ap.add_argument("--decode-only", action="store_true", help="only the decode section "
                    "(split-KV against the tiled forward, torch SDPA and reads of K and V)")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode section")
    ap.add_argument("--decode-sizes", type=int, nargs="+", help="decode Sk values")
    ap.add_argument("--out", type=Path, help="results folder (default bench-results, "
                    "bench-results/quick with --quick, so a quick run never overwrites a full one)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0
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
        changes.update(sizes=(), first_call=None, simulator_tasks=None, tile_explorer=False,
                       decode_sizes=())
    if args.decode_only and (args.no_decode or args.mla_only):
        ap.error("--decode-only excludes --no-decode and --mla-only")
    if args.decode_only:
        changes.update(sizes=(), mla_sizes=(), first_call=None, simulator_tasks=None,
                       tile_explorer=False)
    if args.no_decode:
        changes["decode_sizes"] = ()
    if args.decode_sizes:
        changes["decode_sizes"] = tuple(args.decode_sizes)
    config = replace(config, **changes)
    result = run_suite(config, progress=lambda line: print(line, file=sys.stderr, flush=True))
    out = args.out or Path("bench-results/quick" if args.quick else "bench-results")
    json_path, md_path = save_results(result, out)
    print(to_markdown(result))
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
