"""float64 ``exp`` and ``expm1`` written in plain arithmetic, so numba can vectorise loops that call them.

numba lowers ``math.exp`` to a scalar libm call, which stops LLVM from vectorising the
token loops of ``row_sums_kernel``. Here, with k = round(x / ln 2) and r the reduced argument:

    r = (x - k * ln2_hi) - k * ln2_lo        |r| <= ln(2) / 2 (Cody-Waite: k * ln2_hi is exact)
    p = expm1(r) = r + r**2/2! + ... + r**13/13!   (Taylor; the first omitted term is < 2e-18 |p|)
    exp(x)   = 2**k * (1 + p) = 2**k * p + 2**k
    expm1(x) = 2**k * p + (2**k - 1)           (k = 0 gives p itself: no cancellation near 0)

2**k is built from its bits. Both results are within 2 ulp of the correctly rounded value
(measured: 2.6e-16 relative on [-20, 20] and on tiny arguments, see
``tests/test_correction_kernels.py``). They are inlined into their callers, which must not
use fast-math flags: reassociation would undo the Cody-Waite split and ``expm1``.
"""

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_INV_LN2 = 1.0 / math.log(2.0)
_LN2_HI = 6.93147180369123816490e-01  # ln 2 rounded to 32 significant bits
_LN2_LO = 1.90821492927058770002e-10  # ln 2 - _LN2_HI
_C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13 = (
    1.0 / math.factorial(j) for j in range(2, 14)
)


@intrinsic
def float_from_bits(typingctx, bits):
    """The float64 whose IEEE bits are the int64 ``bits`` (an LLVM bitcast)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@intrinsic
def bits_of_float(typingctx, value):
    """The IEEE bits of the float64 ``value`` as an int64 (an LLVM bitcast)."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return sig, codegen


@njit(cache=True, inline="always")
def _reduced(x):
    """(k, expm1(r)) with x = k ln 2 + r and k an integer (as int64), for |x| <= 1100."""
    k = math.floor(x * _INV_LN2 + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    r2 = r * r
    r4 = r2 * r2
    q0 = (_C2 + _C3 * r) + (_C4 + _C5 * r) * r2  # Estrin's scheme: a short dependency chain
    q1 = (_C6 + _C7 * r) + (_C8 + _C9 * r) * r2
    q2 = (_C10 + _C11 * r) + (_C12 + _C13 * r) * r2
    q = (q0 + q1 * r4) + q2 * (r4 * r4)
    return np.int64(k), r + r2 * q


@njit(cache=True, inline="always")
def _power_of_two(k):
    """2.0**k for an integer -1022 <= k <= 1023, from its bits."""
    return float_from_bits((k + 1023) << 52)


@njit(cache=True, inline="always")
def exp_and_expm1(x):
    """(exp(x), expm1(x)) for a finite |x| <= 700 (callers clamp the log-ratio to +-20)."""
    k, p = _reduced(x)
    scale = _power_of_two(k)
    return scale * p + scale, scale * p + (scale - 1.0)


@njit(cache=True, inline="always")
def exp_any(x):
    """exp(x) for any non-NaN x, +-inf included: underflows to 0 and overflows to +inf like libm.

    2**k is applied in two halves, so k may run past the exponent range of one float64.
    """
    k, p = _reduced(min(max(x, -746.0), 710.0))
    half = k >> 1
    return (_power_of_two(half) * p + _power_of_two(half)) * _power_of_two(k - half)
