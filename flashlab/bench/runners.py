"""How each implementation runs one case: :class:`Runner` (the step measured for memory and the
call that is timed), the flashlab, numpy naive, torch SDPA and MLA runners, and
:func:`make_runner`, which picks one.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from flashlab.bench.config import Case
from flashlab.bench.inputs import grad_output, make_inputs, make_mla_inputs

__all__ = ["Runner", "Clock", "call_seconds", "torch_available", "make_runner"]


class Runner(NamedTuple):
    """How to run one case.

    ``step()`` runs what the memory is measured on (a forward; or forward + backward) and
    returns its outputs; ``once()`` runs what is timed (a forward; or the backward alone,
    its forward done untimed) and returns the seconds it took.
    """

    step: Callable[[], tuple]
    once: Callable[[], float]


#: a clock: seconds since an arbitrary origin (``time.perf_counter``: wall time;
#: ``time.process_time``: CPU time of this process, all its threads)
Clock = Callable[[], float]


def call_seconds(fn: Callable[[], Any], clock: Clock = time.perf_counter) -> float:
    """Seconds one call of ``fn`` takes on ``clock`` (wall time by default)."""
    t0 = clock()
    fn()
    return clock() - t0


def _flashlab_runner(case: Case, clock: Clock) -> Runner:
    import flashlab

    q, k, v = make_inputs(case.n, batch=case.batch, heads=case.heads, d=case.d_qk, d_v=case.d_v)
    opts = dict(causal=case.causal, block_q=case.block[0], block_k=case.block[1])
    if case.direction == "forward":
        def forward():
            return flashlab.flash_attention(q, k, v, **opts)
        return Runner(forward, lambda: call_seconds(forward, clock))
    do = grad_output(case)
    # the forward's (o, lse), computed once, untimed, on the first timed backward
    saved = functools.cache(lambda: flashlab.flash_attention(q, k, v, **opts))

    def training_step():
        o, lse = flashlab.flash_attention(q, k, v, **opts)
        return (o, lse) + flashlab.flash_attention_backward(do, q, k, v, o, lse, **opts)

    def backward():
        o, lse = saved()
        return call_seconds(lambda: flashlab.flash_attention_backward(do, q, k, v, o, lse, **opts), clock)
    return Runner(training_step, backward)


def _naive_runner(case: Case, clock: Clock) -> Runner:
    from flashlab import attention_naive

    q, k, v = make_inputs(case.n, batch=case.batch, heads=case.heads, d=case.d_qk, d_v=case.d_v)

    def forward():
        return attention_naive(q, k, v, causal=case.causal)
    return Runner(forward, lambda: call_seconds(forward, clock))


def torch_available() -> bool:
    """Whether torch can be imported (it is optional: ``requirements-bench.txt``)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _torch_runner(case: Case, clock: Clock) -> Runner:
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.from_numpy(x) for x in
               make_inputs(case.n, batch=case.batch, heads=case.heads, d=case.d_qk, d_v=case.d_v))
    if case.direction == "forward":
        def forward():
            with torch.no_grad():
                return (F.scaled_dot_product_attention(q, k, v, is_causal=case.causal),)
        return Runner(forward, lambda: call_seconds(forward, clock))
    do = torch.from_numpy(grad_output(case))

    def forward_with_graph():
        # new leaves each time, so that gradients never accumulate across calls
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        lq, lk, lv = leaves
        return leaves, F.scaled_dot_product_attention(lq, lk, lv, is_causal=case.causal)

    def training_step():
        leaves, o = forward_with_graph()
        o.backward(do)
        return (o.detach(),) + tuple(x.grad for x in leaves)

    def backward():
        _, o = forward_with_graph()
        return call_seconds(lambda: o.backward(do), clock)
    return Runner(training_step, backward)


def _mla_runner(case: Case, clock: Clock) -> Runner:
    from flashlab.mla import mla_backward, mla_forward

    q_nope, k_nope, v, q_rope, k_rope = make_mla_inputs(
        case.n, batch=case.batch, heads=case.heads, d_nope=case.d_qk, d_rope=case.d_rope,
        d_v=case.d_v)
    opts: dict[str, Any] = dict(dataflow=case.impl.split(":", 1)[1], causal=case.causal,
                block_q=case.block[0], block_k=case.block[1])

    def forward():
        fwd = mla_forward(q_nope, k_nope, v, q_rope, k_rope, **opts)
        return fwd.o, fwd.lse
    if case.direction == "forward":
        return Runner(forward, lambda: call_seconds(forward, clock))
    do = grad_output(case)
    saved = functools.cache(lambda: mla_forward(q_nope, k_nope, v, q_rope, k_rope, **opts))

    def training_step():
        fwd = mla_forward(q_nope, k_nope, v, q_rope, k_rope, **opts)
        grads, _ = mla_backward(do, fwd)
        return (fwd.o, fwd.lse) + tuple(grads)

    def backward():
        fwd = saved()
        return call_seconds(lambda: mla_backward(do, fwd), clock)
    return Runner(training_step, backward)


def make_runner(case: Case, clock: Clock = time.perf_counter) -> Runner:
    """The :class:`Runner` of ``case`` (allocates its inputs); its ``once()`` reads ``clock``."""
    if case.section == "mla":
        return _mla_runner(case, clock)
    return {"flashlab": _flashlab_runner, "numpy_naive": _naive_runner,
            "torch_sdpa": _torch_runner}[case.impl](case, clock)
