"""Pinned makespans of the FlashAttention tile-loop model (:mod:`flashlab.pipeline.schedule`).

The numbers are the model's own output, not measurements: they catch any change of the task
graph (durations, dependencies, buffer slots, program order) that moves a schedule. A change
that is meant to move them must update them on purpose.
"""
import pytest

from flashlab.pipeline import profiles
from flashlab.pipeline.schedule import simulate_fa

# (profile, strategy, (seq_q, seq_kv, d_qk, d_v, block_q, block_k), options, tasks, makespan in s)
PINNED = [
    ("ASCEND_910B_AI_CORE", "iterate_all", (128, 512, 192, 128, 128, 128), {}, 75,
     1.3044626262626267e-05),
    ("ASCEND_910B_AI_CORE", "self_mte2", (128, 512, 192, 128, 128, 128), {}, 75,
     1.1473515151515148e-05),
    ("ASCEND_910B_AI_CORE", "ping_pong", (128, 512, 192, 128, 128, 128), {}, 75,
     1.0703351919191924e-05),
    ("ASCEND_910B_AI_CORE", "ping_pong", (128, 512, 192, 128, 128, 128), {"pad_v": True}, 75,
     1.1935066666666669e-05),
    ("ASCEND_910B_AI_CORE", "ping_pong", (256, 640, 192, 128, 128, 128),
     {"split_rope": 64, "kv_source": "l2"}, 198, 1.8038292121212127e-05),
    ("ASCEND_910B_AI_CORE", "n_buffers", (200, 700, 192, 128, 96, 80),
     {"n_buffers": 3, "split_rope": 64, "lookahead": 0}, 519, 4.1852902095959555e-05),
    ("A100_SM", "ping_pong", (128, 512, 128, 128, 64, 64), {}, 150, 3.5927410267778765e-05),
    ("H100_SM", "iterate_all", (256, 1024, 192, 128, 64, 128), {"split_rope": 64}, 304,
     0.00014394608561053073),
]


@pytest.mark.parametrize("profile, strategy, shape, options, n_tasks, makespan", PINNED)
def test_pinned_makespan(profile, strategy, shape, options, n_tasks, makespan):
    r = simulate_fa(getattr(profiles, profile), strategy, *shape, **options)
    assert len(r.graph.tasks) == n_tasks
    assert r.makespan == pytest.approx(makespan, rel=1e-12, abs=0)
