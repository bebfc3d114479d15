r"""Hardware profiles, memory hierarchies, peak rates and the roofline, in one namespace.

This module gathers :mod:`flashlab.pipeline.params` (the types),
:mod:`flashlab.pipeline.roofline` (the roofline and ``with_*`` copies) and
:mod:`flashlab.pipeline.profiles` (the sourced A100, H100 and Ascend 910B numbers), so that
``from flashlab.pipeline import hardware as hw`` reaches all of them.


A profile is a frozen dataclass. Every number in it is a :class:`Param` that says where the
number comes from and whether it is

- ``"published"`` — stated by the vendor or by a paper (the source is named),
- ``"derived"`` — computed from published numbers (the formula is in the source string),
- ``"assumption"`` — a model parameter with no official figure behind it; the reader may move
  it (:func:`with_hbm_bandwidth`).

The roofline model (Williams, Waterman & Patterson, *Roofline*, CACM 2009): a kernel that does
$F$ floating-point operations and moves $Q$ bytes to and from main memory has *arithmetic
intensity* $I = F / Q$ (FLOP/byte). With peak compute $\pi$ (FLOP/s) and main-memory bandwidth
$\beta$ (byte/s) it can run at most at

$$
P(I) = \min(\pi,\ \beta I) \quad \text{FLOP/s},
$$

memory-bound below the *ridge point* $I^\ast = \pi / \beta$ and compute-bound above it.

Per-core profiles also carry a :class:`CoreModel`: the in-order engines of one core (Ascend's
MTE2, MTE1, Cube, FixPipe, Vector, MTE3; an SM's async copy / TMA, tensor core, FP32 cores)
with their rates and fixed start latencies, the matrix unit's shape, and which memory level
plays which buffer role. :mod:`flashlab.pipeline.schedule` turns it into task durations.
Most engine rates inside a core are not published: they are ``"assumption"`` Params whose
source says why the number was chosen; :func:`with_core` moves them.
"""
from flashlab.pipeline.params import *  # noqa: F401,F403
from flashlab.pipeline.params import __all__ as _params_all
from flashlab.pipeline.profiles import *  # noqa: F401,F403
from flashlab.pipeline.profiles import __all__ as _profiles_all
from flashlab.pipeline.roofline import *  # noqa: F401,F403
from flashlab.pipeline.roofline import __all__ as _roofline_all

__all__ = [*_params_all, *_roofline_all, *_profiles_all]
