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
  each dataflow of ``flashlab.dataflows.DATAFLOWS`` (the MLA section).

What is measured for each case
    * **time**: the median of up to ``repeats`` calls after one warm-up call at full size.
      The implementations of one shape are timed **in turn**, round by round, in one process
      (:func:`time_interleaved`), so that a change of load on the shared machine hits them
      alike; rounds stop once the timed calls add up to ``max_timed_seconds`` per case (at
      least one round); the full suite pauses ``settle_seconds`` (1 s) before each timed
      call, so that one implementation's after-effects (GBs returned to the OS) do not land
      in the next one's time. The backward times the backward alone (the forward's outputs
      are ready). With ``--clock cpu`` (the default of ``--mla-only``) the clock is the process's
      CPU time with every library on one thread, and the rounds go on until every paired ratio
      resolves (:func:`time_paired`, ``flashlab.paired``).
    * **GFLOP/s**: the matmul FLOPs of the case over its time, the same count for every
      implementation of a case, so GFLOP/s ratios are time ratios:
      :func:`flashlab.flops.attention_flops` (forward, ``4 N^2 D`` per head at ``D = Dv``) and
      :func:`flashlab.flops.attention_backward_flops` (``2 N^2 (3 Dqk + 2 Dv)``), scaled for
      ``causal`` by the fraction of the scores flashlab computes (:func:`tile_fraction`, ~1/2).
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

Targets (:func:`evaluate_targets`, thresholds in ``TARGETS``; the report prints them
first, each PASS / MISS with its ratio, or n/a when its cases are not in the run): forward D=128
N=4096 and 8192, causal and not, >= 1.1x torch's throughput and >= 85% of the matmul peak;
forward 192/128 N=8192 >= 2x torch's speed with <= 1/50 of its peak extra memory; backward
D=128 N=2048 and 4096 >= 1.2x torch, 192/128 N=4096 >= 2x; causal forward D=128 N=8192 <= 0.55x
the non-causal time; at N=16384 flashlab's workspace (peak extra memory beyond the returned
arrays, which every implementation must hold) < 100 MB, forward and backward; decode (Sq=1,
H=32/Hkv=8, the largest Sk) >= 1.5x torch's speed and within 1.5x of a plain parallel read of
K and V; the tile explorer's step and the pipeline explorer's change (medians) < 0.1 s.

**Decode** (:func:`decode_bench`, ``--decode-only``): one query row per head against Sk keys
(8192 to 131072), flashlab's split-KV kernel against the tiled forward, torch SDPA
(``enable_gqa``) and two reads of K and V (numpy's one-thread ``np.add.reduce`` and a parallel
Numba read), which bound any decode from below since it must read K and V once.

The full suite (``FULL``, ``make bench``) takes about an hour on 2 cores and
needs ~11 GB free for numpy naive at N=16384 (``--naive-max-n 8192`` skips it). The quick
subset (``QUICK``, ``make bench-quick`` or ``--quick``) runs in under 2 minutes: N 1024 and
2048, one timed call per case, memory at N=1024 (non-causal) only, MLA at S=1024, decode at
Sk=8192; it writes to ``bench-results/quick/``. Other options: ``--sizes``, ``--repeats``,
``--no-torch``, ``--no-mla``, ``--decode-only``, ``--no-decode``, ``--decode-sizes``,
``--ceiling-only``, ``--out``.

The package re-exports every public name of its modules, one per part of the suite:
``config`` (:class:`BenchConfig`, ``FULL``, ``QUICK``, :class:`Case`), ``inputs``
(random operands), ``runners`` (:class:`Runner` per implementation), ``measure`` (memory in a
fresh process, interleaved timing, paired timing on one thread's CPU time, the matmul peak, Numba's
first call), ``paired`` (the median paired ratio and its bootstrap interval), ``decode`` (the decode
section), ``explorers`` (the explorers' timings), ``estimates`` (FLOPs, intensity, memory
estimates), ``suite`` (the cases, skip rules and :func:`run_suite`), ``targets``
(:func:`evaluate_targets`), ``report`` (JSON and markdown), ``cli`` (:func:`main`) and
``ceiling`` (the backward against its five BLAS products alone and PyTorch's backward:
:func:`ceiling_run`, ``python -m flashlab.bench --ceiling-only``).

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

from flashlab.bench.ceiling import CEILING_PROBLEMS, backward_ceiling, backward_products, ceiling_lines, ceiling_run
from flashlab.bench.cli import main
from flashlab.bench.config import (
                                   BASELINES,
                                   CLOCKS,
                                   DIRECTIONS,
                                   FULL,
                                   HAS_BACKWARD,
                                   IMPLEMENTATIONS,
                                   MB,
                                   QUICK,
                                   SCHEMA,
                                   BenchConfig,
                                   Case,
)
from flashlab.bench.decode import decode_bench, decode_ratios
from flashlab.bench.estimates import (
                                   case_flops,
                                   estimated_bytes,
                                   mla_model_peak,
                                   model_intensity,
                                   tile_fraction,
                                   torch_flash_block_q,
                                   torch_uses_math_path,
)
from flashlab.bench.explorers import pipeline_explorer_timing, tile_explorer_step
from flashlab.bench.inputs import grad_output, make_inputs, make_mla_inputs
from flashlab.bench.measure import (
                                   CaseFailed,
                                   available_bytes,
                                   matmul_gflops,
                                   measure_fresh,
                                   measure_memory,
                                   numba_first_call,
                                   peak_extra_memory,
                                   run_worker,
                                   single_thread,
                                   time_interleaved,
                                   time_paired,
                                   user_time,
)
from flashlab.bench.report import (
                                   backward_over_forward,
                                   case_table,
                                   load_results,
                                   merge_results,
                                   save_results,
                                   to_markdown,
)
from flashlab.bench.runners import Clock, Runner, call_seconds, make_runner, torch_available
from flashlab.bench.suite import (
                                   CPU_CLOCK_NOTE,
                                   SINGLE_THREAD_ENV,
                                   attention_cases,
                                   blas_info,
                                   machine_info,
                                   mla_cases,
                                   run_group,
                                   run_suite,
                                   shape_key,
                                   skip_reason,
)
from flashlab.bench.targets import TARGETS, evaluate_targets, find_case
from flashlab.dataflows import DATAFLOWS
from flashlab.paired import (
                                   BOOTSTRAP_SAMPLES,
                                   BOOTSTRAP_SEED,
                                   CONFIDENCE,
                                   MIN_ROUNDS,
                                   RESOLUTION,
                                   PairedRatio,
                                   paired_ratio,
                                   paired_ratio_of_rows,
)

#: every public name of the submodules, and the MLA dataflows the suite runs
__all__ = [
    "IMPLEMENTATIONS", "BASELINES", "HAS_BACKWARD", "DIRECTIONS", "SCHEMA", "MB", "BenchConfig",
    "FULL", "QUICK", "Case", "make_inputs", "make_mla_inputs", "grad_output", "Runner",
    "call_seconds", "torch_available", "make_runner", "available_bytes", "peak_extra_memory",
    "measure_memory", "CaseFailed", "measure_fresh", "run_worker", "time_interleaved",
    "matmul_gflops", "numba_first_call", "decode_bench", "decode_ratios", "tile_explorer_step",
    "pipeline_explorer_timing", "tile_fraction", "case_flops", "torch_uses_math_path",
    "torch_flash_block_q", "model_intensity", "estimated_bytes", "mla_model_peak", "save_results",
    "load_results", "case_table", "backward_over_forward", "to_markdown", "find_case", "TARGETS",
    "evaluate_targets", "attention_cases", "mla_cases", "machine_info", "blas_info", "skip_reason",
    "shape_key", "backward_products", "backward_ceiling", "CEILING_PROBLEMS", "ceiling_run",
    "ceiling_lines", "run_group", "run_suite", "main", "DATAFLOWS", "CLOCKS", "Clock",
    "single_thread", "time_paired", "user_time",
    "RESOLUTION", "MIN_ROUNDS", "CONFIDENCE", "BOOTSTRAP_SAMPLES", "BOOTSTRAP_SEED",
    "PairedRatio", "paired_ratio", "paired_ratio_of_rows", "merge_results", "SINGLE_THREAD_ENV",
    "CPU_CLOCK_NOTE",
]
