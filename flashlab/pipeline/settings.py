"""One point of the design space of the AI Core tile loop, and its simulation.

- :class:`PipelineSettings`: strategy (``iterate_all``, ``self_mte2``, ``ping_pong``,
  ``n_buffers``), tile sizes, the chip's HBM bandwidth, head dims (:data:`HEAD_DIMS`), RoPE
  concatenated or split, number of kv-blocks.
- :func:`simulate_settings` simulates it (:func:`flashlab.pipeline.schedule.simulate_fa`);
  :func:`run_settings` adds the ``iterate_all`` baseline of the same shape and the speedup;
  :func:`summary` states the outcome in one line.
- :func:`core_profile`: the calibrated Ascend 910B AI Core profile
  (:data:`flashlab.pipeline.core_fit.ASCEND_910B_CALIBRATED_CORE`) with the chip's HBM bandwidth moved;
  MTE2 (GM -> L1) and MTE3 (UB -> GM) get a 1/24 share of it each, as in
  :mod:`flashlab.pipeline.profiles`.

The pipeline explorer (:mod:`flashlab.widgets.pipeline`) is a set of controls over these.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from flashlab.arguments import as_int, as_real
from flashlab.pipeline.buffers import STRATEGIES
from flashlab.pipeline.core_fit import ASCEND_910B_CALIBRATED_CORE
from flashlab.pipeline.params import HardwareProfile
from flashlab.pipeline.profiles import ASCEND_910B, ASCEND_910B_CORES
from flashlab.pipeline.roofline import with_hbm_bandwidth
from flashlab.pipeline.schedule import simulate_fa
from flashlab.pipeline.simulate import SimResult

__all__ = ["HEAD_DIMS", "ROPE_MODES", "ROPE_DIM", "DEFAULT_HBM_TB_S",
           "core_profile", "PipelineSettings", "simulate_settings", "run_settings", "summary"]

#: head-dim presets, name -> (d_qk, d_v, pad_v). "192/192 padded V" is MLA's 192/128 with V
#: padded to 192 (the baseline before RECT-FA); "192/128 native V" is RECT-FA's.
HEAD_DIMS: dict[str, tuple[int, int, bool]] = {
    "128/128": (128, 128, False),
    "192/128 native V": (192, 128, False),
    "192/192 padded V": (192, 128, True),
}
#: how the RoPE part of Q and K enters the score, either one QK^T over the concatenated dims, or two
#: products (NoPE, RoPE) accumulated into one L0C tile
ROPE_MODES = ("concat", "split")
#: the RoPE part's head dim when split (DeepSeek-V3's 64, ``flashlab.rope.DEEPSEEK_V3_ROPE_DIM``)
ROPE_DIM = 64
#: the chip's HBM bandwidth the profile assumes, in TB/s (an assumption, no official figure)
DEFAULT_HBM_TB_S = ASCEND_910B.hbm_bandwidth.value / 1e12


def core_profile(hbm_tb_s: float = DEFAULT_HBM_TB_S,
                 base: HardwareProfile = ASCEND_910B_CALIBRATED_CORE) -> HardwareProfile:
    """The AI Core profile ``base`` with the chip's HBM bandwidth set to ``hbm_tb_s`` TB/s.

    One core's share, $\\beta_{core} = \\beta_{chip} / 24$, becomes the profile's
    ``hbm_bandwidth``, and :func:`~flashlab.pipeline.roofline.with_hbm_bandwidth` moves the rate
    of its load engine (MTE2, GM -> L1) and store engine (MTE3, UB -> GM) with it; every other
    number of ``base`` stays. The changed numbers are marked as assumptions that name the chosen
    bandwidth.
    """
    hbm_tb_s = as_real("hbm_tb_s", hbm_tb_s, lo=0.0, lo_open=True, what="a number of TB/s")
    # beta_core = beta_chip / 24
    share = hbm_tb_s * 1e12 / ASCEND_910B_CORES
    why = f"chip HBM bandwidth set to {hbm_tb_s:g} TB/s, one core's share = 1/{ASCEND_910B_CORES} of it"
    return with_hbm_bandwidth(base, share, why)


@dataclass(frozen=True)
class PipelineSettings:
    """One configuration of the tile loop on one AI Core (one q-block of ``block_q`` rows
    against ``kv_blocks`` kv-blocks of ``block_k`` keys).

    Attributes
    ----------
    strategy
        one of :data:`flashlab.pipeline.buffers.STRATEGIES`
    n_buffers
        L1 buffers per operand (used by ``strategy="n_buffers"`` only)
    block_q
        tile rows of Q
    block_k
        keys per kv-block
    hbm_tb_s
        the chip's HBM bandwidth in TB/s (see :func:`core_profile`)
    head_dims
        a key of :data:`HEAD_DIMS`
    rope
        ``"concat"`` or ``"split"`` (:data:`ROPE_MODES`; split: the last :data:`ROPE_DIM`
        dims of Q/K are a second matmul)
    kv_blocks
        number of kv-blocks (steps of the loop)
    """

    strategy: str = "ping_pong"
    n_buffers: int = 2
    block_q: int = 128
    block_k: int = 128
    hbm_tb_s: float = DEFAULT_HBM_TB_S
    head_dims: str = "192/128 native V"
    rope: str = "concat"
    kv_blocks: int = 4

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}; got {self.strategy!r}")
        if self.head_dims not in HEAD_DIMS:
            raise ValueError(f"head_dims must be one of {tuple(HEAD_DIMS)}; got {self.head_dims!r}")
        if self.rope not in ROPE_MODES:
            raise ValueError(f"rope must be one of {ROPE_MODES}; got {self.rope!r}")
        for name in ("n_buffers", "block_q", "block_k", "kv_blocks"):
            object.__setattr__(self, name, as_int(name, getattr(self, name), lo=1))
        object.__setattr__(self, "hbm_tb_s", as_real("hbm_tb_s", self.hbm_tb_s, lo=0.0,
                                                     lo_open=True, what="a number of TB/s"))

    def profile(self) -> HardwareProfile:
        """The AI Core profile at this HBM bandwidth."""
        return core_profile(self.hbm_tb_s)

    def fa_args(self) -> dict:
        """Keyword arguments of :func:`~flashlab.pipeline.schedule.simulate_fa` (profile included)."""
        d_qk, d_v, pad_v = HEAD_DIMS[self.head_dims]
        return dict(profile=self.profile(), strategy=self.strategy, seq_q=self.block_q,
                    seq_kv=self.kv_blocks * self.block_k, d_qk=d_qk, d_v=d_v,
                    block_q=self.block_q, block_k=self.block_k, pad_v=pad_v,
                    split_rope=ROPE_DIM if self.rope == "split" else 0,
                    n_buffers=self.n_buffers if self.strategy == "n_buffers" else None)

    def label(self) -> str:
        """A one-line description, e.g. ``"ping_pong, 128x128, D 192/128 native V, 1.6 TB/s"``."""
        head = (f"n_buffers={self.n_buffers}" if self.strategy == "n_buffers" else self.strategy)
        rope = ", RoPE split" if self.rope == "split" else ""
        return (f"{head}, {self.block_q}x{self.block_k}, D {self.head_dims}{rope}, "
                f"{self.hbm_tb_s:g} TB/s, {self.kv_blocks} kv-blocks")


def simulate_settings(settings: PipelineSettings) -> SimResult:
    """Simulate one configuration (raises ``ValueError`` if its tiles do not fit the buffers)."""
    if not isinstance(settings, PipelineSettings):
        raise TypeError(f"settings must be a PipelineSettings; got {type(settings).__name__}")
    args = settings.fa_args()
    return simulate_fa(args.pop("profile"), args.pop("strategy"), **args)


def run_settings(settings: PipelineSettings) -> tuple[SimResult, SimResult, float]:
    """``(result, baseline, speedup)``: the configuration, the same shape with ``iterate_all``,
    and ``speedup = makespan(iterate_all) / makespan(result)``."""
    result = simulate_settings(settings)
    if settings.strategy == "iterate_all":
        baseline = result
    else:
        baseline = simulate_settings(dataclasses.replace(settings, strategy="iterate_all"))
    # speedup = t_iterate_all / t_strategy
    return result, baseline, baseline.makespan / result.makespan


def summary(result: SimResult, baseline: SimResult, speedup: float) -> str:
    """Plain text: makespan, the ``iterate_all`` makespan and the speedup, the critical engine
    with its utilization and idle time (all modelled, deterministic)."""
    idle = sum(b - a for a, b in result.idle_gaps)
    crit = result.critical_engine
    return (f"makespan {result.makespan * 1e6:.2f} us; iterate_all {baseline.makespan * 1e6:.2f} us; "
            f"speedup {speedup:.3f}x. Critical engine {crit}: busy "
            f"{100 * result.utilization[crit]:.0f}%, idle {idle * 1e6:.2f} us in "
            f"{len(result.idle_gaps)} gaps")
