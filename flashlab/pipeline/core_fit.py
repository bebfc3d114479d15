r"""The one-core pipeline simulator, calibrated: the AI Core profile whose engine rates are fitted
to the calibrated model's stage cycles (:data:`flashlab.pipeline.calibrated.FIT`).

The discrete-event simulator (:func:`flashlab.pipeline.schedule.simulate_fa`) times each task
from the engines of a :class:`~flashlab.pipeline.params.CoreModel`. The uncalibrated profile
(``flashlab.pipeline.profiles.ASCEND_910B_AI_CORE``) takes its Vector rate, its workspace
(L2) bandwidth and its Cube start latency from assumptions. Here they are fitted to pto-isa's
cycles of one reference tile (128 rows x 256 keys, $D = 128$, fp16; ``fa_cost_model.py``):
$c_{qk}, c_p, c_{pv}, c_{gu}$. With the simulator's task durations
(:class:`~flashlab.pipeline.durations.Durations`), $m = 128$ rows, $n = 256$ keys, $d = 128$,
fp32 scores and partial outputs (4 bytes), 5 vector operations and one exponential per score,
2 operations per element of $O$, Vector latency $\lambda_v$ and FixPipe latency $\lambda_f$:

$$
\begin{aligned}
c_p &= \lambda_v + \frac{5mn + mn + m}{r_v} + \frac{4mn}{w}
&&\text{(the softmax task: operations, exponentials, reading } S\text{)}\\
c_{gu} &= \lambda_v + \frac{2md}{r_v} + \frac{4md}{w}
&&\text{(the rescale task: operations, reading } O_{part}\text{)}\\
c_{qk} + c_{pv} &= \frac{2 \cdot mnd}{16^3} + 6\lambda_c + 2\lambda_f + \frac{4m(n + d)}{w}
&&\text{(the Cube and FixPipe, serial through the one L0C slot)}
\end{aligned}
$$

three equations in the Vector rate $r_v$ (exponentials at the same rate), the workspace
bandwidth $w$ (the FixPipe's write and the Vector's reads of the GM workspace) and the Cube's
start latency $\lambda_c$ (6 chunks of 64 along the reduction axis per tile: 2 for $QK^\top$,
4 for $PV$). The Cube's MAC rate stays derived ($16^3$ per cycle). The Cube's two stages are
fitted as a sum: with one MAC rate and one start latency the simulator cannot give $QK^\top$
(2 chunks) more cycles than $PV$ (4 chunks) for the same MACs, as pto-isa's trace does, so
:func:`sim_stage_cycles` reproduces ``qk + pv``, ``p`` and ``gu``, and ``qk``, ``pv`` each
within the calibrated model's own range (+-15 %).

Fitted only to the stage cycles (never to a held-out timing).
"""
from __future__ import annotations

import dataclasses
import functools

from flashlab.pipeline.calibrated import CHIPS, FIT, PTO_COST_MODEL
from flashlab.pipeline.params import Engine, HardwareProfile, Param
from flashlab.pipeline.profiles import ASCEND_910B_AI_CORE
from flashlab.pipeline.schedule import BASE_K, RESCALE_OPS, SOFTMAX_OPS, simulate_fa

__all__ = ["REFERENCE", "fit_rates", "ASCEND_910B_CALIBRATED_CORE", "sim_stage_cycles",
           "reference_qblock"]

_ST = FIT["stage_cycles"]
#: the reference tile of the fit (rows, keys, head dim, bytes per element of fp16)
REFERENCE = {"rows": _ST["tile"]["rows"], "cols": _ST["tile"]["cols"], "d": _ST["tile"]["d"], "elem": 2}
#: the cube clock the stage cycles count (the 910B2's 1.8 GHz)
_CLOCK = CHIPS["910B2"].clock.value
#: bytes of an fp32 score or partial output (S and O_part in the GM workspace)
_ACC = 4


def fit_rates(qk: float, p: float, pv: float, gu: float, base: HardwareProfile = ASCEND_910B_AI_CORE
              ) -> dict[str, float]:
    """``{"vector", "workspace", "cube_latency"}`` in element/cycle, byte/cycle, cycles: the
    solution of the module docstring's three equations for stage cycles ``qk, p, pv, gu`` of
    the reference tile, with the other numbers (latencies of the Vector and FixPipe) of ``base``.

    ``cube_latency`` is negative when the derived MAC time and the FixPipe alone exceed ``qk + pv``;
    ``ValueError`` when the Vector's cycles have no solution with positive rates."""
    core = base.core
    if core is None or core.acc_out is None:
        raise ValueError(f"base must be an Ascend AI Core profile (a core model with a FixPipe); got {base.name!r}")
    f = _CLOCK
    lam_v, lam_f = core.vector.latency.value * f, core.acc_out.latency.value * f
    m, n, d = REFERENCE["rows"], REFERENCE["cols"], REFERENCE["d"]
    # p - lam_v = a1 / r_v + b1 / w and gu - lam_v = a2 / r_v + b2 / w: linear in 1/r_v, 1/w
    a1, b1 = (SOFTMAX_OPS + 1) * m * n + m, _ACC * m * n
    a2, b2 = RESCALE_OPS * m * d, _ACC * m * d
    y1, y2 = p - lam_v, gu - lam_v
    det = a1 * b2 - a2 * b1
    inv_r = (y1 * b2 - y2 * b1) / det
    inv_w = (a1 * y2 - a2 * y1) / det
    # qk + pv = 2 m n d / 16^3 + 6 lam_c + 2 lam_f + 4 m (n + d) / w
    chunks = d // BASE_K + n // BASE_K
    lam_c = (qk + pv - 2 * m * n * d / 16 ** 3 - 2 * lam_f - _ACC * m * (n + d) * inv_w) / chunks
    if inv_r <= 0 or inv_w <= 0:
        raise ValueError(f"stage cycles p={p}, gu={gu} have no solution with positive Vector rate and "
                         "workspace bandwidth")
    return {"vector": 1 / inv_r, "workspace": 1 / inv_w, "cube_latency": lam_c}


def _calibrated_core() -> HardwareProfile:
    base = ASCEND_910B_AI_CORE
    core = base.core
    if core is None or core.acc_out is None:     # ASCEND_910B_AI_CORE has both
        raise ValueError(f"{base.name} has no FixPipe to calibrate")
    f = _CLOCK
    stages = {s: _ST[s] for s in ("qk", "p", "pv", "gu")}
    fit = fit_rates(**stages)
    # the range: the fit at the stage cycles' own range (all -15 %, all +15 %)
    lo = fit_rates(**{s: 1.15 * c for s, c in stages.items()})
    hi = fit_rates(**{s: 0.85 * c for s, c in stages.items()})
    src = (f"fitted to {PTO_COST_MODEL} stage cycles of the 128x256 tile at D = 128 (qk {stages['qk']:.0f}, "
           f"p {stages['p']:.0f}, pv {stages['pv']:.0f}, gu {stages['gu']:.0f}) by "
           "flashlab.pipeline.core_fit.fit_rates; the range is the fit at those cycles -+15 %")

    def fitted(key: str, unit: str, scale: float, what: str) -> Param:
        a, b = sorted((lo[key] * scale, hi[key] * scale))
        return Param(fit[key] * scale, unit, f"{what}: {src}", "fitted", a, b)

    # the latency: its range is the fit's, sorted, no lower than 0 (at -15 % the Cube's derived
    # MAC time and the FixPipe already exceed qk + pv)
    lat = sorted(max(0.0, x["cube_latency"]) for x in (lo, hi))
    cube_latency = Param(fit["cube_latency"] / f, "s", f"the Cube's start latency per chunk, "
                         f"{fit['cube_latency']:.0f} cycles: {src}", "fitted", lat[0] / f, lat[1] / f)
    vector = fitted("vector", "element/s", f, f"{fit['vector']:.0f} element/cycle (both AIV)")
    exp_rate = Param(vector.value, "exp/s", "exp_rate = the fitted Vector rate (exponentials issue at it)", "derived",
                     vector.low, vector.high)
    workspace = fitted("workspace", "B/s", f, f"the GM workspace (L2) at {fit['workspace']:.0f} byte/cycle")
    new = dataclasses.replace(
        core,
        vector=dataclasses.replace(core.vector, rate=vector),
        exp_rate=exp_rate,
        matmul=dataclasses.replace(core.matmul, latency=cube_latency),
        acc_out=Engine(core.acc_out.name, workspace, core.acc_out.latency, core.acc_out.note),
        workspace_bandwidth=workspace,
        note=core.note + "; Vector rate, workspace bandwidth and Cube latency fitted to pto-isa's stage cycles",
    )
    return dataclasses.replace(base, name="Ascend 910B AI Core (calibrated)", core=new)


#: the AI Core profile of the book's pipeline chapter, ``ASCEND_910B_AI_CORE`` with its Vector
#: rate, workspace bandwidth and Cube start latency fitted to the calibrated model (module docstring)
ASCEND_910B_CALIBRATED_CORE = _calibrated_core()


def reference_qblock(tiles: int, profile: HardwareProfile = ASCEND_910B_CALIBRATED_CORE):
    """The simulation of one q-block of the reference tile against ``tiles`` kv-tiles (ping-pong,
    K/V from L2 as in the calibrated model at one head): a
    :class:`~flashlab.pipeline.simulate.SimResult`."""
    r = REFERENCE
    return simulate_fa(profile, "ping_pong", r["rows"], r["cols"] * tiles, r["d"], r["d"], r["rows"], r["cols"],
                       kv_source="l2")


@functools.lru_cache(maxsize=8)
def sim_stage_cycles(profile: HardwareProfile = ASCEND_910B_CALIBRATED_CORE, tiles: int = 16) -> dict[str, float]:
    """The simulator's cycles of the four stages of one reference tile, and its steady state.

    ``qk`` (``pv``): the Cube's $QK^\\top$ ($PV$) tasks of one step and the FixPipe task that
    writes $S$ ($O_{part}$); ``p``: the softmax task; ``gu``: the rescale task (all from the
    last step of a q-block of ``tiles`` tiles, cycles of the 1.8 GHz clock); ``steady``: the makespan
    added by one more tile, $(T(n) - T(n/2)) / (n/2)$."""
    f = _CLOCK
    res = reference_qblock(tiles, profile)
    t = tiles - 1
    dur: dict[str, float] = {"qk": 0.0, "p": 0.0, "pv": 0.0, "gu": 0.0}
    for task in res.graph.tasks:
        if task.step != t:
            continue
        cycles = task.duration * f
        if task.engine in ("CUBE", "FIXPIPE") and task.kind in ("qk", "pv"):
            dur[task.kind] += cycles
        elif task.engine == "VECTOR" and task.kind in ("softmax", "rescale"):
            dur["p" if task.kind == "softmax" else "gu"] += cycles
    half = reference_qblock(tiles // 2, profile)
    dur["steady"] = (res.makespan - half.makespan) * f / (tiles - tiles // 2)
    return dur
