"""The pipeline model: the simulator's rules, the FlashAttention task graphs, the core profiles."""
from __future__ import annotations

import dataclasses
import math
import random
import re

import pytest

from flashlab.pipeline import params, profiles, roofline
from flashlab.pipeline.buffers import STRATEGIES, FAShape, buffer_needs, l0c_slots, resolve_buffers
from flashlab.pipeline.program import cube_order
from flashlab.pipeline.schedule import build_fa_graph, simulate_fa
from flashlab.pipeline.simulate import SimResult, TaskGraph, simulate, two_stage_graph
from flashlab.pipeline.timing import bench_simulator

ASCEND = profiles.ASCEND_910B_AI_CORE
CORE = ASCEND.core
#: the MLA shapes of the article: Q/K head dim 192 (128 nope + 64 rope), V head dim 128
MLA = dict(d_qk=192, d_v=128)


def run(strategy="ping_pong", profile=ASCEND, seq_q=128, seq_kv=512, block_q=128, block_k=128,
        **options) -> SimResult:
    return simulate_fa(profile, strategy, seq_q, seq_kv, block_q=block_q, block_k=block_k,
                       **{**MLA, **options})


# ------------------------------------------------------------------------------ simulator
@pytest.mark.parametrize("a, b, n", [(3, 5, 7), (5, 3, 7), (4, 4, 5), (2, 9, 1), (7, 1, 12)])
def test_two_stage_makespan_is_exact(a, b, n):
    # one buffer: copy and compute serialize; two buffers: the slower stage sets the pace
    assert simulate(two_stage_graph(a, b, n, 1)).makespan == n * (a + b)
    assert simulate(two_stage_graph(a, b, n, 2)).makespan == a + b + (n - 1) * max(a, b)


def test_two_stage_float_durations():
    a, b, n = 0.3e-6, 0.7e-6, 20
    assert simulate(two_stage_graph(a, b, n, 1)).makespan == pytest.approx(n * (a + b), rel=1e-12)
    assert simulate(two_stage_graph(a, b, n, 2)).makespan == pytest.approx(a + b + (n - 1) * b,
                                                                           rel=1e-12)


def test_slots_alternate_ping_pong():
    r = simulate(two_stage_graph(2, 3, 6, 2))
    copies = [r.slot_of[i] for i, t in enumerate(r.graph.tasks) if t.engine == "COPY"]
    assert copies == [(0,), (1,), (0,), (1,), (0,), (1,)]
    held = sorted((s.slot, s.start, s.end) for s in r.occupancy)
    # a slot is never held twice at once
    for (s0, _, e0), (s1, b1, _) in zip(held, held[1:]):
        if s0 == s1:
            assert b1 >= e0


def test_in_order_engines_and_dependencies():
    g = TaskGraph(engines=("A", "B"))
    x = g.add("x", "A", 5.0)
    y = g.add("y", "B", 1.0)
    z = g.add("z", "A", 1.0)           # in program order behind x on A
    w = g.add("w", "B", 1.0, [x])      # waits for x although B is free
    r = simulate(g)
    assert (r.start[y], r.end[y]) == (0.0, 1.0)
    assert r.start[z] == 5.0 and r.start[w] == 5.0
    assert r.makespan == 6.0
    assert r.busy == {"A": 6.0, "B": 2.0}
    assert r.utilization["A"] == 1.0 and r.critical_engine == "A"
    assert r.gaps("B") == [(1.0, 5.0)]
    assert r.idle_gaps == []
    spans = r.timeline
    assert spans[x].engine == "A" and spans[x].task == "x" and spans[x].end == 5.0


def test_empty_graph():
    r = simulate(TaskGraph())
    assert r.makespan == 0.0 and r.timeline == []


def test_impossible_configurations_raise():
    # zero buffers
    g = TaskGraph(pools={"buf": 0})
    g.add("c", "COPY", 1.0, acquire="buf")
    with pytest.raises(ValueError, match=r"pool 'buf''s slot count must be >= 1; got 0"):
        simulate(g)
    with pytest.raises(ValueError, match="n_buffers must be >= 1"):
        build_fa_graph(ASCEND, "n_buffers", 128, 256, 192, 128, 128, 128, n_buffers=0)
    # a task needing more slots than exist
    g = TaskGraph(pools={"buf": 2})
    g.add("c", "COPY", 1.0, acquire="buf", slots=3)
    with pytest.raises(ValueError, match="needs 3 slots of pool 'buf', which has only 2"):
        simulate(g)
    # a dependency cycle
    g = TaskGraph()
    g.add("a", "A", 1.0, [1])
    g.add("b", "B", 1.0, [0])
    with pytest.raises(ValueError, match="cycle"):
        simulate(g)
    # a cycle through program order: y waits for z, which is behind y on the same engine
    g = TaskGraph()
    g.add("y", "A", 1.0, [1])
    g.add("z", "A", 1.0)
    with pytest.raises(ValueError, match="cycle"):
        simulate(g)
    # a deadlock between slots and program order: the second copy needs the slot that only
    # a task waiting for that copy would free
    g = TaskGraph(pools={"buf": 1})
    c0 = g.add("c0", "COPY", 1.0, acquire="buf")
    c1 = g.add("c1", "COPY", 1.0, acquire="buf")
    g.add("use", "MM", 1.0, [c1], releases=[c0])
    with pytest.raises(ValueError, match="deadlock.*COPY: next task c1 needs 1 slot"):
        simulate(g)


@pytest.mark.parametrize("build, match", [
    (lambda g: g.add("a", "A", -1.0), "duration"),
    (lambda g: g.add("a", "A", float("nan")), "duration"),
    (lambda g: g.add("a", "A", 1.0, [5]), "bad dependency"),
    (lambda g: g.add("a", "A", 1.0, acquire="nope"), "unknown pool"),
    (lambda g: g.add("a", "A", 1.0, releases=[0]), "releases"),
])
def test_bad_tasks_raise(build, match):
    g = TaskGraph(pools={"buf": 1})
    build(g)
    with pytest.raises(ValueError, match=match):
        simulate(g)


def test_double_release_raises():
    g = TaskGraph(pools={"buf": 1})
    c = g.add("c", "COPY", 1.0, acquire="buf")
    g.add("u", "MM", 1.0, releases=[c])
    g.add("v", "MM", 1.0, releases=[c])
    with pytest.raises(ValueError, match="released twice"):
        simulate(g)


def test_simulate_rejects_non_graphs():
    with pytest.raises(TypeError, match="TaskGraph"):
        simulate([1, 2])


# ------------------------------------------------------------------------- FA task graphs
def _check_schedule(r: SimResult) -> None:
    """Every rule of the model holds on a simulated timeline."""
    tasks = r.graph.tasks
    for e, busy in r.busy.items():
        assert r.makespan >= busy - 1e-15, e
        assert 0.0 <= r.utilization[e] <= 1.0 + 1e-12
    last_end: dict[str, float] = {}
    for i, t in enumerate(tasks):
        assert r.end[i] == pytest.approx(r.start[i] + t.duration, abs=1e-18)
        # in order, one at a time
        assert r.start[i] >= last_end.get(t.engine, 0.0) - 1e-15, t.name
        last_end[t.engine] = r.end[i]
        for d in t.deps + t.releases:
            assert r.start[i] >= r.end[d] - 1e-15, (t.name, tasks[d].name)
    # no pool ever holds more tiles than it has slots
    for pool, size in r.graph.pools.items():
        events = sorted([(s.start, 1) for s in r.occupancy if s.pool == pool]
                        + [(s.end, -1) for s in r.occupancy if s.pool == pool])
        held = 0
        for _, delta in events:
            held += delta
            assert held <= size, pool


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("profile", [ASCEND, profiles.A100_SM, profiles.H100_SM], ids=["910b", "a100", "h100"])
def test_fa_schedules_obey_the_rules(strategy, profile):
    n_buffers = 3 if strategy == "n_buffers" else None
    block_k = 128 if profile is ASCEND else 64
    r = run(strategy, profile, seq_q=200, seq_kv=300, block_k=block_k, n_buffers=n_buffers,
            split_rope=64)
    _check_schedule(r)
    assert r.idle_gaps == r.gaps(r.critical_engine)
    assert r.utilization[r.critical_engine] == max(r.utilization.values())


def test_ping_pong_never_slower_randomized():
    rng = random.Random(2025)
    chips = [ASCEND, profiles.A100_SM, profiles.H100_SM]
    checked = 0
    for _ in range(40):
        d_qk = rng.choice([64, 128, 192])
        shape = dict(seq_q=rng.randint(1, 160), seq_kv=rng.randint(1, 700), d_qk=d_qk,
                     d_v=rng.choice([32, 64, 128]), block_q=rng.choice([16, 32, 64]),
                     block_k=rng.choice([16, 32, 64, 128]))
        opts = dict(pad_v=rng.random() < 0.5 and shape["d_v"] <= d_qk,
                    split_rope=rng.choice([0, d_qk // 3]), lookahead=rng.choice([0, 1]),
                    kv_source=rng.choice(["hbm", "l2"]), base_k=rng.choice([32, 64]))
        profile = rng.choice(chips)
        # the HBM share from a quarter to 8x the profile's: MTE2-bound to compute-bound
        # (with_hbm_bandwidth moves the load and store engines with it)
        factor = 2.0 ** rng.uniform(-2, 3)
        profile = roofline.with_hbm_bandwidth(profile, factor * profile.hbm_bandwidth.value)
        pp = simulate_fa(profile, "ping_pong", **shape, **opts).makespan
        for other in ("self_mte2", "iterate_all"):
            slower = simulate_fa(profile, other, **shape, **opts).makespan
            assert pp <= slower * (1 + 1e-12), (profile.name, factor, shape, opts, other)
        checked += 1
    assert checked == 40


def test_article_story_on_the_910b():
    """With the default parameters the three strategies rank as in the article: own MTE2 shrinks
    the MTE2 gaps, ping-pong buffers remove most of them."""
    r = {s: run(s, seq_kv=2048) for s in ("iterate_all", "self_mte2", "ping_pong")}
    assert r["ping_pong"].makespan < r["self_mte2"].makespan < r["iterate_all"].makespan
    for s in r.values():
        assert s.critical_engine == "MTE2"
    idle = {s: sum(b - a for a, b in res.idle_gaps) for s, res in r.items()}
    assert idle["ping_pong"] < idle["self_mte2"] < idle["iterate_all"]


def _mte2_starts_and_cube_ends(r: SimResult):
    tasks = r.graph.tasks
    return ({t.name: r.start[i] for i, t in enumerate(tasks) if t.engine == "MTE2"},
            {t.name: r.end[i] for i, t in enumerate(tasks) if t.engine == "CUBE"})


def test_when_the_next_copy_may_start():
    # Cube order QK0, QK1, PV0, ...; QK is 3 chunks of 64 over d = 192, PV 2 chunks over 128 keys
    start, cube = _mte2_starts_and_cube_ends(run("iterate_all"))
    # IterateAll: the copy for the next matmul waits until the Cube finished the current one
    assert start["K1"] >= cube["QK0.2"] and start["V0"] >= cube["QK1.2"]
    assert start["K2"] >= cube["PV0.1"]
    # own MTE2, one buffer: the buffer is free once MTE1 has copied the last chunk to L0,
    # before the Cube has finished
    start, cube = _mte2_starts_and_cube_ends(run("self_mte2"))
    assert start["K1"] < cube["QK0.2"]
    # ping-pong: K1 goes to the other buffer right after K0, before the Cube even starts
    start, cube = _mte2_starts_and_cube_ends(run("ping_pong"))
    k0 = run("ping_pong").graph.tasks
    assert start["K1"] == pytest.approx(start["K0"] + next(t.duration for t in k0 if t.name == "K0"))
    assert start["K1"] < cube["QK0.0"]


def test_deterministic():
    a, b = run("ping_pong", seq_kv=700, pad_v=True), run("ping_pong", seq_kv=700, pad_v=True)
    assert a.start == b.start and a.end == b.end and a.slot_of == b.slot_of


def test_durations_come_from_the_profile():
    g = build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 128)
    by_name = {(t.engine, t.name): t for t in g.tasks}
    lat = {e.name: e.latency.value for e in CORE.engines()}
    # K copy: 128 keys x 192 x 2 bytes at HBM / 24 cores
    k = by_name[("MTE2", "K0")]
    assert k.duration == pytest.approx(lat["MTE2"] + 128 * 192 * 2 / (1.6e12 / 24))
    # a Cube chunk of QK^T: ceil(128/16) ceil(128/16) ceil(64/16) fractals at 1.8 GHz
    qk = by_name[("CUBE", "QK0.0")]
    assert qk.duration == pytest.approx(lat["CUBE"] + 8 * 8 * 4 / 1.8e9)
    # a short last kv-block still costs whole fractals: 100 keys -> ceil(100/16) = 7
    g2 = build_fa_graph(ASCEND, "ping_pong", 128, 228, 192, 128, 128, 128)
    qk_tail = next(t for t in g2.tasks if t.engine == "CUBE" and t.name == "QK1.0")
    assert qk_tail.duration == pytest.approx(lat["CUBE"] + 8 * 7 * 4 / 1.8e9)
    # MTE1 chunk: Q (128 x 64) + K (128 x 64) fp16 at 256 B/cycle x 1.8 GHz
    m1 = by_name[("MTE1", "QK0.0")]
    assert m1.duration == pytest.approx(lat["MTE1"] + (128 + 128) * 64 * 2 / (256 * 1.8e9))
    # softmax: read S (fp32) from the workspace, 5 operations and 1 exp per score
    sm = by_name[("VECTOR", "softmax0")]
    vec = CORE.vector.rate.value
    expected = (lat["VECTOR"] + 128 * 128 * 5 / vec + (128 * 128 + 128) / CORE.exp_rate.value
                + 128 * 128 * 4 / CORE.workspace_bandwidth.value)
    assert sm.duration == pytest.approx(expected)
    # FixPipe drains S (fp32) to the workspace
    assert by_name[("FIXPIPE", "S0")].duration == pytest.approx(
        lat["FIXPIPE"] + 128 * 128 * 4 / CORE.workspace_bandwidth.value)


def test_padded_v_moves_and_computes_more():
    native = build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 128)
    padded = build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 128, pad_v=True)
    def work(g, engine, name):
        """A task's duration less its engine's start latency."""
        task = next(t for t in g.tasks if t.engine == engine and t.name == name)
        return task.duration - next(e.latency.value for e in CORE.engines() if e.name == engine)

    # V: 128 x 192 vs 128 x 128 fp16; PV: 12 vs 8 fractals along n
    assert work(padded, "MTE2", "V0") / work(native, "MTE2", "V0") == pytest.approx(1.5)
    assert work(padded, "CUBE", "PV0.0") / work(native, "CUBE", "PV0.0") == pytest.approx(1.5)
    assert padded.info["executed_flops"] > padded.info["useful_flops"] == native.info["executed_flops"]
    assert padded.info["kv_bytes"] == 2 * 128 * (192 + 192) * 2
    assert native.info["kv_bytes"] == 2 * 128 * (192 + 128) * 2
    assert run("ping_pong", seq_kv=1024).makespan < run("ping_pong", seq_kv=1024, pad_v=True).makespan


def test_split_rope_is_two_matmuls_into_one_accumulator():
    g = build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 128, split_rope=64)
    names = [t.name for t in g.tasks if t.engine == "CUBE" and t.step == 0 and t.name.startswith("QK")]
    assert names == ["QK0.0", "QK0.1", "QKr0.0"]      # nope: 2 chunks of 64; rope: 1 chunk
    loads = [t.name for t in g.tasks if t.engine == "MTE2" and t.step == 0]
    assert {"K0", "Kr0", "Q0", "Qr0"} <= set(loads)
    # one L0C accumulator for both: only the first chunk acquires it, one FixPipe drains it
    acquirers = [t.name for t in g.tasks if t.acquire == "L0C" and t.step == 0]
    assert acquirers == ["QK0.0", "PV0.0"]
    assert [t.name for t in g.tasks if t.engine == "FIXPIPE" and t.step == 0] == ["S0", "O0"]
    # same fractals as the concatenated QK^T: 8 + 4 = 12 k-fractals
    cube = lambda g: sum(t.duration - CORE.matmul.latency.value for t in g.tasks  # noqa: E731
                         if t.engine == "CUBE" and t.step == 0 and t.kind in ("qk", "rope"))
    concat = build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 128)
    assert cube(g) == pytest.approx(cube(concat))


def test_tiles_that_do_not_fit_raise_naming_the_buffer():
    # Q 128x192 + 6 x (K or V 128x192) + 6 x P 128x128, fp16
    with pytest.raises(ValueError, match=r"do not fit in L1 .*= 540672 B > 524288 B \(512 KiB\)"):
        build_fa_graph(ASCEND, "n_buffers", 128, 256, 192, 128, 128, 128, n_buffers=6, pad_v=True)
    build_fa_graph(ASCEND, "n_buffers", 128, 256, 192, 128, 128, 128, n_buffers=5, pad_v=True)
    with pytest.raises(ValueError, match=r"do not fit in L0A .* > 65536 B"):
        build_fa_graph(ASCEND, "ping_pong", 512, 256, 192, 128, 512, 64)
    # a padded partial output of 256 x 192 fp32 is 192 KiB > 128 KiB of L0C; native 128 fits
    with pytest.raises(ValueError, match=r"do not fit in L0C .*196608 B > 131072 B"):
        build_fa_graph(ASCEND, "ping_pong", 256, 512, 192, 128, 256, 64, pad_v=True)
    build_fa_graph(ASCEND, "ping_pong", 256, 512, 192, 128, 256, 64)
    # each vector core holds 64 rows of S (256 keys), O and O_part (256 wide), fp32
    with pytest.raises(ValueError, match=r"do not fit in UB .*per vector core"):
        build_fa_graph(ASCEND, "self_mte2", 128, 512, 64, 256, 128, 256)
    with pytest.raises(ValueError, match=r"do not fit in shared memory"):
        build_fa_graph(profiles.A100_SM, "n_buffers", 128, 512, 192, 128, 128, 128, n_buffers=3)
    # S and O of a 128 x 128 tile, one S in flight, and the L0 fragments: 257 KiB of registers
    with pytest.raises(ValueError, match=r"do not fit in registers .*263168 B > 262144 B"):
        build_fa_graph(profiles.A100_SM, "ping_pong", 128, 512, 192, 128, 128, 128)
    # the same tiles fit with fewer buffers
    build_fa_graph(profiles.A100_SM, "self_mte2", 128, 512, 192, 128, 128, 64)


def test_buffer_plan():
    shape = FAShape(128, 512, 192, 128, 128, 128, pad_v=True)
    needs = {(n.role, n.what.split()[2] if n.role == "L1" else ""): n.nbytes
             for n in buffer_needs(ASCEND, shape, 2)}
    assert sum(v for (role, _), v in needs.items() if role == "L1") == (
        128 * 192 * 2 + 2 * 128 * 192 * 2 + 2 * 128 * 128 * 2)
    # padded V (128 x 192 fp32 partial output = 96 KiB) leaves room for one L0C accumulator
    assert l0c_slots(ASCEND, shape) == 1
    assert l0c_slots(ASCEND, FAShape(128, 512, 192, 128, 128, 128)) == 2


def test_argument_validation():
    with pytest.raises(ValueError, match="strategy must be one of"):
        build_fa_graph(ASCEND, "double", 128, 256, 192, 128, 128, 128)
    with pytest.raises(ValueError, match="uses 2 buffer"):
        resolve_buffers("ping_pong", 3)
    assert resolve_buffers("n_buffers", 5) == 5 and resolve_buffers("iterate_all", None) == 1
    with pytest.raises(ValueError, match="lookahead"):
        build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 128, lookahead=2)
    with pytest.raises(ValueError, match="d_v <= d_qk"):
        build_fa_graph(ASCEND, "ping_pong", 128, 256, 64, 128, 128, 128, pad_v=True)
    with pytest.raises(ValueError, match="split_rope"):
        build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 128, split_rope=192)
    with pytest.raises(ValueError, match="block_k must be >= 1"):
        build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 0)
    with pytest.raises(ValueError, match="kv_source"):
        build_fa_graph(ASCEND, "ping_pong", 128, 256, 192, 128, 128, 128, kv_source="ddr")
    with pytest.raises(ValueError, match="no core model"):
        build_fa_graph(profiles.ASCEND_910B, "ping_pong", 128, 256, 192, 128, 128, 128)
    with pytest.raises(TypeError, match="HardwareProfile"):
        build_fa_graph("910b", "ping_pong", 128, 256, 192, 128, 128, 128)


def test_cube_order():
    assert cube_order(3, 0) == [("QK", 0), ("PV", 0), ("QK", 1), ("PV", 1), ("QK", 2), ("PV", 2)]
    assert cube_order(3, 1) == [("QK", 0), ("QK", 1), ("PV", 0), ("QK", 2), ("PV", 1), ("PV", 2)]
    assert cube_order(1, 1) == [("QK", 0), ("PV", 0)]


def test_gpu_sm_profiles():
    a100 = run("ping_pong", profiles.A100_SM, block_k=64)
    h100 = run("ping_pong", profiles.H100_SM, block_k=64)
    assert a100.engines == ("cp.async", "ldmatrix", "TENSOR", "FP32", "st.global")
    assert h100.engines == ("TMA", "TENSOR", "FP32", "TMA store")   # wgmma reads shared memory
    for r in (a100, h100):
        assert "L0C" not in r.graph.pools and "L1.A" not in r.graph.pools   # S, P in registers
        _check_schedule(r)


# ----------------------------------------------------------------------------- profiles
def test_ascend_core_model_numbers():
    assert CORE.load.name == "MTE2" and CORE.load.rate.status == "derived"
    assert CORE.load.rate.value == pytest.approx(1.6e12 / 24)
    assert CORE.matmul.rate.value == pytest.approx(16 ** 3 * 1.8e9)
    assert CORE.matmul.rate.value * 2 == pytest.approx(ASCEND.peak_flops.value)
    assert (CORE.mma_m.value, CORE.mma_n.value, CORE.mma_k.value) == (16, 16, 16)
    assert CORE.vector_units.value == 2 and CORE.exchange == "gm"
    assert [e.name for e in CORE.engines()] == ["MTE2", "MTE1", "CUBE", "FIXPIPE", "VECTOR", "MTE3"]
    for engine in CORE.engines():
        assert engine.latency.status == "assumption" and engine.latency.unit == "s"
    sizes = {CORE.level_of(r): ASCEND.memory(CORE.level_of(r)).capacity.value
             for r in params.BUFFER_ROLES}
    assert sizes == {"L1": 512 * 1024, "L0A": 64 * 1024, "L0B": 64 * 1024, "L0C": 128 * 1024,
                     "UB": 192 * 1024}
    # the chip profile keeps no core model; chip figures unchanged
    assert profiles.ASCEND_910B.core is None and profiles.ASCEND_910B.hbm_bandwidth.value == 1.6e12


def test_gpu_sm_numbers():
    a, h = profiles.A100_SM, profiles.H100_SM
    assert a.memory("shared memory").capacity.value == 164 * 1024
    assert h.memory("shared memory").capacity.value == 228 * 1024
    assert a.peak_flops.value * 108 == pytest.approx(312e12)
    assert h.peak_flops.value * 132 == pytest.approx(989.4e12)
    assert a.core.load.name == "cp.async" and h.core.load.name == "TMA"
    assert h.core.l1_to_l0 is None and a.core.l1_to_l0.name == "ldmatrix"
    assert a.core.matmul.rate.value * 2 == pytest.approx(a.peak_flops.value)
    # FlashAttention-3: 989 TFLOPS of matmul but 3.9 TFLOPS of exp on an H100 SXM5
    assert h.core.exp_rate.value * 132 == pytest.approx(3.9e12)


def test_with_core():
    faster = roofline.with_core(ASCEND, load=1.2e12 / 24 * 2, vector_latency=0.0)
    assert faster.core.load.rate.value == pytest.approx(1e11)
    assert faster.core.load.rate.status == "assumption"
    assert faster.core.vector.latency.value == 0.0
    assert ASCEND.core.load.rate.value == pytest.approx(1.6e12 / 24)   # original untouched
    assert run("ping_pong", faster).makespan < run("ping_pong").makespan
    with pytest.raises(ValueError, match="unknown core parameter"):
        roofline.with_core(ASCEND, mte7=1.0)
    with pytest.raises(ValueError, match="no l1_to_l0 engine"):
        roofline.with_core(profiles.H100_SM, l1_to_l0=1e12)
    with pytest.raises(ValueError, match="positive rate"):
        roofline.with_core(ASCEND, load=0.0)
    with pytest.raises(ValueError, match="core model"):
        roofline.with_core(profiles.A100_80GB, load=1e9)


def test_core_model_validation():
    with pytest.raises(ValueError, match="exchange"):
        dataclasses.replace(CORE, exchange="shared")
    with pytest.raises(ValueError, match="buffers must map"):
        dataclasses.replace(CORE, buffers=(("L1", "L1"),))
    with pytest.raises(ValueError, match="FixPipe"):
        dataclasses.replace(CORE, acc_out=None)


def test_bench_simulator_runs():
    # a smoke test of the benchmark function (timings are not checked: run it by hand)
    out = bench_simulator(n_tasks=2000, repeat=1)
    assert set(out) == {"two_stage", "flash_attention"}
    assert out["two_stage"]["tasks"] == 2000
    assert out["flash_attention"]["tasks"] > 1000
    assert all(math.isfinite(v["simulate_s"]) and v["simulate_s"] > 0 for v in out.values())


def test_four_l1_buffers_queue_prefetches_ahead_of_p():
    # more buffers issue K/V copies earlier; MTE2 is in order, so the copy of P_0 (on the
    # loop-carried chain through the workspace) waits behind them and the whole loop is later
    from flashlab.pipeline import simulate_fa
    from flashlab.pipeline.profiles import ASCEND_910B_AI_CORE

    runs = {nb: simulate_fa(ASCEND_910B_AI_CORE, "n_buffers", 128, 512, 192, 128, 128, 128, n_buffers=nb)
            for nb in (2, 4)}

    def start_of(r, name):
        return next(r.start[i] for i, t in enumerate(r.graph.tasks) if t.engine == "MTE2" and t.name == name)

    def copies_before(r, name):
        mte2 = [t.name for t in r.graph.tasks if t.engine == "MTE2"]
        return mte2[:mte2.index(name)]

    assert start_of(runs[4], "P0") > start_of(runs[2], "P0")
    assert len(copies_before(runs[4], "P0")) > len(copies_before(runs[2], "P0"))
    assert runs[4].makespan > runs[2].makespan


# ------------------------------------------------------------------ the memory budget
@pytest.mark.parametrize("make, size", [
    # 10**6 tiles of the Ascend loop: ~17 GB of tasks (measured: 158 s to a MemoryError before)
    (lambda: build_fa_graph(profiles.ASCEND_910B_AI_CORE, "ping_pong", 128_000, 128_000, 128, 128,
                            128, 128), r"16\.8 GB \(16750000 tasks"),
    (lambda: build_fa_graph(profiles.ASCEND_910B_AI_CORE, "iterate_all", 10**9, 10**9, 64, 64, 1, 1),
     r"GB \(\d+ tasks"),
    (lambda: simulate(TaskGraph(pools={"big": 10**9})), r"40 GB \(0 tasks, 1000000000 buffer slots"),
    (lambda: two_stage_graph(1.0, 1.0, 10**9, 2), r"2e\+03 GB \(2000000000 tasks"),
], ids=["graph", "tiles-of-one", "pool", "two-stage"])
def test_problems_over_the_memory_budget_are_refused_up_front(make, size):
    """A graph or pool the model could not hold in its budget (2 GB) is refused with the size
    it would need, before anything of that size is allocated (traced peak < 20 MB)."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=size + r".*memory budget of 2 GB"):
            make()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20e6, f"{peak / 1e6:.0f} MB allocated before refusing"


def test_memory_budget_estimate_and_setting(monkeypatch):
    """The estimate is the graph's task count (within 5 %) x BYTES_PER_TASK; a smaller budget
    refuses a graph that the default budget builds."""
    import importlib

    # the module (flashlab.pipeline's own ``simulate`` attribute is the function)
    sim = importlib.import_module("flashlab.pipeline.simulate")

    args = (profiles.ASCEND_910B_AI_CORE, "n_buffers", 128 * 80, 128 * 60, 128, 128, 128, 128)
    g = build_fa_graph(*args, n_buffers=3)
    simulate(g)
    monkeypatch.setattr(sim, "MEMORY_BUDGET", 10**6)
    with pytest.raises(ValueError, match=r"80 x 60 tiles.*GB \((\d+) tasks") as info:
        build_fa_graph(*args, n_buffers=3)
    estimated = int(re.search(r"\((\d+) tasks", str(info.value)).group(1))
    assert abs(estimated - len(g.tasks)) <= 0.05 * len(g.tasks)
    with pytest.raises(ValueError, match="simulating this graph"):
        simulate(g)
