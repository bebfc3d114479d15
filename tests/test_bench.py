"""Smoke tests of the benchmark machinery (flashlab.bench) at tiny sizes.

No timing is asserted (the machine is shared): the tests check the structure of the result,
the FLOP counts, the skip rules, the memory measurement on an allocation of known size, the
ratios and targets on a hand-made result, and the JSON/markdown round trip. torch is
optional: the torch test is skipped without it.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from flashlab import bench
from flashlab.flops import attention_backward_flops, attention_flops

#: a suite small enough for a test: N 32 and 64, 2 heads, memory (fresh process) at N=32
#: non-causal only; MLA (the 24/16 shape is its concatenated one) in this process
TINY = bench.BenchConfig(sizes=(32, 64), shapes=((24, 16),), heads=2, block=(16, 16),
                         baselines=("numpy_naive",), repeats=1, memory_sizes=(32,),
                         memory_causal=(False,), mla_sizes=(32,), mla_heads=2,
                         mla_dims=(16, 8, 16), mla_memory_sizes=(), matmul_n=64,
                         matmul_repeats=1, first_call="cache", simulator_tasks=2000,
                         decode_sizes=(64,), decode_heads=(4, 2), decode_dim=16,
                         decode_repeats=1, pipeline_explorer=False)


@pytest.fixture(scope="module")
def tiny_result():
    lines = []
    res = bench.run_suite(TINY, progress=lines.append)
    res["_progress"] = lines
    return res


def test_suite_runs_every_case(tiny_result):
    res = tiny_result
    cases = bench.attention_cases(TINY) + bench.mla_cases(TINY)
    # 2 N x 2 causal x (flashlab fwd, bwd; naive fwd) + 4 dataflows x 2 + flashlab 2
    assert bench.DATAFLOWS == ("baseline", "native_v", "split_rope", "rect")
    assert len(cases) == 2 * 2 * 3 + 8 + 2
    assert len(res["cases"]) == len(cases)
    assert all(r["status"] == "ok" for r in res["cases"]), \
        [(r["impl"], r["reason"]) for r in res["cases"] if r["status"] != "ok"]
    # a line for the matmul, one for numba, one for the simulator, one for the tile explorer,
    # one per case except the 2 the MLA section reuses, one per decode size
    assert len(res["_progress"]) == 4 + len(cases) - 2 + 1
    # the tile explorer's step time: a median over the steps of one walk
    tex = res["tile_explorer"]
    assert tex["steps"] > 0 and 0 < tex["median_s"] <= tex["max_s"]
    # the simulator's timing: both graphs, about the tasks asked for
    sim = res["simulator"]
    assert set(sim) == {"two_stage", "flash_attention"}
    assert sim["two_stage"]["tasks"] == 2000
    assert all(t["simulate_s"] > 0 and t["tasks_per_s"] == pytest.approx(t["tasks"] / t["simulate_s"])
               for t in sim.values())
    for r in res["cases"]:
        assert r["seconds"] > 0 and len(r["times"]) >= 1
        assert r["gflops"] == pytest.approx(r["flops"] / r["seconds"] / 1e9)
        # against the matmul timed in the same rounds
        assert r["fraction_of_matmul_peak"] == pytest.approx(r["gflops"] / r["matmul_gflops"])
        assert r["matmul_gflops"] in [m["gflops"] for m in res["matmul"]["groups"]]
    mm = res["matmul"]
    # one matmul per shape: 2 N x 2 directions (causal and not in one group), 2 MLA directions
    assert len(mm["groups"]) == 2 * 2 + 2
    # causal and non-causal cases of a shape were timed in the same rounds (one matmul each)
    for n in {r["n"] for r in res["cases"] if r["section"] == "attention"}:
        same = {r["matmul_gflops"] for r in res["cases"]
                if r["section"] == "attention" and r["n"] == n and r["direction"] == "forward"}
        assert len(same) == 1
    assert mm["peak_gflops"] == max(m["gflops"] for m in [mm["start"], mm["end"], *mm["groups"]])
    assert res["timing"] == "interleaved"
    assert res["numba_first_call"]["compile"] is None  # first_call="cache"
    assert res["numba_first_call"]["cache_load"]["forward_seconds"] > 0


def test_memory_only_where_configured(tiny_result):
    for r in bench.case_table(tiny_result):
        fresh = r["n"] == 32 and not r["causal"]
        assert r["fresh_process"] == fresh
        assert ("peak_extra_bytes" in r) == fresh and ("first_call_seconds" in r) == fresh
        if fresh:
            assert r["workspace_bytes"] == max(0, r["peak_extra_bytes"] - r["output_bytes"])
    # MLA cases: timed here (mla_memory_sizes=()), the cost model's peak beside each dataflow
    for r in bench.case_table(tiny_result, section="mla"):
        assert ("peak_extra_bytes" in r) == (r["impl"] == "flashlab" and r["n"] == 32)
        assert ("model_peak_bytes" in r) == r["impl"].startswith("mla:")


def test_output_bytes_are_the_returned_arrays(tiny_result):
    # forward: o (B, H, N, Dv) float32 + lse (B, H, N) float32
    r = bench.find_case(tiny_result, "flashlab", "forward", 32, 24, 16)
    assert r["output_bytes"] == 2 * 32 * (16 + 1) * 4
    # training step: o, lse, dq, dk (N x Dqk), dv (N x Dv)
    r = bench.find_case(tiny_result, "flashlab", "backward", 32, 24, 16)
    assert r["output_bytes"] == 2 * 32 * (16 + 1 + 24 + 24 + 16) * 4


def test_ratios_against_the_baselines(tiny_result):
    for r in bench.case_table(tiny_result):
        if r["impl"] != "flashlab":
            assert "speed_vs" not in r
            continue
        if r["direction"] == "forward":
            base = bench.find_case(tiny_result, "numpy_naive", "forward", r["n"], r["d_qk"],
                                   r["d_v"], r["causal"])
            assert r["speed_vs"]["numpy_naive"] == pytest.approx(base["seconds"] / r["seconds"])
        else:  # no numpy naive backward, and no torch in TINY
            assert r["speed_vs"] == {}
    rect = bench.find_case(tiny_result, "mla:rect", "forward", 32, 16, 16, section="mla")
    base = bench.find_case(tiny_result, "mla:baseline", "forward", 32, 16, 16, section="mla")
    assert rect["speed_vs"]["mla:baseline"] == pytest.approx(base["seconds"] / rect["seconds"])
    assert rect["memory_vs"] == {}  # memory not measured


def test_backward_over_forward(tiny_result):
    # TINY: flashlab has both directions at 2 N x 2 causal; numpy naive only the forward
    rows = bench.backward_over_forward(tiny_result)
    assert tiny_result["backward_over_forward"] == rows
    assert sorted((r["n"], r["causal"]) for r in rows) == [(32, False), (32, True),
                                                          (64, False), (64, True)]
    for r in rows:
        assert r["impl"] == "flashlab" and (r["d_qk"], r["d_v"]) == (24, 16)
        fwd = bench.find_case(tiny_result, "flashlab", "forward", r["n"], 24, 16, r["causal"])
        bwd = bench.find_case(tiny_result, "flashlab", "backward", r["n"], 24, 16, r["causal"])
        assert r["ratio"] == pytest.approx(bwd["seconds"] / fwd["seconds"])
        if not r["causal"]:  # 2 (3 Dqk + 2 Dv) / 2 (Dqk + Dv)
            assert r["flop_ratio"] == pytest.approx((3 * 24 + 2 * 16) / (24 + 16))


def test_mla_section_reuses_the_attention_case():
    # the MLA shape's flashlab 192/128 case is the attention case of the same shape
    cfg = bench.BenchConfig(sizes=(32,), shapes=((24, 16),), causal=(False,), heads=2,
                            mla_sizes=(32,), mla_heads=2, mla_dims=(16, 8, 16))
    att = set(bench.attention_cases(cfg))
    mla = [c for c in bench.mla_cases(cfg) if not c.impl.startswith("mla:")]
    assert mla and all(c in att for c in mla)


def test_json_and_markdown_round_trip(tiny_result, tmp_path):
    res = {k: v for k, v in tiny_result.items() if not k.startswith("_")}
    json_path, md_path = bench.save_results(res, tmp_path / "out")
    loaded = bench.load_results(json_path)
    assert loaded["cases"] == json.loads(json.dumps(res["cases"]))
    md = bench.to_markdown(loaded)
    assert md == md_path.read_text()
    for heading in ("## Machine peak", "## Numba first call", "## Pipeline simulator", "## Tile explorer", "## Targets",
                    "## Attention forward", "## Attention backward", "## Backward / forward",
                    "## MLA",
                    "## Skipped and failed cases", "## Notes"):
        assert heading in md
    # every target is listed; none measurable at these sizes but decode's time over the read
    # of K and V (measured at any size; torch is not in the tiny suite) and the tile explorer's
    # step (the tiny suite leaves the pipeline explorer out)
    assert md.count("n/a  ") == len(res["targets"]) - 2 == 18
    assert bench.BenchConfig.from_dict(loaded["config"]) == TINY
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": 0}))
    with pytest.raises(ValueError, match="schema"):
        bench.load_results(bad)


def test_flops_and_tile_fraction():
    case = bench.Case("flashlab", "forward", 256, 192, 128, heads=8)
    assert bench.case_flops(case) == attention_flops(256, 256, 192, 128, heads=8)
    back = bench.Case("torch_sdpa", "backward", 256, 128, 128, causal=True, block=(64, 64))
    # 4 x 4 tiles of 64, causal: the 10 on and below the diagonal are computed
    assert bench.tile_fraction(256, 64, 64, True) == 10 / 16
    # 128 x 64 tiles: 6 of 8 are not empty (0.75 of the scores), but the kernels compute only
    # the band box of the two tiles right of each diagonal, their lower 64 rows: 0.625
    assert bench.tile_fraction(256, 128, 64, True) == 0.625
    assert bench.case_flops(back) == attention_backward_flops(256, 256, 128, 128, heads=8,
                                                              tile_fraction=10 / 16)
    mla = bench.Case("mla:rect", "forward", 64, 128, 128, d_rope=64)
    assert bench.case_flops(mla) == attention_flops(64, 64, 192, 128, heads=8)


_SEES_AN_ALLOCATION = """
import json
import numpy as np
from flashlab.bench import peak_extra_memory

def step():
    x = np.ones(10 ** 7, dtype=np.float32)
    return (x[:10].copy(),)

print(json.dumps(peak_extra_memory(step)))
"""


def test_memory_measurement_sees_an_allocation():
    # 40 MB written in the call: the high-water mark must rise by at least that much. In a
    # fresh process, as the bench measures (measure_fresh): in this long-lived one, malloc may
    # hand back 40 MB that an earlier test freed and left resident, and the RSS does not rise
    run = subprocess.run([sys.executable, "-c", _SEES_AN_ALLOCATION], capture_output=True,
                         text=True, check=True)
    m = json.loads(run.stdout.strip().splitlines()[-1])
    assert m["peak_extra_bytes"] >= 38 * 10 ** 6
    assert m["output_bytes"] == 40
    assert m["workspace_bytes"] == m["peak_extra_bytes"] - 40


def test_naive_memory_in_a_fresh_process_exceeds_flashlab():
    # numpy naive holds the (B, H, N, N) scores: 8 * 512^2 * 4 = 8.4 MB; flashlab's workspace
    # is O(N)
    naive = bench.measure_fresh(bench.Case("numpy_naive", "forward", 512, 32, 32))
    flash = bench.measure_fresh(bench.Case("flashlab", "forward", 512, 32, 32))
    assert naive["workspace_bytes"] >= 8 * 512 ** 2 * 4
    assert flash["workspace_bytes"] < naive["workspace_bytes"] / 2
    assert naive["first_call_seconds"] >= 0 and flash["first_call_seconds"] > 0


def test_mla_memory_matches_the_cost_model():
    # the baseline dataflow's training step holds every intermediate: the measured peak is the
    # ledger's (flashlab.ledgers) within a few pages of allocator slack
    case = bench.Case("mla:baseline", "backward", 512, 128, 128, heads=4, d_rope=64)
    measured = bench.measure_fresh(case)["peak_extra_bytes"]
    model = bench.mla_model_peak(case)
    assert model > 15 * bench.MB
    assert abs(measured - model) < 0.1 * model + 2 * bench.MB, (measured, model)


def test_skip_rules(monkeypatch):
    big = bench.Case("numpy_naive", "forward", 16384, 128, 128)
    cfg = bench.BenchConfig(naive_max_n=8192)
    reason = bench.skip_reason(big, cfg, True, {})
    assert "naive_max_n=8192" in reason
    # memory: 8 heads x 16384^2 x 4 bytes of scores (8.6 GB) cannot fit in 4 GB; flashlab can
    monkeypatch.setattr(bench.suite, "available_bytes", lambda: 4 * 10 ** 9)
    assert "would not fit in memory" in bench.skip_reason(big, bench.FULL, True, {})
    assert bench.skip_reason(bench.Case("flashlab", "forward", 16384, 128, 128),
                             bench.FULL, True, {}) is None
    # time: predicted from the same series at a smaller N, x4 per doubling
    small = bench.Case("flashlab", "forward", 1024, 128, 128)
    done = {small: {"status": "ok", "n": 1024, "seconds": 100.0}}
    monkeypatch.setattr(bench.suite, "available_bytes", lambda: 10 ** 12)
    reason = bench.skip_reason(bench.Case("flashlab", "forward", 2048, 128, 128),
                               bench.FULL, True, done)
    assert "~400 s per call" in reason
    assert bench.skip_reason(bench.Case("flashlab", "backward", 2048, 128, 128),
                             bench.FULL, True, done) is None
    # torch missing
    assert "torch is not installed" in bench.skip_reason(
        bench.Case("torch_sdpa", "forward", 64, 16, 16), bench.FULL, False, {})


def test_skipped_case_is_reported(monkeypatch, tmp_path):
    cfg = bench.BenchConfig(sizes=(32,), shapes=((16, 16),), causal=(False,), heads=1,
                            baselines=("numpy_naive",), naive_max_n=16, repeats=1,
                            memory_sizes=(), mla_sizes=(), matmul_n=32, matmul_repeats=1,
                            first_call=None, pipeline_explorer=False)
    res = bench.run_suite(cfg)
    naive = [r for r in res["cases"] if r["impl"] == "numpy_naive"]
    assert [r["status"] for r in naive] == ["skipped"]
    flash = bench.find_case(res, "flashlab", "forward", 32, 16, 16)
    assert flash["speed_vs"] == {}  # no baseline measured: no ratio
    md = bench.to_markdown(res)
    assert "numpy_naive forward N=32 16/16 H=1: skipped: numpy naive above naive_max_n=16" in md
    assert "## MLA" not in md


def _result_with(rows: list[dict], peak: float = 100.0) -> dict:
    return {"cases": [{"section": "attention", "status": "ok", "causal": False, **r} for r in rows],
            "matmul": {"peak_gflops": peak}}


def test_targets_pass_miss_and_missing():
    rows = [
        dict(impl="flashlab", direction="forward", n=4096, d_qk=128, d_v=128, seconds=1.0, gflops=90.0),
        dict(impl="torch_sdpa", direction="forward", n=4096, d_qk=128, d_v=128, seconds=1.2, gflops=75.0),
        dict(impl="flashlab", direction="forward", n=8192, d_qk=192, d_v=128, seconds=1.0,
             gflops=1.0, peak_extra_bytes=40 * bench.MB),
        dict(impl="torch_sdpa", direction="forward", n=8192, d_qk=192, d_v=128, seconds=3.0,
             gflops=1.0, peak_extra_bytes=4000 * bench.MB),
        dict(impl="flashlab", direction="backward", n=2048, d_qk=128, d_v=128, seconds=1.0, gflops=1.0),
        dict(impl="torch_sdpa", direction="backward", n=2048, d_qk=128, d_v=128, seconds=1.1, gflops=1.0),
        dict(impl="flashlab", direction="forward", n=16384, d_qk=128, d_v=128, seconds=1.0,
             gflops=1.0, peak_extra_bytes=80 * bench.MB, output_bytes=70 * bench.MB,
             workspace_bytes=10 * bench.MB),
        dict(impl="flashlab", direction="backward", n=16384, d_qk=128, d_v=128, seconds=1.0,
             gflops=1.0, peak_extra_bytes=400 * bench.MB, output_bytes=270 * bench.MB,
             workspace_bytes=130 * bench.MB),
    ]
    result = _result_with(rows)
    # decode: flashlab 10 ms, torch 20 ms, the parallel read 8 ms (the largest Sk counts)
    times = {"flashlab": 0.010, "flashlab_tiled": 0.03, "torch_sdpa": 0.020,
             "read_numpy": 0.012, "read_2threads": 0.008}
    small = {"flashlab": 1.0, "flashlab_tiled": 1.0, "torch_sdpa": 1.0, "read_numpy": 1.0,
             "read_2threads": 1.0}
    result["decode"] = [
        dict(sk=sk, sq=1, heads=32, kv_heads=8, d=128, kv_bytes=10 ** 9, seconds=t, best=t,
             gbps={k: 1.0 / v for k, v in t.items()})
        for sk, t in ((1024, small), (131072, times))]
    t = {x["name"]: x for x in bench.evaluate_targets(result)}
    assert len(t) == len(bench.evaluate_targets(result)) == 20  # the names are distinct
    got = {name: (x["status"], None if x["value"] is None else round(x["value"], 4))
           for name, x in t.items()}
    assert got == {
        # torch 1.2 s / flashlab 1.0 s >= 1.1; 90 of 100 GFLOP/s >= 0.85
        "forward D=128 N=4096 non-causal: throughput / torch SDPA's": ("PASS", 1.2),
        "forward D=128 N=4096 non-causal: GFLOP/s / numpy matmul GFLOP/s": ("PASS", 0.9),
        "forward D=128 N=4096 causal: throughput / torch SDPA's": ("n/a", None),
        "forward D=128 N=4096 causal: GFLOP/s / numpy matmul GFLOP/s": ("n/a", None),
        "forward D=128 N=8192 non-causal: throughput / torch SDPA's": ("n/a", None),
        "forward D=128 N=8192 non-causal: GFLOP/s / numpy matmul GFLOP/s": ("n/a", None),
        "forward D=128 N=8192 causal: throughput / torch SDPA's": ("n/a", None),
        "forward D=128 N=8192 causal: GFLOP/s / numpy matmul GFLOP/s": ("n/a", None),
        "forward 192/128 N=8192 non-causal: speed / torch SDPA's": ("PASS", 3.0),
        "forward 192/128 N=8192 non-causal: peak extra memory / torch SDPA's": ("PASS", 0.01),
        # 1.1 < 1.2
        "backward 128/128 N=2048 non-causal: speed / torch SDPA's": ("MISS", 1.1),
        "backward 128/128 N=4096 non-causal: speed / torch SDPA's": ("n/a", None),
        "backward 192/128 N=4096 non-causal: speed / torch SDPA's": ("n/a", None),
        "forward D=128 N=8192: causal time / non-causal time": ("n/a", None),
        "forward D=128 N=16384: flashlab workspace (MB; peak extra minus the returned arrays)":
            ("PASS", 10.0),
        "backward D=128 N=16384: flashlab workspace (MB; peak extra minus the returned arrays)":
            ("MISS", 130.0),
        # torch 20 ms / flashlab 10 ms; flashlab 10 ms / read 8 ms
        "decode Sq=1 Sk=131072 H=32/Hkv=8: speed / torch SDPA's": ("PASS", 2.0),
        "decode Sq=1 Sk=131072 H=32/Hkv=8: time / a plain read of K and V (every thread)":
            ("PASS", 1.25),
        # no explorer timings in this result
        "tile explorer: median seconds per change": ("n/a", None),
        "pipeline explorer: median seconds per change": ("n/a", None),
    }


def test_decode_section(tiny_result):
    """The tiny suite's decode row: every implementation timed, the ratios derived, markdown."""
    (row,) = tiny_result["decode"]
    assert (row["sk"], row["heads"], row["kv_heads"], row["d"]) == (64, 4, 2, 16)
    assert set(row["seconds"]) == {"flashlab", "flashlab_tiled", "read_numpy", "read_2threads"}
    assert row["kv_bytes"] == 2 * 2 * 64 * 16 * 4
    assert all(len(t) == 1 and t[0] > 0 for t in row["times"].values())
    assert row["vs_torch"] is None and row["over_read_2threads"] > 0
    assert "## Decode" in bench.to_markdown(tiny_result)


def test_decode_bench_tiny_with_torch():
    """decode_bench with torch (GQA through enable_gqa), if torch is installed."""
    pytest.importorskip("torch")
    row = bench.decode_bench(32, heads=4, kv_heads=1, d=8, repeats=1)
    r = bench.decode_ratios(row)
    assert set(row["seconds"]) >= {"flashlab", "torch_sdpa"} and r["vs_torch"] > 0


def config_from_cli(monkeypatch, argv: list[str]):
    """The BenchConfig that ``bench.main(argv)`` would run (the suite itself is not run)."""
    seen = []

    def fake_suite(config, progress=None):
        seen.append(config)
        raise SystemExit(0)
    monkeypatch.setattr(bench.cli, "run_suite", fake_suite)
    with pytest.raises(SystemExit):
        bench.main(argv)
    return seen[0]


def test_cli_decode_only(monkeypatch, tmp_path):
    cfg = config_from_cli(monkeypatch, ["--decode-only", "--decode-sizes", "1024", "--out", str(tmp_path)])
    assert cfg.sizes == () and cfg.mla_sizes == () and cfg.decode_sizes == (1024,)
    assert bench.attention_cases(cfg) == [] and bench.mla_cases(cfg) == []
    assert config_from_cli(monkeypatch, ["--no-decode", "--out", str(tmp_path)]).decode_sizes == ()
    with pytest.raises(SystemExit) as e:
        bench.main(["--decode-only", "--no-decode"])
    assert e.value.code == 2


def _outputs(case: bench.Case) -> tuple[np.ndarray, ...]:
    """The arrays ``case``'s step returns, as float64 numpy arrays."""
    return tuple(np.asarray(x.detach() if hasattr(x, "detach") else x, dtype=np.float64)
                 for x in bench.make_runner(case).step())


@pytest.mark.parametrize("causal", [False, True])
def test_implementations_compute_the_same_thing(causal):
    # the comparisons are fair only if every implementation gets the same inputs and computes
    # the same attention (same default scale, same causal alignment)
    shape = dict(n=48, d_qk=24, d_v=16, causal=causal, heads=2, block=(16, 16))
    o, lse = _outputs(bench.Case("flashlab", "forward", **shape))
    o_naive, _ = _outputs(bench.Case("numpy_naive", "forward", **shape))
    np.testing.assert_allclose(o, o_naive, atol=1e-5)
    o2, lse2, *grads = _outputs(bench.Case("flashlab", "backward", **shape))
    np.testing.assert_array_equal(o2, o)
    assert [g.shape for g in grads] == [(1, 2, 48, 24), (1, 2, 48, 24), (1, 2, 48, 16)]
    # the MLA dataflows compute the same o
    mla = dict(n=48, d_qk=16, d_v=16, d_rope=8, causal=causal, heads=2, block=(16, 16))
    o_flows = [_outputs(bench.Case(f"mla:{f}", "forward", **mla))[0] for f in bench.DATAFLOWS]
    for o_flow in o_flows[1:]:
        np.testing.assert_allclose(o_flow, o_flows[0], atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_torch_computes_what_flashlab_computes(causal):
    pytest.importorskip("torch")
    shape = dict(n=48, d_qk=24, d_v=16, causal=causal, heads=2, block=(16, 16))
    (o_torch,) = _outputs(bench.Case("torch_sdpa", "forward", **shape))
    o, _ = _outputs(bench.Case("flashlab", "forward", **shape))
    np.testing.assert_allclose(o_torch, o, atol=1e-5)
    # training step: (o, dq, dk, dv) against flashlab's (o, lse, dq, dk, dv)
    torch_step = _outputs(bench.Case("torch_sdpa", "backward", **shape))
    o_fl, _, *grads = _outputs(bench.Case("flashlab", "backward", **shape))
    for got, want in zip(torch_step, [o_fl, *grads]):
        np.testing.assert_allclose(got, want, atol=1e-4)
    cases = [bench.Case(impl, "backward", **shape) for impl in ("flashlab", "torch_sdpa")]
    timed, matmul = bench.time_interleaved(cases, repeats=2, max_timed_seconds=60, matmul_n=64)
    assert [len(timed[c]["times"]) for c in cases] == [2, 2] and matmul["gflops"] > 0


def test_without_torch_its_cases_are_skipped(monkeypatch):
    monkeypatch.setattr(bench.suite, "torch_available", lambda: False)
    cfg = bench.BenchConfig(sizes=(32,), shapes=((16, 16),), causal=(False,), heads=1,
                            repeats=1, memory_sizes=(), mla_sizes=(), matmul_n=32,
                            matmul_repeats=1, first_call=None, pipeline_explorer=False)
    res = bench.run_suite(cfg)
    torch_rows = [r for r in res["cases"] if r["impl"] == "torch_sdpa"]
    assert len(torch_rows) == 2 and all(r["status"] == "skipped" for r in torch_rows)
    assert any("torch is not installed" in n for n in res["notes"])
    assert "torch not installed" in bench.to_markdown(res)


def test_interleaved_rounds():
    cases = [bench.Case(impl, "forward", 32, 16, 16, heads=1, block=(16, 16))
             for impl in ("flashlab", "numpy_naive")]
    # a budget of 0 s: one round only; a large one: `repeats` rounds for every case
    timed, matmul = bench.time_interleaved(cases, repeats=3, max_timed_seconds=0, matmul_n=32)
    assert [len(timed[c]["times"]) for c in cases] == [1, 1]
    timed, matmul = bench.time_interleaved(cases, repeats=3, max_timed_seconds=100, matmul_n=32)
    assert [len(timed[c]["times"]) for c in cases] == [3, 3]
    for c in cases:
        assert timed[c]["seconds"] == sorted(timed[c]["times"])[1]
    assert matmul["n"] == 32 and matmul["gflops"] == pytest.approx(2 * 32 ** 3 / matmul["seconds"] / 1e9)


def test_machine_names_the_blas_kernels(tiny_result, monkeypatch):
    # the figures depend on which OpenBLAS kernels run (AVX2 or AVX-512: 2x on Zen 5), so the
    # run records NumPy's (the matmul peak) and SciPy's (flashlab's tiles), and any pin
    m = tiny_result["machine"]
    roles = {b["role"] for b in m["blas"]}
    assert {"numpy (matmul peak)", "scipy (flashlab tiles)"} <= roles
    assert all(b["library"] and b["version"] for b in m["blas"])
    md = bench.to_markdown(json.loads(json.dumps(
        {k: v for k, v in tiny_result.items() if not k.startswith("_")})))
    line = next(ln for ln in md.splitlines() if ln.startswith("BLAS: "))
    assert "scipy (flashlab tiles): " in line and "numpy (matmul peak): " in line
    pin = m["openblas_coretype"]
    assert (f"OPENBLAS_CORETYPE={pin} in the environment" if pin else "OPENBLAS_CORETYPE unset") in line
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert bench.blas_info()["openblas_coretype"] == "Zen"
    # a library without an architecture (torch's MKL) is named without one
    mkl = json.loads(json.dumps({k: v for k, v in tiny_result.items() if not k.startswith("_")}))
    mkl["machine"]["blas"].append({"role": "other", "library": "mkl", "version": "2024.2",
                                   "architecture": None})
    md_mkl = bench.to_markdown(mkl)
    assert "; other: mkl 2024.2 (OPENBLAS_CORETYPE" in md_mkl and "None kernels" not in md_mkl
    # a run recorded before the BLAS was has no such line
    old = json.loads(json.dumps({k: v for k, v in tiny_result.items() if not k.startswith("_")}))
    del old["machine"]["blas"]
    assert "BLAS: " not in bench.to_markdown(old)


def test_markdown_of_a_run_before_interleaving(tiny_result):
    # results written before the interleaved timing (no "timing", no per-case matmul) still load
    old = json.loads(json.dumps({k: v for k, v in tiny_result.items() if not k.startswith("_")}))
    del old["timing"], old["matmul"]["groups"]
    for r in old["cases"]:
        r.pop("matmul_gflops", None)
    md = bench.to_markdown(old)
    assert "a run before interleaved timing" in md and "against the best of the two" in md
    assert len(bench.evaluate_targets(old)) == 20
    # a run before the decode section has none: its targets are n/a
    del old["decode"]
    status = {t["name"]: t["status"] for t in bench.evaluate_targets(old)}
    assert [s for name, s in status.items() if name.startswith("decode")] == ["n/a", "n/a"]


def test_command_line(tmp_path, capsys):
    out = tmp_path / "res"
    assert bench.main(["--quick", "--sizes", "32", "--no-mla", "--no-torch", "--out", str(out)]) == 0
    res = bench.load_results(out / "bench.json")
    assert res["config"]["sizes"] == [32] and res["config"]["mla_sizes"] == []
    assert {r["impl"] for r in res["cases"]} == {"flashlab", "numpy_naive"}
    assert "# flashlab benchmark" in capsys.readouterr().out


def test_cli_mla_only(monkeypatch, tmp_path):
    cfg = config_from_cli(monkeypatch, ["--mla-only", "--out", str(tmp_path)])
    assert cfg.sizes == () and cfg.mla_sizes == bench.FULL.mla_sizes
    assert cfg.first_call is None and cfg.simulator_tasks is None
    assert bench.attention_cases(cfg) == [] and bench.mla_cases(cfg)
    with pytest.raises(SystemExit) as e:
        bench.main(["--mla-only", "--no-mla"])
    assert e.value.code == 2


def test_model_intensity_of_each_kind_of_row():
    from flashlab import flops
    row = dict(n=4096, d_qk=128, d_v=128, block=[256, 128])
    std = flops.operation_intensities(4096, 4096, 128, 128, elem=4)["standard attention"]
    assert bench.model_intensity({**row, "impl": "numpy_naive", "direction": "forward"}) == std
    # torch at 192/128 takes its math path: standard attention's intensity
    math_row = {**row, "d_qk": 192, "impl": "torch_sdpa", "direction": "forward"}
    assert bench.model_intensity(math_row) == \
        flops.operation_intensities(4096, 4096, 192, 128, elem=4)["standard attention"]
    fused = bench.model_intensity({**row, "impl": "flashlab", "direction": "forward"})
    assert fused == flops.operation_intensities(4096, 4096, 128, 128, block_q=256, elem=4)["FlashAttention (fused)"]
    assert fused > 3 * std                       # ~B_r/2 against ~D/4 FLOP per byte
    # torch's flash kernel uses its own query block (256 rows at this N), not the row's
    assert bench.model_intensity({**row, "block": [64, 64], "impl": "torch_sdpa", "direction": "forward"}) == fused
    assert bench.model_intensity({**row, "block": [64, 64], "impl": "flashlab", "direction": "backward"}) == \
        flops.flash_backward_intensity(4096, 4096, 128, 128, block_q=64)
    assert [bench.torch_flash_block_q(n) for n in (100, 192, 767, 768)] == [32, 64, 64, 256]


def test_settle_pause_before_every_timed_call(monkeypatch):
    """The pause lies outside the timed calls: one sleep before each case's call and before
    the matmul, every round; none with the default 0 (the quick and the notebook runs)."""
    cases = [bench.Case(impl, "forward", 32, 16, 16, heads=1, block=(16, 16))
             for impl in ("flashlab", "numpy_naive")]
    slept = []
    monkeypatch.setattr(bench.measure.time, "sleep", slept.append)
    timed, _ = bench.time_interleaved(cases, repeats=2, max_timed_seconds=100, matmul_n=32,
                                      settle_seconds=0.25)
    assert slept == [0.25] * (2 * (len(cases) + 1))
    assert all(len(timed[c]["times"]) == 2 for c in cases)
    assert bench.FULL.settle_seconds == 1.0 and bench.QUICK.settle_seconds == 0.0
    with pytest.raises(ValueError, match="settle_seconds"):
        bench.BenchConfig(settle_seconds=-1)


def test_pipeline_explorer_timing_in_result_and_report():
    """A run with only the explorer timings: the pipeline explorer's record, its report line
    and its target (no timing is asserted)."""
    assert bench.FULL.pipeline_explorer and not bench.QUICK.pipeline_explorer
    cfg = bench.BenchConfig(sizes=(), mla_sizes=(), matmul_n=32, matmul_repeats=1,
                            first_call=None, simulator_tasks=None, tile_explorer=False,
                            pipeline_explorer=True)
    lines = []
    res = bench.run_suite(cfg, progress=lines.append)
    assert "pipeline explorer changes ..." in lines
    pex = res["pipeline_explorer"]
    assert set(pex) >= {"changes", "median_s", "max_s", "build_s", "figures_built", "target_s"}
    assert pex["changes"] > 0 and 0 < pex["median_s"] <= pex["max_s"]
    assert "tile_explorer" not in res
    md = bench.to_markdown(json.loads(json.dumps(res)))
    assert "## Pipeline explorer" in md and "## Tile explorer" not in md
    target = {t["name"]: t for t in res["targets"]}
    assert target["pipeline explorer: median seconds per change"]["status"] in ("PASS", "MISS")
    assert target["tile explorer: median seconds per change"]["status"] == "n/a"


def test_backward_products_are_the_five_tile_products():
    # the ceiling's kernel must do the backward's work: summed over its tiles, the raw
    # products are whole-matrix products (odd length, tiles that do not divide it)
    from flashlab.bench.ceiling import backward_products

    rng = np.random.default_rng(3)
    h, n, dqk, dv = 2, 37, 12, 8
    q, k = (rng.standard_normal((h, n, dqk), dtype=np.float32) for _ in range(2))
    v, do = (rng.standard_normal((h, n, dv), dtype=np.float32) for _ in range(2))
    dq, dk, dvv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    backward_products(q, k, v, do, 8, 16, dq, dk, dvv)
    s = q @ k.transpose(0, 2, 1)                  # S = Q K^T
    dp = do @ v.transpose(0, 2, 1)                # dP = dO V^T
    np.testing.assert_allclose(dvv, s.transpose(0, 2, 1) @ do, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dq, dp @ k, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dk, dp.transpose(0, 2, 1) @ q, rtol=1e-4, atol=1e-3)


def test_backward_ceiling_record(tmp_path, monkeypatch, capsys):
    from flashlab.bench import ceiling

    r = ceiling.backward_ceiling(n=64, heads=2, d_qk=24, d_v=16, block=(16, 32), rounds=2,
                                 threads=1, with_torch=False, matmul_n=64)
    sec, gf = r["seconds"], r["gflops"]
    assert set(sec) == {"flashlab", "products"} and min(sec.values()) > 0
    assert r["other_fraction"] == pytest.approx(1 - sec["products"] / sec["flashlab"])
    flops = 2 * 2 * 64 * 64 * (3 * 24 + 2 * 16)
    assert gf["products"] == pytest.approx(flops / sec["products"] / 1e9)
    assert r["matmul_gflops"] > 0
    assert r["problem"] == "N = 64, H = 2, 24/16, 16 x 32 tiles, 1 thread(s)"
    # the command line: one row per problem, the machine (and its BLAS) recorded
    monkeypatch.setattr(ceiling, "CEILING_PROBLEMS", ((48, 16, 8),))
    assert bench.main(["--ceiling-only", "--repeats", "1", "--out", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "ceiling.json").read_text())
    assert [(x["n"], x["d_qk"], x["d_v"]) for x in run["rows"]] == [(48, 16, 8)]
    assert run["machine"]["blas"] and "products alone" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--ceiling-only", "--mla-only"])
    assert "excludes --mla-only" in capsys.readouterr().err
