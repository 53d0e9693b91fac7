"""What a correction method kept and how heavy its weights are (spec section 2, "Per method, log").

Over the n valid tokens and the n_seq non-empty responses:

    keep_token_frac = #(valid tokens with w > 0) / n
    keep_seq_frac   = #(responses with at least one kept token) / n_seq
    weight_mean     = sum(w) / n                weight_max = max(w)
    ess             = (sum w)**2 / (n * sum w**2), 0 if every w is 0
    keep_seq_frac_by_len = keep_seq_frac per bucket of T_i: <=128, <=512, <=2048, >2048
                      (None for an empty bucket)

An empty batch gives ``None`` for every value (and for every bucket).

Shapes: the README's suffix legend (B responses, T response positions).
"""

import torch

from system.correction.ratios import LogRatios
from system.correction.reductions import LENGTH_BUCKETS, as_float, ess_fraction, fraction_by_bucket


def method_statistics(ratios: LogRatios, w_BT: torch.Tensor) -> dict:
    """Kept fractions and weight statistics of the weights ``w_BT`` returned by ``compute_weights``."""
    w_BT = torch.as_tensor(w_BT, device=ratios.valid_BT.device).detach()
    if w_BT.shape != ratios.valid_BT.shape:
        raise ValueError(
            f"weights have shape {tuple(w_BT.shape)} but the batch is {tuple(ratios.valid_BT.shape)}"
        )
    n = ratios.num_tokens
    n_seq = ratios.num_sequences
    if n == 0:
        return {
            "keep_token_frac": None,
            "keep_seq_frac": None,
            "weight_mean": None,
            "weight_max": None,
            "ess": None,
            "keep_seq_frac_by_len": {key: None for key, _ in LENGTH_BUCKETS},
        }
    valid_BT = ratios.valid_BT
    w_BT = torch.where(valid_BT, w_BT.to(torch.float64), 0.0)
    kept_BT = valid_BT & (w_BT > 0)
    kept_seq_B = kept_BT.any(dim=1)
    return {
        "keep_token_frac": int(kept_BT.sum().item()) / n,
        "keep_seq_frac": int(kept_seq_B.sum().item()) / n_seq,
        "weight_mean": as_float(w_BT.sum() / n),
        "weight_max": as_float(torch.where(valid_BT, w_BT, float("-inf")).max()),
        "ess": ess_fraction(w_BT, n),
        "keep_seq_frac_by_len": fraction_by_bucket(
            kept_seq_B, ratios.num_valid_B, ratios.seq_valid_B
        ),
    }
