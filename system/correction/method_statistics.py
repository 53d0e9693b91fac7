"""What a correction method kept and how heavy its weights are (spec section 2, "Per method, log").

Over the n valid tokens and the n_seq non-empty responses:

    keep_token_frac = #(valid tokens with w > 0) / n
    keep_seq_frac   = #(responses with at least one kept token) / n_seq
    weight_mean     = sum(w) / n                weight_max = max(w)
    ess             = (sum w)**2 / (n * sum w**2), 0 if every w is 0
    keep_seq_frac_by_len = keep_seq_frac per bucket of T_i: <=128, <=512, <=2048, >2048
                      (None for an empty bucket)

An empty batch gives ``None`` for every value (and for every bucket).

Shapes: B = responses in the batch, T = padded response length.
"""

import torch

from system.correction.ratios import LogRatios
from system.correction.reductions import LENGTH_BUCKETS, fraction_by_bucket
from system.correction.weight_row_sums import weight_row_sums


def method_statistics(ratios: LogRatios, w_BT: torch.Tensor) -> dict:
    """Kept fractions and weight statistics of the weights ``w_BT`` returned by ``compute_weights``."""
    w_BT = torch.as_tensor(w_BT, device=ratios.valid_BT.device).detach()
    if w_BT.shape != ratios.valid_BT.shape:
        raise ValueError(
            f"weights have shape {tuple(w_BT.shape)} but the batch is {tuple(ratios.valid_BT.shape)}"
        )
    rows_B5 = weight_row_sums(w_BT, ratios.valid_BT, ratios.cpu_arrays is not None).cpu().numpy()
    num_valid_B, num_kept_B, sum_w_B, sum_w_sq_B, max_w_B = rows_B5.T
    n = int(num_valid_B.sum())
    if n == 0:
        return {
            "keep_token_frac": None,
            "keep_seq_frac": None,
            "weight_mean": None,
            "weight_max": None,
            "ess": None,
            "keep_seq_frac_by_len": {key: None for key, _ in LENGTH_BUCKETS},
        }
    seq_valid_B = num_valid_B >= 1
    kept_seq_B = num_kept_B > 0
    sum_w, sum_w_sq = float(sum_w_B.sum()), float(sum_w_sq_B.sum())
    return {
        "keep_token_frac": float(num_kept_B.sum()) / n,
        "keep_seq_frac": int(kept_seq_B.sum()) / int(seq_valid_B.sum()),
        "weight_mean": sum_w / n,
        "weight_max": float(max_w_B.max()),
        "ess": 0.0 if sum_w_sq == 0.0 else min(sum_w**2 / (n * sum_w_sq), 1.0),
        "keep_seq_frac_by_len": fraction_by_bucket(kept_seq_B, num_valid_B, seq_valid_B),
    }
