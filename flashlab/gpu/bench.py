r"""``python -m flashlab.gpu.bench``: time the CUDA twin and torch's attention on a real GPU.

Two benches, each case placed on the device's roofline (:func:`roofline`), with the bytes of
the matching :func:`flashlab.traffic.traffic` dataflow:

1. **The twin** (float32 on CUDA cores): the fused forward and backward
   (:mod:`flashlab.gpu.forward`, :mod:`flashlab.gpu.backward`) against the standard three
   kernels (:mod:`flashlab.gpu.standard`), which run the same matmul code: the time difference
   is the IO difference. Bytes are the **global-memory requests** the kernels' instrumented
   builds count (dataflows ``"gpu:fused"`` / ``"gpu:standard"``); the L2 cache serves part of
   them, so the DRAM bytes are fewer (module :mod:`flashlab.gpu.traffic`).
2. **The torch pair**, where the arithmetic is fast: torch's *unfused* attention
   (``baddbmm`` for $\text{scale}\,QK^\top$, ``masked_fill_`` for the causal mask, ``softmax``,
   ``bmm`` with V: separate kernels, S and P in DRAM, dataflow ``"standard"``) against
   ``scaled_dot_product_attention`` forced onto one fused backend at a time with
   ``torch.nn.attention.sdpa_kernel`` (``FLASH_ATTENTION``: bf16/fp16 only;
   ``EFFICIENT_ATTENTION``: also fp32, where its CUTLASS kernel runs 3xTF32 tensor-core MMA;
   dataflow ``"fused"`` with every K/V re-read served by L2, ``kv_hit=1``), in bf16, fp16 and
   fp32, forward.

Every case records its median time (CUDA events, operands resident), achieved TFLOP/s, the
bytes of its dataflow, and its roofline point: arithmetic intensity, the peak it runs against
(:func:`device_peaks`: FP32 CUDA cores, bf16/fp16 or TF32 tensor cores, from the device's
attributes) and the time the roofline predicts. :func:`pair_summary` sets, per torch case, the
measured unfused/fused speed-up beside the roofline's. The JSON names the device, the versions
and the date. With ``--ncu`` and Nsight Compute on the PATH, one extra run of the twin's fused
forward and standard kernels at the first size records ``ncu``'s DRAM bytes.

Without a CUDA GPU (the twin would run in Numba's simulator) it refuses: it times nothing and
writes nothing, exit status 2. Its analysis (records, roofline, summary, report) is tested on
injected timings.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import shutil
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from flashlab.flops import attention_backward_flops, attention_flops
from flashlab.ledgers import attended_pairs
from flashlab.tiling import KV_RESIDENT
from flashlab.traffic import backward_traffic, traffic

__all__ = ["FP32_LANES_PER_SM", "TENSOR_FLOPS_PER_SM_CLOCK", "PEAK_OF", "device_peaks", "roofline",
           "make_record", "pair_summary", "bench_document", "write_json", "report", "run_twin",
           "run_torch", "main"]

#: FP32 lanes (CUDA cores) per SM by compute capability major.minor; 2 FLOPs each per clock (FMA)
FP32_LANES_PER_SM = {(6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128,
                     (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}
#: dense tensor-core FLOPs per SM per clock (fp32 accumulate), data-centre parts only:
#: A100 (8.0) 312 TFLOP/s bf16 = 108 SMs x 1.41 GHz x 2048; H100/H200 (9.0) 4096
TENSOR_FLOPS_PER_SM_CLOCK = {(8, 0): {"bf16": 2048, "fp16": 2048, "tf32": 1024},
                             (9, 0): {"bf16": 4096, "fp16": 4096, "tf32": 2048}}
#: which peak of :func:`device_peaks` each implementation runs against, per dtype: the twin and
#: torch's unfused float32 matmuls (cuBLAS SGEMM, TF32 off: torch's default) on CUDA cores,
#: SDPA's memory-efficient float32 kernel as 3xTF32 (three TF32 MMAs per product: a third of
#: the TF32 peak), everything in bf16/fp16 on tensor cores
PEAK_OF = {("twin", "fp32"): "fp32", ("unfused", "fp32"): "fp32", ("efficient", "fp32"): "3xtf32",
           **{(impl, dt): dt for impl in ("unfused", "flash", "efficient") for dt in ("bf16", "fp16")}}
DEFAULT_OUT = "flashlab/data/gpu_bench_fa2.json"
ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}
#: query rows per block of the fused torch backends, for their K/V re-reads in traffic.traffic
#: (FlashAttention-2's forward: 128; the CUTLASS memory-efficient kernel: 64)
TORCH_BLOCK_Q = {"flash": 128, "efficient": 64}


def device_peaks(name: str, cc: tuple[int, int], sms: int, clock_khz: int | None,
                 mem_clock_khz: int | None, bus_bits: int | None) -> dict:
    """The device's peaks from its attributes (None where unknown), in TFLOP/s and GB/s.

    FP32 CUDA cores: ``SMs x lanes x 2 x clock``; tensor cores (bf16, fp16, TF32, and 3xTF32 =
    TF32 / 3): ``SMs x`` :data:`TENSOR_FLOPS_PER_SM_CLOCK` ``x clock``; DRAM:
    ``2 (double data rate) x memory clock x bus width / 8``.
    """
    lanes = FP32_LANES_PER_SM.get((cc[0], cc[1]))
    fp32 = None if not (lanes and clock_khz) else sms * lanes * 2 * clock_khz * 1e3
    hbm = None if not (mem_clock_khz and bus_bits) else 2 * mem_clock_khz * 1e3 * bus_bits / 8
    tc = TENSOR_FLOPS_PER_SM_CLOCK.get((cc[0], cc[1]), {})
    tensor = {k: (sms * f * clock_khz * 1e3 / 1e12 if clock_khz else None) for k, f in tc.items()}
    tf32 = tensor.get("tf32")
    if tf32:
        tensor["3xtf32"] = tf32 / 3
    return {"name": name, "compute_capability": list(cc), "sms": sms,
            "fp32_peak_tflops": None if fp32 is None else fp32 / 1e12,
            "tensor_peak_tflops": tensor,
            "dram_peak_gbs": None if hbm is None else hbm / 1e9}


def _peak(peaks: dict, key: str) -> float | None:
    return peaks.get("fp32_peak_tflops") if key == "fp32" else peaks.get("tensor_peak_tflops", {}).get(key)


def roofline(flops: float, nbytes: float | None, peak_tflops: float | None,
             dram_gbs: float | None) -> dict:
    """One point on the roofline: intensity ``flops / nbytes`` (FLOP per byte), the ridge
    ``peak / bandwidth``, the predicted time ``max(flops / peak, nbytes / bandwidth)`` and which
    roof sets it (``"compute"`` or ``"memory"``); None where a number is unknown."""
    if nbytes is None or not peak_tflops or not dram_gbs:
        return {"intensity": None if not nbytes else flops / nbytes, "ridge": None,
                "predicted_seconds": None, "bound": None}
    t_compute, t_memory = flops / (peak_tflops * 1e12), nbytes / (dram_gbs * 1e9)
    return {"intensity": flops / nbytes, "ridge": peak_tflops * 1e12 / (dram_gbs * 1e9),
            "predicted_seconds": max(t_compute, t_memory),
            "bound": "compute" if t_compute >= t_memory else "memory"}


def make_record(impl: str, *, n: int, d_qk: int, d_v: int, causal: bool, batch: int,
                heads: int, times: list[float], traffic_bytes: float | None, peaks: dict,
                block: tuple[int, int] | None = None, direction: str = "forward",
                dtype: str = "fp32", peak: str = "fp32", dataflow: str | None = None,
                skips_masked: bool = True) -> dict:
    """One timed case: median seconds, TFLOP/s, GB/s, their shares of the peaks, its roofline point.

    FLOPs are the matmul FLOPs of :func:`flashlab.flops.attention_flops` (forward) or
    :func:`~flashlab.flops.attention_backward_flops` (backward: five products, 2.5x at equal
    dims), over the attended fraction of the score matrix (causal: about half); the roofline
    uses the FLOPs the implementation *executes*: the whole matrix when it skips nothing
    (``skips_masked=False``: the unfused and standard pipelines). ``peak`` names the peak of
    :func:`device_peaks` it runs against (:data:`PEAK_OF`); ``traffic_bytes`` are the bytes of
    ``dataflow`` (:func:`flashlab.traffic.traffic`).
    """
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    if not times:
        raise ValueError("times must hold at least one measurement; got []")
    seconds = statistics.median(times)
    flops_of = attention_flops if direction == "forward" else attention_backward_flops
    flops = flops_of(n, n, d_qk, d_v, batch=batch, heads=heads,
                     tile_fraction=attended_pairs(n, n, causal) / (n * n))
    executed = flops if skips_masked else flops_of(n, n, d_qk, d_v, batch=batch, heads=heads)
    tflops = flops / seconds / 1e12
    gbs = None if traffic_bytes is None else traffic_bytes / seconds / 1e9
    peak_tflops, dram = _peak(peaks, peak), peaks.get("dram_peak_gbs")
    point = roofline(executed, traffic_bytes, peak_tflops, dram)
    return {"impl": impl, "direction": direction, "dtype": dtype, "n": n, "d_qk": d_qk, "d_v": d_v,
            "causal": causal, "batch": batch, "heads": heads,
            "block": None if block is None else list(block), "seconds": seconds,
            "times": list(times), "flops": flops, "executed_flops": executed, "tflops": tflops,
            "dataflow": dataflow, "traffic_bytes": traffic_bytes, "gbs": gbs,
            "peak": peak, "peak_tflops": peak_tflops,
            "share_of_peak": None if not peak_tflops else executed / seconds / 1e12 / peak_tflops,
            "share_of_fp32_peak": None if not peaks.get("fp32_peak_tflops") else tflops / peaks["fp32_peak_tflops"],
            "share_of_dram_peak": None if (not dram or gbs is None) else gbs / dram,
            "roofline": point,
            "share_of_roofline": (None if point["predicted_seconds"] is None
                                  else point["predicted_seconds"] / seconds)}


def pair_summary(cases: list[dict]) -> list[dict]:
    """Per torch case (dtype, N, d, causal) and fused backend: the measured speed-up of the fused
    backend over torch's unfused attention and the one the roofline predicts, and their ratio
    (1 = as predicted). Cases without an unfused partner, or without a prediction, are left out."""
    def key(r):
        return (r["dtype"], r["n"], r["d_qk"], r["causal"], r["direction"])
    unfused = {key(r): r for r in cases if r["impl"] == "torch unfused"}
    out = []
    for r in cases:
        if not r["impl"].startswith("torch SDPA") or key(r) not in unfused:
            continue
        u = unfused[key(r)]
        pu, pf = u["roofline"]["predicted_seconds"], r["roofline"]["predicted_seconds"]
        if pu is None or pf is None:
            continue
        measured, predicted = u["seconds"] / r["seconds"], pu / pf
        out.append({"dtype": r["dtype"], "n": r["n"], "d": r["d_qk"], "causal": r["causal"],
                    "direction": r["direction"], "fused": r["impl"],
                    "bytes_saved": u["traffic_bytes"] - r["traffic_bytes"],
                    "measured_speedup": measured, "predicted_speedup": predicted,
                    "measured_over_predicted": measured / predicted})
    return out


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("numpy", "numba", "numba-cuda", "llvmlite", "cuda-bindings", "torch"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def bench_document(records: list[dict], peaks: dict, config: dict, notes: list[str],
                   versions: dict | None = None) -> dict:
    """The JSON document: schema, date, device (with its peaks), versions, config, notes, cases
    and the torch pair's :func:`pair_summary`."""
    return {"schema": 2, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": peaks, "versions": _versions() if versions is None else versions,
            "config": config, "notes": notes, "cases": records, "pairs": pair_summary(records)}


def write_json(doc: dict, path: str | Path) -> Path:
    """Write ``doc`` (from :func:`bench_document`) to ``path``; refuses one with no device name."""
    if not doc.get("device", {}).get("name"):
        raise ValueError("doc must name its device (doc['device']['name'])")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report(doc: dict) -> str:
    """A plain-text table of a document's cases (device and peaks on top, the torch pair's
    measured and predicted speed-ups below)."""
    dev = doc["device"]
    tensor = dev.get("tensor_peak_tflops") or {}
    lines = [f"device: {dev['name']} (cc {'.'.join(map(str, dev['compute_capability']))}, "
             f"{dev['sms']} SMs; FP32 peak {_fmt(dev['fp32_peak_tflops'], '.1f')} TFLOP/s, "
             + "".join(f"{k} {_fmt(v, '.0f')}, " for k, v in tensor.items())
             + f"DRAM peak {_fmt(dev['dram_peak_gbs'], '.0f')} GB/s)",
             f"{'impl':<26}{'pass':>9}{'dtype':>6}{'N':>7}{'d':>5}{'causal':>8}{'ms':>10}"
             f"{'TFLOP/s':>9}{'%peak':>7}{'GB/s':>8}{'%DRAM':>7}{'FLOP/B':>8}{'bound':>8}{'%roof':>7}"]

    def share(s: float | None) -> str:
        return "-" if s is None else f"{100 * s:.1f}"

    for r in doc["cases"]:
        roof = r.get("roofline") or {}
        lines.append(f"{r['impl']:<26}{r.get('direction', 'forward'):>9}{r.get('dtype', 'fp32'):>6}{r['n']:>7}"
                     f"{r['d_qk']:>5}{str(r['causal']):>8}{1e3 * r['seconds']:>10.3f}{r['tflops']:>9.3f}"
                     f"{share(r.get('share_of_peak', r.get('share_of_fp32_peak'))):>7}"
                     f"{_fmt(r['gbs'], '.0f'):>8}{share(r['share_of_dram_peak']):>7}"
                     f"{_fmt(roof.get('intensity'), '.0f'):>8}{roof.get('bound') or '-':>8}"
                     f"{share(r.get('share_of_roofline')):>7}")
    for p in doc.get("pairs", []):
        lines.append(f"pair {p['dtype']} N={p['n']} d={p['d']} causal={p['causal']} {p['fused']}: "
                     f"{p['measured_speedup']:.2f}x measured, {p['predicted_speedup']:.2f}x predicted "
                     f"({p['measured_over_predicted']:.2f})")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    return "\n".join(lines)


def _gpu_peaks(cuda) -> dict:
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)

    def attr(a):
        try:
            return int(getattr(dev, a))
        except Exception:          # an attribute a newer driver dropped: that peak is unknown
            return None
    clock, mem_clock, bus = attr("CLOCK_RATE"), attr("MEMORY_CLOCK_RATE"), attr("GLOBAL_MEMORY_BUS_WIDTH")
    if None in (clock, mem_clock, bus):
        clock, mem_clock, bus = _nvml_clocks(clock, mem_clock, bus)
    return device_peaks(name, tuple(dev.compute_capability), attr("MULTIPROCESSOR_COUNT"),
                        clock, mem_clock, bus)


def _nvml_clocks(clock, mem_clock, bus):
    """Fill the clocks (kHz) and bus width (bits) CUDA 13 no longer reports from NVML's maxima."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        clock = clock or 1000 * pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
        mem_clock = mem_clock or 1000 * pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        bus = bus or pynvml.nvmlDeviceGetMemoryBusWidth(handle)
    except Exception:              # no NVML (or an older one): those peaks stay unknown
        pass
    return clock, mem_clock, bus


def _time(sync, event, launch, repeats: int) -> list[float]:
    """Median-ready times of ``launch`` (seconds): one warm-up, then ``repeats`` timed with events."""
    launch()                       # compile and warm up
    sync()
    times = []
    for _ in range(repeats):
        start, stop = event(), event()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)   # milliseconds
    return times


def _max_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)))


def run_twin(sizes, d: int, causal_list, batch: int, heads: int, repeats: int,
             block: tuple[int, int] | None = None, backward_block: tuple[int, int] | None = None,
             peaks: dict | None = None) -> list[dict]:
    """Time the twin (needs a real CUDA GPU; the simulator's times mean nothing): per (N, causal)
    the fused forward, the fused backward (D kernel + key-block kernel) and the standard three
    kernels, launched exactly as :mod:`flashlab.gpu.attention` launches them. Tiles: ``None``
    takes the first of :data:`flashlab.gpu.inspect.TILE_CHOICES` that fits in 48 KiB of shared
    memory. At the first size each result is compared with the float64 reference."""
    from flashlab.gpu.attention import band_scalars, fused_scalars, kv_blocks, q_blocks
    from flashlab.gpu.backward import (
        DOT_ROWS,
        backward_kernel,
        backward_shared_bytes,
        backward_threads,
        dot_kernel,
    )
    from flashlab.gpu.forward import cuda, forward_kernel, forward_shared_bytes, forward_threads
    from flashlab.gpu.inspect import fitting_tile
    from flashlab.gpu.standard import (
        SOFTMAX_WARPS,
        STANDARD_TILE,
        pv_kernel,
        scores_kernel,
        softmax_kernel,
        standard_threads,
    )
    from flashlab.reference import attention_reference, attention_reference_backward
    from flashlab.validation import prepare
    peaks = _gpu_peaks(cuda) if peaks is None else peaks
    fblock = block or fitting_tile(forward_shared_bytes, d)
    bblock = backward_block or fitting_tile(backward_shared_bytes, d)
    records = []
    rng = np.random.default_rng(0)
    timed = lambda launch: _time(cuda.synchronize, cuda.event, launch, repeats)  # noqa: E731
    for n in sizes:
        for causal in causal_list:
            q, k, v, do = (rng.standard_normal((batch, heads, n, d)).astype(np.float32)
                           for _ in range(4))
            p = prepare(q, k, v, causal=causal, block_q=fblock[0], block_k=fblock[1])
            band, scalars = band_scalars(p), fused_scalars(p)
            gq, gk, gv, gdo = (cuda.to_device(x) for x in (q, k, v, do))
            o = cuda.device_array((batch, heads, n, d), np.float32)
            lse = cuda.device_array((batch, heads, n), np.float32)
            counter = cuda.to_device(np.zeros(2, np.int64))
            case = dict(n=n, d_qk=d, d_v=d, causal=causal, batch=batch, heads=heads, peaks=peaks)
            kw = dict(seq_q=n, d_qk=d, d_v=d, batch=batch, heads=heads, elem=4, causal=causal)
            check = n == sizes[0]
            want = attention_reference(q, k, v, causal=causal) if check else None

            # fused forward
            fwd = forward_kernel(p.block_q, p.block_k, d, d, False)
            kvb = cuda.to_device(kv_blocks(p))
            grid, threads = (batch * heads, math.ceil(n / p.block_q)), forward_threads(p.block_q, p.block_k, d)
            t = timed(lambda: fwd[grid, threads](gq, gk, gv, kvb, *scalars, o, lse, counter))
            fused = traffic("gpu:fused", **kw, block_q=p.block_q, block_k=p.block_k).total
            rec = make_record("flashlab twin fused", times=t, traffic_bytes=fused, dataflow="gpu:fused",
                              block=(p.block_q, p.block_k), **case)
            if want is not None:    # check
                rec["max_abs_error_vs_float64"] = _max_error(o.copy_to_host(), want[0])
            records.append(rec)

            # fused backward: D = rowsum(dO o O), then one block per (kv head, key block)
            pb = p.with_blocks(*bblock)
            dot, bwd = dot_kernel(d, False), backward_kernel(pb.block_q, pb.block_k, d, d, False)
            qbl = cuda.to_device(q_blocks(pb))
            dd = cuda.device_array((batch, heads, n), np.float32)
            gdq = cuda.to_device(np.zeros((batch, heads, n, d), np.float32))
            gdk, gdv = (cuda.device_array((batch, heads, n, d), np.float32) for _ in range(2))
            dgrid = (batch * heads, math.ceil(n / DOT_ROWS))
            bgrid = (batch * heads, math.ceil(n / pb.block_k))
            bthreads = backward_threads(pb.block_q, pb.block_k, d, d)

            def backward():
                dot[dgrid, 8 * DOT_ROWS](gdo, o, dd, counter)
                bwd[bgrid, bthreads](gdo, gq, gk, gv, lse, dd, qbl, *scalars, gdq, gdk, gdv, counter)
            if check:
                backward()               # once on a zeroed dQ, to compare with the reference
                want_b = attention_reference_backward(do, q, k, v, causal=causal)
                err = max(_max_error(g.copy_to_host(), w) for g, w in zip((gdq, gdk, gdv), want_b))
            t = timed(backward)          # (dQ keeps accumulating: only the times matter here)
            fused_b = backward_traffic("gpu:fused", **kw, block_q=pb.block_q, block_k=pb.block_k).total
            rec = make_record("flashlab twin fused", times=t, traffic_bytes=fused_b, dataflow="gpu:fused",
                              block=(pb.block_q, pb.block_k), direction="backward", **case)
            if check:
                rec["max_abs_error_vs_float64"] = err
            records.append(rec)

            # standard attention: S materialised, three kernels (the same matmul code)
            T = STANDARD_TILE
            s = cuda.device_array((batch, heads, n, n), np.float32)
            sgrid = (batch * heads, math.ceil(n / T))
            k1, k2, k3 = scores_kernel(T, d, False), softmax_kernel(T, False), pv_kernel(T, d, False)
            st = standard_threads(T, d)

            def standard():
                k1[sgrid, st](gq, gk, *band, s, counter)
                k2[sgrid, 32 * SOFTMAX_WARPS](s, counter)
                k3[sgrid, st](s, gv, o, counter)
            t = timed(standard)
            std = traffic("gpu:standard", **kw, block_q=T).total
            rec = make_record("flashlab twin standard", times=t, traffic_bytes=std, dataflow="gpu:standard",
                              skips_masked=False, block=(T, T), **case)
            if want is not None:    # check
                rec["max_abs_error_vs_float64"] = _max_error(o.copy_to_host(), want[0])
            records.append(rec)
    return records


class _WallEvent:
    """A CUDA event's interface on the host clock: :func:`run_torch` on ``device="cpu"``."""

    def record(self) -> None:
        import time
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "_WallEvent") -> float:
        return 1e3 * (end.t - self.t)


def run_torch(sizes, dims, dtypes, causal_list, batch: int, heads: int, repeats: int,
              peaks: dict, device: str = "cuda") -> list[dict]:
    """Time torch's unfused attention and SDPA's fused backends, forward (torch with CUDA;
    ``device="cpu"`` runs the same code on the host clock, for tests: those times mean nothing).

    Unfused: ``S = baddbmm(S, Q, K^T, beta=0, alpha=scale)``, causal ``S.masked_fill_(mask, -inf)``,
    ``P = softmax(S)``, ``O = bmm(P, V)`` on (B*H, N, d) tensors. Fused: SDPA under
    ``sdpa_kernel(FLASH_ATTENTION)`` (bf16/fp16) and ``sdpa_kernel(EFFICIENT_ATTENTION)``.
    A case that runs out of memory or that a backend refuses is left out (noted in the record
    list as ``skipped``).
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    f = torch.nn.functional.scaled_dot_product_attention
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    on_gpu = device == "cuda"
    event = (lambda: torch.cuda.Event(enable_timing=True)) if on_gpu else _WallEvent
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    records = []
    for dt in dtypes:
        for d in dims:
            for n in sizes:
                for causal in causal_list:
                    case = dict(n=n, d_qk=d, d_v=d, causal=causal, batch=batch, heads=heads,
                                peaks=peaks, dtype=dt)
                    kw = dict(seq_q=n, d_qk=d, d_v=d, batch=batch, heads=heads, elem=ELEM[dt],
                              causal=causal)
                    q, k, v = (torch.randn(batch, heads, n, d, device=device, dtype=tdt[dt])
                               for _ in range(3))
                    try:
                        q3, k3, v3 = (x.reshape(batch * heads, n, d) for x in (q, k, v))
                        s = torch.empty(batch * heads, n, n, device=device, dtype=tdt[dt])
                        mask = (torch.ones(n, n, device=device, dtype=torch.bool).triu_(1)
                                if causal else None)
                        scale = 1.0 / math.sqrt(d)

                        def unfused():
                            torch.baddbmm(s, q3, k3.transpose(1, 2), beta=0.0, alpha=scale, out=s)
                            if mask is not None:
                                s.masked_fill_(mask, -math.inf)
                            return torch.bmm(torch.softmax(s, dim=-1), v3)
                        with torch.no_grad():
                            t = _time(sync, event, unfused, repeats)
                        records.append(make_record(
                            "torch unfused", times=t, traffic_bytes=traffic("standard", **kw).total,
                            dataflow="standard", peak=PEAK_OF["unfused", dt], skips_masked=False, **case))
                    except torch.cuda.OutOfMemoryError:
                        torch.cuda.empty_cache()
                    for backend, name in ((SDPBackend.FLASH_ATTENTION, "flash"),
                                          (SDPBackend.EFFICIENT_ATTENTION, "efficient")):
                        if dt == "fp32" and name == "flash":
                            continue             # FlashAttention-2 has no float32 kernel
                        try:
                            with torch.no_grad(), sdpa_kernel(backend):
                                t = _time(sync, event, lambda: f(q, k, v, is_causal=causal), repeats)
                        except RuntimeError:
                            continue
                        # DRAM bytes: K and V re-reads served by L2 (kv_hit=1: a head's K and V,
                        # <= 8 MB here, stay in the 50 MB L2 while its query blocks run)
                        nbytes = traffic("fused", **kw, kv_hit=KV_RESIDENT).total
                        rec = make_record(f"torch SDPA {name}", times=t, traffic_bytes=nbytes,
                                          dataflow="fused", peak=PEAK_OF[name, dt], **case)
                        # and with every re-read from DRAM (no L2): the model's upper bound
                        rec["traffic_bytes_no_l2"] = traffic("fused", **kw, block_q=TORCH_BLOCK_Q[name]).total
                        records.append(rec)
                    if on_gpu:
                        torch.cuda.empty_cache()
    return records


def _ncu_dram_bytes(n: int, d: int, heads: int) -> dict | None:
    """Nsight Compute's DRAM bytes (``dram__bytes.sum``) of one fused forward and one standard
    run of the twin, or None without ``ncu`` (or if it fails)."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return None
    code = ("import numpy as np\nfrom flashlab.gpu import flash_attention_gpu, standard_attention_gpu\n"
            f"x = np.random.default_rng(0).standard_normal((3, 1, {heads}, {n}, {d})).astype(np.float32)\n"
            "flash_attention_gpu(*x)\nstandard_attention_gpu(*x)\n")
    try:
        out = subprocess.run([ncu, "--metrics", "dram__bytes.sum", "--csv", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    per_kernel: dict[str, float] = {}
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split('","')]
        if len(cells) > 3 and cells[-3] == "dram__bytes.sum":
            unit, value = cells[-2], float(cells[-1].replace(",", ""))
            scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
            name = cells[4]   # the kernel (Numba mangles its Python name into it)
            per_kernel[name] = per_kernel.get(name, 0.0) + value * scale
    return {"n": n, "d": d, "heads": heads, "dram_bytes_per_kernel": per_kernel} if per_kernel else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashlab.gpu.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096], help="the twin's N")
    ap.add_argument("--d", type=int, nargs="+", default=[64], help="the twin's head dims")
    ap.add_argument("--torch-sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--torch-d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16", "fp32"], choices=sorted(ELEM))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-twin", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="also record Nsight Compute's DRAM bytes (needs ncu)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    from flashlab.gpu.target import is_simulator
    if is_simulator():
        print("flashlab.gpu.bench: no CUDA GPU here (the kernels would run in Numba's CUDA "
              "simulator on the CPU, whose times mean nothing); nothing timed, no JSON written.",
              file=sys.stderr)
        return 2
    from flashlab.gpu.forward import cuda
    peaks = _gpu_peaks(cuda)
    causal = (False, True)
    records = []
    if not args.no_twin:
        for d in args.d:
            records += run_twin(args.sizes, d, causal, args.batch, args.heads, args.repeats, peaks=peaks)
    torch_ok = False
    if not args.no_torch:
        try:
            import torch
            torch_ok = torch.cuda.is_available()
        except ImportError:
            pass
        if torch_ok:
            records += run_torch(args.torch_sizes, args.torch_d, args.dtypes, causal, args.batch,
                                 args.heads, args.repeats, peaks)
    notes = ["twin: float32 on CUDA cores; bytes are global-memory requests (traffic.traffic 'gpu:*'); "
             "the L2 cache serves part of them, so DRAM moves fewer",
             "torch: DRAM bytes of traffic.traffic 'standard' (unfused: S and P through DRAM; causal adds "
             "the masked_fill pass, its bool mask not counted) and 'fused' with kv_hit=1 (K/V re-reads "
             "served by L2; traffic_bytes_no_l2: every re-read from DRAM, query blocks of 128 (flash) "
             "or 64 (efficient) rows)",
             "roofline: predicted time max(executed FLOPs / peak, bytes / DRAM peak); unfused and "
             "standard execute the whole score matrix, the fused kernels only the attended tiles",
             "fp32: torch matmul with TF32 off (default) on CUDA cores; SDPA efficient fp32 as 3xTF32 "
             "tensor-core MMA (a third of the TF32 peak)"]
    if not torch_ok and not args.no_torch:
        notes.append("torch with CUDA not available: no torch cases")
    config = {"sizes": args.sizes, "d": args.d, "torch_sizes": args.torch_sizes, "torch_d": args.torch_d,
              "dtypes": args.dtypes, "causal": list(causal), "batch": args.batch, "heads": args.heads,
              "repeats": args.repeats, "timing": "CUDA events, operands resident in device memory, "
              "median of repeats after one warm-up"}
    if torch_ok:
        import torch
        config["torch_matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    doc = bench_document(records, peaks, config, notes)
    if args.ncu:
        doc["ncu"] = _ncu_dram_bytes(args.sizes[0], args.d[0], args.heads)
    path = write_json(doc, args.out)
    print(report(doc))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
