"""Two LLVM operations Numba does not expose, for the kernels' inner loops.

- ``int_bits_as_float32``: the float32 whose IEEE-754 bits are an integer's low 32 bits
  (a bit cast): builds $2^k$ from $k$ in the vectorised exp
  (:func:`flashlab.kernels.tile.exp_nonpositive`);
- ``maxnum``: LLVM's ``llvm.maxnum``, the larger of two floats (a NaN operand is
  ignored, as ``a if a > b else b`` ignores a NaN ``a``). LLVM vectorises a reduction over
  it, which it does not for Numba's ``max`` or a compare-and-select loop
  (:func:`flashlab.kernels.tile.row_max`).

Both are ``@intrinsic``: they compile inline into the calling ``@njit`` function and work in
cached kernels. They are callable only inside ``@njit`` code (and Sphinx does not see them as
functions, so they are described here rather than below).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["int_bits_as_float32", "maxnum"]


@intrinsic
def int_bits_as_float32(typingctx, bits):
    """The float32 whose bits are the low 32 bits of the integer ``bits`` (no conversion).

    Numba widens int32 arithmetic to int64, hence the truncation to 32 bits first.
    """
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = builder.trunc(args[0], ir.IntType(32)) if bits.bitwidth > 32 else args[0]
        return builder.bitcast(low, ir.FloatType())
    return types.float32(bits), codegen


@intrinsic
def maxnum(typingctx, a, b):
    """``llvm.maxnum(a, b)`` for two floats of the same type: the larger; NaN ignored."""
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, signature, args):
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.maxnum", [t], ir.FunctionType(t, [t, t]))
        # nsz: +0 and -0 may come out either way (equal scores: no effect on any result).
        # Not nnan: scores that overflowed to NaN must not make the result undefined.
        return builder.call(fn, args, fastmath=("nsz",))
    return a(a, b), codegen
