"""flashlab.rect: the RECT-FA ideas composed (separate operators by bytes / HBM bandwidth, the
FA kernel by the calibrated chip model)."""
from __future__ import annotations

import math

import pytest

from flashlab import ledgers, rect
from flashlab.dataflows import DATAFLOWS, IDEAS, Step
from flashlab.pipeline import calibrated

CHIP = calibrated.CHIPS["910B2"]
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
    assert covered >= ledgers.attended_pairs(p.seq, p.seq, causal=True)


def test_kernel_options_per_idea():
    assert rect.kernel_options((), SMALL) == dict(strategy="iterate_all", dv=192, split=False)
    assert rect.kernel_options(ALL, SMALL) == dict(strategy="ping_pong", dv=128, split=True)


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
    base = ledgers.mla_forward_steps(1, 4, 1024, 128, 64, 128, dataflow="baseline", causal=True)
    pad = next(s for s in base if s.name == "pad V")
    assert rect.separate_steps(SMALL, {"split_rope"})[0] == pad


@pytest.mark.parametrize("ideas", rect.all_combinations(), ids=rect.label)
def test_separate_steps_are_the_dataflows_own(ideas):
    """Removing each idea's operators from the baseline leaves exactly the separate operators of
    the flashlab.mla dataflow of those ideas (split_rope alone: pad V / slice O, no concat)."""
    flow = rect.dataflow_of(ideas)
    assert flow in DATAFLOWS
    args, kw = SMALL.cost_args()
    for backward, fn in ((False, ledgers.mla_forward_steps), (True, ledgers.mla_backward_steps)):
        own = [s for s in fn(*args, dataflow=flow, **kw) if not s.name.startswith("flash attention")]
        assert rect.separate_steps(SMALL, ideas, backward=backward) == own, (flow, backward)


def test_op_seconds_is_bytes_over_bandwidth():
    step = Step("x", 0, 3_000, 1_000, 1_000)
    assert rect.op_seconds(step, 2_000.0) == 2.0
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        rect.op_seconds(step, 0)


def test_chip_model_by_name_or_model():
    assert rect.chip_model("910B2") is CHIP and rect.chip_model(CHIP) is CHIP
    with pytest.raises(ValueError, match="chip must be one of"):
        rect.chip_model("910B")
    with pytest.raises(TypeError, match="chip must be a chip name"):
        rect.chip_model(3)


def test_kernel_seconds_is_the_calibrated_model_of_the_ideas_kernel():
    full = rect.MLAProblem(heads=4, seq=1024, causal=False)
    # the baseline kernel: V padded to D = 192, IterateAll, one QK product
    p = calibrated.predict(CHIP, 1, 4, 1024, 1024, 192, 192, dtype="bfloat16", strategy="iterate_all")
    assert rect.kernel_seconds(full, ()) == p.seconds
    # 4 heads x 8 q-blocks = 32 q-blocks on 24 cores: 2 waves; 48 cores: 1 wave, faster
    assert p.waves == 2 and rect.kernel_seconds(full, (), cores=48) < p.seconds
    # causal: the rows, longest first, dealt in a snake, so a core runs a long and a short row:
    # about half the tiles of the full problem
    causal = rect.kernel_seconds(SMALL, ())
    assert 0.5 < causal / rect.kernel_seconds(full, ()) < 0.75
    with pytest.raises(ValueError, match="2-byte operands"):
        rect.kernel_seconds(rect.MLAProblem(elem=4), ())


def test_compose_adds_kernel_and_remaining_operators():
    base = rect.compose(SMALL, ())
    bw = 1.6e12
    moved = sum(s.bytes_read + s.bytes_written for s in rect.separate_steps(SMALL, ()))
    assert base.ops_total == pytest.approx(moved / bw)
    assert base.total == pytest.approx(base.kernel + base.ops_total)
    rect_fa = rect.compose(SMALL, ALL)
    assert rect_fa.ops == () and rect_fa.total == rect_fa.kernel
    assert rect.speedup(base, rect_fa) == pytest.approx(base.total / rect_fa.total)
    assert base.label == "baseline"
    with pytest.raises(ValueError, match="part must be"):
        rect.speedup(base, rect_fa, part="ops")


def test_model_properties_that_the_chapter_relies_on():
    """Native V and ping-pong make the kernel faster; the separate operators shrink to zero;
    more HBM bandwidth never slows the baseline."""
    combos = {c: rect.compose(SMALL, c) for c in rect.all_combinations()}
    for c, r in combos.items():
        if "native_v" not in c:
            assert combos[c | {"native_v"}].kernel < r.kernel
        if "ping_pong" not in c:
            assert combos[c | {"ping_pong"}].kernel < r.kernel
        assert combos[c | {"split_rope", "native_v"}].ops_total == 0.0
    slow = rect.compose(SMALL, (), chip=calibrated.with_param(CHIP, hbm_bandwidth=0.8e12))
    fast = rect.compose(SMALL, (), chip=calibrated.with_param(CHIP, hbm_bandwidth=3.2e12))
    assert fast.total <= slow.total and fast.ops_total == pytest.approx(slow.ops_total / 4)


def test_backward_roofline_is_the_flop_ratio_when_compute_bound():
    before = rect.compose_backward(SMALL, ())
    after = rect.compose_backward(SMALL, {"native_v"})
    d, dv = 192, 128
    # 5 products: 3 over the QK dim, 2 over V's dim (padded to D in the baseline)
    assert rect.speedup(before, after, part="kernel") == pytest.approx((3 * d + 2 * d) / (3 * d + 2 * dv))
    assert rect.compose_backward(SMALL, {"ping_pong"}).total == before.total
    assert [n for n, _ in rect.compose_backward(SMALL, ALL).ops] == []
    assert math.isclose(after.ops_total, sum(
        rect.op_seconds(s, 1.6e12) for s in rect.separate_steps(SMALL, {"native_v"}, backward=True)))
