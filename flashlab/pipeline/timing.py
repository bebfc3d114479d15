"""How fast the simulator runs (:func:`bench_simulator`; by hand, never in a unit test)."""
from __future__ import annotations

import time

from flashlab.pipeline.profiles import ASCEND_910B_AI_CORE
from flashlab.pipeline.schedule import build_fa_graph
from flashlab.pipeline.simulate import simulate, two_stage_graph

__all__ = ["bench_simulator"]


def bench_simulator(n_tasks: int = 100_000, repeat: int = 3) -> dict:
    """Time the simulator on about ``n_tasks`` tasks (not a unit test: run it by hand).

    Two graphs: the two-stage pipeline (``n_tasks`` tasks) and the FlashAttention tile loop
    on an Ascend 910B AI Core (ping-pong, 128 x 128 tiles, D = 192/128, enough kv-blocks for
    about ``n_tasks`` tasks). Returns the best of ``repeat`` wall-clock times for building and
    simulating each, and tasks per second.
    """
    def best(fn):
        times, out = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return min(times), out

    out = {}
    t_build, g = best(lambda: two_stage_graph(1.0, 2.0, n_tasks // 2, 2))
    t_sim, _ = best(lambda: simulate(g))
    out["two_stage"] = {"tasks": len(g.tasks), "build_s": t_build, "simulate_s": t_sim,
                        "tasks_per_s": len(g.tasks) / t_sim}
    probe = build_fa_graph(ASCEND_910B_AI_CORE, "ping_pong", 128, 128 * 8, 192, 128, 128, 128)
    per_block = len(probe.tasks) / 8
    n_kv = max(1, round(n_tasks / per_block))
    t_build, g = best(lambda: build_fa_graph(ASCEND_910B_AI_CORE, "ping_pong", 128, 128 * n_kv,
                                             192, 128, 128, 128))
    t_sim, _ = best(lambda: simulate(g))
    out["flash_attention"] = {"tasks": len(g.tasks), "build_s": t_build, "simulate_s": t_sim,
                              "tasks_per_s": len(g.tasks) / t_sim}
    return out
