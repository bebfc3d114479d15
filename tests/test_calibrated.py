"""The calibrated NPU model (flashlab.pipeline.calibrated, flashlab.rect.forward_time): its fit
reproduces its inputs, every parameter is sourced with a range, its shape is right, and it meets
the held-out measurements it was never fitted to."""
from __future__ import annotations

import math

import pytest

from flashlab import flops, ledgers, rect, tiling, vendor
from flashlab.pipeline import calibrated
from flashlab.pipeline.params import STATUSES

B2 = calibrated.CHIPS["910B2"]
FIT = calibrated.FIT
HELD = calibrated.HELD_OUT["multi_core_910B2"]
SEQS = [1024 * 2 ** k for k in range(8)]          # 1K .. 128K


def efficiency(s: int, chip: str = "910B2") -> float:
    m = calibrated.chip_model(chip)
    p = calibrated.predict(m, 1, 1, s, s, 128)
    return p.flops / p.seconds / m.peak_flops


# ---- the fit reproduces its own inputs ------------------------------------------------------
def test_fit_reproduces_the_stage_cycles_of_the_reference_tile():
    """One core alone (no contention), the 128 x 256 tile at D = 128: pto-isa's four stage cycles."""
    st = calibrated.stage_cycles(B2, 128, 256, 128, 128, calibrated.contention(B2, 1))
    for s in ("qk", "p", "pv", "gu"):
        assert st[s] == pytest.approx(FIT["stage_cycles"][s], rel=1e-12)
    assert B2.launch_cycles.value == FIT["stage_cycles"]["launch"]
    assert calibrated.tile_shape(B2, 128, 128) == (128, 256)


def test_fit_reproduces_the_chip_time():
    f = FIT["chip_time"]
    t = rect.forward_time(1, 1, f["sq"], f["sk"], f["d"], chip=f["chip"])
    assert t * 1e6 == pytest.approx(f["us"], rel=1e-6)
    assert B2.port_cores.status == "fitted"
    # the fit is not a no-op: another target time gives another port
    assert calibrated.fit_port_cores(B2, f["us"] * 1.05) < B2.port_cores.value


def test_fitted_and_held_out_are_disjoint():
    """The one whole-chip time the model is fitted to is the only measured row it may match by
    construction; every other row is held out."""
    assert HELD["fitted_row"] == FIT["chip_time"]["sq"]
    held = [r for r in HELD["rows"] if r["s"] != HELD["fitted_row"]]
    assert len(held) == 5


# ---- every parameter has a source class and a range ------------------------------------------
@pytest.mark.parametrize("chip", list(calibrated.CHIPS))
def test_every_parameter_has_a_source_class_and_a_range(chip):
    m = calibrated.CHIPS[chip]
    for name, p in m.params().items():
        assert p.status in STATUSES, name
        assert p.source.strip() and p.low is not None and p.low <= p.value <= p.high, name
    # every mechanism of the issue is carried by named parameters of the model
    for mech, names in calibrated.MECHANISMS.items():
        assert names and all(n in m.params() for n in names), mech
    fitted = {n for n, p in m.params().items() if p.status == "fitted"}
    assert fitted == {"qk_cycles", "p_cycles", "pv_cycles", "gu_cycles", "launch_cycles", "port_cores"}


def test_with_param_moves_one_number_and_checks_its_name():
    m = calibrated.with_param(B2, preload=2)
    assert m.preload.value == 2 and B2.preload.value == 4 and "moved" in m.preload.source
    with pytest.raises(ValueError, match="no parameter 'preloads'"):
        calibrated.with_param(B2, preloads=2)


# ---- the shape: monotone in S and in the cores, efficiency rising with S ---------------------
@pytest.mark.parametrize("chip", list(calibrated.CHIPS))
def test_forward_time_is_monotone_in_s(chip):
    times = [rect.forward_time(1, 1, s, s, 128, chip=chip) for s in SEQS]
    assert all(a < b for a, b in zip(times, times[1:]))
    for causal in (False, True):
        t = [rect.forward_time(2, 8, s, s, 128, causal=causal, chip=chip) for s in range(256, 4097, 256)]
        assert all(a <= b for a, b in zip(t, t[1:]))


def test_forward_time_is_monotone_in_the_core_count():
    p = rect.MLAProblem(heads=16, seq=2048, causal=False)
    times = [rect.kernel_seconds(p, {"native_v", "split_rope", "ping_pong"}, cores=c) for c in range(1, 49)]
    assert all(a >= b for a, b in zip(times, times[1:]))
    assert times[0] > 10 * times[-1]


@pytest.mark.parametrize("chip", list(calibrated.CHIPS))
def test_efficiency_rises_with_s(chip):
    eff = [efficiency(s, chip) for s in SEQS]
    assert all(a < b for a, b in zip(eff, eff[1:])), eff
    assert eff[0] < 0.15 and 0.4 < eff[-1] < 0.6


def test_the_a3_is_the_910b2_at_its_own_clock():
    a3 = calibrated.CHIPS["A3"]
    assert a3.clock.value == 1.85e9 and a3.cores.value == 24
    t_b2, t_a3 = (rect.forward_time(1, 1, 32768, 32768, 128, chip=c) for c in ("910B2", "A3"))
    assert t_a3 == pytest.approx(t_b2 * 1.8 / 1.85, rel=1e-3)


# ---- the mechanisms -------------------------------------------------------------------------
def test_whole_q_blocks_in_waves_the_busiest_core_sets_the_time():
    # 24 q-blocks: one wave; 25: two, the 25th alone on core 0
    one, two = (calibrated.predict(B2, 1, 1, 128 * n, 4096, 128) for n in (24, 25))
    assert (one.waves, two.waves) == (1, 2)
    assert two.seconds > 1.8 * one.seconds - B2.launch_cycles.value / B2.clock.value


def test_kv_from_hbm_when_they_do_not_fit_l2():
    small = calibrated.predict(B2, 1, 1, 4096, 4096, 128)
    big = calibrated.predict(B2, 1, 48, 4096, 2 ** 20, 128)
    assert small.kv_source == "l2" and big.kv_source == "hbm"
    slow = calibrated.with_param(B2, hbm_bandwidth=0.2e12)
    assert calibrated.predict(slow, 1, 48, 4096, 2 ** 20, 128).seconds > big.seconds
    assert calibrated.predict(slow, 1, 1, 4096, 4096, 128).seconds == small.seconds


def test_the_shared_port_slows_each_core_as_more_run():
    assert calibrated.contention(B2, 1) == 1.0
    narrow = calibrated.with_param(B2, port_cores=6)
    assert calibrated.contention(narrow, 24) == 4.0
    # one q-block per core: 6 cores run as fast per q-block as one; 24 run slower
    t = {n: calibrated.predict(narrow, 1, 1, 128 * n, 8192, 128).seconds for n in (1, 6, 24)}
    assert t[1] == pytest.approx(t[6]) and t[24] > 1.5 * t[6]


def test_preload_depth_fills_the_pipeline():
    st = calibrated.stage_cycles(B2, 128, 256, 128, 128)
    serial = sum(st.values())
    # one tile: the four stages in a row; many tiles with preload: max(cube, vector) a tile
    assert calibrated.qblock_cycles(st, 1, 4) == pytest.approx(serial)
    n = 64
    steady = max(st["qk"] + st["pv"], st["p"] + st["gu"])
    assert calibrated.qblock_cycles(st, n, 4) == pytest.approx(n * steady, rel=0.05)
    assert calibrated.qblock_cycles(st, n, 1) > calibrated.qblock_cycles(st, n, 2) >= \
        calibrated.qblock_cycles(st, n, 4)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="dtype must be one of"):
        rect.forward_time(1, 1, 128, 128, 128, dtype="float32")
    with pytest.raises(ValueError, match="chip must be one of"):
        rect.forward_time(1, 1, 128, 128, 128, chip="H100")
    with pytest.raises(ValueError, match="sq must be >= 1"):
        rect.forward_time(1, 1, 0, 128, 128)
    with pytest.raises(TypeError, match="causal must be a bool"):
        rect.forward_time(1, 1, 128, 128, 128, causal=1)
    with pytest.raises(ValueError, match="strategy must be one of"):
        calibrated.predict(B2, 1, 1, 128, 128, 128, strategy="both")


# ---- the held-out test: never fitted ---------------------------------------------------------
def test_held_out_multi_core_times_within_a_quarter():
    """The 910B2 PTO kernel at S = 1K .. 16K (all 24 cores), none of them fitted: within 25 %."""
    for r in HELD["rows"]:
        t = rect.forward_time(1, 1, r["s"], r["s"], 128) * 1e6
        assert abs(t / r["pto_us"] - 1) <= 0.25, (r["s"], t, r["pto_us"])


def test_held_out_measured_efficiency_rises_like_the_model():
    peak = B2.peak_flops
    measured = [4 * r["s"] ** 2 * 128 / (r["pto_us"] * 1e-6) / peak for r in HELD["rows"]]
    model = [efficiency(r["s"]) for r in HELD["rows"]]
    assert all(a < b for a, b in zip(measured, measured[1:]))
    assert all(a < b for a, b in zip(model, model[1:]))


# ---- the roofline is the lower bound ---------------------------------------------------------
@pytest.mark.parametrize("ideas", rect.all_combinations(), ids=rect.label)
def test_calibrated_kernel_is_never_below_its_roofline(ideas):
    """pipeline >= roofline: the FA kernel of every idea set, and plain FA at every S, never runs
    faster than max(F / pi, Q / beta) with its compulsory traffic."""
    p = rect.MLAProblem()
    args, kw = p.cost_args()
    steps = ledgers.mla_forward_steps(*args, dataflow=rect.dataflow_of(ideas), kv_hit=tiling.KV_RESIDENT, **kw)
    k = next(s for s in steps if s.name.startswith("flash attention"))
    roof = max(k.flops / B2.peak_flops, (k.bytes_read + k.bytes_written) / B2.hbm_bandwidth.value)
    assert rect.kernel_seconds(p, ideas) >= roof


@pytest.mark.parametrize("s", SEQS)
def test_forward_time_is_never_below_the_roofline(s):
    ops = flops.operation_costs(s, s, 128, 128, elem=2, kv_hit=tiling.KV_RESIDENT)["FlashAttention (fused)"]
    roof = max(ops[0] / B2.peak_flops, ops[1] / B2.hbm_bandwidth.value)
    assert rect.forward_time(1, 1, s, s, 128) >= roof
    assert not math.isnan(roof)


# ---- every verdict recomputed from the model, never stored -----------------------------------
def test_every_verdict_is_recomputed_from_the_model():
    for r in vendor.vendor_table():
        assert r.verdict == vendor.verdict(r)
        if r.not_comparable:
            continue
        e = r.estimates[r.decides]
        assert e.like and e.low == e.high
        words = {vendor.classify(r.kind, r.vendor, v, at_least=r.at_least) for v in [e.low] + [x[2] for x in r.spread]}
        word = vendor.verdict_headline(r.verdict)
        assert word == (words.pop() if len(words) == 1 else "undetermined")
        # the spread moves every parameter with a range to both of its ends
        assert {n for n, _, _ in r.spread} == set(vendor.SENSITIVITY_PARAMETERS)
        for name, v, lo, hi in r.flips:
            assert lo != hi and getattr(B2, name).low <= v <= getattr(B2, name).high
    # the pipeline column is the calibrated model: recompute one
    p = rect.MLAProblem()
    before = rect.compose(p, ())
    after = rect.compose(p, {"native_v"})
    assert vendor.row("fa_forward").estimates["pipeline"].low == pytest.approx(before.kernel / after.kernel)


def test_prediction_carries_the_steady_state_cycles():
    # the fields are the stage cycles at the prediction's contention, and name the engine waited on
    from flashlab.pipeline import calibrated as cal
    chip = cal.CHIPS["910B2"]
    for sq, causal in ((32768, False), (1024, False), (4096, True)):
        pred = cal.predict(chip, 1, 1, sq, sq, 128, causal=causal)
        st = cal.stage_cycles(chip, *pred.tile, 128, 128, pred.g)
        assert pred.cube_cycles == pytest.approx(st["qk"] + st["pv"])
        assert pred.vector_cycles == pytest.approx(st["p"] + st["gu"])
        assert pred.waits_on == ("cube" if pred.cube_cycles >= pred.vector_cycles else "vector")
    # the reference tile alone: the Cube's 2487 + 1617 against the Vector's 2489 + 834
    one = cal.predict(chip, 1, 1, 128, 256, 128)
    assert one.waits_on == "cube" and one.cube_cycles == pytest.approx(cal.FIT["stage_cycles"]["qk"]
                                                                      + cal.FIT["stage_cycles"]["pv"])
