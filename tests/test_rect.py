"""flashlab.rect: the RECT-FA ideas composed (separate operators by bytes / HBM bandwidth, the
FA kernel by the pipeline model scaled to the whole problem)."""
from __future__ import annotations

import math

import pytest

from flashlab import cost, rect
from flashlab.dataflows import DATAFLOWS, IDEAS, Step
from flashlab.pipeline import ASCEND_910B, ASCEND_910B_AI_CORE, simulate_fa
from flashlab.pipeline.profiles import ASCEND_910B_CORES

CORE = ASCEND_910B_AI_CORE
#: small problems keep the simulations short
SMALL = rect.MLAProblem(heads=4, seq=1024)
ODD = rect.MLAProblem(batch=2, heads=3, seq=300, block_q=64, block_k=128)
ALL = frozenset(IDEAS)


def test_ideas_are_checked_and_named():
    assert rect.check_ideas(["native_v", "native_v"]) == {"native_v"}
    with pytest.raises(ValueError, match="ideas must be names from"):
        rect.check_ideas(["pingpong"])
    with pytest.raises(TypeError, match="not one string"):
        rect.check_ideas("native_v")
    assert rect.label(()) == "baseline"
    assert rect.label(ALL) == "RECT-FA (all three)"
    assert rect.label({"ping_pong", "native_v"}) == "native V + ping-pong"
    combos = rect.all_combinations()
    assert len(combos) == 8 and len(set(combos)) == 8 and combos[0] == frozenset() and combos[-1] == ALL


def test_problem_is_validated():
    with pytest.raises(ValueError, match="heads must be >= 1"):
        rect.MLAProblem(heads=0)
    with pytest.raises(ValueError, match="d_v must be <="):
        rect.MLAProblem(d_v=256)
    with pytest.raises(TypeError, match="causal must be a bool"):
        rect.MLAProblem(causal=1)


def test_kv_blocks_follow_the_causal_band():
    # rows 0..63 see keys 0..63: 1 block of 128; rows 64..127: 1; 128..191: 2; ... 256..299: 3
    assert ODD.kv_blocks() == [1, 1, 2, 2, 3]
    assert rect.MLAProblem(seq=300, causal=False, block_q=64, block_k=128).kv_blocks() == [3] * 5
    # the pairs the blocks cover contain every attended pair
    p = ODD
    covered = sum(min(p.block_q, p.seq - i * p.block_q) * min(n * p.block_k, p.seq)
                  for i, n in enumerate(p.kv_blocks()))
    assert covered >= cost.attended_pairs(p.seq, p.seq, causal=True)


def test_kernel_options_per_idea():
    assert rect.kernel_options((), SMALL) == dict(strategy="iterate_all", pad_v=True, split_rope=0)
    assert rect.kernel_options(ALL, SMALL) == dict(strategy="ping_pong", pad_v=False, split_rope=64)


def test_separate_steps_each_idea_removes_its_operators():
    def names(ideas, backward=False):
        return [s.name for s in rect.separate_steps(SMALL, ideas, backward=backward)]

    assert names(()) == ["expand k_rope", "concat Q", "concat K", "pad V", "slice O"]
    assert names({"native_v"}) == ["expand k_rope", "concat Q", "concat K"]
    assert names({"split_rope"}) == ["pad V", "slice O"]
    assert names({"ping_pong"}) == names(())
    assert names(ALL) == [] and names(ALL, True) == []
    assert names((), True) == ["pad dO", "split dQ", "split dK", "sum dk_rope over heads", "slice dV"]
    # the bytes are the cost model's
    base = cost.mla_forward_steps(1, 4, 1024, 128, 64, 128, dataflow="baseline", causal=True)
    pad = next(s for s in base if s.name == "pad V")
    assert rect.separate_steps(SMALL, {"split_rope"})[0] == pad


@pytest.mark.parametrize("ideas", rect.all_combinations(), ids=rect.label)
def test_separate_steps_are_the_dataflows_own(ideas):
    """Removing each idea's operators from the baseline leaves exactly the separate operators of
    the flashlab.mla dataflow of those ideas (split_rope alone: pad V / slice O, no concat)."""
    flow = rect.dataflow_of(ideas)
    assert flow in DATAFLOWS
    args, kw = SMALL.cost_args()
    for backward, fn in ((False, cost.mla_forward_steps), (True, cost.mla_backward_steps)):
        own = [s for s in fn(*args, dataflow=flow, **kw) if not s.name.startswith("flash attention")]
        assert rect.separate_steps(SMALL, ideas, backward=backward) == own, (flow, backward)


def test_op_seconds_is_bytes_over_bandwidth():
    step = Step("x", 0, 3_000, 1_000, 1_000)
    assert rect.op_seconds(step, 2_000.0) == 2.0
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        rect.op_seconds(step, 0)


def test_chip_bandwidth_round_trip():
    assert rect.chip_bandwidth(CORE) == pytest.approx(ASCEND_910B.hbm_bandwidth.value)
    assert ASCEND_910B.peak_flops.value / CORE.peak_flops.value == ASCEND_910B_CORES
    p = rect.with_chip_bandwidth(CORE, 2.4e12)
    assert rect.chip_bandwidth(p) == pytest.approx(2.4e12)
    assert p.core.load.rate.value == pytest.approx(1e11) and p.core.store.rate.value == pytest.approx(1e11)
    assert p.core.load.rate.status == "assumption"
    assert CORE.core.load.rate.value == pytest.approx(1.6e12 / 24)  # the original is untouched
    with pytest.raises(ValueError, match="bytes_per_s"):
        rect.with_chip_bandwidth(CORE, -1.0)
    with pytest.raises(ValueError, match="cores must be"):
        rect.with_chip_bandwidth(CORE, 1e12, cores=0)


@pytest.mark.parametrize("ideas", [frozenset(), ALL, frozenset({"split_rope"})], ids=rect.label)
def test_qblock_model_matches_further_simulations(ideas):
    """The line through n = N/2 and N predicts the simulated per-q-block cost at other n >= 3 (within 1 %)."""
    prob = rect.MLAProblem(heads=1, seq=1536)  # N = 12 kv-blocks
    t = rect.qblock_model(CORE, prob, ideas)
    assert t.n_fit == (6, 12) and t.b > 0
    opts = rect.kernel_options(ideas, prob)
    strategy = opts.pop("strategy")
    for n in (3, 5, 9):
        one, two = (simulate_fa(CORE, strategy, m * 128, n * 128, 192, 128, 128, 128, **opts).makespan
                    for m in (1, 2))
        assert two - one == pytest.approx(t(n), rel=0.01)


def test_kernel_seconds_scales_to_the_whole_problem():
    full = rect.MLAProblem(heads=4, seq=1024, causal=False)
    t = rect.qblock_model(CORE, full, ())
    n_q = 1024 // 128
    assert rect.kernel_seconds(CORE, full, ()) == pytest.approx(4 / 24 * n_q * t(8))
    # twice the heads: twice the time; twice the cores: half
    assert rect.kernel_seconds(CORE, rect.MLAProblem(heads=8, seq=1024, causal=False), ()) == \
        pytest.approx(2 * rect.kernel_seconds(CORE, full, ()))
    assert rect.kernel_seconds(CORE, full, (), cores=48) == \
        pytest.approx(rect.kernel_seconds(CORE, full, ()) / 2)
    # causal: about half the kv-blocks (1 + 2 + ... + 8 of 8 x 8), so between 1/2 and 3/4
    causal = rect.kernel_seconds(CORE, SMALL, ())
    assert 0.5 < causal / rect.kernel_seconds(CORE, full, ()) < 0.75


def test_compose_adds_kernel_and_remaining_operators():
    base = rect.compose(CORE, SMALL, ())
    bw = 1.6e12
    moved = sum(s.bytes_read + s.bytes_written for s in rect.separate_steps(SMALL, ()))
    assert base.ops_total == pytest.approx(moved / bw)
    assert base.total == pytest.approx(base.kernel + base.ops_total)
    rect_fa = rect.compose(CORE, SMALL, ALL)
    assert rect_fa.ops == () and rect_fa.total == rect_fa.kernel
    assert rect.speedup(base, rect_fa) == pytest.approx(base.total / rect_fa.total)
    assert base.label == "baseline"
    with pytest.raises(ValueError, match="part must be"):
        rect.speedup(base, rect_fa, part="ops")


def test_model_properties_that_the_chapter_relies_on():
    """Native V and ping-pong make the kernel faster; the separate operators shrink to zero;
    more HBM bandwidth never slows the baseline."""
    combos = {c: rect.compose(CORE, SMALL, c) for c in rect.all_combinations()}
    for c, r in combos.items():
        if "native_v" not in c:
            assert combos[c | {"native_v"}].kernel < r.kernel
        if "ping_pong" not in c:
            assert combos[c | {"ping_pong"}].kernel < r.kernel
        assert combos[c | {"split_rope", "native_v"}].ops_total == 0.0
    slow = rect.compose(rect.with_chip_bandwidth(CORE, 0.8e12), SMALL, ())
    fast = rect.compose(rect.with_chip_bandwidth(CORE, 3.2e12), SMALL, ())
    assert fast.total < slow.total and fast.ops_total == pytest.approx(slow.ops_total / 4)


def test_backward_roofline_is_the_flop_ratio_when_compute_bound():
    before = rect.compose_backward(CORE, SMALL, ())
    after = rect.compose_backward(CORE, SMALL, {"native_v"})
    d, dv = 192, 128
    # 5 products: 3 over the QK dim, 2 over V's dim (padded to D in the baseline)
    assert rect.speedup(before, after, part="kernel") == pytest.approx((3 * d + 2 * d) / (3 * d + 2 * dv))
    assert rect.compose_backward(CORE, SMALL, {"ping_pong"}).total == before.total
    assert [n for n, _ in rect.compose_backward(CORE, SMALL, ALL).ops] == []
    assert math.isclose(after.ops_total, sum(
        rect.op_seconds(s, 1.6e12) for s in rect.separate_steps(SMALL, {"native_v"}, backward=True)))
