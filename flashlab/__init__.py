"""flashlab: FlashAttention and the Ascend RECT-FA optimizations, in Numba, for a teaching book.

Public API (see DESIGN.md):

- :func:`attention_reference` — float64 naive attention, the truth.
- :func:`flash_attention` — the tiled online-softmax forward kernel.
"""
from flashlab.api import flash_attention, tiles_computed
from flashlab.reference import attention_naive, attention_reference, attention_reference_backward

__all__ = ["flash_attention", "tiles_computed", "attention_reference", "attention_naive",
           "attention_reference_backward"]
__version__ = "0.1.0"
