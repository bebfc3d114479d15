"""python -m flashlab.gpu.bench: refuses without a GPU; its records, roofline, pair summary, JSON
and report on injected timings; the twin's launches in the simulator; the torch pair's code on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flashlab.flops import attention_flops
from flashlab.gpu.bench import (
    bench_document,
    device_peaks,
    make_record,
    pair_summary,
    report,
    roofline,
    write_json,
)
from flashlab.ledgers import attended_pairs
from flashlab.traffic import tiled_attention_traffic, traffic


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
    # dense tensor cores on sm_90: 4096 bf16 FLOPs per SM per clock (1070 TFLOP/s here), TF32 half
    tc = p["tensor_peak_tflops"]
    assert tc["bf16"] == tc["fp16"] == pytest.approx(132 * 4096 * 1.98e9 / 1e12)
    assert tc["tf32"] == pytest.approx(tc["bf16"] / 2) and tc["3xtf32"] == pytest.approx(tc["tf32"] / 3)
    unknown = device_peaks("Old GPU", (3, 5), 15, None, 3_000_000, 384)
    assert unknown["fp32_peak_tflops"] is None and unknown["dram_peak_gbs"] > 0
    assert unknown["tensor_peak_tflops"] == {}


def test_record_json_and_report(tmp_path):
    p = peaks()
    traffic = tiled_attention_traffic(1024, 1024, 64, 64, block_q=64, block_k=32, heads=8).total
    rec = make_record("flashlab twin fused", n=1024, d_qk=64, d_v=64, causal=False, batch=1, heads=8,
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
    assert "Test GPU" in text and "flashlab twin fused" in text and "torch SDPA" in text
    assert "note: a note" in text
    with pytest.raises(ValueError, match="device"):
        write_json({"device": {}, "cases": []}, tmp_path / "x.json")


def test_backward_record_counts_the_five_products():
    p = peaks()
    rec = make_record("flashlab twin fused", n=64, d_qk=32, d_v=16, causal=True, batch=2, heads=3,
                      times=[1e-3], traffic_bytes=None, peaks=p, direction="backward")
    assert rec["direction"] == "backward"
    # 2 Sq Sk (3 Dqk + 2 Dv) per head, over the attended (causal) fraction
    want = 2.0 * 64 * 64 * (3 * 32 + 2 * 16) * 2 * 3 * attended_pairs(64, 64, True) / 64**2
    assert rec["flops"] == pytest.approx(want)
    assert "backward" in report(bench_document([rec], p, {}, []))
    with pytest.raises(ValueError, match="direction"):
        make_record("x", n=4, d_qk=2, d_v=2, causal=False, batch=1, heads=1, times=[1.0],
                    traffic_bytes=None, peaks=p, direction="sideways")


def test_roofline_picks_the_roof_that_binds():
    # 1 TFLOP at 100 TFLOP/s is 10 ms; 1 GB at 1000 GB/s is 1 ms: compute-bound
    point = roofline(1e12, 1e9, 100.0, 1000.0)
    assert point["bound"] == "compute" and point["intensity"] == pytest.approx(1000.0)
    assert point["predicted_seconds"] == pytest.approx(1e-2) and point["ridge"] == pytest.approx(100.0)
    mem = roofline(1e10, 1e9, 100.0, 1000.0)      # 0.1 ms of arithmetic, 1 ms of bytes
    assert mem["bound"] == "memory" and mem["predicted_seconds"] == pytest.approx(1e-3)
    assert mem["intensity"] == pytest.approx(10.0)
    assert roofline(1e10, None, 100.0, 1000.0)["predicted_seconds"] is None
    assert roofline(1e10, 1e9, None, 1000.0)["bound"] is None


def torch_case(impl, dt, seconds, n=4096, d=64, causal=False, p=None):
    """An injected torch record, bytes from traffic.traffic for its dataflow (as run_torch does)."""
    p = p or peaks()
    e = 2 if dt != "fp32" else 4
    kw = dict(seq_q=n, d_qk=d, d_v=d, heads=8, elem=e, causal=causal)
    unfused = impl == "torch unfused"
    nbytes = (traffic("standard", **kw) if unfused else traffic("fused", **kw, kv_hit=1.0)).total
    peak = "fp32" if (dt == "fp32" and unfused) else ("3xtf32" if dt == "fp32" else dt)
    return make_record(impl, n=n, d_qk=d, d_v=d, causal=causal, batch=1, heads=8, times=[seconds],
                       traffic_bytes=nbytes, peaks=p, dtype=dt, peak=peak,
                       dataflow="standard" if unfused else "fused", skips_masked=not unfused)


def test_pair_summary_sets_measured_beside_predicted():
    p = peaks()
    unfused = torch_case("torch unfused", "bf16", 1.0e-3, p=p)
    flash = torch_case("torch SDPA flash", "bf16", 0.25e-3, p=p)
    # bf16, N = 4096, d = 64, 8 heads: the unfused pipeline moves 4 N^2 elements per head through
    # DRAM, far below the ridge: memory-bound; the fused kernel (K/V re-reads in L2) compute-bound
    assert unfused["roofline"]["bound"] == "memory" and flash["roofline"]["bound"] == "compute"
    t_u = unfused["traffic_bytes"] / (p["dram_peak_gbs"] * 1e9)
    t_f = attention_flops(4096, 4096, 64, 64, heads=8) / (p["tensor_peak_tflops"]["bf16"] * 1e12)
    [pair] = pair_summary([unfused, flash, torch_case("torch SDPA flash", "fp16", 1e-3, p=p)])
    assert pair["fused"] == "torch SDPA flash" and pair["dtype"] == "bf16"
    assert pair["measured_speedup"] == pytest.approx(4.0)
    assert pair["predicted_speedup"] == pytest.approx(t_u / t_f)
    assert pair["measured_over_predicted"] == pytest.approx(4.0 / (t_u / t_f))
    assert pair["bytes_saved"] == unfused["traffic_bytes"] - flash["traffic_bytes"] > 0
    # the share of the roofline: predicted / measured time
    assert flash["share_of_roofline"] == pytest.approx(t_f / 0.25e-3)
    # fp32: the unfused matmuls run against the CUDA-core peak, the efficient kernel against 3xTF32
    u32, e32 = torch_case("torch unfused", "fp32", 1e-3, p=p), torch_case("torch SDPA efficient", "fp32", 1e-3, p=p)
    assert u32["peak_tflops"] == p["fp32_peak_tflops"]
    assert e32["peak_tflops"] == pytest.approx(p["tensor_peak_tflops"]["tf32"] / 3)
    # causal: unfused executes the whole matrix, the fused kernel only the attended pairs
    uc = torch_case("torch unfused", "bf16", 1e-3, causal=True, p=p)
    fc = torch_case("torch SDPA flash", "bf16", 1e-3, causal=True, p=p)
    assert uc["executed_flops"] == attention_flops(4096, 4096, 64, 64, heads=8) > uc["flops"] == fc["executed_flops"]
    doc = bench_document([unfused, flash], p, {}, [], versions={"torch": "x"})
    assert doc["pairs"] == pair_summary([unfused, flash]) and doc["versions"] == {"torch": "x"}
    assert "pair bf16 N=4096 d=64 causal=False torch SDPA flash: 4.00x measured" in report(doc)
    with pytest.raises(ValueError, match="times"):
        make_record("x", n=4, d_qk=2, d_v=2, causal=False, batch=1, heads=1, times=[],
                    traffic_bytes=None, peaks=p)


def test_torch_pair_code_runs_on_the_cpu():
    """run_torch's unfused pipeline and SDPA calls on the CPU (times meaningless): the records
    carry the right dataflows and peaks; a backend the device lacks is left out, never faked."""
    torch = pytest.importorskip("torch")
    from flashlab.gpu import bench
    recs = bench.run_torch([16], [8], ["fp32", "bf16"], (False, True), 1, 2, 1, peaks(), device="cpu")
    impls = {(r["impl"], r["dtype"], r["causal"]) for r in recs}
    for dt in ("fp32", "bf16"):
        for causal in (False, True):
            assert ("torch unfused", dt, causal) in impls
    assert ("torch SDPA flash", "fp32", False) not in impls     # FlashAttention-2 has no fp32 kernel
    for r in recs:
        assert r["dataflow"] == ("standard" if r["impl"] == "torch unfused" else "fused")
        assert r["peak"] == bench.PEAK_OF[r["impl"].split()[-1], r["dtype"]]
        assert r["seconds"] > 0 and r["roofline"]["predicted_seconds"] > 0
    # the unfused code computes attention (checked against SDPA's math on the same inputs)
    q, k, v = (torch.randn(2, 16, 8) for _ in range(3))
    s = torch.baddbmm(torch.empty(2, 16, 16), q, k.transpose(1, 2), beta=0.0, alpha=8 ** -0.5)
    s.masked_fill_(torch.ones(16, 16, dtype=torch.bool).triu_(1), float("-inf"))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(torch.bmm(torch.softmax(s, dim=-1), v), want, atol=1e-5)


def test_bench_runs_every_kernel_in_the_simulator():
    """The twin's whole run (fused forward, the two backward kernels, the standard three; the
    errors against float64) on a tiny case, launched as on a GPU, with the device's peaks faked."""
    from flashlab.gpu import bench
    from flashlab.gpu.target import is_simulator
    if not is_simulator():
        pytest.skip("a CUDA GPU is present: python -m flashlab.gpu.bench runs the real thing")
    recs = bench.run_twin([24], 8, (False, True), 1, 2, 1, block=(8, 8), backward_block=(8, 16),
                          peaks=peaks())
    impls = [(r["impl"], r["direction"], r["causal"]) for r in recs]
    assert impls == [(i, d, c) for c in (False, True) for i, d in
                     (("flashlab twin fused", "forward"), ("flashlab twin fused", "backward"),
                      ("flashlab twin standard", "forward"))]
    for r in recs:
        assert r["max_abs_error_vs_float64"] < 1e-5, r
        assert r["dataflow"] in ("gpu:fused", "gpu:standard") and r["traffic_bytes"] > 0
