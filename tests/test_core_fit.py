"""The one-core simulator and the calibrated model are one model: the calibrated AI Core profile
(flashlab.pipeline.core_fit) reproduces the calibrated model's stage cycles and q-block times."""
import dataclasses

import pytest

from flashlab.pipeline import calibrated
from flashlab.pipeline.core_fit import (
    ASCEND_910B_CALIBRATED_CORE,
    REFERENCE,
    fit_rates,
    reference_qblock,
    sim_stage_cycles,
)
from flashlab.pipeline.params import Param
from flashlab.pipeline.profiles import ASCEND_910B_AI_CORE

CHIP = calibrated.CHIPS["910B2"]
F = CHIP.clock.value
STAGES = calibrated.stage_cycles(CHIP, REFERENCE["rows"], REFERENCE["cols"], REFERENCE["d"], REFERENCE["d"])


def _stage_errors(profile) -> dict[str, float]:
    sim = sim_stage_cycles(profile)
    cal = dict(STAGES, cube=STAGES["qk"] + STAGES["pv"],
               steady=max(STAGES["qk"] + STAGES["pv"], STAGES["p"] + STAGES["gu"]))
    sim = dict(sim, cube=sim["qk"] + sim["pv"])
    return {k: sim[k] / cal[k] - 1 for k in cal}


#: tolerances of the tie: the fitted quantities (the Vector's two stages, the Cube core's sum,
#: the steady state of a tile) within 2 %; QK and PV each within the calibrated model's own
#: +-15 % range of the stage cycles (one MAC rate and one start latency cannot split them as
#: pto-isa's trace does: core_fit's docstring)
TOL = {"p": 0.02, "gu": 0.02, "cube": 0.02, "steady": 0.02, "qk": 0.15, "pv": 0.15}


def test_simulator_reproduces_the_stage_cycles():
    err = _stage_errors(ASCEND_910B_CALIBRATED_CORE)
    for k, tol in TOL.items():
        assert abs(err[k]) <= tol, (k, err[k])


def test_the_uncalibrated_core_fails_the_same_test():
    # the test can fail: the assumed profile (and a wrong Vector rate) miss the stage cycles
    err = _stage_errors(ASCEND_910B_AI_CORE)
    assert any(abs(err[k]) > tol for k, tol in TOL.items())
    core = ASCEND_910B_CALIBRATED_CORE.core
    half = Param(core.vector.rate.value / 2, "element/s", "a wrong rate, for the test", "assumption")
    slow = dataclasses.replace(ASCEND_910B_CALIBRATED_CORE, core=dataclasses.replace(
        core, vector=dataclasses.replace(core.vector, rate=half)))
    assert abs(_stage_errors(slow)["p"]) > TOL["p"]


def test_fit_reproduces_its_inputs_and_is_sourced():
    fit = fit_rates(**{s: calibrated.FIT["stage_cycles"][s] for s in ("qk", "p", "pv", "gu")})
    assert fit["vector"] > 0 and fit["workspace"] > 0 and fit["cube_latency"] >= 0
    core = ASCEND_910B_CALIBRATED_CORE.core
    assert core.vector.rate.value == pytest.approx(fit["vector"] * F)
    assert core.workspace_bandwidth.value == pytest.approx(fit["workspace"] * F)
    assert core.matmul.latency.value == pytest.approx(fit["cube_latency"] / F)
    for p in (core.vector.rate, core.workspace_bandwidth, core.matmul.latency):
        assert p.status == "fitted" and "fa_cost_model.py" in p.source
        assert p.low <= p.value <= p.high and p.low < p.high
    # the Cube's MAC rate stays derived
    assert core.matmul.rate == ASCEND_910B_AI_CORE.core.matmul.rate
    assert core.matmul.rate.status == "derived"
    with pytest.raises(ValueError, match="no solution"):
        fit_rates(2487, 10, 1617, 10)


#: the simulator's q-block has fill and drain the calibrated model folds into one dispatch per
#: q-block (the Q load, the hand-off of P through GM before the first PV, the final division and
#: the O store): sim - (dispatch + qblock_cycles) lies in 0 .. 8000 cycles (4.4 us) at every n,
#: and within 5 % once the q-block has 32 tiles or more
FILL_CYCLES = 8000


def test_qblock_time_agrees_with_the_calibrated_model():
    depth, dispatch = int(CHIP.preload.value), CHIP.dispatch_cycles.value
    for n in range(1, 65):
        sim = reference_qblock(n).makespan * F
        cal = dispatch + calibrated.qblock_cycles(STAGES, n, depth)
        assert 0 <= sim - cal <= FILL_CYCLES, (n, sim, cal)
        if n >= 32:
            assert abs(sim / cal - 1) <= 0.05, (n, sim, cal)


def test_fit_refuses_a_core_without_fixpipe():
    from flashlab.pipeline.profiles import A100_SM
    with pytest.raises(ValueError, match="base must be an Ascend AI Core"):
        fit_rates(2487, 2489, 1617, 834, base=A100_SM)
