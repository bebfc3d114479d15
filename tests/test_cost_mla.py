"""flashlab.ledgers' MLA closed forms against the ledger flashlab.mla measures on real arrays.

The ledger counts bytes with ``nbytes`` of the arrays each step really read and wrote, FLOPs
from the arrays' shapes and the band the kernel applies; the closed forms must give the same
integers, step by step, for every dataflow, both directions, causal or not, Sq != Sk, float32
and float64, and shapes where the backward kernel needs partial sums for dK/dV too (B*H < 4).
"""
from __future__ import annotations

import numpy as np
import pytest

from flashlab import ledgers, mla
from flashlab.dataflows import COST_FIELDS, DATAFLOWS, total
from flashlab.masks import allowed, band_from

FIELDS = COST_FIELDS
#: (B, H, Sq, Sk, Dn, Dr, Dv): DeepSeek-V3's dims; odd dims with Sq != Sk; B*H < 4 (the
#: backward splits query blocks: dK/dV partials); one head (k_rope needs no head sum)
SIZES = [(1, 4, 16, 16, 128, 64, 128), (2, 3, 7, 12, 16, 8, 12), (1, 2, 70, 9, 8, 4, 8),
         (1, 1, 5, 5, 8, 4, 8)]


def run(size, dataflow, causal, dtype, block_q=16):
    B, H, Sq, Sk, dn, dr, dv = size
    rng = np.random.default_rng(0)
    shapes = [(B, H, Sq, dn), (B, H, Sk, dn), (B, H, Sk, dv), (B, H, Sq, dr), (B, 1, Sk, dr)]
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    fwd = mla.mla_forward(*args, dataflow=dataflow, causal=causal, block_q=block_q, block_k=8)
    _, bwd = mla.mla_backward(rng.standard_normal(fwd.o.shape).astype(dtype), fwd)
    return fwd.ledger, bwd


def as_tuple(step) -> tuple:
    return tuple(getattr(step, f) for f in FIELDS)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dataflow", DATAFLOWS)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_closed_forms_equal_the_ledger(size, dataflow, causal, dtype):
    B, H, Sq, Sk, dn, dr, dv = size
    elem = np.dtype(dtype).itemsize
    ledger_f, ledger_b = run(size, dataflow, causal, dtype)
    kw = dict(dataflow=dataflow, causal=causal, elem=elem, seq_k=Sk)
    closed_f = ledgers.mla_forward_steps(B, H, Sq, dn, dr, dv, **kw)
    closed_b = ledgers.mla_backward_steps(B, H, Sq, dn, dr, dv, block_q=16, **kw)
    assert [as_tuple(s) for s in ledger_f] == [as_tuple(c) for c in closed_f]
    assert [as_tuple(s) for s in ledger_b] == [as_tuple(c) for c in closed_b]
    for ledger, closed in ((ledger_f, closed_f), (ledger_b, closed_b)):
        assert as_tuple(total(ledger)) == as_tuple(total(closed))


def test_the_shapes_exercise_every_workspace_case():
    """RECT and split RoPE always need dk_rope partials (H > 1); B*H < 4 adds dK/dV partials to
    every flow."""
    def kernel_workspace(size, flow):
        steps = ledgers.mla_backward_steps(*size[:3], *size[4:], dataflow=flow, seq_k=size[3],
                                        block_q=16, elem=4)
        return next(s for s in steps if s.name == "flash attention backward").workspace

    ws = {size: {f: kernel_workspace(size, f) for f in DATAFLOWS} for size in SIZES}
    assert ws[SIZES[0]]["baseline"] == ws[SIZES[0]]["native_v"] == 0
    assert ws[SIZES[0]]["split_rope"] > 0 and ws[SIZES[0]]["rect"] > 0
    assert all(w > 0 for w in ws[SIZES[2]].values())
    assert set(ws[SIZES[3]].values()) == {0}


def test_split_rope_is_the_baselines_pad_and_slice_around_rects_kernel():
    """split_rope keeps the baseline's pad V / slice O (and their gradients) and drops its
    expand, concat, split and head sum; its kernel reads the one shared k_rope head like RECT's
    and does the baseline's FLOPs (V padded to D), its backward a tiny bit fewer (no head sum)."""
    args = (2, 16, 1024, 128, 64, 128)
    for fn in (ledgers.mla_forward_steps, ledgers.mla_backward_steps):
        flows = {f: {s.name: s for s in fn(*args, dataflow=f, causal=True)} for f in DATAFLOWS}
        kernel = next(n for n in flows["rect"])
        pad_slice = {n for n in flows["baseline"] if n.startswith(("pad", "slice"))}
        assert len(pad_slice) == 2
        assert set(flows["split_rope"]) == pad_slice | {kernel}
        for name in pad_slice:
            assert flows["split_rope"][name] == flows["baseline"][name]
        # the kernel: the baseline's matmul FLOPs, fewer bytes (no per-head K_rope, no 192-wide Q, K)
        split, base = flows["split_rope"][kernel], flows["baseline"][kernel]
        assert split.flops == base.flops
        assert split.bytes_read < base.bytes_read
    s = {f: total(ledgers.mla_forward_steps(*args, dataflow=f, causal=True))
         for f in DATAFLOWS}
    # Q, K rows: D = 192 read either way; K_rope: one head instead of H (and no concat)
    assert s["baseline"].flops == s["split_rope"].flops > s["rect"].flops
    assert s["baseline"].bytes_read > s["split_rope"].bytes_read > s["rect"].bytes_read


@pytest.mark.parametrize("sq, sk", [(1, 1), (5, 5), (5, 3), (3, 5), (64, 17)])
def test_attended_pairs_count_the_mask(sq, sk):
    for causal in (False, True):
        left, right = band_from(causal)
        assert ledgers.attended_pairs(sq, sk, causal) == int(allowed(sq, sk, left, right).sum())


def test_savings_for_deepseek_dims():
    """Padding V 128 -> 192 makes PV 1.5x; the forward's matmuls 2(192 + 192) / 2(192 + 128)
    = 1.2x and the backward's (3*192 + 2*192) / (3*192 + 2*128) = 960/832; splitting RoPE
    saves no matmul FLOPs (only the tiny head sum) but bytes and memory."""
    s = ledgers.mla_savings(2, 16, 1024, 128, 64, 128, causal=True)
    native, split, both = (s[k] for k in ledgers.MLA_IDEAS)
    assert native["PV FLOPs"] == 1.5 and split["PV FLOPs"] == 1.0
    assert native["forward FLOPs"] == pytest.approx(384 / 320, rel=1e-12)
    # (both dataflows also do the small head sum of dk_rope)
    assert native["backward FLOPs"] == pytest.approx(960 / 832, rel=1e-4)
    assert split["forward FLOPs"] == 1.0
    assert 1.0 < split["backward FLOPs"] < 1.001
    for idea in (native, split, both):
        assert all(v >= 1.0 for v in idea.values()), idea
    for q in both:
        assert both[q] == pytest.approx(native[q] * split[q], rel=1e-12)
    assert split["forward bytes"] > 2 and both["forward memory"] > 5


def test_savings_equal_the_ratios_of_measured_ledgers():
    size = (1, 4, 16, 16, 128, 64, 128)
    totals = {}
    for flow in DATAFLOWS:
        f, b = (total(x) for x in run(size, flow, True, np.float32))
        totals[flow] = {"forward FLOPs": f.flops, "backward FLOPs": b.flops,
                        "forward bytes": f.bytes_read + f.bytes_written,
                        "backward bytes": b.bytes_read + b.bytes_written,
                        "forward memory": f.allocated + f.workspace,
                        "backward memory": b.allocated + b.workspace,
                        "PV FLOPs": f.matmuls["O = PV"]}
    s = ledgers.mla_savings(1, 4, 16, 128, 64, 128, causal=True, elem=4, block_q=16)
    for idea, (before, after) in ledgers.MLA_IDEAS.items():
        for q, factor in s[idea].items():
            assert factor == pytest.approx(totals[before][q] / totals[after][q], rel=1e-12), (idea, q)


@pytest.mark.parametrize("call, error, match", [
    (lambda: ledgers.mla_forward_steps(1, 2, 8, 16, 8, 16, dataflow="fused"), ValueError,
     "dataflow must be one of"),
    (lambda: ledgers.mla_forward_steps(1, 2, 8.0, 16, 8, 16), TypeError, "seq must be an int"),
    (lambda: ledgers.mla_backward_steps(1, 0, 8, 16, 8, 16), ValueError, "heads must be >= 1"),
    (lambda: ledgers.mla_forward_steps(1, 2, 8, 16, 8, 32, dataflow="baseline"), ValueError, "d_v must be <="),
    (lambda: ledgers.mla_backward_steps(1, 2, 8, 16, 8, 32, dataflow="split_rope"), ValueError,
     "d_v must be <="),
    (lambda: ledgers.mla_backward_steps(1, 2, 8, 16, 8, 16, block_q=0), ValueError, "block_q must be >= 1"),
])
def test_bad_sizes_raise(call, error, match):
    """TypeError for a wrong type, ValueError for a wrong value (flashlab.arguments.as_int)."""
    with pytest.raises(error, match=match):
        call()
