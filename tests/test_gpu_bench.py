"""python -m flashlab.gpu.bench: refuses without a GPU; its records, JSON and report (injected data)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flashlab.cost import attended_pairs, attention_flops, tiled_attention_traffic
from flashlab.gpu.bench import bench_document, device_peaks, make_record, report, write_json


def test_refuses_without_a_gpu(tmp_path):
    from flashlab.gpu.target import driver_device_count
    if driver_device_count():
        pytest.skip("a CUDA GPU is present: the bench would run")
    out = tmp_path / "gpu.json"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-m", "flashlab.gpu.bench", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2
    assert "no CUDA GPU" in r.stderr and "nothing timed" in r.stderr
    assert not out.exists()


def peaks():
    # an H100 SXM's attributes: 132 SMs at 1.98 GHz, HBM3 at 2.619 GHz on a 5120-bit bus
    return device_peaks("Test GPU", (9, 0), 132, 1_980_000, 2_619_000, 5120)


def test_device_peaks_from_attributes():
    p = peaks()
    assert p["fp32_peak_tflops"] == pytest.approx(132 * 128 * 2 * 1.98e9 / 1e12)   # 66.9
    assert p["dram_peak_gbs"] == pytest.approx(2 * 2.619e9 * 5120 / 8 / 1e9)      # 3352
    unknown = device_peaks("Old GPU", (3, 5), 15, None, 3_000_000, 384)
    assert unknown["fp32_peak_tflops"] is None and unknown["dram_peak_gbs"] > 0


def test_record_json_and_report(tmp_path):
    p = peaks()
    traffic = sum(tiled_attention_traffic(1024, 1024, 64, 64, block_q=64, block_k=32, heads=8))
    rec = make_record("flashlab twin", n=1024, d_qk=64, d_v=64, causal=False, batch=1, heads=8,
                      times=[3e-3, 1e-3, 2e-3], traffic_bytes=traffic, peaks=p, block=(64, 32))
    assert rec["seconds"] == 2e-3
    flops = attention_flops(1024, 1024, 64, 64, heads=8)
    assert rec["tflops"] == pytest.approx(flops / 2e-3 / 1e12)
    assert rec["share_of_fp32_peak"] == pytest.approx(rec["tflops"] / p["fp32_peak_tflops"])
    assert rec["gbs"] == pytest.approx(traffic / 2e-3 / 1e9)
    assert rec["share_of_dram_peak"] == pytest.approx(rec["gbs"] / p["dram_peak_gbs"])
    causal = make_record("torch SDPA", n=4, d_qk=2, d_v=2, causal=True, batch=1, heads=1,
                         times=[1.0], traffic_bytes=None, peaks=p)
    # causal: 10 of the 16 pairs attended
    assert causal["flops"] == pytest.approx(attention_flops(4, 4, 2, 2) * 10 / 16)
    assert causal["gbs"] is None and causal["share_of_dram_peak"] is None

    doc = bench_document([rec, causal], p, {"sizes": [1024]}, ["a note"])
    path = write_json(doc, tmp_path / "sub" / "gpu.json")
    back = json.loads(path.read_text())
    assert back == doc and back["device"]["name"] == "Test GPU"
    text = report(back)
    assert "Test GPU" in text and "flashlab twin" in text and "torch SDPA" in text
    assert "note: a note" in text
    with pytest.raises(ValueError, match="device"):
        write_json({"device": {}, "cases": []}, tmp_path / "x.json")


def test_backward_record_counts_the_five_products():
    p = peaks()
    rec = make_record("flashlab twin", n=64, d_qk=32, d_v=16, causal=True, batch=2, heads=3,
                      times=[1e-3], traffic_bytes=None, peaks=p, direction="backward")
    assert rec["direction"] == "backward"
    # 2 Sq Sk (3 Dqk + 2 Dv) per head, over the attended (causal) fraction
    want = 2.0 * 64 * 64 * (3 * 32 + 2 * 16) * 2 * 3 * attended_pairs(64, 64, True) / 64**2
    assert rec["flops"] == pytest.approx(want)
    assert "backward" in report(bench_document([rec], p, {}, []))
    with pytest.raises(ValueError, match="direction"):
        make_record("x", n=4, d_qk=2, d_v=2, causal=False, batch=1, heads=1, times=[1.0],
                    traffic_bytes=None, peaks=p, direction="sideways")


def test_bench_runs_every_kernel_in_the_simulator(monkeypatch):
    """The whole run (forward, backward, standard; the errors against float64) on a tiny case,
    with the simulator's device peaks faked: every launch's arguments are right before a GPU sees them."""
    from flashlab.gpu import bench
    from flashlab.gpu.target import is_simulator
    if not is_simulator():
        pytest.skip("a CUDA GPU is present: python -m flashlab.gpu.bench runs the real thing")
    monkeypatch.setattr(bench, "_gpu_peaks", lambda cuda: peaks())
    doc = bench.run([24], 8, (False, True), 1, 2, (8, 8), 1, (8, 8))
    impls = [(r["impl"], r["direction"], r["causal"]) for r in doc["cases"]]
    assert impls == [(i, d, c) for c in (False, True) for i, d in
                     (("flashlab twin", "forward"), ("flashlab twin", "backward"),
                      ("standard (3 kernels)", "forward"))]
    for r in doc["cases"]:
        assert r["max_abs_error_vs_float64"] < 1e-5, r
