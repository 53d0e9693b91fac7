"""Reduce per-token losses to the scalar that is back-propagated (spec section 5).

With v the valid mask BEFORE correction masking (a token rejected by its weight still counts)
and T_i = sum_t v[i,t]:

    token-mean:           sum_{i,t} v l / N_tok            N_tok = valid tokens of the GLOBAL batch
    seq-mean-token-mean:  sum_i (sum_t v l / T_i) / N_seq  N_seq = responses with T_i >= 1, GLOBAL
    seq-mean-token-sum:   sum_i (sum_t v l) / N_seq

Passing the global counts (all data-parallel ranks, all micro-batches) makes the per-rank,
per-micro-batch results sum to the global mean; without them the local counts are used.
A batch with no valid token gives 0 with the graph intact, never NaN: non-valid positions
are replaced by 0 (not multiplied by 0) and every divisor is at least 1.

Shapes: B = responses in the batch, T = padded response length.
"""

import torch

AGGREGATION_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _denominator(global_count: float | None, local_count: torch.Tensor, name: str):
    if global_count is None:
        return local_count.clamp(min=1)
    if global_count < 0:
        raise ValueError(f"{name} must be >= 0, got {global_count}")
    return max(float(global_count), 1.0)


def aggregate(
    loss_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    mode: str,
    num_valid_tokens_global: float | None = None,
    num_sequences_global: float | None = None,
) -> torch.Tensor:
    """The scalar loss of ``loss_BT`` under ``mode`` (one of ``AGGREGATION_MODES``)."""
    if loss_BT.dim() != 2 or valid_BT.shape != loss_BT.shape:
        raise ValueError(
            f"loss must be [B, T] and valid the same shape, got {tuple(loss_BT.shape)} and {tuple(valid_BT.shape)}"
        )
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; known: {list(AGGREGATION_MODES)}")
    valid_BT = valid_BT.bool()
    masked_BT = torch.where(valid_BT, loss_BT, 0.0)
    num_valid_B = valid_BT.sum(dim=1)
    if mode == "token-mean":
        return masked_BT.sum() / _denominator(num_valid_tokens_global, num_valid_B.sum(), "num_valid_tokens_global")
    seq_loss_B = masked_BT.sum(dim=1)
    if mode == "seq-mean-token-mean":
        seq_loss_B = seq_loss_B / num_valid_B.clamp(min=1)
    num_sequences = (num_valid_B >= 1).sum()
    return seq_loss_B.sum() / _denominator(num_sequences_global, num_sequences, "num_sequences_global")
