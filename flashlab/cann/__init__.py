"""The Ascend CANN operator ``FlashAttentionScore`` and its grad, on flashlab's kernels.

- :mod:`~flashlab.cann.attributes` — the operator's constants and integer-attribute checks;
- :mod:`~flashlab.cann.layouts` — BSH/SBH/BSND/BNSD/TND and the canonical (B, N, S, D) view;
- :mod:`~flashlab.cann.varlen` — TND's packed sequences (cumulative ends, row slicing);
- :mod:`~flashlab.cann.sparse_modes` — ``sparse_mode`` 0..8 as bands (:data:`SPARSE_MODES`);
- :mod:`~flashlab.cann.plan` — the mask arguments turned into kernel calls (:func:`plan`);
- :mod:`~flashlab.cann.pse` — ``pse``/``pse_type``: bias tensors and ALiBi slopes;
- :mod:`~flashlab.cann.operator` — :func:`flash_attention_score` and its grad (the full
  description of the interface is that module's docstring), and :func:`npu_fusion_attention`,
  the same forward with torch_npu's seven outputs.

**What this door checks: nothing of its own but the operator's ranges.** It translates the
operator's layouts (BSH/SBH/BSND/BNSD/TND) and names (``query``, ``keep_prob``,
``actual_seq_qlen``, ...) and hands them to :mod:`flashlab.validation`, whose rules
(:func:`~flashlab.validation.operands` with a :class:`~flashlab.validation.Door` per layout,
:func:`~flashlab.validation.check_dropout`, :func:`~flashlab.validation.packed_sequences`, ...)
check every entry point alike and name the argument as the operator does. What stays here is
the vendor's contract, which has no meaning elsewhere: ``head_num`` and ``D`` ranges,
``sparse_mode`` and the ``pre_tokens``/``next_tokens``/``prefix`` ranges with the device
tiling's TND checks (:mod:`~flashlab.cann.plan`), ``pse``/``pse_type``, the softmax statistics.
``tests/test_door_checks.py`` lists each of those checks and fails on any other.
"""
from flashlab.cann.attributes import INT32_MAX, LAYOUTS, SOFTMAX_REPEAT
from flashlab.cann.layouts import Dims, from_bnsd, layout_shape, to_bnsd
from flashlab.cann.operator import (
    flash_attention_score,
    flash_attention_score_grad,
    lse_from_stats,
    npu_fusion_attention,
)
from flashlab.cann.plan import Call, plan, sparse_mode_mask
from flashlab.cann.sparse_modes import (
    CANN_COMPRESSED,
    SPARSE_MODES,
    SparseMode,
    compressed_mask,
    prefix_mask,
    sparse_mode_band,
    varlen_sequence_mode,
)
from flashlab.masks import NO_LIMIT

__all__ = ["flash_attention_score", "flash_attention_score_grad", "lse_from_stats",
           "npu_fusion_attention",
           "sparse_mode_mask", "plan", "Call", "Dims", "to_bnsd", "from_bnsd", "layout_shape",
           "LAYOUTS", "INT32_MAX", "SOFTMAX_REPEAT",
           "CANN_COMPRESSED", "SPARSE_MODES", "SparseMode", "compressed_mask", "prefix_mask",
           "sparse_mode_band", "varlen_sequence_mode", "NO_LIMIT"]
