"""Hardware profiles: every number sourced, the roofline and ridge point, the drawings."""
from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from flashlab.pipeline import params, profiles, roofline  # noqa: E402
from flashlab.viz.hierarchy import draw_ai_core, draw_pyramid, format_bytes, format_rate  # noqa: E402


@pytest.mark.parametrize("key", sorted(profiles.PROFILES))
def test_every_number_has_a_source(key):
    found = list(params.params(profiles.PROFILES[key]))
    assert len(found) >= 8
    for path, p in found:
        assert p.status in params.STATUSES, path
        assert p.source.strip(), path
        assert p.unit, path


def test_params_rejects_a_bare_number():
    level = dataclasses.replace(profiles.A100_80GB.memories[0], count=108)
    with pytest.raises(TypeError, match="bare number"):
        list(params.params(level))


@pytest.mark.parametrize("kwargs, err", [
    ({"value": -1.0, "unit": "B", "source": "x"}, ValueError),
    ({"value": float("nan"), "unit": "B", "source": "x"}, ValueError),
    ({"value": 1.0, "unit": "B", "source": " "}, ValueError),
    ({"value": 1.0, "unit": "B", "source": "x", "status": "guess"}, ValueError),
    ({"value": "1", "unit": "B", "source": "x"}, TypeError),
])
def test_param_validation(kwargs, err):
    with pytest.raises(err):
        params.Param(**kwargs)


def test_ascend_910b_numbers():
    chip, core = profiles.ASCEND_910B, profiles.ASCEND_910B_AI_CORE
    # 24 cores * 16^3 MAC * 2 FLOP * 1.8 GHz
    assert chip.peak_flops.value == pytest.approx(24 * 16 ** 3 * 2 * 1.8e9)
    assert chip.peak_flops.value / 1e12 == pytest.approx(353.9, abs=0.1)
    assert chip.peak_flops.status == "derived"
    assert core.peak_flops.value * 24 == pytest.approx(chip.peak_flops.value)
    assert chip.hbm_bandwidth.status == "assumption"
    sizes = {m.name: m.capacity.value for m in core.memories}
    assert sizes["L1"] == 512 * 1024 and sizes["L0A"] == sizes["L0B"] == 64 * 1024
    assert sizes["L0C"] == 128 * 1024 and sizes["UB"] == 192 * 1024
    assert sizes["L2"] == 192 * 1024 ** 2 and sizes["GM"] == 64 * 1024 ** 3
    assert chip.memory("L1").count.value == 24 and chip.memory("UB").count.value == 48
    engines = {(p.src, p.dst): p.engine for p in chip.paths}
    assert engines[("GM", "L1")] == "MTE2" and engines[("L1", "L0A")] == "MTE1"
    assert engines[("L0C", "GM")] == "FixPipe" and engines[("UB", "GM")] == "MTE3"


def test_gpu_numbers():
    assert profiles.A100_80GB.peak_flops.value == 312e12
    assert profiles.A100_80GB.hbm_bandwidth.value == 2039e9
    assert 1.5e12 <= profiles.A100_40GB.hbm_bandwidth.value <= 2.0e12
    sram = profiles.A100_80GB.memory("SRAM (shared memory/L1)")
    assert sram.capacity.value == 192 * 1024 and sram.count.value == 108
    assert sram.bandwidth.value == 19e12
    assert profiles.H100.hbm_bandwidth.value == 3.35e12
    assert profiles.H100.memory("SRAM (shared memory/L1)").count.value == 132
    assert any("TMA" in p.engine for p in profiles.H100.paths)
    with pytest.raises(KeyError, match="no memory level"):
        profiles.A100_80GB.memory("L3")


def test_ridge_and_roofline():
    p = profiles.A100_80GB
    ridge = roofline.ridge_point(p)
    assert ridge == pytest.approx(312e12 / 2039e9)
    # below the ridge: bandwidth x intensity; above: the peak
    assert roofline.roofline(p, 10.0) == pytest.approx(10.0 * 2039e9)
    assert roofline.roofline(p, 10 * ridge) == pytest.approx(312e12)
    assert roofline.roofline(p, ridge) == pytest.approx(312e12)
    ys = roofline.roofline(p, np.array([1.0, ridge / 2, 1e4]))
    assert ys.shape == (3,) and np.all(np.diff(ys) >= 0)
    # time: the slower of compute and traffic
    assert roofline.roofline_time(p, 312e12, 1.0) == pytest.approx(1.0)
    assert roofline.roofline_time(p, 1.0, 2039e9) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="bytes_moved"):
        roofline.roofline_time(p, 1.0, -1.0)
    assert roofline.bound(p, 1.25) == "memory" and roofline.bound(p, 1e3) == "compute"
    with pytest.raises(ValueError, match="intensity"):
        roofline.roofline(p, -1.0)
    with pytest.raises(TypeError, match="HardwareProfile"):
        roofline.ridge_point("a100")


def test_with_hbm_bandwidth_is_a_copy_marked_assumption():
    p = roofline.with_hbm_bandwidth(profiles.ASCEND_910B, 1.2e12)
    assert p.hbm_bandwidth.value == 1.2e12 and p.hbm_bandwidth.status == "assumption"
    assert profiles.ASCEND_910B.hbm_bandwidth.value == 1.6e12
    assert roofline.ridge_point(p) > roofline.ridge_point(profiles.ASCEND_910B)
    with pytest.raises(dataclasses.FrozenInstanceError):
        profiles.ASCEND_910B.peak_flops = p.peak_flops
    with pytest.raises(ValueError, match="bytes_per_s"):
        roofline.with_hbm_bandwidth(p, 0)


@pytest.mark.parametrize("key", [k for k, p in sorted(profiles.PROFILES.items()) if p.core is not None])
def test_load_and_store_stream_at_the_hbm_share(key):
    # at import and after with_hbm_bandwidth: r_load = r_store = the scope's hbm_bandwidth
    base = profiles.PROFILES[key]
    for p in (base, roofline.with_hbm_bandwidth(base, 0.37 * base.hbm_bandwidth.value)):
        for name in roofline.HBM_ENGINES:
            assert getattr(p.core, name).rate.value == pytest.approx(p.hbm_bandwidth.value), (key, name)


def test_with_hbm_bandwidth_moves_mte2_and_mte3_of_a_core():
    core = profiles.ASCEND_910B_AI_CORE
    chip = 1.2e12
    p = roofline.with_hbm_bandwidth(core, chip / 24, "1.2 TB/s / 24")
    # beta_core = beta_chip / 24 for the hbm_bandwidth, MTE2 (load) and MTE3 (store) alike
    assert p.hbm_bandwidth.value == pytest.approx(1.2e12 / 24)
    assert p.core.load.rate.value == pytest.approx(1.2e12 / 24) and p.core.load.name == "MTE2"
    assert p.core.store.rate.value == pytest.approx(1.2e12 / 24) and p.core.store.name == "MTE3"
    assert p.core.load.rate.status == "assumption" and "1.2 TB/s / 24" in p.core.load.rate.source
    # the pool the core has a share of moves with it: 24 x beta_core
    assert p.memory("GM").bandwidth.value == pytest.approx(1.2e12)
    assert roofline.with_hbm_bandwidth(profiles.ASCEND_910B, 1.2e12).memory("GM").bandwidth.value == 1.2e12
    # nothing that does not come from the HBM moves; the original stays
    for name in ("l1_to_l0", "matmul", "acc_out", "vector", "workspace_bandwidth", "exp_rate"):
        assert getattr(p.core, name) == getattr(core.core, name), name
    assert core.core.load.rate.value == pytest.approx(1.6e12 / 24)
    # the profile's own bandwidth reproduces its MTE2 rate
    same = roofline.with_hbm_bandwidth(core, core.hbm_bandwidth.value)
    assert same.core.load.rate.value == core.core.load.rate.value
    with pytest.raises(TypeError, match="HardwareProfile"):
        roofline.with_hbm_bandwidth("ascend", 1e12)


def test_with_hbm_bandwidth_changes_an_mte2_bound_makespan():
    from flashlab.pipeline.schedule import simulate_fa
    core = profiles.ASCEND_910B_AI_CORE
    shape = dict(seq_q=128, seq_kv=1024, d_qk=192, d_v=128, block_q=128, block_k=128)
    share = core.hbm_bandwidth.value
    r = {f: simulate_fa(roofline.with_hbm_bandwidth(core, f * share), "ping_pong", **shape)
         for f in (1.0, 0.5)}
    assert r[1.0].critical_engine == r[0.5].critical_engine == "MTE2"
    lat = core.core.load.latency.value
    copies = 0
    for fast, slow in zip(r[1.0].graph.tasks, r[0.5].graph.tasks):
        assert fast.name == slow.name
        if fast.engine == "MTE2" and fast.name[0] in "QKV":
            # t = latency + bytes / r_load: half the rate, twice the transfer time
            assert slow.duration - lat == pytest.approx(2 * (fast.duration - lat), rel=1e-12)
            copies += 1
    assert copies == 1 + 2 * 8  # Q, then K and V of 8 kv-blocks
    # MTE2-bound: the makespan follows the copies (P comes back from the L2 workspace, whose rate
    # does not move, so it grows by less than 2x)
    assert 1.4 * r[1.0].makespan < r[0.5].makespan < 2 * r[1.0].makespan


def test_formatting():
    assert format_bytes(196608) == "192 KiB"
    assert format_bytes(40e6) == "40 MB"
    assert format_bytes(80e9) == "80 GB"
    assert format_bytes(64 * 1024 ** 3) == "64 GiB"
    assert format_rate(2.039e12) == "2.04 TB/s"
    assert format_rate(12.8e9) == "12.8 GB/s"


def test_drawings_from_profiles():
    fig = draw_pyramid(profiles.A100_80GB, ["SRAM (shared memory/L1)", "HBM", "CPU DRAM"])
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "19 TB/s" in texts and "12.8 GB/s" in texts
    plt.close(fig)
    fig = draw_ai_core(profiles.ASCEND_910B_AI_CORE)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for engine in ("MTE2", "MTE1", "FixPipe", "MTE3"):
        assert engine in texts
    assert any("512 KiB" in t for t in texts)
    plt.close(fig)
    with pytest.raises(ValueError, match="layout has no position"):
        draw_ai_core(profiles.A100_80GB)


def test_markdown_table():
    from flashlab.viz.style import markdown_table
    assert markdown_table(["a", "b"], [[1, "x"]]) == "| a | b |\n|---|---|\n| 1 | x |"
    with pytest.raises(ValueError, match="cells"):
        markdown_table(["a", "b"], [[1]])
