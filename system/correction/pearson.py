"""Pearson correlation of mu and old over the valid tokens, merged from per-response moments (spec section 1).

Response i holds n_i valid tokens and the sums of y = x - ref_i (``row_sums``: ref_i is its
first valid value). With population moments:

    mean_i = ref_i + S(y) / n_i                 M_i(x, x') = S(y y') - S(y) S(y') / n_i
    M(x, x') = sum_i M_i(x, x') + sum_i n_i (mean_i - mean)(mean'_i - mean')     (Chan et al.)
    logp_pearson = M(mu, old) / sqrt(M(mu, mu) M(old, old)), clipped to [-1, 1]

``None`` when mu or old is constant over the valid tokens, decided exactly (numpy's
``ptp == 0``): no token differs from its response's reference and every reference is equal.

Shapes: N = responses with at least one valid token, K = ``len(row_sums.COLUMNS)``.
"""

import math

import numpy as np

from system.correction.row_sums import COL

_SUMS = [COL["sum_mu"], COL["sum_old"]]
_REFS = [COL["ref_mu"], COL["ref_old"]]
_SQUARES = [COL["sum_mu_sq"], COL["sum_old_sq"], COL["sum_mu_old"]]
_MOVES = [COL["num_mu_moves"], COL["num_old_moves"]]


def _constant(rows_NK: np.ndarray) -> bool:
    """Whether mu or old takes a single value over the valid tokens."""
    refs_N2 = rows_NK[:, _REFS]
    same_2 = (rows_NK[:, _MOVES].sum(0) == 0) & (refs_N2 == refs_N2[0]).all(0)
    return bool(same_2.any())


def _centred_moments(rows_NK: np.ndarray) -> np.ndarray:
    """[M(mu, mu), M(old, old), M(mu, old)] merged over the rows."""
    n_N1 = rows_NK[:, COL["num_valid"], None]
    sums_N2 = rows_NK[:, _SUMS]
    mean_N2 = rows_NK[:, _REFS] + sums_N2 / n_N1
    dev_N2 = mean_N2 - (n_N1 * mean_N2).sum(0) / n_N1.sum()
    pairs = ([0, 1, 0], [0, 1, 1])  # (mu, mu), (old, old), (mu, old)
    within_N3 = rows_NK[:, _SQUARES] - sums_N2[:, pairs[0]] * sums_N2[:, pairs[1]] / n_N1
    between_N3 = n_N1 * dev_N2[:, pairs[0]] * dev_N2[:, pairs[1]]
    return (within_N3 + between_N3).sum(0)


def pearson_from_rows(rows_NK: np.ndarray) -> float | None:
    """The correlation of mu and old from the rows of the non-empty responses (N >= 1)."""
    if _constant(rows_NK):
        return None
    var_mu, var_old, cov = _centred_moments(rows_NK).tolist()
    if var_mu <= 0.0 or var_old <= 0.0:  # rounding on a nearly constant input
        return None
    return max(-1.0, min(1.0, cov / (math.sqrt(var_mu) * math.sqrt(var_old))))
