"""flops.operation_costs / operation_intensities and the roofline drawing."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashlab import flops, traffic  # noqa: E402
from flashlab.pipeline.profiles import A100_80GB, ASCEND_910B  # noqa: E402
from flashlab.viz.roofline import attention_operations, plot_roofline  # noqa: E402

SHAPES = [(1024, 1024, 64, 64), (4096, 4096, 128, 128), (2048, 1000, 192, 128), (7, 300, 16, 8)]


@pytest.mark.parametrize("sq, sk, dqk, dv", SHAPES)
@pytest.mark.parametrize("elem", [2, 4])
def test_operation_costs_agree_with_the_other_models(sq, sk, dqk, dv, elem):
    ops = flops.operation_costs(sq, sk, dqk, dv, block_q=64, elem=elem)
    unfused = ("QK^T", "softmax", "PV")
    # the intensities of the unfused steps are those of matmul_intensities
    ref = flops.matmul_intensities(sq, sk, dqk, dv, elem=elem)
    for name in unfused:
        f, b = ops[name]
        assert f / b == pytest.approx(ref[name])
    # unfused traffic adds up to Algorithm 0's, the matmul FLOPs to attention_flops
    assert sum(ops[n][1] for n in unfused) == elem * traffic.hbm_elements_standard(sq, sk, dqk, dv)
    assert ops["standard attention"] == (sum(ops[n][0] for n in unfused),
                                         sum(ops[n][1] for n in unfused))
    assert ops["QK^T"][0] + ops["PV"][0] == pytest.approx(flops.attention_flops(sq, sk, dqk, dv))
    # fused: the same arithmetic, the tiled traffic
    f, b = ops["FlashAttention (fused)"]
    assert f == pytest.approx(sum(ops[n][0] for n in unfused))
    assert b == elem * traffic.hbm_elements_flash(sq, sk, dqk, dv, 64)
    its = flops.operation_intensities(sq, sk, dqk, dv, block_q=64, elem=elem)
    assert its["softmax"] == pytest.approx(flops.SOFTMAX_FLOPS_PER_ELEMENT / (2 * elem))


@pytest.mark.parametrize("block_q", [64, 128])
def test_fused_intensity_is_about_the_block_size(block_q):
    # 4 N^2 d FLOPs over 2 bytes x (N / Br) x N x 2d re-read elements -> about Br FLOP/B
    i = flops.operation_intensities(16384, 16384, 128, 128, block_q=block_q)["FlashAttention (fused)"]
    assert block_q <= i < 1.05 * block_q


def test_operation_costs_validates():
    with pytest.raises(ValueError, match="block_q"):
        flops.operation_costs(128, 128, 64, 64, block_q=0)
    with pytest.raises(TypeError, match="seq_q must be an int"):
        flops.operation_costs(1.5, 128, 64, 64)


def test_plot_roofline_places_every_operation():
    ops = attention_operations(2048, 64)
    assert set(ops) == {"QK^T", "softmax", "PV", "standard attention", "FlashAttention (fused)"}
    fig = plot_roofline([A100_80GB, ASCEND_910B], ops)
    ax = fig.axes[0]
    # one roof per profile + one marker per (profile, operation)
    marker_lines = [ln for ln in ax.lines if len(ln.get_xdata()) == 1]
    assert len(marker_lines) == 2 * len(ops)
    plt.close(fig)
    with pytest.raises(ValueError, match="outside intensity_range"):
        plot_roofline(A100_80GB, {"x": 1e6})
    with pytest.raises(TypeError, match="HardwareProfile"):
        plot_roofline(["A100"])


def test_flash_backward_intensity_counts_five_products_over_the_streamed_operands():
    n, d, bq = 4096, 128, 64
    n_flops = 2 * n * n * (3 * d + 2 * d)
    elements = n * 4 * d + 3 * (n // bq) * n * 2 * d
    lse = 4 * n                                   # the LSE, read once in float32
    assert flops.flash_backward_intensity(n, n, d, d, block_q=bq) == pytest.approx(n_flops / (4 * elements + lse))
    # taller q-blocks stream K, V (and dK, dV) fewer times: intensity grows with block_q
    values = [flops.flash_backward_intensity(n, n, d, d, block_q=b) for b in (32, 64, 128, 256)]
    assert values == sorted(values) and values[-1] > 3 * values[0]
    # a ragged last q-block counts as a whole one
    assert flops.flash_backward_intensity(100, 100, 8, 8, block_q=64) == \
        flops.flash_backward_intensity(100, 100, 8, 8, block_q=50)
