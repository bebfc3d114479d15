"""flashlab.mla: the four MLA dataflows agree with each other, with the float64 reference and
with finite differences, and the RECT dataflow never materialises a concatenated Q/K or a
per-head copy of k_rope (checked on its ledger, on the arrays handed to the kernel, and on the
memory really allocated, measured with tracemalloc).

Shapes use DeepSeek-V3's head dims (NoPE 128, RoPE 64, V 128) with few heads and short
sequences; the finite differences use tiny dims.
"""
from __future__ import annotations

import numba
import numpy as np
import pytest
from conftest import assert_close_to_reference, max_abs_err

import flashlab
from flashlab import api, mla
from flashlab.dataflows import total
from flashlab.memory import traced_peak
from flashlab.rope import DEEPSEEK_V3_NOPE_DIM as DN
from flashlab.rope import DEEPSEEK_V3_ROPE_DIM as DR
from flashlab.rope import DEEPSEEK_V3_V_DIM as DV

GRAD_NAMES = ("dq_nope", "dk_nope", "dv", "dq_rope", "dk_rope")
#: float32 gradients vs the float64 analytic ones: max abs error / max |reference| (measured
#: ~1e-6 at these sizes; a wrong slice, split or head sum gives errors of order 1)
GRAD_RTOL32 = 1e-5


def operands(B, H, Sq, Sk, dn=DN, dr=DR, dv=DV, hr=1, dtype=np.float32, seed=0):
    """q_nope, k_nope, v, q_rope, k_rope (in flash_attention's order) and a random dO."""
    rng = np.random.default_rng(seed)
    shapes = [(B, H, Sq, dn), (B, H, Sk, dn), (B, H, Sk, dv), (B, H, Sq, dr), (B, hr, Sk, dr),
              (B, H, Sq, dv)]
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return arrays[:5], arrays[5]


def reference(args, do, causal):
    q, k, v, qr, kr = args
    o, lse = flashlab.attention_reference(q, k, v, q_rope=qr, k_rope=kr, causal=causal)
    grads = flashlab.attention_reference_backward(do, q, k, v, q_rope=qr, k_rope=kr, causal=causal)
    return o, lse, grads


CASES = {
    "B1H4-S48-causal": dict(B=1, H=4, Sq=48, Sk=48, causal=True),
    "B2H2-Sq37-Sk53": dict(B=2, H=2, Sq=37, Sk=53, causal=False),
    "B1H2-Sq53-Sk29-causal": dict(B=1, H=2, Sq=53, Sk=29, causal=True, blocks=dict(block_q=16, block_k=24)),
    "B1H4-Hr2": dict(B=1, H=4, Sq=20, Sk=20, causal=False, hr=2),
}


@pytest.mark.parametrize("dataflow", mla.DATAFLOWS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_dataflows_match_float64_reference(case, dataflow):
    args, do = operands(case["B"], case["H"], case["Sq"], case["Sk"], hr=case.get("hr", 1), seed=1)
    causal = case["causal"]
    blocks = case.get("blocks", {})
    fwd = mla.mla_forward(*args, dataflow=dataflow, causal=causal, **blocks)
    grads, _ = mla.mla_backward(do, fwd)
    ref_o, ref_lse, ref_grads = reference(args, do, causal)
    naive_o, naive_lse = flashlab.attention_naive(*args[:3], q_rope=args[3], k_rope=args[4], causal=causal)
    assert fwd.o.dtype == np.float32 and fwd.o.shape == ref_o.shape
    assert_close_to_reference(fwd.o, fwd.lse, naive_o, naive_lse, ref_o, ref_lse, what=dataflow)
    for name, g, arg, ref in zip(GRAD_NAMES, grads, args, ref_grads):
        assert g.shape == arg.shape and g.dtype == np.float32, name
        err = max_abs_err(g, ref)
        assert err <= GRAD_RTOL32 * np.abs(ref).max(), f"{dataflow} {name}: {err:.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dataflows_agree_with_each_other(dtype):
    """Same o and gradients from all four dataflows (only the rounding differs)."""
    args, do = operands(2, 4, 33, 40, dtype=dtype, seed=2)
    results = {}
    for flow in mla.DATAFLOWS:
        fwd = mla.mla_forward(*args, dataflow=flow, causal=True, block_q=16, block_k=16)
        results[flow] = (fwd.o,) + mla.mla_backward(do, fwd)[0]
    # float64: limited by the float32 LSE the backward recomputes P from (~1e-7 relative)
    rtol = 1e-5 if dtype == np.float32 else 1e-6
    assert set(results) == {"baseline", "native_v", "split_rope", "rect"}
    for flow in ("baseline", "native_v", "split_rope"):
        for name, a, b in zip(("o",) + GRAD_NAMES, results[flow], results["rect"]):
            assert max_abs_err(a, b.astype(np.float64)) <= rtol * np.abs(b).max(), f"{flow} {name}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dataflow", mla.DATAFLOWS)
def test_finite_differences(dataflow, causal):
    """Central differences of f = sum(o * dO) in float64 for every element of the five
    operands, k_rope shared by both heads (its gradient sums them)."""
    args, do = operands(1, 2, 3, 4, dn=4, dr=2, dv=3, dtype=np.float64, seed=3)
    fwd = mla.mla_forward(*args, dataflow=dataflow, causal=causal, block_q=2, block_k=3)
    grads, _ = mla.mla_backward(do, fwd)

    def f(xs: list) -> float:
        return float((mla.mla_forward(*xs, dataflow=dataflow, causal=causal, block_q=2,
                                      block_k=3).o * do).sum())

    eps = 1e-6
    for i, (name, g) in enumerate(zip(GRAD_NAMES, grads)):
        fd = np.zeros_like(g)
        for idx in np.ndindex(g.shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            fd[idx] = (f(plus) - f(minus)) / (2 * eps)
        assert np.abs(fd).max() > 0.01, f"{name}: a degenerate case tests nothing"
        # the backward recomputes P from a float32 LSE: ~1e-7 relative
        np.testing.assert_allclose(g, fd, atol=1e-6 * max(1.0, np.abs(fd).max()), err_msg=name)


# ----------------------------------------------------------------- what RECT never builds
def test_rect_ledger_has_no_concat_or_expanded_k_rope():
    B, H, S = 1, 4, 32
    args, do = operands(B, H, S, S, seed=4)
    base = mla.mla_forward(*args, dataflow="baseline")
    rect = mla.mla_forward(*args, dataflow="rect")
    # baseline: the per-head k_rope copy and the 192-wide Q, K, V, O are in its ledger
    written = [shape for s in base.ledger for shape in s.writes.values()]
    assert (B, H, S, DR) in written and (B, H, S, DN + DR) in written
    # rect: one step, whose operands are the native arrays and whose only allocations are O, LSE
    (step,) = rect.ledger
    assert step.name == "flash attention"
    assert step.reads == {"q": (B, H, S, DN), "k": (B, H, S, DN), "v": (B, H, S, DV),
                          "q_rope": (B, H, S, DR), "k_rope": (B, 1, S, DR)}
    assert step.allocated == rect.o.nbytes + rect.lse.nbytes and step.workspace == 0
    # backward: no split, no head sum; dk_rope comes out with the one shared head
    grads, ledger = mla.mla_backward(do, rect)
    (bstep,) = ledger
    assert bstep.writes["dk_rope"] == (B, 1, S, DR)
    assert bstep.allocated == sum(g.nbytes for g in grads)
    assert all(DN + DR not in shape for shape in list(bstep.reads.values()) + list(bstep.writes.values()))
    # the one per-head rope-sized buffer left: the kernel's deterministic partial sums of dk_rope
    assert bstep.workspace == B * H * S * DR * 4


def test_kernel_receives_the_callers_arrays(monkeypatch):
    """Spy on the kernel API: RECT hands it the caller's own arrays (no copy at all, shared
    k_rope with one head); the baseline hands it 192-wide concatenations."""
    calls = []
    real_fwd, real_bwd = api.flash_attention, api.flash_attention_backward

    def spy_fwd(q, k, v, **kw):
        calls.append(("fwd", q, k, v, kw.get("q_rope"), kw.get("k_rope")))
        return real_fwd(q, k, v, **kw)

    def spy_bwd(do, q, k, v, o, lse, **kw):
        calls.append(("bwd", q, k, v, kw.get("q_rope"), kw.get("k_rope")))
        return real_bwd(do, q, k, v, o, lse, **kw)

    monkeypatch.setattr(api, "flash_attention", spy_fwd)
    monkeypatch.setattr(api, "flash_attention_backward", spy_bwd)
    args, do = operands(1, 4, 16, 16, seed=5)
    mla.mla_backward(do, mla.mla_forward(*args, dataflow="rect"))
    assert [c[0] for c in calls] == ["fwd", "bwd"]
    for call in calls:
        assert all(passed is given for passed, given in zip(call[1:], args)), call[0]
    calls.clear()
    mla.mla_backward(do, mla.mla_forward(*args, dataflow="baseline"))
    for call in calls:
        assert call[1].shape[-1] == DN + DR and call[3].shape[-1] == DN + DR
        assert call[2].shape[1] == 4 and call[4] is None
    # split RoPE alone: the caller's q_nope, k_nope and rope pair (one shared head), V padded
    calls.clear()
    mla.mla_backward(do, mla.mla_forward(*args, dataflow="split_rope"))
    assert [c[0] for c in calls] == ["fwd", "bwd"]
    for call in calls:
        assert call[1] is args[0] and call[2] is args[1] and call[4] is args[3] and call[5] is args[4]
        assert call[3].shape[-1] == DN + DR and np.array_equal(call[3][..., :DV], args[2])
        assert not call[3][..., DV:].any()


def test_split_rope_ledger_is_pad_kernel_slice():
    """split_rope: the baseline's pad V and slice O around RECT's kernel call (no expand, no
    concat); backward: pad dO, the kernel, slice dV (no split, no head sum)."""
    B, H, S = 1, 4, 32
    args, do = operands(B, H, S, S, seed=7)
    fwd = mla.mla_forward(*args, dataflow="split_rope")
    assert [s.name for s in fwd.ledger] == ["pad V", "flash attention", "slice O"]
    kernel = fwd.ledger[1]
    assert kernel.reads == {"q": (B, H, S, DN), "k": (B, H, S, DN), "v": (B, H, S, DN + DR),
                            "q_rope": (B, H, S, DR), "k_rope": (B, 1, S, DR)}
    assert kernel.writes["o"] == (B, H, S, DN + DR) and fwd.o.shape == (B, H, S, DV)
    # the kernel does the baseline's matmuls: QK^T over D, PV over the padded D
    base = mla.mla_forward(*args, dataflow="baseline")
    assert kernel.matmuls == next(s for s in base.ledger if s.name == "flash attention").matmuls
    grads, ledger = mla.mla_backward(do, fwd)
    assert [s.name for s in ledger] == ["pad dO", "flash attention backward", "slice dV"]
    assert ledger[1].writes["dk_rope"] == (B, 1, S, DR) and grads[4].shape == (B, 1, S, DR)
    with pytest.raises(ValueError, match="split_rope dataflow pads V"):
        mla.mla_forward(*operands(1, 2, 8, 8, dn=8, dr=4, dv=16)[0], dataflow="split_rope")


@pytest.mark.parametrize("dataflow", mla.DATAFLOWS)
def test_ledger_memory_is_what_is_really_allocated(dataflow):
    """The traced peak of each dataflow equals the ledger's prediction (every allocation kept
    until the dataflow returns, plus the workspace of the step running) within a slack for
    the kernels' per-tile buffers. One Numba thread and 16-row blocks keep those small; the
    per-head k_rope copy (and RECT's dk_rope partials) are 512 KiB here, far above the slack."""
    B, H, S = 1, 4, 512
    args, do = operands(B, H, S, S, seed=6)
    blocks = dict(block_q=16, block_k=16)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        fwd = mla.mla_forward(*args, dataflow=dataflow, **blocks)      # warm up (load the JIT cache)
        mla.mla_backward(do, fwd)
        fwd, peak_fwd = traced_peak(mla.mla_forward, *args, dataflow=dataflow, **blocks)
        (_, ledger_bwd), peak_bwd = traced_peak(mla.mla_backward, do, fwd)
    finally:
        numba.set_num_threads(threads)
    # kernel scratch: per-tile buffers (~100 KiB for 16-row blocks), row max and tile counts
    slack = 128 * 1024 + 16 * B * H * S
    assert (B * H * S * DR * 4) > 2 * slack
    for what, ledger, peak in (("forward", fwd.ledger, peak_fwd), ("backward", ledger_bwd, peak_bwd)):
        predicted = mla.ledger_peak(ledger)
        assert predicted <= peak <= predicted + slack, (
            f"{dataflow} {what}: traced peak {peak} vs ledger {predicted} (+ slack {slack})")


def test_ledger_peak_and_total():
    steps = [mla.Step("a", 1, 10, 100, 100), mla.Step("b", 2, 20, 5, 5, workspace=300),
             mla.Step("c", 3, 30, 50, 50)]
    # peak: a (100), then b's output plus its workspace (100 + 5 + 300), then all (155)
    assert mla.ledger_peak(steps) == 405
    summed = total(steps)
    assert (summed.flops, summed.bytes_read, summed.bytes_written, summed.allocated,
            summed.workspace) == (6, 60, 155, 155, 300)
    text = mla.format_ledger(steps)
    assert text.splitlines()[-1].startswith("total")


def test_rect_allows_v_wider_than_qk_but_baseline_cannot_pad_to_it():
    args, do = operands(1, 2, 8, 8, dn=16, dr=8, dv=32, seed=7)
    fwd = mla.mla_forward(*args, dataflow="rect")
    ref_o, _ = flashlab.attention_reference(*args[:3], q_rope=args[3], k_rope=args[4])
    assert max_abs_err(fwd.o, ref_o) < 1e-5
    with pytest.raises(ValueError, match="pads V"):
        mla.mla_forward(*args, dataflow="baseline")


def _bad(**change):
    args, _ = operands(1, 4, 8, 8, dn=16, dr=8, dv=16, seed=8)
    names = ("q_nope", "k_nope", "v", "q_rope", "k_rope")
    kw = dict(zip(names, args))
    kw.update(change)
    return lambda: mla.mla_forward(*(kw[n] for n in names), **{k: v for k, v in kw.items() if k not in names})


@pytest.mark.parametrize("call, exc, match", [
    (_bad(dataflow="fused"), ValueError, "dataflow must be one of"),
    (_bad(q_nope=np.zeros((1, 4, 8, 16), dtype=np.float16)), TypeError, "float32 or float64"),
    (_bad(v=np.zeros((1, 4, 8, 16))), TypeError, "share one dtype"),
    (_bad(k_rope=np.zeros((1, 3, 8, 8), dtype=np.float32)), ValueError, "multiple of k_rope's heads"),
    (_bad(k_rope=np.zeros((1, 1, 8, 4), dtype=np.float32)), ValueError, "k_rope must have shape"),
    (_bad(k_nope=np.zeros((1, 2, 8, 16), dtype=np.float32)), ValueError, "k_nope must have shape"),
    (_bad(v=np.zeros((1, 4, 9, 16), dtype=np.float32)), ValueError, "v must have shape"),
    (_bad(q_rope=[[1.0]]), TypeError, "q_rope must be a numpy.ndarray"),
    (_bad(q_nope=np.zeros((4, 8, 16), dtype=np.float32)), ValueError, "4 dims"),
])
def test_bad_inputs_raise(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_bad_backward_inputs_raise():
    args, do = operands(1, 2, 8, 8, dn=16, dr=8, dv=16, seed=9)
    fwd = mla.mla_forward(*args)
    with pytest.raises(ValueError, match="output's shape"):
        mla.mla_backward(do[..., :8], fwd)
    with pytest.raises(TypeError, match="output's dtype"):
        mla.mla_backward(do.astype(np.float64), fwd)
    with pytest.raises(TypeError, match="MLAForward"):
        mla.mla_backward(do, fwd.o)
