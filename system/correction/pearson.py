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


def _constant(rows_NK: np.ndarray, x: str) -> bool:
    """Whether x (mu or old) takes a single value over the valid tokens."""
    refs_N = rows_NK[:, COL[f"ref_{x}"]]
    return rows_NK[:, COL[f"num_{x}_moves"]].sum() == 0 and bool((refs_N == refs_N[0]).all())


def pearson_from_rows(rows_NK: np.ndarray) -> float | None:
    """The correlation of mu and old from the rows of the non-empty responses (N >= 1)."""
    if _constant(rows_NK, "mu") or _constant(rows_NK, "old"):
        return None
    n_N = rows_NK[:, COL["num_valid"]]
    s_mu_N, s_old_N = rows_NK[:, COL["sum_mu"]], rows_NK[:, COL["sum_old"]]
    mean_mu_N = rows_NK[:, COL["ref_mu"]] + s_mu_N / n_N
    mean_old_N = rows_NK[:, COL["ref_old"]] + s_old_N / n_N
    dev_mu_N = mean_mu_N - np.dot(n_N, mean_mu_N) / n_N.sum()
    dev_old_N = mean_old_N - np.dot(n_N, mean_old_N) / n_N.sum()
    var_mu = (rows_NK[:, COL["sum_mu_sq"]] - s_mu_N * s_mu_N / n_N).sum() + np.dot(n_N, dev_mu_N**2)
    var_old = (rows_NK[:, COL["sum_old_sq"]] - s_old_N * s_old_N / n_N).sum() + np.dot(
        n_N, dev_old_N**2
    )
    cov = (rows_NK[:, COL["sum_mu_old"]] - s_mu_N * s_old_N / n_N).sum() + np.dot(
        n_N * dev_mu_N, dev_old_N
    )
    if var_mu <= 0.0 or var_old <= 0.0:  # rounding on a nearly constant input
        return None
    return max(-1.0, min(1.0, float(cov / (math.sqrt(var_mu) * math.sqrt(var_old)))))
