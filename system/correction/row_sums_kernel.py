"""The columns of ``row_sums`` and the valid mask in one fused pass over (mu, old, mask), on CPU (numba).

Per response, a vectorised loop reads mu, old and the mask once, writes ``valid``, and adds
each token's summands into lane ``t % CHUNK`` of a small block (20 x CHUNK float64, in L1);
one reduction per response then sums the lanes. Padding before the first and after the last
masked-in token is not visited. No [B, T] temporary is written. The kernel
is single-threaded and releases the GIL (``nogil``): callers may run batches in threads.

Numerics: every summand is computed in float64 by ``_add_token`` in a function without
reassociation (``vector_exp`` gives ``exp`` and ``expm1`` within 2 ulp), and each lane adds
its tokens in order. Only ``_sum_lanes`` may reassociate (``reassoc``, which LLVM needs to
vectorise a floating-point sum): reordering a plain sum of stored values is harmless,
whereas reordering ``e - dc`` or the Cody-Waite reduction would not be. max and min are
taken on the IEEE bits as integers, which vectorises without assuming the absence of NaN.
Measured: about 4 ns per [B, T] slot on one AVX-512 core (the benchmark's memory floor
reads a slot in about 0.4 ns).

Inputs: float32 or float64 mu and old, bool mask, all C-contiguous [B, T] numpy arrays.
"""

import math

import numpy as np
from numba import njit

from system.correction.row_sums import COLUMNS, LOG_2, LOG_5, LOG_RATIO_CLAMP, SUMMED_COLUMNS
from system.correction.vector_exp import bits_of_float, exp_and_expm1, exp_any, float_from_bits

CHUNK = 64
"""Lanes of the per-response block: 20 sums x 64 x 8 bytes = 10 KiB. (Measured: 32 or 64 lanes
are fastest; 128 is 15% slower and 256 twice as slow, the rows then alias in L1.)"""

_NUM_SUMS = len(SUMMED_COLUMNS)
assert _NUM_SUMS == 20 and COLUMNS[_NUM_SUMS:] == ("max_abs_d", "min_d", "ref_mu", "ref_old")
_NOT_SIGN = np.int64(0x7FFFFFFFFFFFFFFF)
_INF_KEY = np.int64(0x7FF0000000000000)  # ordered_bits(+inf)
_GAP_BEYOND = -math.expm1(-LOG_RATIO_CLAMP)  # 1 - exp(-20)


@njit(cache=True, inline="always")
def ordered_bits(x):
    """An int64 that orders like the float64 x (either sign); the map is its own inverse on bits."""
    bits = bits_of_float(x)
    return bits ^ ((bits >> 63) & _NOT_SIGN)


@njit(cache=True, inline="always")
def from_ordered_bits(key):
    """The float64 of an ``ordered_bits`` key."""
    return float_from_bits(key ^ ((key >> 63) & _NOT_SIGN))


@njit(cache=True, inline="always")
def flag_span(flags_T):
    """(first set flag, one past the last set flag), (0, 0) if none: a scan of the padding only."""
    stop = flags_T.shape[0]
    while stop > 0 and not flags_T[stop - 1]:
        stop -= 1
    start = 0
    while start < stop and not flags_T[start]:
        start += 1
    return start, stop


@njit(cache=True)
def _first_valid(mu_T, old_T, mask_T):
    """(mu, old) of the first valid token, (0, 0) without one."""
    for t in range(mu_T.shape[0]):
        m, o = np.float64(mu_T[t]), np.float64(old_T[t])
        if mask_T[t] and abs(o - m) < math.inf:
            return m, o
    return 0.0, 0.0


@njit(cache=True, inline="always")
def _add_token(m0, o0, in_mask, ref_m, ref_o, block, c):
    """Add one token's summands (``SUMMED_COLUMNS`` order) to lane c; return (valid, |d|, d or +inf)."""
    finite = abs(o0 - m0) < math.inf  # False for NaN and +-inf
    valid = in_mask and finite
    m = m0 if valid else 0.0
    o = o0 if valid else 0.0
    d = o - m
    dc = min(max(d, -LOG_RATIO_CLAMP), LOG_RATIO_CLAMP)
    rho, e = exp_and_expm1(dc)
    rho = rho if valid else 0.0
    a = abs(d)
    beyond = d > LOG_RATIO_CLAMP  # exp(mu) * |e| misses the gap there: use exp(old) instead
    y_m = m - ref_m if valid else 0.0
    y_o = o - ref_o if valid else 0.0
    block[0, c] += 1.0 if valid else 0.0
    block[1, c] += 1.0 if (in_mask and not finite) else 0.0
    block[2, c] += dc
    block[3, c] += d
    block[4, c] += dc * dc
    block[5, c] += e - dc
    block[6, c] += e * (e + 2.0)
    block[7, c] += rho
    block[8, c] += rho * rho
    block[9, c] += a
    block[10, c] += 1.0 if a > LOG_2 else 0.0
    block[11, c] += 1.0 if a > LOG_5 else 0.0
    block[12, c] += exp_any(o if beyond else m) * (_GAP_BEYOND if beyond else abs(e))
    block[13, c] += y_m
    block[14, c] += y_m * y_m
    block[15, c] += y_o
    block[16, c] += y_o * y_o
    block[17, c] += y_m * y_o
    block[18, c] += 1.0 if y_m != 0.0 else 0.0
    block[19, c] += 1.0 if y_o != 0.0 else 0.0
    return valid, a, d if valid else math.inf


@njit(cache=True, fastmath={"reassoc", "nsz"})
def _sum_lanes(block, out_K):
    """out_K[k] = sum of block[k, :] (the only reassociated arithmetic)."""
    for k in range(block.shape[0]):
        total = 0.0
        for c in range(block.shape[1]):
            total += block[k, c]
        out_K[k] = total


@njit(cache=True, fastmath={"contract"})
def _one_row(mu_T, old_T, mask_T, valid_T, out_K):
    ref_m, ref_o = _first_valid(mu_T, old_T, mask_T)
    block = np.zeros((_NUM_SUMS, CHUNK))
    max_bits, min_key = np.int64(0), _INF_KEY
    first, end = flag_span(mask_T)  # padding on either side is not visited
    valid_T[:first] = False
    valid_T[end:] = False
    for start in range(first, end, CHUNK):
        stop = min(start + CHUNK, end)
        # Views indexed from 0: LLVM vectorises this loop, not one over ``x[start + c]``.
        mu_C, old_C, mask_C = mu_T[start:stop], old_T[start:stop], mask_T[start:stop]
        valid_C = valid_T[start:stop]
        for c in range(stop - start):
            valid, a, d = _add_token(
                np.float64(mu_C[c]), np.float64(old_C[c]), mask_C[c], ref_m, ref_o, block, c
            )
            valid_C[c] = valid
            max_bits = max(max_bits, bits_of_float(a))  # a >= 0: its bits order like it
            min_key = min(min_key, ordered_bits(d))
    _sum_lanes(block, out_K)
    out_K[_NUM_SUMS] = float_from_bits(max_bits)
    out_K[_NUM_SUMS + 1] = from_ordered_bits(min_key)
    out_K[_NUM_SUMS + 2] = ref_m
    out_K[_NUM_SUMS + 3] = ref_o


@njit(cache=True, nogil=True)
def row_sums_kernel(mu_BT, old_BT, mask_BT, valid_BT, out_BK):
    """Fill ``valid_BT`` (bool [B, T]) and ``out_BK`` (float64 [B, K]) from mu, old and mask."""
    for i in range(mu_BT.shape[0]):
        _one_row(mu_BT[i], old_BT[i], mask_BT[i], valid_BT[i], out_BK[i])
