"""The roofline and hit-rate explorer: where the RECT-FA forward kernel sits on a chip's roofline.

The model is read in one place, :func:`forward_point` (the adapter). The roofline, the lower
bound, is :func:`flashlab.rect.kernel_roofline_by_hit` (FLOPs and HBM bytes of the kernel step of
:func:`flashlab.ledgers.mla_forward_steps`, the K/V re-reads served on chip at the hit rate) with
:func:`flashlab.rect.break_even_hit`. On the Ascend chips the estimate is the calibrated model
(:func:`flashlab.rect.kernel_seconds`, the model of :func:`flashlab.rect.forward_time`): its time,
its share of the peak, where it serves K/V from, and the engine its steady state waits on. The
GPUs are drawn on their roofline only (the calibrated model is of the Ascend kernel).
"""
from __future__ import annotations

import dataclasses
import functools

from flashlab import rect
from flashlab.arguments import as_int, as_real
from flashlab.dataflows import IDEAS
from flashlab.pipeline import calibrated
from flashlab.pipeline.params import HardwareProfile, Param
from flashlab.pipeline.profiles import A100_80GB, ASCEND_910B, H100
from flashlab.widgets.explorer import Control, Explorer

__all__ = ["CHIPS", "HEAD_DIMS", "GRID_HITS", "GRID_SEQ", "ENGINES", "forward_point",
           "RooflineExplorer"]


def _ascend(name: str) -> HardwareProfile:
    """The roofline profile of calibrated chip ``name``: its Cube peak and HBM bandwidth."""
    chip = calibrated.chip_model(name)
    peak = Param(chip.peak_flops, "FLOP/s", f"calibrated.CHIPS[{name!r}].peak_flops", "derived")
    return dataclasses.replace(ASCEND_910B, name=name, peak_flops=peak, hbm_bandwidth=chip.hbm_bandwidth)


#: the chips the explorer offers (chip-level peak FLOP/s and HBM bandwidth); the Ascend ones are
#: the calibrated model's (:data:`flashlab.pipeline.calibrated.CHIPS`)
CHIPS: dict[str, HardwareProfile] = {"910B2": _ascend("910B2"), "A3": _ascend("A3"),
                                     "A100 80GB": A100_80GB, "H100 SXM": H100}
#: head dims ``D_nope + D_rope / D_v`` -> (d_nope, d_rope, d_v)
HEAD_DIMS: dict[str, tuple[int, int, int]] = {
    "64+64 / 64": (64, 64, 64),
    "128+64 / 128 (DeepSeek-V3)": (128, 64, 128),
    "192+64 / 256": (192, 64, 256),
}
#: the K/V hit rates the static roofline explorer offers (issue 33)
GRID_HITS = tuple(k / 10 for k in range(11))
#: the sequence lengths it offers
GRID_SEQ = (1024, 4096, 16384)
#: the engine that sets the roofline time when the kernel is compute- or memory-bound
ENGINES = {"ascend": {"compute": "the Cube unit (matrix engine)",
                      "memory": "MTE2, the HBM -> L1 copies (HBM bandwidth)"},
           "gpu": {"compute": "the tensor cores", "memory": "the HBM loads (HBM bandwidth)"}}


def _sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (the JSON is the same on any machine)."""
    return float(f"{x:.{digits}g}")


@functools.lru_cache(maxsize=None)
def _calibrated(chip: str, problem: rect.MLAProblem) -> dict:
    """The calibrated model's estimate of the RECT-FA kernel (every idea) on Ascend ``chip``
    (it does not depend on the hit rate: computed once per chip and problem, not once per point
    of the hit-rate sweep; the dict is shared, read-only)."""
    model = calibrated.chip_model(chip)
    opts = rect.kernel_options(IDEAS, problem)
    pred = calibrated.predict(model, problem.batch, problem.heads, problem.seq, problem.seq,
                              problem.d_qk, opts["dv"], causal=problem.causal, dtype="bfloat16",
                              strategy=opts["strategy"], split=opts["split"])
    engine = "the Cube (QK and PV)" if pred.waits_on == "cube" else "the Vector (softmax and O update)"
    return {"seconds": pred.seconds, "flops": pred.flops, "kv_source": pred.kv_source,
            "engine": engine, "share_of_peak": pred.flops / pred.seconds / model.peak_flops}


def forward_point(chip: str, kv_hit: float, head_dims: str, seq: int) -> dict:
    """The RECT-FA forward kernel of one MLA layer (B = 1, H = 128, causal, bf16, 128 x 128
    tiles; :class:`flashlab.rect.MLAProblem` with ``seq`` and ``head_dims``) on ``chip`` at K/V
    hit rate ``kv_hit``: the explorer's one adapter to the models.

    Returns ``{"flops", "bytes", "peak", "bandwidth", "bound", "engine", "seconds",
    "break_even", "model"}``: FLOPs and HBM bytes of the kernel, the chip's peak FLOP/s and HBM
    B/s, ``"compute"`` or ``"memory"``, the engine that sets the roofline time, the roofline time
    $\\max(F/\\pi, Q/\\beta)$ (the lower bound), the hit rate above which the kernel is
    compute-bound, and on an Ascend chip the calibrated model's estimate (``None`` on a GPU):
    ``{"seconds", "flops", "kv_source", "engine", "share_of_peak"}``.
    """
    if chip not in CHIPS:
        raise ValueError(f"chip must be one of {tuple(CHIPS)}; got {chip!r}")
    if head_dims not in HEAD_DIMS:
        raise ValueError(f"head_dims must be one of {tuple(HEAD_DIMS)}; got {head_dims!r}")
    kv_hit = as_real("kv_hit", kv_hit, lo=0.0, hi=1.0, what="a hit rate in [0, 1]")
    seq = as_int("seq", seq, lo=1)
    profile = CHIPS[chip]
    d_nope, d_rope, d_v = HEAD_DIMS[head_dims]
    problem = rect.MLAProblem(seq=seq, d_nope=d_nope, d_rope=d_rope, d_v=d_v)
    (p,) = rect.kernel_roofline_by_hit(profile, problem, (kv_hit,))
    peak, bandwidth = profile.peak_flops.value, profile.hbm_bandwidth.value
    family = "ascend" if chip in calibrated.CHIPS else "gpu"
    return {"flops": p.flops, "bytes": p.bytes_moved, "peak": peak, "bandwidth": bandwidth,
            "bound": p.bound, "engine": ENGINES[family][p.bound],
            # t = max(F / pi, Q / beta)
            "seconds": max(p.flops / peak, p.bytes_moved / bandwidth),
            "break_even": rect.break_even_hit(profile, problem),
            "model": _calibrated(chip, problem) if family == "ascend" else None}


class RooflineExplorer(Explorer):
    """The RECT-FA forward kernel on a chip's roofline as the K/V hit rate, the head dims, the
    sequence length and the chip change: one explorer, live and static.

    The picture: the chip's roof $\\min(\\pi, \\beta I)$ on log-log axes, its ridge, the kernel
    at every hit rate 0, 0.1, ..., 1 (grey) and at the chosen one (the dot, blue when
    compute-bound, red when memory-bound); the numbers under it name the engine that bounds
    it. Everything comes from :func:`forward_point`.
    """

    kind = "roofline"
    title = "Roofline explorer: the RECT-FA forward kernel, K/V hit rate and chip"
    notebook = "rect_fa"
    controls = (
        Control("kv_hit", "K/V hit rate", GRID_HITS, {"min": 0.0, "max": 1.0, "step": 0.01}),
        Control("head_dims", "head dims", tuple(HEAD_DIMS)),
        Control("seq", "S", GRID_SEQ, {"min": 128, "max": 131072}),
        Control("chip", "chip", tuple(CHIPS)),
    )
    defaults = {"kv_hit": 0.5, "head_dims": "128+64 / 128 (DeepSeek-V3)", "seq": 4096,
                "chip": "910B2"}

    def __init__(self, kv_hit: float = 0.5, head_dims: str = "128+64 / 128 (DeepSeek-V3)",
                 seq: int = 4096, chip: str = "910B2") -> None:
        super().__init__(kv_hit=kv_hit, head_dims=head_dims, seq=seq, chip=chip)

    def state(self, values: dict) -> dict:
        """The roof, the sweep over :data:`GRID_HITS` and the point at ``values["kv_hit"]``."""
        pt = forward_point(values["chip"], values["kv_hit"], values["head_dims"], values["seq"])
        peak, bw = pt["peak"], pt["bandwidth"]
        ridge = peak / bw

        def placed(p: dict) -> list[float]:
            intensity = p["flops"] / p["bytes"]
            # attainable P(I) = min(pi, beta I)
            return [_sig(intensity), _sig(min(peak, bw * intensity))]

        sweep = [placed(forward_point(values["chip"], h, values["head_dims"], values["seq"]))
                 for h in GRID_HITS]
        point = placed(pt)
        return {"chip": values["chip"], "peak": _sig(peak), "bw": _sig(bw), "ridge": _sig(ridge),
                "ridge_label": f"{ridge:.0f} FLOP/byte", "xrange": [1, 10000],
                "yrange": [1e11, 1e16], "sweep": sweep, "point": point, "bound": pt["bound"],
                "text": [
                    f"{values['chip']}: peak {peak / 1e12:.0f} TFLOP/s, HBM {bw / 1e12:.2f} TB/s, "
                    f"ridge {ridge:.0f} FLOP/byte",
                    f"RECT-FA forward kernel, B = 1, H = 128, S = {values['seq']}, D "
                    f"{values['head_dims']}, causal: {pt['flops'] / 1e12:.3f} TFLOP, "
                    f"{pt['bytes'] / 2**30:.3f} GiB from HBM at K/V hit rate "
                    f"{values['kv_hit']:.2f}: {point[0]:.4g} FLOP/byte",
                    f"{pt['bound']}-bound, the time set by {pt['engine']}: "
                    f"{pt['seconds'] * 1e3:.3f} ms on the roofline; compute-bound above a "
                    f"K/V hit rate of {pt['break_even']:.2f}",
                    _model_line(pt["model"])]}


def _model_line(model: dict | None) -> str:
    """The calibrated model's estimate as one line of the explorer's numbers."""
    if model is None:
        return "calibrated model: Ascend chips only (this GPU is drawn on its roofline only)"
    return (f"calibrated model (rect.forward_time's): {model['seconds'] * 1e3:.3f} ms, "
            f"{model['share_of_peak'] * 100:.0f} % of peak, K/V from {model['kv_source'].upper()}, "
            f"steady state waits on {model['engine']}")
