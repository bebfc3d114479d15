"""What the benchmark suite measures: :class:`BenchConfig` (with the suites ``FULL`` and
``QUICK``), one measurement :class:`Case`, and the constants they share.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from flashlab.arguments import as_int
from flashlab.dataflows import DATAFLOWS
from flashlab.tiling import BACKWARD_BLOCK, FORWARD_BLOCK

__all__ = ["IMPLEMENTATIONS", "BASELINES", "HAS_BACKWARD", "DIRECTIONS", "CLOCKS", "SCHEMA", "MB",
           "BenchConfig", "FULL", "QUICK", "Case"]


#: the attention implementations of the main section
IMPLEMENTATIONS = ("flashlab", "numpy_naive", "torch_sdpa")
#: the baselines flashlab is compared with
BASELINES = ("numpy_naive", "torch_sdpa")
#: implementations with a backward (numpy naive has none in float32, see the module doc)
HAS_BACKWARD = ("flashlab", "torch_sdpa")
DIRECTIONS = ("forward", "backward")
#: the clocks a run can time with (:class:`BenchConfig` ``clock``)
CLOCKS = ("wall", "cpu", "user")
#: version of the JSON layout written by :func:`run_suite`
SCHEMA = 1
MB = 10 ** 6


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class BenchConfig:
    """What :func:`run_suite` measures. The defaults are the full suite (``make bench``).

    - ``sizes``, ``shapes``, ``causal``: attention cases: N (= Sq = Sk), (Dqk, Dv) pairs,
      causal or not;
    - ``batch``, ``heads``: B and H; ``block``, ``backward_block``: flashlab's (block_q,
      block_k) for the forward cases and for the backward cases (the API's defaults);
    - ``baselines``: which of ``BASELINES`` to run (torch ones are skipped if torch is
      missing);
    - ``repeats``, ``max_timed_seconds``: timed calls per case after the warm-up (see the
      module doc);
    - ``settle_seconds``: a pause before each timed call (see :func:`time_interleaved`);
    - ``max_call_seconds``: skip a case predicted to take longer than this per call;
    - ``memory_sizes``, ``memory_causal``: N (``None``: every N) and causal values of the
      attention cases that run in a fresh process and measure peak extra memory; the other
      cases are timed in this process;
    - ``memory_headroom``: skip a case whose estimated memory exceeds this fraction of
      MemAvailable;
    - ``naive_max_n``: skip numpy naive above this N (``None``: no limit; 16384 needs 8+ GB);
    - ``mla_sizes``, ``mla_heads``, ``mla_dims``, ``mla_memory_sizes``: the MLA section: S, H,
      (NoPE, RoPE, V) head dims, and the S measured in fresh processes (``None``: every S);
    - ``clock``: ``"wall"`` (``time.perf_counter``, the implementations' own threads:
      :func:`time_interleaved`), ``"cpu"`` (the process's CPU time with every library on one
      thread, rounds until the paired ratios resolve: :func:`time_paired`) or ``"user"`` (the
      same rounds on the user-mode part of that time, :func:`user_time`: without the kernel's
      work for the process, page faults above all); ``min_rounds``, ``max_rounds``: the rounds
      of the paired clocks (``max_timed_seconds`` caps them too); ``warm_each``: on those
      clocks, each timed call right after an untimed call of the same case (:func:`time_paired`);
    - ``directions``: the directions of the main section's cases (a subset of ``DIRECTIONS``);
    - ``matmul_n``, ``matmul_repeats``: the numpy float32 matmul that sets the practical peak;
    - ``first_call``: :func:`numba_first_call`: ``"compile"`` (compile from an empty cache,
      tens of seconds, then the cache load), ``"cache"`` (the cache load only) or ``None``;
    - ``simulator_tasks``: time :func:`flashlab.pipeline.timing.bench_simulator` on about
      this many tasks (``None``: skip);
    - ``tile_explorer``: time one step of the tile explorer
      (:func:`tile_explorer_step`);
    - ``pipeline_explorer``: time the pipeline explorer's changes
      (:func:`pipeline_explorer_timing`);
    - ``decode_sizes``, ``decode_heads``, ``decode_dim``, ``decode_sq``, ``decode_repeats``:
      the decode section (:func:`decode_bench`): Sk values (none by default: ``FULL``
      has 8192, 32768 and 131072), (H, Hkv), head dim, query rows, timed rounds.
    """

    sizes: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    shapes: tuple[tuple[int, int], ...] = ((128, 128), (192, 128))
    causal: tuple[bool, ...] = (False, True)
    batch: int = 1
    heads: int = 8
    block: tuple[int, int] = FORWARD_BLOCK
    backward_block: tuple[int, int] = BACKWARD_BLOCK
    baselines: tuple[str, ...] = BASELINES
    repeats: int = 3
    max_timed_seconds: float = 30.0
    settle_seconds: float = 0.0
    max_call_seconds: float = 300.0
    memory_sizes: tuple[int, ...] | None = None
    memory_causal: tuple[bool, ...] = (False, True)
    memory_headroom: float = 0.75
    naive_max_n: int | None = None
    mla_sizes: tuple[int, ...] = (1024, 4096)
    mla_heads: int = 8
    mla_dims: tuple[int, int, int] = (128, 64, 128)
    mla_memory_sizes: tuple[int, ...] | None = None
    clock: str = "wall"
    min_rounds: int = 10
    max_rounds: int = 60
    warm_each: bool = False
    directions: tuple[str, ...] = DIRECTIONS
    matmul_n: int = 4096
    matmul_repeats: int = 3
    first_call: str | None = "compile"
    simulator_tasks: int | None = 100_000
    tile_explorer: bool = True
    pipeline_explorer: bool = True
    decode_sizes: tuple[int, ...] = ()
    decode_heads: tuple[int, int] = (32, 8)
    decode_dim: int = 128
    decode_sq: int = 1
    decode_repeats: int = 7

    def __post_init__(self):
        for name in ("sizes", "mla_sizes", "decode_sizes"):
            for n in getattr(self, name):
                as_int(f"each of {name}", n, lo=1, what="an int >= 1")
        for b in self.baselines:
            if b not in BASELINES:
                raise ValueError(f"baselines must be a subset of {BASELINES}; got {self.baselines!r}")
        if not 0 <= self.settle_seconds <= 60:
            raise ValueError(f"settle_seconds must be in [0, 60]; got {self.settle_seconds}")
        if self.decode_heads[0] % self.decode_heads[1]:
            raise ValueError(f"decode_heads (H, Hkv) needs H % Hkv == 0; got {self.decode_heads}")
        if self.repeats < 1 or self.decode_repeats < 1:
            raise ValueError(f"repeats and decode_repeats must be >= 1; got {self.repeats}, "
                             f"{self.decode_repeats}")
        if not self.directions or not set(self.directions) <= set(DIRECTIONS):
            raise ValueError(f"directions must be a non-empty subset of {DIRECTIONS}; got {self.directions!r}")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}; got {self.clock!r}")
        if not 2 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"need 2 <= min_rounds <= max_rounds; got min_rounds={self.min_rounds}, "
                             f"max_rounds={self.max_rounds}")
        if self.first_call not in ("compile", "cache", None):
            raise ValueError(f"first_call must be 'compile', 'cache' or None; got {self.first_call!r}")
        if not 0 < self.memory_headroom <= 1:
            raise ValueError(f"memory_headroom must be in (0, 1]; got {self.memory_headroom}")

    @property
    def paired(self) -> bool:
        """Whether the run times on one thread's CPU clock, in paired rounds (``"cpu"``, ``"user"``)."""
        return self.clock != "wall"

    def block_for(self, direction: str) -> tuple[int, int]:
        """flashlab's ``(block_q, block_k)`` for cases of ``direction``."""
        block_q, block_k = self.block if direction == "forward" else self.backward_block
        return block_q, block_k

    @classmethod
    def from_dict(cls, d: dict) -> "BenchConfig":
        """The inverse of ``dataclasses.asdict`` (JSON turns tuples into lists)."""
        def tup(x):
            return tuple(tup(y) for y in x) if isinstance(x, list) else x
        return cls(**{k: tup(v) for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})


#: ``make bench``: B=1, H=8, fp32, N 1024..16384, D=128 and 192/128, causal and not; a 1 s
#: pause before each timed call; decode at Sk 8192, 32768, 131072 (H=32/Hkv=8, D=128)
FULL = BenchConfig(settle_seconds=1.0, decode_sizes=(8192, 32768, 131072))
#: ``make bench-quick`` (under 2 minutes): N 1024 and 2048, one timed call after the warm-up,
#: memory at N=1024 non-causal only, MLA at S=1024 without memory, a 2048^3 matmul, no
#: compile timing, decode at Sk=8192, no pipeline explorer timing
QUICK = BenchConfig(sizes=(1024, 2048), repeats=1, memory_sizes=(1024,), memory_causal=(False,),
                    mla_sizes=(1024,), mla_memory_sizes=(), matmul_n=2048, matmul_repeats=3,
                    first_call="cache", simulator_tasks=20_000, decode_sizes=(8192,),
                    decode_repeats=3, pipeline_explorer=False)


@dataclass(frozen=True)
class Case:
    """One measurement: an implementation, a direction and a shape (all float32).

    q, k: (batch, heads, n, d_qk); v, dO: (batch, heads, n, d_v). MLA cases (``impl`` =
    ``"mla:<dataflow>"``): q_nope, k_nope (batch, heads, n, d_qk), q_rope (batch, heads, n,
    d_rope), the shared k_rope (batch, 1, n, d_rope), v (batch, heads, n, d_v).
    """

    impl: str
    direction: str
    n: int
    d_qk: int
    d_v: int
    causal: bool = False
    batch: int = 1
    heads: int = 8
    d_rope: int = 0
    block: tuple[int, int] = FORWARD_BLOCK

    def __post_init__(self):
        known = IMPLEMENTATIONS + tuple(f"mla:{f}" for f in DATAFLOWS)
        if self.impl not in known:
            raise ValueError(f"impl must be one of {known}; got {self.impl!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}; got {self.direction!r}")
        if self.direction == "backward" and self.impl == "numpy_naive":
            raise ValueError("numpy_naive has no backward (flashlab's naive backward is the "
                             "float64 reference): use impl 'flashlab' or 'torch_sdpa'")
        if self.impl.startswith("mla:") and self.d_rope < 1:
            raise ValueError(f"an MLA case needs d_rope >= 1; got {self.d_rope}")

    @property
    def section(self) -> str:
        return "mla" if self.impl.startswith("mla:") else "attention"

    @property
    def label(self) -> str:
        dims = f"{self.d_qk}+{self.d_rope}/{self.d_v}" if self.d_rope else f"{self.d_qk}/{self.d_v}"
        return (f"{self.impl} {self.direction} N={self.n} {dims}"
                f"{' causal' if self.causal else ''} H={self.heads}")

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        d = {k: d[k] for k in (f.name for f in dataclasses.fields(cls)) if k in d}
        return cls(**{**d, "block": tuple(d.get("block", FORWARD_BLOCK))})
