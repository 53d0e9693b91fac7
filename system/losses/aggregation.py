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

Shapes: the README's suffix legend (B responses, T response positions).
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from system.config.learner import LearnerConfig
from system.correction.ratios import valid_tokens
from system.registry import Registry, config_types


@dataclass(frozen=True)
class LossNormalisers:
    """Global counts the aggregation divides by, computed once per batch over all ranks."""

    num_valid_tokens: int
    num_sequences: int


def loss_normalisers(
    response_mask_BT: np.ndarray, behaviour_logp_BT: np.ndarray, proximal_logp_BT: np.ndarray
) -> LossNormalisers:
    """Valid tokens and sequences with at least one valid token, over the GLOBAL ``[B, T]`` batch."""
    if not response_mask_BT.shape == behaviour_logp_BT.shape == proximal_logp_BT.shape:
        raise ValueError(
            f"response_mask {response_mask_BT.shape}, behaviour_logp {behaviour_logp_BT.shape} and "
            f"proximal_logp {proximal_logp_BT.shape} must have one [B, T] shape"
        )
    valid_BT = valid_tokens(response_mask_BT, behaviour_logp_BT, proximal_logp_BT)
    return LossNormalisers(int(valid_BT.sum()), int((valid_BT.sum(axis=1) >= 1).sum()))


def _denominator(global_count: float | None, local_count: torch.Tensor, name: str):
    """The global count when given (at least 1), else the local one (at least 1)."""
    if global_count is None:
        return local_count.clamp(min=1)
    if global_count < 0:
        raise ValueError(f"{name} must be >= 0, got {global_count}")
    return max(float(global_count), 1.0)


def _token_mean(masked_BT, num_valid_B, num_tokens_global, num_sequences_global):
    return masked_BT.sum() / _denominator(
        num_tokens_global, num_valid_B.sum(), "num_valid_tokens_global"
    )


def _seq_mean(seq_loss_B, num_valid_B, num_sequences_global):
    num_sequences = (num_valid_B >= 1).sum()
    return seq_loss_B.sum() / _denominator(
        num_sequences_global, num_sequences, "num_sequences_global"
    )


def _seq_mean_token_mean(masked_BT, num_valid_B, num_tokens_global, num_sequences_global):
    seq_loss_B = masked_BT.sum(dim=1) / num_valid_B.clamp(min=1)
    return _seq_mean(seq_loss_B, num_valid_B, num_sequences_global)


def _seq_mean_token_sum(masked_BT, num_valid_B, num_tokens_global, num_sequences_global):
    return _seq_mean(masked_BT.sum(dim=1), num_valid_B, num_sequences_global)


AGGREGATIONS: Registry[Callable[..., torch.Tensor]] = Registry(
    "learner.aggregation", config_types(LearnerConfig.model_fields["aggregation"].annotation), {
        "token-mean": _token_mean,
        "seq-mean-token-mean": _seq_mean_token_mean,
        "seq-mean-token-sum": _seq_mean_token_sum,
    })
"""Aggregation modes keyed by ``learner.aggregation``."""
AGGREGATION_MODES: tuple[str, ...] = tuple(AGGREGATIONS)


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
    reduce = AGGREGATIONS[mode]  # a ValueError naming learner.aggregation for an unknown mode
    valid_BT = valid_BT.bool()
    masked_BT = torch.where(valid_BT, loss_BT, 0.0)  # replaced, not multiplied: no NaN survives
    return reduce(
        masked_BT, valid_BT.sum(dim=1), num_valid_tokens_global, num_sequences_global
    )
