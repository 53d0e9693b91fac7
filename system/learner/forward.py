"""Micro-batched forward passes over one rank's shard, returning response-only ``[B, T]`` log-probs.

Each micro-batch is trimmed to its longest sequence before the forward (right padding and a
causal mask make the trimmed columns irrelevant to the kept ones), and scattered back into
the shard's response view. The proximal recompute and the training forward use the same
micro-batches (each mini-batch's, ``update_micro_slices``) and the same trimming, so on the first
update ``cur - old`` is exactly 0.
"""

from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn

from system.learner.batch import LearnerBatch, update_micro_slices
from system.learner.logprobs import Sampling, token_logprobs, token_logprobs_and_entropy


@dataclass(frozen=True)
class ShardTensors:
    """The torch tensors of one rank's shard, on the learner's device."""

    input_ids_BS: torch.Tensor
    attention_mask_BS: torch.Tensor
    response_start_B: torch.Tensor
    response_len_B: torch.Tensor
    response_mask_BT: torch.Tensor  # bool
    behaviour_logp_BT: torch.Tensor  # float32, raw (may hold NaN on masked-out tokens)
    advantages_B: torch.Tensor
    num_response_tokens: int

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids_BS.shape[0])

    def rows(self, index: slice) -> "ShardTensors":
        """The sub-shard of rows ``index`` (views, no copy); keeps S and T of the shard."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return ShardTensors(**{k: v[index] if isinstance(v, torch.Tensor) else v for k, v in values.items()})


def shard_tensors(batch: LearnerBatch, device: torch.device) -> ShardTensors:
    """Move a rank's ``LearnerBatch`` to ``device`` as tensors (response views precomputed)."""
    arrays = batch.response_arrays()

    def to(x: np.ndarray) -> torch.Tensor:
        return torch.tensor(x, device=device)  # a copy: Ray hands out read-only arrays

    return ShardTensors(
        input_ids_BS=to(batch.input_ids_BS).long(),
        attention_mask_BS=to(batch.attention_mask_BS).long(),
        response_start_B=to(batch.response_start_B).long(),
        response_len_B=to(batch.response_len_B).long(),
        response_mask_BT=to(arrays.mask_BT).bool(),
        behaviour_logp_BT=to(arrays.behaviour_BT).float(),
        advantages_B=to(batch.advantages_B).float(),
        num_response_tokens=batch.num_response_tokens,
    )


def response_logprobs(
    model: nn.Module, shard: ShardTensors, rows: slice, sampling: float | Sampling, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp_BT, entropy_BT or None)`` of the micro-batch ``rows``, from one trimmed forward.

    ``sampling``: the rollout's temperature, top-p and top-k (a bare number is a temperature
    without truncation); ``logp`` is ``-inf`` at tokens outside the top-k / top-p set.
    """
    s = Sampling.of(sampling)
    start_B, len_B = shard.response_start_B[rows], shard.response_len_B[rows]
    width = int((start_B + len_B).max())
    ids_BS = shard.input_ids_BS[rows, :width]
    mask_BS = shard.attention_mask_BS[rows, :width]
    T = shard.num_response_tokens
    if with_entropy:
        logp_BS, entropy_BS = token_logprobs_and_entropy(model, ids_BS, mask_BS, s.temperature, s.top_p, s.top_k)
        return gather_response(logp_BS, start_B, len_B, T), gather_response(entropy_BS, start_B, len_B, T)
    logp_BS = token_logprobs(model, ids_BS, mask_BS, s.temperature, s.top_p, s.top_k)
    return gather_response(logp_BS, start_B, len_B, T), None


@torch.no_grad()
def proximal_logprobs(
    model: nn.Module, shard: ShardTensors, micro_batch_size: int, sampling: float | Sampling,
    mini_batches: int = 1,
) -> torch.Tensor:
    """fp32 proximal log-probs ``[B_shard, T]`` of the whole shard with the current weights (no grad).
    Collective under FSDP.
    Through the micro-batches the update will use (``update_micro_slices``: each mini-batch's own),
    since another batch shape changes the kernels' summation order (measured: 2.4e-7 in fp32 on
    the tiny model when the slices differ)."""
    pieces = [
        response_logprobs(model, shard, rows, sampling, with_entropy=False)[0]
        for rows in update_micro_slices(shard.num_sequences, mini_batches, micro_batch_size)
    ]
    return torch.cat(pieces, dim=0)


def gather_response(
    x_BS: torch.Tensor, response_start_B: torch.Tensor, response_len_B: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Response-only view ``x_BT`` of a per-position tensor (differentiable; 0 past each response): the
    torch twin of ``system.learner.batch.response_view``."""
    t_T = torch.arange(num_tokens, device=x_BS.device)
    pos_BT = response_start_B.to(x_BS.device)[:, None] + t_T[None, :]
    inside_BT = t_T[None, :] < response_len_B.to(x_BS.device)[:, None]
    pos_BT = torch.where(inside_BT, pos_BT, 0).clamp(max=x_BS.shape[1] - 1)
    gathered_BT = x_BS.gather(1, pos_BT)
    return torch.where(inside_BT, gathered_BT, torch.zeros((), dtype=x_BS.dtype, device=x_BS.device))
