"""The batches the AIS tests share: (mu, old, mask) from per-token log-ratios, and the hand batch of
spec section 3 with its derivation (``tests/test_correction_ais*.py``)."""

import math

import torch
from hypothesis import settings

from system.correction import compute_log_ratios, default_method_configs

NAN = float("nan")
LN2, LN4, LN_HALF = math.log(2.0), math.log(4.0), math.log(0.5)
SETTINGS = settings(max_examples=60, deadline=None)
METHODS = default_method_configs()


def batch_of(d_rows, dtype=torch.float64):
    """(mu, old, mask) with mu = -3 and old = mu + d; rows shorter than the longest are padded."""
    t = max(len(r) for r in d_rows)
    d = torch.tensor([list(r) + [0.0] * (t - len(r)) for r in d_rows], dtype=dtype)
    mask = torch.tensor([[1] * len(r) + [0] * (t - len(r)) for r in d_rows])
    mu = torch.full(d.shape, -3.0, dtype=dtype)
    return mu, mu + d, mask


def ratios_of(d_rows):
    return compute_log_ratios(*batch_of(d_rows))


# ---- the hand batch ---------------------------------------------------------------------------
#
# seq-mis (hi = 3) on four responses, rho_seq = [2, 4, 0.5, 1]:
#   response 0: one token,  d = ln 2            -> kept,     w = 2,   T = 1
#   response 1: one token,  d = ln 4 > ln 3     -> REJECTED, w = 0,   k = 0
#   response 2: two tokens, d = ln 0.5, 0       -> kept,     w = 0.5, T = 2
#   response 3: two tokens, d = 0, 0            -> kept,     w = 1,   T = 2
# advantages A = [1, -1, -1, 1] (two groups of two, each summing to 0).
#   d_i = A_i / T_i * sum_t k (w - 1) = [1 * 1, 0, -1 * (2 * -0.5) / 2, 0] = [1, 0, 0.5, 0]
#   b = 1.5 / 4 = 3/8;  mean d^2 = 1.25 / 4 = 5/16;  s2 = 5/16 - 9/64 = 11/64
#   R: min(rho_seq, 2) = [2, 2, 0.5, 1], sum 5.5, sum of squares 9.25 -> R = 30.25 / 37
#   n_eff = 4 R = 121/37;  noise2 = (11/64) / (121/37) = 37/704;  b^2 = 9/64 = 99/704
#   b2_plus = 62/704;  alpha_raw = 62/99;  alpha_1 = 0.5 * 0 + 0.5 * 62/99 = 31/99
# step 2: two one-token responses with d = ln 2 (w = 2) and A = [0.5, 0.5]:
#   d_i = [0.5, 0.5]: b = 0.5, s2 = 0 -> noise 0, alpha_raw = 1
#   alpha_2 = 0.5 * 31/99 + 0.5 * 1 = 65/99
# omega at step 1 (alpha = 31/99): [1 + 31/99, 0, 1 - 0.5 * 31/99 (both tokens), 1, 1]
HAND_D = [[LN2], [LN4], [LN_HALF, 0.0], [0.0, 0.0]]
HAND_A = torch.tensor([1.0, -1.0, -1.0, 1.0])
STEP2_D = [[LN2], [LN2]]
STEP2_A = torch.tensor([0.5, 0.5])

