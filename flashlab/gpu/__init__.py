"""flashlab.gpu: a Numba CUDA twin of the FlashAttention kernels, with its memory traffic counted.

- :func:`flash_attention_gpu`, :func:`flash_attention_backward_gpu`: the fused forward and
  backward (:mod:`flashlab.gpu.forward`, :mod:`flashlab.gpu.backward`);
- :func:`standard_attention_gpu`: the three-kernel baseline (:mod:`flashlab.gpu.standard`);
- with ``count_traffic=True`` each also returns its global-memory requests (bytes loaded and
  stored by the threads) as a :class:`flashlab.traffic.Traffic`, counted by an instrumented
  build; what reaches DRAM is less (:mod:`flashlab.gpu.traffic`).

They run on a CUDA GPU when one is present and in Numba's CUDA simulator otherwise
(:mod:`flashlab.gpu.target` says how the choice is made). ``python -m flashlab.gpu.bench``
times them on a GPU. Importing :mod:`flashlab` never imports this package; importing this
package imports ``numba.cuda`` only when one of the names below is first used.
"""
from __future__ import annotations

import importlib

__all__ = ["flash_attention_gpu", "flash_attention_backward_gpu", "standard_attention_gpu"]

_WHERE = {"flash_attention_gpu": "attention", "flash_attention_backward_gpu": "attention",
          "standard_attention_gpu": "attention"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"flashlab.gpu.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'flashlab.gpu' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
