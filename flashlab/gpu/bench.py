"""``python -m flashlab.gpu.bench``: time the CUDA twin on a real GPU, against torch SDPA.

Times, with CUDA events and the operands already in device memory, the fused forward
(:mod:`flashlab.gpu.forward`), the standard three-kernel attention (:mod:`flashlab.gpu.standard`)
and, when torch with CUDA is installed, ``torch.nn.functional.scaled_dot_product_attention``
on the same float32 tensors. Each case reports the median time, achieved TFLOP/s (the
matmul FLOPs of :func:`flashlab.cost.attention_flops`, causal: the attended fraction) and
GB/s of global memory (the bytes the kernel's instrumented build counts, i.e.
:func:`flashlab.cost.tiled_attention_traffic` / :func:`~flashlab.cost.standard_attention_traffic`;
none for torch, whose traffic is not counted), each also as a share of the device's peaks
computed from its attributes (FP32 CUDA-core FLOP/s and DRAM bandwidth). The JSON names the
device.

What it measures is a *teaching* kernel: one thread per query row, float32 on CUDA cores,
no tensor cores, no vectorised loads. It is not FlashAttention-2, and its shares of peak are
expected to be small; the point is the comparison with the standard kernels on the same
device, and the traffic each moves.

Without a CUDA GPU (the kernels would run in Numba's simulator) it refuses: it times nothing
and writes nothing, exit status 2.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from flashlab.cost import (
    attended_pairs,
    attention_backward_flops,
    attention_flops,
    standard_attention_traffic,
    tiled_attention_traffic,
)

__all__ = ["FP32_LANES_PER_SM", "device_peaks", "make_record", "bench_document", "write_json",
           "report", "main"]

#: FP32 lanes (CUDA cores) per SM by compute capability major.minor; 2 FLOPs each per clock (FMA)
FP32_LANES_PER_SM = {(6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128,
                     (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}
DEFAULT_OUT = "flashlab/data/gpu_bench.json"


def device_peaks(name: str, cc: tuple[int, int], sms: int, clock_khz: int | None,
                 mem_clock_khz: int | None, bus_bits: int | None) -> dict:
    """The device's FP32 CUDA-core and DRAM peaks from its attributes (None where unknown).

    FP32: ``SMs x lanes x 2 x clock``; DRAM: ``2 (double data rate) x memory clock x bus width / 8``.
    """
    lanes = FP32_LANES_PER_SM.get((cc[0], cc[1]))
    fp32 = None if not (lanes and clock_khz) else sms * lanes * 2 * clock_khz * 1e3
    hbm = None if not (mem_clock_khz and bus_bits) else 2 * mem_clock_khz * 1e3 * bus_bits / 8
    return {"name": name, "compute_capability": list(cc), "sms": sms,
            "fp32_peak_tflops": None if fp32 is None else fp32 / 1e12,
            "dram_peak_gbs": None if hbm is None else hbm / 1e9}


def make_record(impl: str, *, n: int, d_qk: int, d_v: int, causal: bool, batch: int,
                heads: int, times: list[float], traffic_bytes: int | None, peaks: dict,
                block: tuple[int, int] | None = None, direction: str = "forward") -> dict:
    """One timed case: median seconds, TFLOP/s, GB/s and their shares of the peaks.

    FLOPs are the matmul FLOPs of :func:`flashlab.cost.attention_flops` (forward) or
    :func:`~flashlab.cost.attention_backward_flops` (backward: five products, 2.5x at equal
    dims), scaled by the attended fraction of the score matrix.
    """
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    seconds = statistics.median(times)
    flops_of = attention_flops if direction == "forward" else attention_backward_flops
    flops = flops_of(n, n, d_qk, d_v, batch=batch, heads=heads,
                     tile_fraction=attended_pairs(n, n, causal) / (n * n))
    tflops = flops / seconds / 1e12
    gbs = None if traffic_bytes is None else traffic_bytes / seconds / 1e9
    fp32, dram = peaks.get("fp32_peak_tflops"), peaks.get("dram_peak_gbs")
    return {"impl": impl, "direction": direction, "n": n, "d_qk": d_qk, "d_v": d_v,
            "causal": causal, "batch": batch, "heads": heads,
            "block": None if block is None else list(block), "seconds": seconds,
            "times": list(times), "flops": flops, "tflops": tflops,
            "traffic_bytes": traffic_bytes, "gbs": gbs,
            "share_of_fp32_peak": None if not fp32 else tflops / fp32,
            "share_of_dram_peak": None if (not dram or gbs is None) else gbs / dram}


def bench_document(records: list[dict], peaks: dict, config: dict, notes: list[str]) -> dict:
    """The JSON document: schema, date, device (with its peaks), config, notes, cases."""
    return {"schema": 1, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": peaks, "config": config, "notes": notes, "cases": records}


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
    """A plain-text table of a document's cases, with the device and its peaks on top."""
    dev = doc["device"]
    lines = [f"device: {dev['name']} (cc {'.'.join(map(str, dev['compute_capability']))}, "
             f"{dev['sms']} SMs; FP32 peak {_fmt(dev['fp32_peak_tflops'], '.1f')} TFLOP/s, "
             f"DRAM peak {_fmt(dev['dram_peak_gbs'], '.0f')} GB/s)",
             f"{'impl':<22}{'pass':>9}{'N':>7}{'d':>5}{'causal':>8}{'ms':>10}{'TFLOP/s':>9}"
             f"{'%FP32':>7}{'GB/s':>8}{'%DRAM':>7}"]
    def share(s: float | None) -> str:
        return "-" if s is None else f"{100 * s:.1f}"

    for r in doc["cases"]:
        lines.append(f"{r['impl']:<22}{r.get('direction', 'forward'):>9}{r['n']:>7}{r['d_qk']:>5}{str(r['causal']):>8}"
                     f"{1e3 * r['seconds']:>10.3f}{r['tflops']:>9.3f}"
                     f"{share(r['share_of_fp32_peak']):>7}{_fmt(r['gbs'], '.0f'):>8}"
                     f"{share(r['share_of_dram_peak']):>7}")
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


def _time(cuda, launch, repeats: int) -> list[float]:
    launch()                       # compile and warm up
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)   # milliseconds
    return times


def _torch_times(q, k, v, do, causal: bool, repeats: int):
    """(forward times, backward times) of torch SDPA on the GPU, or None without torch + CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    tq, tk, tv = (torch.from_numpy(x).cuda().requires_grad_() for x in (q, k, v))
    tdo = torch.from_numpy(do).cuda()
    f = torch.nn.functional.scaled_dot_product_attention

    def timed(step) -> list[float]:
        step()                                     # warm-up
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            step()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        return times

    with torch.no_grad():
        forward = timed(lambda: f(tq, tk, tv, is_causal=causal))
    out = f(tq, tk, tv, is_causal=causal)
    backward = timed(lambda: torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True))
    return forward, backward


def _max_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)))


def run(sizes, d: int, causal_list, batch: int, heads: int, block: tuple[int, int],
        repeats: int, backward_block: tuple[int, int] = (32, 32)) -> dict:
    """Time every case on the GPU and return the document (needs a real CUDA GPU).

    Per (N, causal): the fused forward, the fused backward (``backward_block`` tiles: its
    six shared tiles need smaller ones than the forward's), the standard three kernels and, when
    torch has CUDA, SDPA forward and backward. At the first size, each fused kernel's float32
    result is also compared with the float64 reference (max abs error in the record).
    """
    from flashlab.gpu.attention import kv_blocks
    from flashlab.gpu.backward import backward_kernel
    from flashlab.gpu.forward import cuda, forward_kernel
    from flashlab.gpu.standard import STANDARD_TILE, pv_kernel, scores_kernel, softmax_kernel
    from flashlab.reference import attention_reference, attention_reference_backward
    from flashlab.validation import prepare
    peaks = _gpu_peaks(cuda)
    records = []
    rng = np.random.default_rng(0)
    for n in sizes:
        for causal in causal_list:
            q, k, v, do = (rng.standard_normal((batch, heads, n, d)).astype(np.float32)
                           for _ in range(4))
            p = prepare(q, k, v, causal=causal, block_q=block[0], block_k=block[1])
            band = (np.float32(p.scale), np.int64(p.left), np.int64(p.right))
            gq, gk, gv, gdo = (cuda.to_device(x) for x in (q, k, v, do))
            o = cuda.device_array((batch, heads, n, d), np.float32)
            lse = cuda.device_array((batch, heads, n), np.float32)
            counter = cuda.to_device(np.zeros(2, np.int64))
            case = dict(n=n, d_qk=d, d_v=d, causal=causal, batch=batch, heads=heads, peaks=peaks)
            check = n == sizes[0]
            want = attention_reference(q, k, v, causal=causal) if check else None

            # fused forward
            fwd = forward_kernel(p.block_q, p.block_k, d, d, False)
            kvb = cuda.to_device(kv_blocks(p))
            grid = (batch * heads, math.ceil(n / p.block_q))
            t = _time(cuda, lambda: fwd[grid, p.block_q](gq, gk, gv, kvb, *band, o, lse, counter),
                      repeats)
            fused = sum(tiled_attention_traffic(n, n, d, d, block_q=p.block_q, block_k=p.block_k,
                                                batch=batch, heads=heads, causal=causal))
            rec = make_record("flashlab twin", times=t, traffic_bytes=fused,
                              block=(p.block_q, p.block_k), **case)
            if want is not None:    # check
                rec["max_abs_error_vs_float64"] = _max_error(o.copy_to_host(), want[0])
            records.append(rec)

            # fused backward: recomputes P from the forward's LSE; dK, dV by atomic adds
            pb = prepare(q, k, v, causal=causal, block_q=backward_block[0],
                         block_k=backward_block[1])
            bwd = backward_kernel(pb.block_q, pb.block_k, d, d, False)
            kvb_b = cuda.to_device(kv_blocks(pb))
            gdq = cuda.device_array((batch, heads, n, d), np.float32)
            gdk, gdv = (cuda.to_device(np.zeros((batch, heads, n, d), np.float32)) for _ in range(2))
            bgrid = (batch * heads, math.ceil(n / pb.block_q))

            def backward():
                bwd[bgrid, pb.block_q](gdo, gq, gk, gv, o, lse, kvb_b, *band, gdq, gdk, gdv, counter)
            if check:
                backward()               # once on zeroed dK, dV, to compare with the reference
                want_b = attention_reference_backward(do, q, k, v, causal=causal)
                err = max(_max_error(g.copy_to_host(), w) for g, w in zip((gdq, gdk, gdv), want_b))
            t = _time(cuda, backward, repeats)   # (dK, dV keep accumulating: only times matter)
            fused_b = sum(tiled_attention_traffic(n, n, d, d, block_q=pb.block_q,
                                                  block_k=pb.block_k, batch=batch, heads=heads,
                                                  causal=causal, backward=True))
            rec = make_record("flashlab twin", times=t, traffic_bytes=fused_b,
                              block=(pb.block_q, pb.block_k), direction="backward", **case)
            if check:
                rec["max_abs_error_vs_float64"] = err
            records.append(rec)

            # standard attention: S materialised, three kernels
            T = STANDARD_TILE
            s = cuda.device_array((batch, heads, n, n), np.float32)
            sgrid = (batch * heads, math.ceil(n / T))
            k1, k2, k3 = scores_kernel(T, d, False), softmax_kernel(T, False), pv_kernel(T, d, False)

            def standard():
                k1[sgrid, T](gq, gk, *band, s, counter)
                k2[sgrid, T](s, counter)
                k3[sgrid, T](s, gv, o, counter)
            t = _time(cuda, standard, repeats)
            std = sum(standard_attention_traffic(n, n, d, d, tile=T, batch=batch, heads=heads))
            rec = make_record("standard (3 kernels)", times=t, traffic_bytes=std, **case)
            if want is not None:    # check
                rec["max_abs_error_vs_float64"] = _max_error(o.copy_to_host(), want[0])
            records.append(rec)

            tt = _torch_times(q, k, v, do, causal, repeats)
            if tt is not None:
                for direction, times in zip(("forward", "backward"), tt):
                    records.append(make_record("torch SDPA", times=times, traffic_bytes=None,
                                               direction=direction, **case))
    notes = ["float32 on CUDA cores, one thread per query row: a teaching kernel, not "
             "FlashAttention-2 on tensor cores",
             "GB/s = counted global-memory bytes / time; torch SDPA's traffic is not counted",
             "backward FLOPs: the five products of flashlab.cost.attention_backward_flops "
             "(2.5x the forward's); torch SDPA float32 runs its own (non-tensor-core) kernels"]
    config = {"sizes": list(sizes), "d": d, "causal": list(causal_list), "batch": batch,
              "heads": heads, "block": list(block), "backward_block": list(backward_block),
              "repeats": repeats, "timing": "CUDA events, operands resident in device memory, "
              "median of repeats after one warm-up"}
    return bench_document(records, peaks, config, notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashlab.gpu.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--block", type=int, nargs=2, default=[64, 32], metavar=("BLOCK_Q", "BLOCK_K"))
    ap.add_argument("--backward-block", type=int, nargs=2, default=[32, 32],
                    metavar=("BLOCK_Q", "BLOCK_K"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    from flashlab.gpu.target import is_simulator
    if is_simulator():
        print("flashlab.gpu.bench: no CUDA GPU here (the kernels would run in Numba's CUDA "
              "simulator on the CPU, whose times mean nothing); nothing timed, no JSON written.",
              file=sys.stderr)
        return 2
    doc = run(args.sizes, args.d, (False, True), args.batch, args.heads, tuple(args.block),
              args.repeats, tuple(args.backward_block))
    path = write_json(doc, args.out)
    print(report(doc))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
