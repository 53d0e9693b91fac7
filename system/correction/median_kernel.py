"""Exact order statistics of |d| = |old - mu| over the valid tokens, on CPU (numba), without materialising |d|.

numpy's median needs the (n+1)/2-th smallest value, or the n/2-th and (n/2+1)-th. Selection
by bracketing (the idea of Floyd and Rivest), exact for any input:

1. ``median_bracket``: a strided sample of m ~ (2.5 N)**(2/3) valid |d| is partitioned; its
   ranks m/2 -+ (2.5 sqrt(m) + 8) (over 5 binomial standard deviations) give [lo, hi];
2. ``_band_pass`` counts the valid |d| < lo and keeps those in [lo, hi] (a few percent of
   n). (Fusing it into ``row_sums_kernel`` was measured: no faster, that kernel is compute-bound);
3. ``order_statistics_in_band`` selects the ranks within the kept values with
   ``np.partition``. If the bracket missed (an adversarial layout), the pass is repeated
   with [0, inf], which keeps every value.

|d| is computed from the float inputs exactly as in ``row_sums_kernel`` (in float64).
"""

import math

import numpy as np
from numba import njit

from system.correction.row_sums_kernel import flag_span

_MIN_SAMPLE = 1024
_MAX_SAMPLE = 65536
BAND_CHUNK = 256
"""Tokens per chunk of the band passes."""


@njit(cache=True, nogil=True)
def _sample_abs_d(mu_N, old_N, mask_N, stride):
    """|d| of the valid tokens (mask and both finite) at flat positions 0, stride, 2 stride, ..."""
    out = np.empty((mu_N.shape[0] + stride - 1) // stride)
    num = 0
    for j in range(0, mu_N.shape[0], stride):
        a = abs(np.float64(old_N[j]) - np.float64(mu_N[j]))
        if mask_N[j] and a < math.inf:
            out[num] = a
            num += 1
    return out[:num]


def median_bracket(
    mu_BT: np.ndarray, old_BT: np.ndarray, mask_BT: np.ndarray
) -> tuple[float, float]:
    """[lo, hi] that holds the median |d| with overwhelming probability; [0, inf] for a small batch."""
    size = mu_BT.size
    if size <= _MIN_SAMPLE:
        return 0.0, math.inf
    target = min(max((2.5 * size) ** (2 / 3), _MIN_SAMPLE), _MAX_SAMPLE)
    sample_S = _sample_abs_d(
        mu_BT.reshape(-1), old_BT.reshape(-1), mask_BT.reshape(-1), max(1, int(size / target))
    )
    num = sample_S.shape[0]
    margin = 2.5 * math.sqrt(num) + 8.0
    rank_lo, rank_hi = math.floor(num / 2 - margin), math.ceil(num / 2 + 1 + margin)
    picks = [r - 1 for r in (rank_lo, rank_hi) if 1 <= r <= num]
    part_S = np.partition(sample_S, picks) if picks else sample_S
    lo = float(part_S[rank_lo - 1]) if rank_lo >= 1 else 0.0
    hi = float(part_S[rank_hi - 1]) if rank_hi <= num else math.inf
    return lo, hi


@njit(cache=True, nogil=True)
def keep_band_chunk(abs_d_C, kept_C, num, band_N, cursor):
    """Move the flagged ones of ``abs_d_C[:num]`` to ``band_N[cursor:]``; return the new cursor.

    Branch-free (a store at every token, the cursor moving only for kept ones): whether |d|
    is in the band is a coin flip that a branch would mispredict.
    """
    for c in range(num):
        band_N[cursor] = abs_d_C[c]  # cursor <= tokens seen so far: inside band_N
        cursor += kept_C[c]
    return cursor


@njit(cache=True, nogil=True)
def _band_pass(mu_BT, old_BT, valid_BT, lo, hi, band_N):
    """(number of valid |d| < lo, number kept); the valid |d| in [lo, hi] go to band_N[:kept]."""
    abs_d_C = np.empty(BAND_CHUNK)
    kept_C = np.empty(BAND_CHUNK, dtype=np.uint8)
    below = cursor = 0
    for i in range(mu_BT.shape[0]):
        first, end = flag_span(valid_BT[i])  # padding on either side is not visited
        for start in range(first, end, BAND_CHUNK):
            stop = min(start + BAND_CHUNK, end)
            mu_C, old_C, valid_C = (
                mu_BT[i, start:stop],
                old_BT[i, start:stop],
                valid_BT[i, start:stop],
            )
            hits = 0
            for c in range(stop - start):  # vectorised
                a = abs(np.float64(old_C[c]) - np.float64(mu_C[c]))
                below += valid_C[c] & (a < lo)
                abs_d_C[c] = a
                kept_C[c] = valid_C[c] & (a >= lo) & (a <= hi)
                hits += kept_C[c]
            if hits:
                cursor = keep_band_chunk(abs_d_C, kept_C, stop - start, band_N, cursor)
    return below, cursor


def order_statistics_in_band(
    below: int, band_M: np.ndarray, ranks: list[int]
) -> list[float] | None:
    """The values of the 1-indexed ``ranks`` if the band (after ``below`` smaller values) holds them, else None."""
    if not (below < min(ranks) and max(ranks) <= below + band_M.shape[0]):
        return None
    picked_M = np.partition(band_M, [r - below - 1 for r in ranks])
    return [float(picked_M[r - below - 1]) for r in ranks]


def abs_d_order_statistics(mu_BT, old_BT, valid_BT, ranks: list[int]) -> list[float]:
    """The values of the 1-indexed ``ranks`` among the valid |d| (numpy [B, T] inputs)."""
    band_N = np.empty(mu_BT.size)  # only the kept values touch its pages
    for lo, hi in (median_bracket(mu_BT, old_BT, valid_BT), (0.0, math.inf)):
        below, kept = _band_pass(mu_BT, old_BT, valid_BT, lo, hi, band_N)
        values = order_statistics_in_band(below, band_N[:kept], ranks)
        if values is not None:
            return values
    raise AssertionError("the band [0, inf] holds every rank")
