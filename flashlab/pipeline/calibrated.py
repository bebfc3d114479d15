r"""The calibrated model of one FlashAttention forward kernel on a whole Ascend chip.

:func:`flashlab.rect.forward_time` is its public face; every NPU time of the book comes from
:func:`predict`. The model has the mechanisms of the hand-written PTO FlashAttention kernel
(pto-isa, ``kernels/manual/common/flash_atten``, commit ``3186c381``):

**One q-block on one core** is a pipeline of four stages per kv-tile of ``cols`` keys
(:func:`qblock_cycles`): the Cube computes $S = QK^\top$ (``qk``), the Vector its online softmax
(``p``), the Cube $PV$ (``pv``), the Vector the rescale-and-accumulate of $O$ (``gu``). The Cube
runs up to ``preload`` QK products ahead of the Vector, so in the steady state a tile costs
$\max(t_{qk} + t_{pv},\ t_p + t_{gu})$; the first tiles fill the pipeline and the last ones drain
it, once per q-block.

**Stage cycles** scale with the work of the tile from the reference tile (128 rows x 256 keys,
$D = 128$, fp16), and a share $f$ of each is memory traffic (K/V tiles and the GM workspace
through which Cube and Vector exchange $S$, $P$, $O$) that slows when the cores share the port:

$$
t_s = c_s \cdot w_s \cdot \big((1 - f_s) + f_s\,g(a)\big), \qquad g(a) = \max(1,\ a / n_{\text{port}}),
$$

with $w_{qk} = \frac{B_r D_{qk} B_c}{128 \cdot 128 \cdot 256}$, $w_{pv} = \frac{B_r D_v B_c}{128 \cdot 128 \cdot 256}$,
$w_p = \frac{B_r B_c}{128 \cdot 256}$, $w_{gu} = \frac{B_r D_v}{128 \cdot 128}$, $a$ the active cores
and $n_{\text{port}}$ the number of cores the shared memory port serves at a lone core's rate.

**The chip** runs whole q-blocks in waves of the core count $c$: the $Q$ q-blocks, longest
first, are dealt to $\lceil Q / \lceil Q/c \rceil \rceil$ cores (the fewest that keep the
number of waves) in a snake order, which balances a causal mask's rows; the busiest core sets
the time, after one launch overhead. While $a$ cores run,
each runs $T(a) / T(1)$ slower than alone (the contention of its memory traffic), and as cores
finish their last q-block the others speed up:

$$
t = \frac{1}{f_{\text{clk}}}\Big(L + \max_{\text{core}}
\sum_{\text{its q-blocks}} \big(d + T_{\text{q-block}}(n_{\text{tiles}})\big)\Big),
$$

$L$ the launch overhead, $d$ the dispatch of one q-block, each core's sum in lone-core cycles
stretched phase by phase by the contention of the cores still running.

**K/V** stay in the L2 cache when the heads in flight fit in it; otherwise every tile's K and V
come from HBM, and the Cube cannot go faster than its share $\beta / a$ of the HBM bandwidth.

**Fitted** (:data:`FIT`): the four stage cycles and the launch overhead are pto-isa's own cost
model constants (``fa_cost_model.py``, ``FitConstants``), taken as they are; $n_{\text{port}}$ is
the one number chosen here, so that the 910B2 at $S = 32768$ takes the measured 3262.6 µs
(:func:`fit_port_cores`). **Held out**: every other timing in ``flashlab/data/npu_fa_measured.json``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from flashlab import data as _data
from flashlab.arguments import as_bool, as_int, as_real
from flashlab.pipeline.params import MiB, Param
from flashlab.pipeline.profiles import INI_910B2

__all__ = ["PTO", "PTO_README", "PTO_COST_MODEL", "A3_INI", "MSMODELING", "DTYPE_BYTES", "STRATEGIES",
           "ChipModel", "Prediction", "measured", "FIT", "HELD_OUT", "tile_shape", "stage_cycles",
           "contention", "qblock_cycles", "predict", "fit_port_cores", "CHIPS", "chip_model",
           "with_param", "MECHANISMS", "TARGET", "held_out_errors",
           "onboard_cores"]

# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------
PTO = "pto-isa (github.com/hw-native-sys/pto-isa, commit 3186c381)"
PTO_COST_MODEL = f"{PTO} kernels/manual/common/flash_atten/scripts/fa_cost_model.py"
PTO_README = f"{PTO} kernels/manual/common/flash_atten/README.md"
A3_INI = "CANN platform_config/Ascend910_9391.ini (one die of the 910C)"
MSMODELING = "Huawei msmodeling tensor_cast/device.py (commit 84fec853)"

#: bytes per element of the dtypes the Cube takes at its full rate
DTYPE_BYTES = {"float16": 2, "bfloat16": 2}
#: how the kernel moves K/V into L1 (its own MTE2 double buffered, or the Matmul API's IterateAll)
STRATEGIES = ("ping_pong", "iterate_all")


def measured() -> dict:
    """``flashlab/data/npu_fa_measured.json``: the fit inputs and the held-out timings, with source."""
    return _data.load_json("npu_fa_measured.json")


_M = measured()
#: the only numbers the model is fitted to (stage cycles of one 128x256 tile, launch, one chip time)
FIT: dict = _M["fit"]
#: the measured timings the model is tested against and never fitted to
HELD_OUT: dict = _M["held_out"]
_STAGES = FIT["stage_cycles"]


def _r(value: float, unit: str, source: str, status: str, low: float | None = None,
       high: float | None = None) -> Param:
    """A Param with its range (``low`` .. ``high``, the value itself when not given)."""
    return Param(value, unit, source, status, value if low is None else low, value if high is None else high)


@dataclass(frozen=True)
class ChipModel:
    """Every number of the calibrated model for one chip, each a
    :class:`~flashlab.pipeline.params.Param` with its status (published / derived / fitted /
    assumption) and the range :func:`flashlab.vendor.verdicts` moves it across.

    Attributes
    ----------
    name
        ``"910B2"`` or ``"A3"``
    cores
        AI Cores (cube cores), $c$
    clock
        the cube clock, Hz
    macs_per_cycle
        MACs per cycle of one Cube (16 x 16 x 16)
    l2_bytes
        the L2 cache, bytes
    l2_usable
        the share of the L2 cache K/V may fill
    hbm_bandwidth
        the chip's HBM byte/s (K/V that miss L2)
    qk_cycles
        cycles of the Cube's $QK^\\top$ for the reference tile (128 x 256, $D = 128$, fp16), one
        core alone; ``p_cycles`` (the Vector's softmax), ``pv_cycles`` (the Cube's $PV$) and
        ``gu_cycles`` (the Vector's update of $O$) likewise
    p_cycles
        see ``qk_cycles``
    pv_cycles
        see ``qk_cycles``
    gu_cycles
        see ``qk_cycles``
    qk_gm
        the share of ``qk_cycles`` that is memory traffic; ``p_gm``, ``pv_gm``, ``gu_gm`` likewise
    p_gm
        see ``qk_gm``
    pv_gm
        see ``qk_gm``
    gu_gm
        see ``qk_gm``
    launch_cycles
        the kernel launch overhead, once per kernel
    dispatch_cycles
        the cost of starting one q-block on a core (its block dispatch), once per q-block
    preload
        QK products the Cube runs ahead of the Vector
    tile_rows
        query rows of the tile
    tile_cols
        keys of the tile for head dims up to 128
    tile_cols_wide
        keys of the tile beyond $D = 128$ (the Vector's UB holds fewer columns of a wider tile)
    port_cores
        $n_{\\text{port}}$: the active cores the shared memory port serves at a lone core's rate
    l2_core_rate
        byte/cycle one core's MTE2 reads from L2 (a K/V tile the Matmul API loads unhidden)
    iterate_all_exposed
        the share of a K/V tile's load that ``"iterate_all"`` leaves exposed (ping-pong hides it)
    split_cycles
        extra Cube cycles per tile when $QK^\\top$ is two products accumulated in place (split RoPE)
    """

    name: str
    cores: Param
    clock: Param
    macs_per_cycle: Param
    l2_bytes: Param
    l2_usable: Param
    hbm_bandwidth: Param
    qk_cycles: Param
    p_cycles: Param
    pv_cycles: Param
    gu_cycles: Param
    qk_gm: Param
    p_gm: Param
    pv_gm: Param
    gu_gm: Param
    launch_cycles: Param
    dispatch_cycles: Param
    preload: Param
    tile_rows: Param
    tile_cols: Param
    tile_cols_wide: Param
    port_cores: Param
    l2_core_rate: Param
    iterate_all_exposed: Param
    split_cycles: Param

    @property
    def peak_flops(self) -> float:
        """Dense fp16 FLOP/s of the chip, $2 \\cdot 16^3 \\cdot c \\cdot f_{\\text{clk}}$."""
        # pi = 2 FLOP/MAC * MAC/cycle * cores * Hz
        return 2 * self.macs_per_cycle.value * self.cores.value * self.clock.value

    def params(self) -> dict[str, Param]:
        """``{field name: Param}`` of every number of the model."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}


#: the mechanisms the issue names, each with the parameters that carry it
MECHANISMS = {
    "whole q-blocks in waves of the core count; the busiest core sets the time": ("cores",),
    "launch overhead, fill and drain": ("launch_cycles", "dispatch_cycles", "preload"),
    "the kernel's tile shape per head dim": ("tile_rows", "tile_cols", "tile_cols_wide"),
    "K/V from L2 when they fit, from HBM otherwise": ("l2_bytes", "l2_usable", "hbm_bandwidth"),
    "a memory port shared by the active cores": ("port_cores", "qk_gm", "p_gm", "pv_gm", "gu_gm"),
    "the preload depth of QK ahead of the Vector": ("preload",),
}


def tile_shape(chip: ChipModel, d_qk: int, d_v: int) -> tuple[int, int]:
    """``(rows, cols)`` of the kernel's tile for these head dims: 128 x 256 up to $D = 128$
    (the pto-isa kernel's reference tile), 128 x ``tile_cols_wide`` beyond."""
    wide = max(d_qk, d_v) > 128
    return int(chip.tile_rows.value), int((chip.tile_cols_wide if wide else chip.tile_cols).value)


def contention(chip: ChipModel, active: int) -> float:
    """$g(a) = \\max(1, a / n_{\\text{port}})$: how much slower each core's memory traffic runs when
    ``active`` cores share the port than when one runs alone."""
    # g = max(1, a / n_port)
    return max(1.0, active / chip.port_cores.value)


def stage_cycles(chip: ChipModel, rows: int, cols: int, d_qk: int, d_v: int, g: float = 1.0, *,
                 elem: int = 2, strategy: str = "ping_pong", split: bool = False,
                 hbm_share: float | None = None) -> dict[str, float]:
    """Cycles of the four stages of one tile (``qk``, ``p``, ``pv``, ``gu``) at contention ``g``.

    Each is $c_s w_s ((1 - f_s) + f_s g)$ (module docstring). ``strategy="iterate_all"`` adds the
    exposed share of the K (V) tile's load from L2 to ``qk`` (``pv``); ``split`` adds
    ``split_cycles`` to ``qk``; ``hbm_share`` (byte/s of one core, K/V from HBM) makes the Cube
    stages no faster than streaming their K or V tile at that rate.
    """
    ref_r, ref_c, ref_d = _STAGES["tile"]["rows"], _STAGES["tile"]["cols"], _STAGES["tile"]["d"]
    # work of the tile relative to the reference tile
    w = {"qk": rows * d_qk * cols / (ref_r * ref_d * ref_c),
         "p": rows * cols / (ref_r * ref_c),
         "pv": rows * d_v * cols / (ref_r * ref_d * ref_c),
         "gu": rows * d_v / (ref_r * ref_d)}
    out = {}
    for s in ("qk", "p", "pv", "gu"):
        c, f = getattr(chip, f"{s}_cycles").value, getattr(chip, f"{s}_gm").value
        # t_s = c_s w_s ((1 - f_s) + f_s g)
        out[s] = c * w[s] * ((1 - f) + f * g)
    tile_bytes = {"qk": cols * d_qk * elem, "pv": cols * d_v * elem}     # the K tile, the V tile
    if strategy == "iterate_all":
        for s, nbytes in tile_bytes.items():
            # the load the Matmul API issues just before the product: exposed * bytes / (rate / g)
            out[s] += chip.iterate_all_exposed.value * nbytes * g / chip.l2_core_rate.value
    if split:
        out["qk"] += chip.split_cycles.value
    if hbm_share is not None:
        for s, nbytes in tile_bytes.items():
            # the Cube waits for its operand: cycles >= bytes / (beta / a) * f_clk
            out[s] = max(out[s], nbytes / hbm_share * chip.clock.value)
    return out


def qblock_cycles(stages: dict[str, float], tiles: int, preload: int) -> float:
    """Cycles of one q-block of ``tiles`` kv-tiles: the Cube and the Vector, each in order.

    The Cube issues ``qk`` of the first ``min(preload, tiles)`` tiles, then for each tile $t$ the
    ``qk`` of tile $t + $ ``preload`` (if any) and the ``pv`` of $t$; the Vector runs ``p`` of a
    tile once its ``qk`` is done and ``gu`` of $t$ once its ``pv`` is done. ``pv`` of $t$ waits
    for ``p`` of $t$. The q-block ends when the last ``gu`` does (fill and drain included).
    """
    depth = max(1, min(preload, tiles))
    qk_done = [0.0] * tiles
    p_done = [0.0] * tiles
    cube = vec = 0.0

    def issue_qk(t):
        nonlocal cube, vec
        cube += stages["qk"]
        qk_done[t] = cube
        vec = max(vec, qk_done[t]) + stages["p"]
        p_done[t] = vec

    for t in range(depth):
        issue_qk(t)
    for t in range(tiles):
        if t + depth < tiles:
            issue_qk(t + depth)
        cube = max(cube, p_done[t]) + stages["pv"]
        vec = max(vec, cube) + stages["gu"]
    return vec


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` finds for one kernel.

    Attributes
    ----------
    seconds
        the kernel's time
    flops
        $2 (D_{qk} + D_v)$ per attended (query, key) pair, whole tiles of the mask counted
    cycles_busiest
        cycles of the busiest core's q-blocks (launch excluded)
    qblocks
        q-blocks in all
    waves
        $\\lceil \\text{q-blocks} / c \\rceil$
    active
        the cores that run them
    tile
        ``(rows, cols)``
    kv_source
        ``"l2"`` or ``"hbm"``
    g
        the contention factor $g(a)$
    cube_cycles
        the Cube's steady-state cycles per tile, $t_{qk} + t_{pv}$, while the ``active`` cores run
    vector_cycles
        the Vector's, $t_p + t_{gu}$
    waits_on
        the engine the steady state waits on, $\\max(t_{qk} + t_{pv},\\ t_p + t_{gu})$:
        ``"cube"`` or ``"vector"``
    """

    seconds: float
    flops: float
    cycles_busiest: float
    qblocks: int
    waves: int
    active: int
    tile: tuple[int, int]
    kv_source: str
    g: float
    cube_cycles: float
    vector_cycles: float
    waits_on: str

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12


def _check(batch, heads, sq, sk, d, dv, causal, dtype):
    for name, v in (("batch", batch), ("heads", heads), ("sq", sq), ("sk", sk), ("d", d), ("dv", dv)):
        as_int(name, v, lo=1)
    as_bool("causal", causal)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {tuple(DTYPE_BYTES)} (the Cube's full-rate types); got {dtype!r}")


def predict(chip: ChipModel, batch: int, heads: int, sq: int, sk: int, d: int, dv: int | None = None, *,
            causal: bool = False, dtype: str = "float16", strategy: str = "ping_pong",
            split: bool = False, cores: int | None = None) -> Prediction:
    """The calibrated time of one FlashAttention forward kernel (module docstring).

    ``q`` is ``(batch, heads, sq, d)``, ``k`` ``(batch, heads, sk, d)``, ``v`` ``(batch, heads, sk, dv)``;
    ``causal`` is the top-left mask (query $i$ sees keys $j \\le i$). ``cores`` runs the kernel on
    fewer (or more) cores than the chip has; ``strategy`` and ``split`` are the RECT-FA kernel
    variants (:func:`stage_cycles`).
    """
    dv = d if dv is None else dv
    _check(batch, heads, sq, sk, d, dv, causal, dtype)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}; got {strategy!r}")
    c = int(chip.cores.value) if cores is None else as_int("cores", cores, lo=1)
    elem = DTYPE_BYTES[dtype]
    rows, cols = tile_shape(chip, d, dv)
    n_q = math.ceil(sq / rows)
    # kv-tiles of q-block i: all of them, or (causal, top-left) those up to the diagonal
    tiles = np.full(n_q, math.ceil(sk / cols), dtype=np.int64)
    if causal:
        tiles = np.array([math.ceil(min((i + 1) * rows, sk) / cols) for i in range(n_q)], dtype=np.int64)
    total_q = batch * heads * n_q
    # the waves of c cores, and the fewest cores that run them: ceil(Q / ceil(Q / c))
    waves = math.ceil(total_q / c)
    used = math.ceil(total_q / waves)
    active = used
    # K/V of the heads in flight: the heads the active cores' q-blocks belong to
    heads_in_flight = min(batch * heads, math.ceil(active / n_q) + 1)
    kv_bytes = heads_in_flight * sk * (d + dv) * elem
    in_l2 = kv_bytes <= chip.l2_usable.value * chip.l2_bytes.value
    depth = int(chip.preload.value)

    @functools.lru_cache(maxsize=None)
    def stages(a: int) -> dict[str, float]:
        # the stage cycles while a cores run: contention g(a), K/V from HBM at beta / a when they miss L2
        share = None if in_l2 else chip.hbm_bandwidth.value / a
        return stage_cycles(chip, rows, cols, d, dv, contention(chip, a), elem=elem, strategy=strategy,
                            split=split, hbm_share=share)

    @functools.lru_cache(maxsize=None)
    def per_qblock(n: int, a: int) -> float:
        # a q-block of n tiles while a cores run: its dispatch, then its pipeline (fill, steady
        # state, drain)
        return chip.dispatch_cycles.value + qblock_cycles(stages(a), n, depth)

    # the q-blocks longest first, dealt to the cores in a snake (0 .. c-1, c-1 .. 0, ...): each
    # core's work in lone-core cycles
    cyc = np.sort(np.tile(np.array([per_qblock(int(n), 1) for n in tiles]), batch * heads))[::-1]
    k = np.arange(total_q)
    core = np.where((k // used) % 2 == 0, k % used, used - 1 - k % used)
    work = np.sort(np.bincount(core, weights=cyc, minlength=used))
    work = work[work > 0]
    # the cores finish in order of their work; while a of them run, each progresses 1 / s(a) as
    # fast as alone, s(a) = T(a) / T(1) for the longest q-block: the busiest core ends at
    # sum over phases of (w_i - w_{i-1}) s(a_i)
    n_max = int(tiles.max())
    busiest, done = 0.0, 0.0
    for i, w in enumerate(work):
        a = len(work) - i
        busiest += (w - done) * per_qblock(n_max, a) / per_qblock(n_max, 1)
        done = w
    busiest = float(busiest)
    seconds = (chip.launch_cycles.value + busiest) / chip.clock.value
    # FLOPs: 2 (d + dv) per attended pair
    pairs = batch * heads * (int(np.minimum(tiles * cols, sk).sum()) * rows if causal else sq * sk)
    # steady state of a tile: max(t_qk + t_pv, t_p + t_gu), the Cube's stages against the Vector's
    st = stages(active)
    cube, vector = st["qk"] + st["pv"], st["p"] + st["gu"]
    return Prediction(seconds, 2.0 * (d + dv) * pairs, busiest, total_q, waves, active,
                      (rows, cols), "l2" if in_l2 else "hbm", contention(chip, active),
                      cube, vector, "cube" if cube >= vector else "vector")


#: the target, within 25 % of the held-out measurements
TARGET = 0.25


def held_out_errors(chip: ChipModel) -> dict[str, list[dict]]:
    """The model against the held-out measurements of :data:`HELD_OUT`, row by row.

    ``{"multi_core": [...], "few_cores": [...], "onboard": [...]}``, each row a dict with ``cores``,
    ``sq``, ``sk``, ``measured_us``, ``model_us``, ``error`` (``model_us / measured_us - 1``) and
    ``met`` ($|\\text{error}| \\le$ :data:`TARGET`). ``multi_core`` is the 24-core table at
    $S_0 = S_1 = S$ (the fitted row included, marked by ``fitted``); ``few_cores`` the README's
    1-8 core table, $S_0 = 128 \\times$ cores (one q-block per core), $S_1$ in its columns;
    ``onboard`` its one onboard run at $S_0 = S_1 = 2048$, on the cores its two printed numbers
    imply (:func:`onboard_cores`). fp16, $B = 1$, one head, $D = 128$."""
    def row(cores: int, sq: int, sk: int, us: float, **extra) -> dict:
        t = predict(chip, 1, 1, sq, sk, 128, cores=cores).seconds * 1e6
        # error = model / measured - 1
        return dict(cores=cores, sq=sq, sk=sk, measured_us=us, model_us=t, error=t / us - 1,
                    met=abs(t / us - 1) <= TARGET, **extra)

    multi, few, onboard = HELD_OUT["multi_core_910B2"], HELD_OUT["few_cores"], HELD_OUT["onboard_2k"]
    return {"multi_core": [row(int(chip.cores.value), r["s"], r["s"], r["pto_us"], fitted=r["s"] == multi["fitted_row"])
                           for r in multi["rows"]],
            "few_cores": [row(int(n), 128 * int(n), s1, us) for n, col in few["us"].items()
                          for s1, us in zip(few["s1"], col)],
            "onboard": [row(onboard_cores(), onboard["s"], onboard["s"], onboard["us"])]}


def onboard_cores() -> int:
    """The cores of the README's onboard run at $S = 2048$ (:data:`HELD_OUT` ``onboard_2k``), which it
    does not print: its normalized TFLOP/s are its TFLOP/s times ``24 / cores``, and its TFLOP/s are
    $4 S^2 D$ over its time, so

    $$\\text{cores} = 24 \\cdot \\frac{4 S^2 D / t}{\\text{normalized TFLOP/s}}.$$
    """
    ob = HELD_OUT["onboard_2k"]
    tflops = 4 * ob["s"] ** 2 * 128 / (ob["us"] * 1e-6) / 1e12
    return round(24 * tflops / ob["normalized_tflops"])


def with_param(chip: ChipModel, **values: float) -> ChipModel:
    """A copy of ``chip`` with parameters moved (``with_param(chip, preload=2)``); each moved
    number keeps its range and status and says that it was moved."""
    changes = {}
    for name, v in values.items():
        if name not in chip.params():
            raise ValueError(f"no parameter {name!r}; the parameters are {sorted(chip.params())}")
        p = getattr(chip, name)
        as_real(name, v, lo=0.0)
        changes[name] = dataclasses.replace(p, value=float(v), low=min(p.low, v), high=max(p.high, v),
                                            source=f"{p.source} (moved to {v:g})")
    return dataclasses.replace(chip, **changes)


def fit_port_cores(chip: ChipModel, us: float | None = None) -> float:
    """$n_{\\text{port}}$ such that ``chip`` takes ``us`` µs (default: the measured 910B2 time of
    :data:`FIT`) at the fit shape, by bisection ($t$ falls as $n_{\\text{port}}$ grows). With a
    time the model cannot reach even with no contention, the cores count (no contention at all)."""
    fit = FIT["chip_time"]
    target = (fit["us"] if us is None else as_real("us", us, lo=0, lo_open=True)) * 1e-6

    def t(n):
        return predict(with_param(chip, port_cores=n), 1, 1, fit["sq"], fit["sk"], fit["d"]).seconds

    lo, hi = 1e-3, float(chip.cores.value)
    if t(hi) >= target:
        return hi
    for _ in range(60):     # t(lo) > target > t(hi)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t(mid) > target else (lo, mid)
    return (lo + hi) / 2


def _pto(name: str, value: float, unit: str, low: float, high: float) -> Param:
    return _r(value, unit, f"{PTO_COST_MODEL} FitConstants.{name} (pto-isa's fit to its own simulator "
                           f"traces of the 128x256 tile at D = 128); range considered {low:g}-{high:g}",
              "fitted", low, high)


def _gm(name: str, value: float) -> Param:
    return _r(value, "1", f"{PTO_COST_MODEL} FitConstants.{name} ('GM fractions inferred from the "
                          "baseline trace'); range considered 0.5-0.95", "published", 0.5, 0.95)


def _chip(name: str, cores: Param, clock: Param, l2: Param, hbm: Param) -> ChipModel:
    # the stage cycles: pto-isa's, +-15 % for run-to-run and simulator-to-board spread
    return ChipModel(
        name=name, cores=cores, clock=clock,
        macs_per_cycle=_r(16 ** 3, "MAC/cycle", f"{INI_910B2} cube_m/n/k_size = 16 (16*16*16)", "derived"),
        l2_bytes=l2,
        l2_usable=_r(0.5, "1", "assumed: K/V may fill half of L2 (the GM workspace, Q and O share it); "
                               "0.25-1 considered", "assumption", 0.25, 1.0),
        hbm_bandwidth=hbm,
        qk_cycles=_pto("qk_tile_cycles", _STAGES["qk"], "cycles", 0.85 * _STAGES["qk"], 1.15 * _STAGES["qk"]),
        p_cycles=_pto("p_tile_cycles", _STAGES["p"], "cycles", 0.85 * _STAGES["p"], 1.15 * _STAGES["p"]),
        pv_cycles=_pto("pv_tile_cycles", _STAGES["pv"], "cycles", 0.85 * _STAGES["pv"], 1.15 * _STAGES["pv"]),
        gu_cycles=_pto("gu_tile_cycles", _STAGES["gu"], "cycles", 0.85 * _STAGES["gu"], 1.15 * _STAGES["gu"]),
        qk_gm=_gm("qk_gm_fraction", 0.74), p_gm=_gm("p_gm_fraction", 0.71),
        pv_gm=_gm("pv_gm_fraction", 0.89), gu_gm=_gm("gu_gm_fraction", 0.72),
        launch_cycles=_pto("launch_overhead_cycles", _STAGES["launch"], "cycles",
                           0.5 * _STAGES["launch"], 2.0 * _STAGES["launch"]),
        dispatch_cycles=_r(2000, "cycles", f"{PTO_COST_MODEL} NPU_BLOCK_DISPATCH_CYCLES = 2000 (pto-isa's "
                                           "onboard correction, fitted by pto-isa to 910B3/B4 runs); 0-4000 "
                                           "considered", "published", 0, 4000),
        preload=_r(4, "tiles", f"{PTO_README}: qkPreloadNum (default 4); 2-6 (the cost model's search "
                               "list) considered", "published", 2, 6),
        tile_rows=_r(128, "rows", f"{PTO_README}: reference shape CUBE_S0 = 128", "published"),
        tile_cols=_r(256, "keys", f"{PTO_README}: reference shape TILE_S1 = 256 at HEAD = 128", "published"),
        tile_cols_wide=_r(128, "keys", "assumed for head dims above 128: a 128x256 fp32 score tile and a "
                                       "wider O tile overflow the 192 KiB UB; 128-256 considered",
                          "assumption", 128, 256),
        port_cores=_r(1.0, "cores", "placeholder, replaced by the fit", "fitted", 1.0, 1.0),
        l2_core_rate=_r(110, "B/cycle", f"{INI_910B2} [AICoreMemoryRates] l2_rate = 110 byte/cycle; "
                                        "86 (l2_write_rate)-256 considered", "published", 86, 256),
        iterate_all_exposed=_r(1.0, "1", "assumed: IterateAll copies each operand just before its "
                                         "product, so all of a K/V tile's load is exposed; 0.5-1 "
                                         "considered", "assumption", 0.5, 1.0),
        split_cycles=_r(20, "cycles", "assumed: the second product's Cube pipeline fill (the pipeline "
                                      "model's Cube start latency); 0-200 considered", "assumption", 0, 200),
    )


def _fitted(chip: ChipModel) -> ChipModel:
    """``chip`` with ``port_cores`` fitted to the 910B2 time of :data:`FIT`; its range is what the
    fit gives for that time +-10 % (the spread assumed between runs)."""
    us = FIT["chip_time"]["us"]
    n, n_slow, n_fast = (fit_port_cores(chip, us * k) for k in (1.0, 1.1, 0.9))
    src = (f"fitted so that the 910B2 takes {us} us at S = {FIT['chip_time']['sq']}, D = 128 "
           f"({PTO_README}, Performance); {n_slow:.3g}-{n_fast:.3g} fit that time -+10 %")
    return dataclasses.replace(chip, port_cores=Param(n, "cores", src, "fitted", min(n, n_slow), max(n, n_fast)))


_HBM = "no official figure; msmodeling's device.py: 1.6 TiB/s; 1.2-1.8 TB/s considered (community figures)"
_B2 = _fitted(_chip(
    "910B2",
    _r(24, "cores", f"{INI_910B2} ai_core_cnt = 24", "published"),
    _r(1.8e9, "Hz", f"{INI_910B2} cube_freq = 1800 MHz", "published"),
    _r(192 * MiB, "B", f"{INI_910B2} [SoCInfo] l2_size = 201326592", "published"),
    _r(1.6e12, "B/s", _HBM, "assumption", 1.2e12, 1.8e12)))

#: the calibrated chips, the 910B2 (fitted) and one die of the 910C (A3), which shares the
#: 910B2's fitted core and port numbers (the same dav-c220 AI Core) with its own clock
CHIPS: dict[str, ChipModel] = {
    "910B2": _B2,
    "A3": dataclasses.replace(
        _B2, name="A3",
        cores=_r(24, "cores", f"{A3_INI} ai_core_cnt = 24", "published"),
        clock=_r(1.85e9, "Hz", f"{A3_INI} cube_freq = 1850 MHz", "published"),
        l2_bytes=_r(192 * MiB, "B", f"{A3_INI} l2_size (192 MiB)", "published"),
        hbm_bandwidth=_r(1.6e12, "B/s", f"{MSMODELING} A3 die 1.6 TiB/s (no official figure); 1.2-1.8 TB/s "
                                        "considered", "assumption", 1.2e12, 1.8e12)),
}


@functools.lru_cache(maxsize=None)
def chip_model(chip: str) -> ChipModel:
    """The :data:`CHIPS` entry for ``chip`` (``ValueError`` naming the chips)."""
    if chip not in CHIPS:
        raise ValueError(f"chip must be one of {tuple(CHIPS)}; got {chip!r}")
    return CHIPS[chip]
