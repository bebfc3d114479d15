"""flashlab.viz.backward: the step lists, their FLOP count and the drawing."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashlab import flops  # noqa: E402
from flashlab.viz.backward import BACKWARD_STEPS, FORWARD_STEPS, MATMUL, VECTOR, draw_tile_steps, matmul_flops_per_tile  # noqa: E402


def test_step_lists_count_two_and_five_products():
    assert sum(s.kind == MATMUL for s in FORWARD_STEPS) == 2
    assert sum(s.kind == MATMUL for s in BACKWARD_STEPS) == 5
    for s in FORWARD_STEPS + BACKWARD_STEPS:
        assert s.kind in (MATMUL, VECTOR)
        assert (s.dim in ("qk", "v")) == (s.kind == MATMUL), s.formula
        assert s.formula.startswith("$") and s.formula.endswith("$")


def test_backward_needs_d_before_the_loop_and_recomputes_p_from_the_lse():
    assert not BACKWARD_STEPS[0].per_tile and "D_i" in BACKWARD_STEPS[0].formula
    tile_steps = [s.formula for s in BACKWARD_STEPS if s.per_tile]
    assert any("LSE" in f for f in tile_steps)


@pytest.mark.parametrize("dqk, dv", [(64, 64), (192, 128), (1, 7)])
def test_forward_flops_match_the_cost_model(dqk, dv):
    """Summed over a whole Sq x Sk grid of tiles, the forward's products are flops.attention_flops."""
    sq, sk, br, bc = 256, 128, 64, 32
    tiles = (sq // br) * (sk // bc)
    assert tiles * matmul_flops_per_tile(FORWARD_STEPS, br, bc, dqk, dv) == \
        flops.attention_flops(sq, sk, dqk, dv)


def test_backward_over_forward_flops():
    def ratio(dqk, dv):
        return (matmul_flops_per_tile(BACKWARD_STEPS, 64, 64, dqk, dv)
                / matmul_flops_per_tile(FORWARD_STEPS, 64, 64, dqk, dv))
    assert ratio(128, 128) == 2.5
    # 3 products contract/produce d_qk, 2 produce/contract d_v: (3*192 + 2*128) / (192 + 128)
    assert ratio(192, 128) == pytest.approx(2.6)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                        (True, TypeError), (None, TypeError)])
def test_flops_rejects_bad_sizes(bad, error):
    with pytest.raises(error, match="block_q must be"):
        matmul_flops_per_tile(BACKWARD_STEPS, bad, 64, 64, 64)


def test_draw_tile_steps_draws_one_box_per_step():
    fig = draw_tile_steps()
    ax = fig.axes[0]
    assert len(ax.patches) >= len(FORWARD_STEPS) + len(BACKWARD_STEPS)
    texts = [t.get_text() for t in ax.texts]
    assert "#5" in texts and "#6" not in texts
    assert any("5 products" in t for t in texts) and any("2 products" in t for t in texts)
    fig.canvas.draw()          # every formula must parse as mathtext
    plt.close(fig)
