"""flashlab: FlashAttention and the Ascend RECT-FA optimizations, in Numba, for a teaching book.

Public API:

- :func:`attention_reference` — float64 naive attention, the truth;
  :func:`attention_reference_backward` its analytic gradients;
  :func:`attention_naive` the same algorithm in the inputs' dtype (the numpy baseline).
- :func:`flash_attention` — the tiled online-softmax forward kernel;
  :func:`flash_attention_backward` — the tiled backward with recomputation from the LSE;
  :func:`tiles_computed` — how many tiles the forward really computes (tile skipping).
- :func:`flash_attention_score` / :func:`flash_attention_score_grad` — the CANN
  ``FlashAttentionScore`` operator's interface (layouts, sparse_mode, softmax_max/sum).

Submodules: ``masks`` (the mask model), ``dropout`` (the counter-based dropout mask),
``compat`` (flash_attn's ``flash_attn_func``/``flash_attn_varlen_func`` on numpy arrays),
``torch_attention`` (an autograd Function, needs torch), ``flops``, ``traffic`` and ``ledgers`` (the
closed-form FLOP counts, main-memory traffic and MLA step ledgers), ``walk``
(the forward one tile at a time), ``pipeline`` (hardware profiles), ``viz`` (drawings),
``widgets`` (the tile and pipeline explorers; their live controls need ipywidgets),
``bench`` (``python -m flashlab.bench``), ``numba_cache`` (where compiled kernels are cached;
read-only installs).
"""
from typing import TYPE_CHECKING

from flashlab._lazy import lazy_face

#: where each public name lives; imported on first use (PEP 562), so that ``import flashlab``
#: and ``import flashlab.pipeline`` do not load Numba
_EXPORTS = {
    "flashlab.api": ("flash_attention", "flash_attention_backward", "tiles_computed"),
    "flashlab.cann": ("flash_attention_score", "flash_attention_score_grad"),
    "flashlab.reference": ("attention_reference", "attention_naive", "attention_reference_backward"),
}
__all__ = ["flash_attention", "flash_attention_backward", "tiles_computed",
           "flash_attention_score", "flash_attention_score_grad",
           "attention_reference", "attention_naive", "attention_reference_backward"]
__version__ = "0.1.0"
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers and readers
    from flashlab.api import flash_attention, flash_attention_backward, tiles_computed
    from flashlab.cann import flash_attention_score, flash_attention_score_grad
    from flashlab.reference import attention_naive, attention_reference, attention_reference_backward
