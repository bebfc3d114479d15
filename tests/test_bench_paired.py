"""The paired ratio of interleaved timings and its bootstrap interval (flashlab.paired), the
CPU-clock rounds that stop once every ratio resolves (bench.time_paired), and the merge of runs at
different sizes. The timings are injected: nothing here is timed."""
from __future__ import annotations

import mmap
import time
from dataclasses import asdict

import numpy as np
import pytest

from flashlab import bench, paired
from tests.test_bench import config_from_cli


def _rounds(n: int, effect: float, noise: float, shared: float, seed: int) -> tuple[list, list]:
    """Times of two implementations over ``n`` rounds: a load factor common to the round (log-sd
    ``shared``) times each one's own noise (log-sd ``noise``); ``a`` is ``effect`` times slower."""
    rng = np.random.default_rng(seed)
    load = np.exp(rng.normal(0, shared, n))
    a = effect * load * np.exp(rng.normal(0, noise, n))
    b = load * np.exp(rng.normal(0, noise, n))
    return list(a), list(b)


def test_the_estimate_is_the_median_of_the_round_ratios():
    pr = bench.paired_ratio([2.0, 4.0, 3.0, 5.0], [1.0, 2.0, 1.0, 2.0])
    assert pr.median == np.median([2.0, 2.0, 3.0, 2.5]) and pr.rounds == 4
    assert pr.low <= pr.median <= pr.high
    # a forward and its backward, summed round by round
    a, b = {"times": [2.0, 4.0]}, {"times": [1.0, 2.0]}
    assert bench.paired_ratio_of_rows([a, a], [b, b]).median == 2.0
    # the longer series is cut to the shorter
    assert bench.paired_ratio([1.0, 1.0, 9.0], [1.0, 1.0]).rounds == 2


def test_a_ten_percent_effect_under_shared_load_resolves():
    # the machine's load moves both times by ~20 % from round to round; each call adds ~3 %
    a, b = _rounds(30, 1.10, noise=0.03, shared=0.2, seed=1)
    pr = bench.paired_ratio(a, b)
    assert pr.resolved and pr.halfwidth <= paired.RESOLUTION
    assert pr.low > 1.0                       # the 10 % is told from none
    assert pr.low <= 1.10 <= pr.high
    # the times alone (unpaired) do not resolve it: their medians move with the load
    spread = np.std(np.log(a)) / np.sqrt(30)
    assert 2 * spread > paired.RESOLUTION


def test_pure_noise_does_not_resolve():
    # no effect, and each call's noise (~30 %) larger than what ten rounds can average out
    a, b = _rounds(12, 1.0, noise=0.3, shared=0.2, seed=2)
    pr = bench.paired_ratio(a, b)
    assert not pr.resolved and pr.halfwidth > paired.RESOLUTION
    assert pr.low < 1.0 < pr.high


def test_too_few_rounds_never_resolve():
    # three identical ratios: a zero-width interval, but three rounds are no 95 % interval
    pr = bench.paired_ratio([1.1, 2.2, 3.3], [1.0, 2.0, 3.0])
    assert pr.halfwidth == pytest.approx(0.0) and not pr.resolved
    one = bench.paired_ratio([2.0], [1.0])
    assert one.median == 2.0 and one.high == float("inf") and not one.resolved
    with pytest.raises(ValueError, match="at least one round"):
        bench.paired_ratio([], [1.0])
    with pytest.raises(ValueError, match="positive"):
        bench.paired_ratio([1.0, -1.0], [1.0, 1.0])


def test_the_interval_is_reproducible_and_round_trips():
    a, b = _rounds(20, 1.05, noise=0.05, shared=0.1, seed=3)
    first, again = bench.paired_ratio(a, b), bench.paired_ratio(a, b)
    assert first == again                      # a fixed seed
    assert bench.PairedRatio.from_dict(first.to_dict()) == first
    # another seed: the same interval to within the bootstrap's own error (the medians of
    # resampled rounds are order statistics, so the ends often agree exactly)
    other = bench.paired_ratio(a, b, seed=7)
    assert other.low == pytest.approx(first.low, rel=0.01) and other.high == pytest.approx(first.high, rel=0.01)


class _FakeRunner:
    """A runner whose timed call returns the next of the injected times."""

    def __init__(self, times, order, name):
        self.times, self.order, self.name = iter(times), order, name

    def once(self):
        self.order.append(self.name)
        return next(self.times)


def _inject(monkeypatch, series: dict[str, list]) -> list:
    order: list[str] = []
    runners = {}

    def make_runner(case, clock):
        # the first call is the warm-up: give it a time of its own
        runners[case.impl] = _FakeRunner([1.0] + series[case.impl], order, case.impl)
        return runners[case.impl]
    monkeypatch.setattr(bench.measure, "make_runner", make_runner)
    return order


def _cases():
    return [bench.Case(impl, "forward", 32, 16, 16, heads=1, block=(16, 16))
            for impl in ("flashlab", "numpy_naive")]


def test_rounds_stop_once_every_ratio_resolves(monkeypatch):
    a, b = _rounds(60, 1.10, noise=0.01, shared=0.2, seed=4)
    order = _inject(monkeypatch, {"flashlab": b, "numpy_naive": a})
    timed, matmul, rounds = bench.time_paired(_cases(), min_rounds=10, max_rounds=60, matmul_n=16)
    assert rounds == {"rounds": 10, "resolved": True, "stopped": "resolved"}
    fl, nv = (timed[c] for c in _cases())
    assert fl["times"] == b[:10] and fl["seconds"] == np.median(b[:10])
    # each row stores the others' time over its own, with the interval
    assert bench.PairedRatio.from_dict(fl["paired_vs"]["numpy_naive"]) == bench.paired_ratio(a[:10], b[:10])
    # (an even number of rounds: the median averages the two middle ratios, so 1/x only nearly)
    assert fl["paired_vs"]["numpy_naive"]["median"] == \
        pytest.approx(1 / nv["paired_vs"]["flashlab"]["median"], rel=1e-3)
    # warm-ups, then A B, B A, A B, ...: no case always runs after the same one
    assert order[:2] == ["flashlab", "numpy_naive"]
    assert order[2:8] == ["flashlab", "numpy_naive", "numpy_naive", "flashlab", "flashlab", "numpy_naive"]
    assert matmul["n"] == 16


def test_warm_each_times_every_call_right_after_one_of_its_own(monkeypatch):
    a, b = _rounds(60, 1.10, noise=0.01, shared=0.2, seed=4)
    # each timed call is preceded by an untimed one: give those a time of their own (never read)
    order = _inject(monkeypatch, {"flashlab": [x for t in b for x in (9.0, t)],
                                  "numpy_naive": [x for t in a for x in (9.0, t)]})
    timed, _, rounds = bench.time_paired(_cases(), min_rounds=10, max_rounds=60, matmul_n=16,
                                         warm_each=True)
    assert rounds["rounds"] == 10 and rounds["resolved"]
    fl, nv = (timed[c] for c in _cases())
    assert fl["times"] == b[:10] and nv["times"] == a[:10]    # the untimed calls' 9.0 never counted
    # warm-ups, then each case twice in a row (untimed, timed), the order reversed every round
    assert order[2:10] == ["flashlab"] * 2 + ["numpy_naive"] * 4 + ["flashlab"] * 2


def test_the_user_clock_leaves_out_system_time():
    # touching fresh pages spends system time (the kernel finds and zeroes each one): the user
    # clock does not count it. A new anonymous mapping every time: a freed numpy array's pages
    # may come back from the allocator's cache already mapped, with no system time at all
    t_cpu, t_user = time.process_time(), bench.user_time()
    for _ in range(20):
        with mmap.mmap(-1, 1 << 24) as pages:
            for offset in range(0, 1 << 24, mmap.PAGESIZE):
                pages[offset] = 1
    sys_part = (time.process_time() - t_cpu) - (bench.user_time() - t_user)
    # 81920 page faults: milliseconds of system time, far above either clock's resolution
    assert sys_part > 1e-3
    assert bench.measure.PAIRED_CLOCKS == {"cpu": time.process_time, "user": bench.user_time}
    assert bench.BenchConfig(clock="user").paired and not bench.BenchConfig().paired
    with pytest.raises(ValueError, match="directions"):
        bench.BenchConfig(directions=("sideways",))


def test_rounds_stop_at_the_cap_when_the_noise_never_resolves(monkeypatch):
    a, b = _rounds(30, 1.0, noise=0.5, shared=0.0, seed=5)
    _inject(monkeypatch, {"flashlab": b, "numpy_naive": a})
    timed, _, rounds = bench.time_paired(_cases(), min_rounds=10, max_rounds=30, matmul_n=16)
    assert rounds == {"rounds": 30, "resolved": False, "stopped": "max_rounds"}
    _inject(monkeypatch, {"flashlab": [1.0] * 30, "numpy_naive": a})
    _, _, rounds = bench.time_paired(_cases(), min_rounds=10, max_rounds=30, max_timed_seconds=5,
                                     matmul_n=16)
    assert rounds["stopped"] == "max_timed_seconds" and rounds["rounds"] == 10
    with pytest.raises(ValueError, match="min_rounds"):
        bench.time_paired(_cases(), min_rounds=1)


def test_the_cpu_clock_in_the_configuration_and_the_command_line(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="clock"):
        bench.BenchConfig(clock="sundial")
    with pytest.raises(ValueError, match="min_rounds"):
        bench.BenchConfig(min_rounds=20, max_rounds=10)
    cfg = config_from_cli(monkeypatch, ["--mla-only", "--mla-sizes", "256", "--max-rounds", "20",
                                        "--settle-seconds", "0.1", "--out", str(tmp_path)])
    assert cfg.clock == "cpu" and cfg.mla_sizes == (256,) and cfg.max_rounds == 20
    assert cfg.settle_seconds == 0.1
    cfg = config_from_cli(monkeypatch, ["--mla-only", "--clock", "wall", "--out", str(tmp_path)])
    assert cfg.clock == "wall"
    assert bench.FULL.clock == "wall"          # the full suite keeps the wall clock
    cfg = config_from_cli(monkeypatch, ["--fused-only", "--out", str(tmp_path)])
    assert (cfg.clock, cfg.warm_each, cfg.settle_seconds, cfg.sizes) == ("user", True, 0.0, (4096,))
    assert cfg.directions == ("forward",) and cfg.baselines == ("numpy_naive",) and cfg.shapes == ((128, 128),)
    assert not (cfg.mla_sizes or cfg.decode_sizes or cfg.memory_sizes) and cfg.causal == (False,)


def _part(sizes, load):
    cfg = bench.BenchConfig(sizes=(), mla_sizes=sizes, clock="cpu")
    return {"schema": bench.SCHEMA, "date": f"d{sizes[0]}", "machine": {"cpu": "X"}, "timing": "paired",
            "config": asdict(cfg), "load_average_start": [load, 0, 0], "load_average_end": [load + 1, 0, 0],
            "duration_seconds": 10.0, "notes": ["n"], "decode": [],
            "matmul": {"start": {"gflops": 1.0}, "end": {"gflops": 2.0}, "groups": [{"gflops": 3.0}],
                       "peak_gflops": 3.0},
            "cases": [{**asdict(bench.Case(impl, "forward", sizes[0], 128, 128, d_rope=rope)), "section": sec,
                       "status": "skipped", "reason": "a test"}
                      for sec, impl, rope in (("attention", "flashlab", 0), ("mla", "mla:rect", 64))]}


def test_runs_at_different_sizes_merge_into_one():
    longer = _part((4096,), 1.5)
    longer["config"]["max_timed_seconds"] = 35.0          # a part's own time budget
    m = bench.merge_results([_part((1024,), 0.5), longer])
    assert m["config"]["max_timed_seconds"] == 35.0
    assert [p["max_timed_seconds"] for p in m["parts"]] == [bench.FULL.max_timed_seconds, 35.0]
    assert m["config"]["mla_sizes"] == [1024, 4096]
    assert [(c["section"], c["n"]) for c in m["cases"]] == [("attention", 1024), ("attention", 4096),
                                                            ("mla", 1024), ("mla", 4096)]
    assert m["load_average_start"][0] == 0.5 and m["load_average_end"][0] == 2.5
    assert [p["load_average_start"][0] for p in m["parts"]] == [0.5, 1.5]
    assert m["duration_seconds"] == 20.0 and len(m["matmul"]["groups"]) == 2
    with pytest.raises(ValueError, match="two parts"):
        bench.merge_results([_part((1024,), 0.5), _part((1024,), 0.5)])
    other = _part((4096,), 1.5)
    other["config"]["mla_heads"] = 2
    with pytest.raises(ValueError, match="configuration"):
        bench.merge_results([_part((1024,), 0.5), other])
