"""The front doors check nothing of their own: every ``raise ValueError``/``raise TypeError`` in
:mod:`flashlab.compat`, :mod:`flashlab.torch_attention` and :mod:`flashlab.cann` is listed here,
function by function, with the reason it belongs to that door and not to
:mod:`flashlab.validation`.

A door that grows its own check again (a new ``raise`` in a function not listed, or one more in
a listed function) fails :func:`test_doors_raise_only_what_is_listed`: move the rule into
``validation`` (called with the door's names, see :class:`flashlab.validation.Door`) or, for a
vendor range the CANN operator alone enforces, list it here with its reason. A listed raise
that disappears fails too, so that the list stays the truth.
"""
from __future__ import annotations

import ast
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import flashlab
from flashlab import cann

ROOT = Path(__file__).resolve().parent.parent / "flashlab"
DOOR_MODULES = ["compat.py", "torch_attention.py"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "cann").glob("*.py"))

#: (module, function) -> (number of ValueError/TypeError raises, why the door keeps them)
ALLOWED: dict[tuple[str, str], tuple[int, str]] = {
    ("compat.py", "_unpack_qkv"): (1, "qkv's axis 2 holds q, k, v: flash_attn's packed layout "
                                      "(batch_size, seqlen, 3, nheads, headdim)"),
    # torch: what numpy cannot see
    ("torch_attention.py", "_numpy"): (4, "a torch.Tensor, on the CPU, of a dtype numpy can hold"),
    ("torch_attention.py", "_attention"): (2, "q, k, v, alibi_slopes are torch tensors (before the op)"),
    # CANN: the operator's attribute types and layouts
    ("cann/attributes.py", "int64"): (1, "the operator's int64 attribute range"),
    ("cann/attributes.py", "int64_list"): (2, "the operator's int64 list attributes (prefix)"),
    ("cann/layouts.py", "to_bnsd"): (1, "an input_layout this reader does not know (internal)"),
    ("cann/layouts.py", "from_bnsd"): (1, "an input_layout this writer does not know (internal)"),
    ("cann/layouts.py", "split_hidden"): (1, "reading BSH/SBH: H = N * D must divide"),
    ("cann/layouts.py", "layout_name"): (1, "input_layout's values in any case: op-plugin upper-cases "
                                            "it (toupper, 'BSH/SBH/BNSD/BSND/TND(case-insensitive)'); "
                                            "the PTA documents list capitals only: the source is followed"),
    ("cann/layouts.py", "canonical"): (4, "head_num 1..256, the query's heads = head_num, D 1..768, "
                                          "D_v <= D: the operator's ranges"),
    ("cann/operator.py", "_check_options"): (1, "inner_precise 0..2 (the operator's attribute)"),
    ("cann/operator.py", "_setup"): (3, "softmax_layout and actual_seq_* belong to TND only"),
    ("cann/operator.py", "_rope_operands"): (2, "Dr % 8 == 0 and Dr <= D (the operator's rule); the "
                                                "RoPE inputs need atten_mask (PTA docs as issue 34 "
                                                "reports them; the line was not located, see "
                                                "DOCS_VS_SOURCE)"),
    ("cann/operator.py", "_softmax_operand"): (3, "the operator's softmax statistics [..., 8] float32"),
    ("cann/operator.py", "lse_from_stats"): (1, "a softmax row of the operator's statistics"),
    ("cann/operator.py", "flash_attention_score_grad"): (1, "softmax_in, the operator's reserved input"),
    # CANN: the vendor's mask and pse contract (sparse modes, token ranges, the device's TND checks)
    ("cann/plan.py", "tnd_seq"): (1, "internal: a call without a TND sequence"),
    ("cann/plan.py", "_as_bool_mask"): (2, "atten_mask: bool or uint8, the operator's dtypes"),
    ("cann/plan.py", "_check_compressed"): (2, "the compressed 2048x2048 / 3072x2048 mask"),
    ("cann/plan.py", "_full_mask"): (3, "atten_mask shapes per sparse_mode"),
    ("cann/plan.py", "_prefix_list"): (3, "prefix of modes 5/6"),
    ("cann/plan.py", "_check_mode0_range"): (2, "mode 0 pre/next token ranges"),
    ("cann/plan.py", "plan"): (1, "sparse_mode 0..8"),
    ("cann/plan.py", "_check_mode_for_layout"): (2, "modes 5, 7, 8 and the layout"),
    ("cann/plan.py", "_check_prefix_batch"): (1, "prefix modes 5/6: B <= 32 (PTA documents, "
                                                "\"prefix稀疏计算场景B不大于32\")"),
    ("cann/plan.py", "_check_band_tokens"): (1, "pre_tokens + next_tokens >= 0"),
    ("cann/plan.py", "_checked_mask"): (2, "mode 5's prefix mask"),
    ("cann/plan.py", "_check_split_modes"): (6, "the device's TND checks of modes 3, 7, 8"),
    ("cann/plan.py", "_check_tnd_ranges"): (5, "the device's TND checks of modes 0, 4"),
    ("cann/plan.py", "_check_consistent"): (1, "a mode-0 atten_mask that contradicts pre/next tokens"),
    ("cann/pse.py", "_start_idx"): (1, "q_start_idx/kv_start_idx of pse_type 2/3"),
    ("cann/pse.py", "pse_setup"): (13, "pse_type and the pse shapes and dtypes the operator takes"),
    ("cann/pse.py", "check_alibi_cover"): (2, "the ALiBi-compressed pse covers the band"),
    ("cann/sparse_modes.py", "compressed_mask"): (1, "the compressed-mask modes"),
    ("cann/sparse_modes.py", "sparse_mode_band"): (3, "sparse_mode's band rules"),
}


#: Where the documents and the source say different things, flashlab follows the source; each
#: entry: (what the documents say, what the source does, what flashlab does), both cited.
#: Sources: op-plugin op_plugin/ops/opapi/FlashAttentionKernelNpuOpApi.cpp@0606d3f1 (torch_npu's
#: npu_fusion_attention), op_plugin/ops/opapi/FlashAttentionV2KernelNpuOpApi.cpp@21d1b56e (the
#: form with query_rope/key_rope), ops-transformer flash_attention_score tiling (AnalyzeTndLayout);
#: documents: op-plugin docs/context/torch_npu-npu_fusion_attention.md@3ec6c1fc (PTA).
DOCS_VS_SOURCE = {
    "input_layout case": (
        "PTA: \"支持BSH、SBH、BSND、BNSD、TND\" (upper case only)",
        "op-plugin: \"for (auto &c : input_layout_str) { c = toupper(c); }\" then \"The input_layout "
        "should be BSH/SBH/BNSD/BSND/TND(case-insensitive)\"",
        "any case accepted (flashlab.cann.layouts.layout_name)"),
    "TND token count": (
        "PTA: \"要求T（B*S）取值范围1~1M\" and cumulative ends such as \"2 4 6 8 10\" (T = the sum)",
        "tiling: \"OP_CHECK_IF(t1Size < accumS1 || t2Size < accumS2, ... Query T(%ld) and key T(%ld) "
        "need larger than respectively sum of seqLen\" (T >= the sum)",
        "T >= the last end accepted; rows after it: out 0, no-key statistics, zero gradients"),
    "prefix batch": (
        "PTA: \"prefix稀疏计算场景B不大于32\"",
        "op-plugin passes prefix through unchecked (the check is the documents')",
        "B <= 32 checked for modes 5/6 (plan._check_prefix_batch)"),
    "RoPE atten_mask": (
        "PTA, as issue 34 reports it: the RoPE inputs require atten_mask (the line was not found "
        "in the PTA page at 3ec6c1fc, which does not describe query_rope at all)",
        "op-plugin's npu_fusion_attention_common checks no atten_mask for the RoPE inputs; on SoCs "
        "before Ascend910_95 (A2/A3) key_rope needs actual_seq_qlen/actual_seq_kvlen: \"the size of "
        "actual_seq_qlen and actual_seq_kvlen cannot be empty.\" (TND only)",
        "the documented rule is checked: query_rope/key_rope without atten_mask are refused "
        "(operator._rope_operands); every layout is accepted with RoPE, as Ascend910_95's path does"),
}


def raises_by_function(path: Path) -> Counter:
    """``{top-level function: number of raise ValueError/TypeError in it}`` (nested functions
    count for the function around them; a raise at module level counts as ``<module>``)."""
    counts: Counter = Counter()

    def walk(node, owner):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, child.name if owner == "<module>" else owner)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError"):
                    counts[owner] += 1
            walk(child, owner)

    walk(ast.parse(path.read_text(), filename=str(path)), "<module>")
    return counts


def found() -> dict[tuple[str, str], int]:
    return {(module, fn): n for module in DOOR_MODULES
            for fn, n in raises_by_function(ROOT / module).items()}


def test_doors_raise_only_what_is_listed():
    have = found()
    extra = {key: n for key, n in have.items() if n != ALLOWED.get(key, (0, ""))[0]}
    gone = {key for key in ALLOWED if key not in have}
    assert not extra, (f"a front door raises ValueError/TypeError where the list does not say it may "
                       f"(move the rule into flashlab.validation, or list the vendor range): {extra}")
    assert not gone, f"listed raises no longer in the code (update ALLOWED): {gone}"


def test_the_walker_sees_a_new_check():
    """The walker is able to fail: a door function with its own check is counted."""
    src = ("def door(q):\n    if q.ndim != 4:\n        raise ValueError('q')\n"
           "    def inner():\n        raise TypeError('x')\n    return inner\n")
    path = Path(__file__).with_name("_door_probe.py")
    try:
        path.write_text(src)
        assert raises_by_function(path) == Counter({"door": 2})
    finally:
        path.unlink()


def test_compat_and_torch_import_no_checks_of_their_own():
    """compat's old private checks are gone: the door calls validation's rules."""
    from flashlab import compat
    for name in ("_array", "_same_dtype", "_heads", "_check_padded", "_cu_seqlens", "_max_seqlen"):
        assert not hasattr(compat, name), name
    assert not hasattr(cann.layouts, "operand_array")


# --------------------------------------------------------------- issue 22, point 6 leftover
def test_mode2_with_default_tokens_does_not_warn():
    """The device's OP_LOGW that resets pre/next tokens for sparse modes 1-3 is not reproduced
    (documented in flash_attention_score's docstring): the default mode-2 call is silent."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 6, 8)).astype(np.float32) for _ in range(3))
    tri = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
    ref = flashlab.attention_reference(q, k, v, scale=0.5, causal=True)[0]
    for mode, kw in ((1, dict(atten_mask=np.zeros((6, 6), bool))), (2, dict(atten_mask=tri)),
                     (3, dict(atten_mask=tri))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = cann.flash_attention_score(q, k, v, 2, "BNSD", scale=0.5, sparse_mode=mode, **kw)[0]
        if mode in (2, 3):      # Sq == Sk: both causal
            np.testing.assert_allclose(out, ref, atol=1e-5)
    assert "OP_LOGW" in cann.flash_attention_score.__doc__


@pytest.mark.parametrize("module", DOOR_MODULES)
def test_every_door_module_is_listed_or_clean(module):
    """Every door module parses and its raises are all in :data:`ALLOWED` (one line per module
    in the report, so a failure names the file)."""
    counts = raises_by_function(ROOT / module)
    for fn, n in counts.items():
        assert ALLOWED.get((module, fn), (0, ""))[0] == n, f"{module}:{fn} raises {n} ValueError/TypeError"


# ------------------------------------------------------------------- issue 34, point 5
def test_docs_vs_source_follow_the_source():
    """The two rules where the documents and the source differ behave as the source does."""
    assert set(DOCS_VS_SOURCE) >= {"input_layout case", "TND token count"}
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((7, 2, 8)).astype(np.float32) for _ in range(3))
    lens = dict(actual_seq_qlen=[2, 5], actual_seq_kvlen=[3, 5])    # T = 7 > 5
    lower = cann.flash_attention_score(q, k, v, 2, "tnd", **lens)
    upper = cann.flash_attention_score(q, k, v, 2, "TND", **lens)
    for a, b in zip(lower, upper):
        np.testing.assert_array_equal(a, b)
    assert (upper[0][5:] == 0).all()
