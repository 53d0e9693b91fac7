"""Exact order statistics of |d| = |old - mu| over the valid tokens, on CPU (numba), without materialising |d|.

numpy's median needs the (n+1)/2-th smallest value, or the n/2-th and (n/2+1)-th. Selection
by bracketing (the idea of Floyd-Rivest), exact for any input:

1. a strided sample of m ~ (2.5 n)**(2/3) valid |d| is partitioned; the sample ranks
   r * m / n -+ (2.5 sqrt(m) + 8) (over 5 binomial standard deviations) give a bracket [lo, hi];
   (up to 1024 valid tokens, the bracket is [0, inf]);
2. one pass over the tokens counts the |d| < lo and keeps those in [lo, hi]
   (a few percent of n), each response in its own row of a scratch buffer;
3. ``np.partition`` selects the ranks within the kept values. If the bracket missed (an
   adversarial layout), the pass is repeated with [0, inf]: every value is kept.

|d| is recomputed from the float inputs exactly as in ``row_sums_kernel`` (in float64).
"""

import math

import numpy as np
from numba import njit

_MIN_SAMPLE = 1024
_MAX_SAMPLE = 65536


@njit(cache=True)
def _sample_abs_d(mu_BT, old_BT, valid_BT, stride):
    """|d| of the valid tokens at flat positions 0, stride, 2 stride, ..."""
    mu_N, old_N, valid_N = mu_BT.reshape(-1), old_BT.reshape(-1), valid_BT.reshape(-1)
    out = np.empty((mu_N.shape[0] + stride - 1) // stride)
    num = 0
    for j in range(0, mu_N.shape[0], stride):
        if valid_N[j]:
            out[num] = abs(np.float64(old_N[j]) - np.float64(mu_N[j]))
            num += 1
    return out[:num]


@njit(cache=True, nogil=True)
def _band_rows(mu_BT, old_BT, valid_BT, lo, hi, band_BT, counts_B2):
    """Per response: the number of valid |d| < lo, and the valid |d| in [lo, hi] (into its row)."""
    for i in range(mu_BT.shape[0]):
        below = kept = 0
        for t in range(mu_BT.shape[1]):
            if valid_BT[i, t]:
                a = abs(np.float64(old_BT[i, t]) - np.float64(mu_BT[i, t]))
                if a < lo:
                    below += 1
                elif a <= hi:
                    band_BT[i, kept] = a
                    kept += 1
        counts_B2[i, 0] = below
        counts_B2[i, 1] = kept


@njit(cache=True)
def _gather_rows(band_BT, kept_B):
    """The first kept_B[i] values of every row of band_BT, concatenated."""
    out = np.empty(kept_B.sum())
    num = 0
    for i in range(band_BT.shape[0]):
        out[num : num + kept_B[i]] = band_BT[i, : kept_B[i]]
        num += kept_B[i]
    return out


def _band(mu_BT, old_BT, valid_BT, lo: float, hi: float) -> tuple[int, np.ndarray]:
    """(number of valid |d| below lo, the valid |d| within [lo, hi])."""
    band_BT = np.empty(mu_BT.shape)  # pages are touched only where values are kept
    counts_B2 = np.empty((mu_BT.shape[0], 2), dtype=np.int64)
    _band_rows(mu_BT, old_BT, valid_BT, lo, hi, band_BT, counts_B2)
    return int(counts_B2[:, 0].sum()), _gather_rows(band_BT, counts_B2[:, 1].copy())


def _bracket(mu_BT, old_BT, valid_BT, count: int, ranks: list[int]) -> tuple[float, float]:
    """[lo, hi] that holds the wanted ranks with overwhelming probability, from a sample."""
    size = min(max((2.5 * count) ** (2 / 3), _MIN_SAMPLE), _MAX_SAMPLE)
    stride = max(1, int(count / size))  # a flat stride samples about count / stride valid tokens
    sample_S = _sample_abs_d(mu_BT, old_BT, valid_BT, stride)
    num = sample_S.shape[0]
    margin = 2.5 * math.sqrt(num) + 8.0
    rank_lo = math.floor(min(ranks) / count * num - margin)
    rank_hi = math.ceil(max(ranks) / count * num + margin)
    picks = [r - 1 for r in (rank_lo, rank_hi) if 1 <= r <= num]
    part_S = np.partition(sample_S, picks) if picks else sample_S
    lo = float(part_S[rank_lo - 1]) if rank_lo >= 1 else 0.0
    hi = float(part_S[rank_hi - 1]) if rank_hi <= num else math.inf
    return lo, hi


def abs_d_order_statistics(mu_BT, old_BT, valid_BT, count: int, ranks: list[int]) -> list[float]:
    """The values of the 1-indexed ``ranks`` among the ``count`` valid |d| (numpy [B, T] inputs)."""
    lo, hi = (0.0, math.inf) if count <= _MIN_SAMPLE else _bracket(mu_BT, old_BT, valid_BT, count, ranks)
    below, band_M = _band(mu_BT, old_BT, valid_BT, lo, hi)
    if not (below < min(ranks) and max(ranks) <= below + band_M.shape[0]):
        below, band_M = _band(mu_BT, old_BT, valid_BT, 0.0, math.inf)
    picked_M = np.partition(band_M, [r - below - 1 for r in ranks])
    return [float(picked_M[r - below - 1]) for r in ranks]
