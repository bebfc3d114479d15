"""The Ascend CANN operator ``FlashAttentionScore`` and its grad, on flashlab's kernels.

- :mod:`~flashlab.cann.attributes` — the operator's constants and integer-attribute checks;
- :mod:`~flashlab.cann.layouts` — BSH/SBH/BSND/BNSD/TND and the canonical (B, N, S, D) view;
- :mod:`~flashlab.cann.varlen` — TND's packed sequences (cumulative ends, row slicing);
- :mod:`~flashlab.cann.sparse_modes` — ``sparse_mode`` 0..8 as bands (:data:`SPARSE_MODES`);
- :mod:`~flashlab.cann.plan` — the mask arguments turned into kernel calls (:func:`plan`);
- :mod:`~flashlab.cann.pse` — ``pse``/``pse_type``: bias tensors and ALiBi slopes;
- :mod:`~flashlab.cann.operator` — :func:`flash_attention_score` and its grad (the full
  description of the interface is that module's docstring).
"""
from flashlab.cann.attributes import INT32_MAX, LAYOUTS, SOFTMAX_REPEAT
from flashlab.cann.layouts import Dims, from_bnsd, layout_shape, to_bnsd
from flashlab.cann.operator import flash_attention_score, flash_attention_score_grad, lse_from_stats
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
           "sparse_mode_mask", "plan", "Call", "Dims", "to_bnsd", "from_bnsd", "layout_shape",
           "LAYOUTS", "INT32_MAX", "SOFTMAX_REPEAT",
           "CANN_COMPRESSED", "SPARSE_MODES", "SparseMode", "compressed_mask", "prefix_mask",
           "sparse_mode_band", "varlen_sequence_mode", "NO_LIMIT"]
