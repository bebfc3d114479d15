"""The operator's constants and the checks of its integer attributes.

Integer attributes are int64 on the device (:func:`int64`, :func:`int64_list`); offsets beyond
any length act as unbounded (:func:`clamp_tokens`). bfloat16 operands are read in float32
(:func:`as_compute`).
"""
from __future__ import annotations

import numpy as np

from flashlab.arguments import as_int
from flashlab.masks import NO_LIMIT

__all__ = ["LAYOUTS", "INT32_MAX", "INT64_MIN", "INT64_MAX", "SOFTMAX_REPEAT", "EMPTY_ROW_MAX",
           "EMPTY_ROW_SUM", "MAX_HEADS", "MAX_HEAD_DIM", "ALIBI_ROWS", "SOFTMAX_LAYOUTS",
           "FLOAT_NAMES", "is_bf16", "as_compute", "int64", "int64_list", "clamp_tokens"]

#: the input layouts the operator accepts
LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")

#: the operator's default ``pre_tokens``/``next_tokens`` (INT32_MAX: unbounded)
INT32_MAX = 2147483647

#: the range of the operator's int64 attributes
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

#: softmax_max / softmax_sum repeat each row's value this many times (32 bytes of float32)
SOFTMAX_REPEAT = 8

#: The values the operator writes into softmax_max and softmax_sum for a row with no allowed
#: key (the device's invalid-row path): float32's lowest and largest numbers.
EMPTY_ROW_MAX = float(np.finfo(np.float32).min)
EMPTY_ROW_SUM = float(np.finfo(np.float32).max)

#: the documented limits "N：取值范围为1~256" and "D：取值范围为1~768"
MAX_HEADS = 256
MAX_HEAD_DIM = 768

#: rows of the ALiBi-compressed pse ("只需要输入原始PSE最后1024行")
ALIBI_ROWS = 1024

#: ``softmax_layout`` values: "" (the default, NTD in TND) and "TND"
SOFTMAX_LAYOUTS = ("", "TND")

FLOAT_NAMES = ("float16", "float32", "float64", "bfloat16")


def is_bf16(dtype: np.dtype) -> bool:
    """bfloat16 arrays exist only once ``ml_dtypes`` is imported; recognised by name."""
    return np.dtype(dtype).name == "bfloat16"


def as_compute(x: np.ndarray) -> np.ndarray:
    """bfloat16 -> float32 (the kernels' dtype for it); other dtypes unchanged."""
    return x.astype(np.float32) if is_bf16(x.dtype) else x


def int64(name: str, x) -> int:
    """An int64 attribute: a Python or NumPy integer (never a bool) in [-2**63, 2**63 - 1]."""
    v = as_int(name, x, what="an int (Python or numpy integer)")
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"{name} must fit in int64 (the operator's attribute type, "
                         f"[-2**63, 2**63 - 1]); got {v}")
    return v


def int64_list(name: str, x) -> list[int]:
    """An int64 list attribute (list, tuple or integer numpy array)."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers; got a numpy array of dtype {x.dtype}")
        items = x.reshape(-1).tolist()
    elif isinstance(x, (list, tuple)):
        items = list(x)
    else:
        raise TypeError(f"{name} must be a list of ints; got {x!r} of type {type(x).__name__}")
    return [int64(f"{name}[{i}]", v) for i, v in enumerate(items)]


def clamp_tokens(x: int) -> int:
    """pre/next tokens beyond any length act as unbounded: clamp into [-NO_LIMIT, NO_LIMIT]."""
    return max(-NO_LIMIT, min(NO_LIMIT, x))
