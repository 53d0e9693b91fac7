"""Collate rollout groups (in order) into one padded ``LearnerBatch`` with group advantages."""

from collections.abc import Sequence

import numpy as np
import torch

from system.learner.batch import LearnerBatch
from system.losses.advantages import group_advantages
from system.types import RolloutGroup


def _ragged_positions(start_B: np.ndarray, length_B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of every position of ``length_B[b]`` consecutive columns from ``start_B[b]`` in each
    row b, rows in order: the scatter indices of a ragged batch's concatenated values."""
    total = int(length_B.sum())
    rows = np.repeat(np.arange(len(length_B)), length_B)
    first_of_row = np.repeat(np.cumsum(length_B) - length_B, length_B)  # index of the row's first value
    return rows, np.repeat(start_B, length_B) + (np.arange(total) - first_of_row)


def collate_groups(
    groups: Sequence[RolloutGroup], scale_advantages_by_std: bool, pad_token_id: int = 0
) -> LearnerBatch:
    """Pad the completions of ``groups`` (in order) into one batch and compute group advantages."""
    completions = [(g_idx, c) for g_idx, g in enumerate(groups) for c in g.completions]
    if not completions:
        raise ValueError("cannot collate an empty batch: the groups hold no completions")
    for _, c in completions:
        if len(c.prompt_token_ids) == 0:
            raise ValueError(f"completion {c.uid} has an empty prompt; the first token needs a context")
    prompt_len_B = np.array([len(c.prompt_token_ids) for _, c in completions], dtype=np.int64)
    response_len_B = np.array([len(c.response_token_ids) for _, c in completions], dtype=np.int64)
    num_seq, seq_len = len(completions), int((prompt_len_B + response_len_B).max())
    input_ids_BS = np.full((num_seq, seq_len), pad_token_id, dtype=np.int64)
    behaviour_logp_BS = np.zeros((num_seq, seq_len), dtype=np.float32)
    response_mask_BS = np.zeros((num_seq, seq_len), dtype=bool)
    # every completion's tokens in one scatter (a loop of 512 completions took ~2.6 ms, this ~0.4)
    rows_p, cols_p = _ragged_positions(np.zeros_like(prompt_len_B), prompt_len_B)
    rows_r, cols_r = _ragged_positions(prompt_len_B, response_len_B)
    input_ids_BS[rows_p, cols_p] = np.concatenate([c.prompt_token_ids for _, c in completions])
    if len(rows_r):
        input_ids_BS[rows_r, cols_r] = np.concatenate([c.response_token_ids for _, c in completions])
        behaviour_logp_BS[rows_r, cols_r] = np.concatenate([c.behaviour_logprobs for _, c in completions])
        response_mask_BS[rows_r, cols_r] = True
    positions_S = np.arange(seq_len)
    rewards_B = np.array([c.reward for _, c in completions], dtype=np.float32)
    group_index_B = np.array([g for g, _ in completions], dtype=np.int64)
    advantages_B = group_advantages(
        torch.from_numpy(rewards_B), torch.from_numpy(group_index_B), scale_by_std=scale_advantages_by_std
    )
    return LearnerBatch(
        input_ids_BS=input_ids_BS,
        attention_mask_BS=positions_S[None, :] < (prompt_len_B + response_len_B)[:, None],
        response_mask_BS=response_mask_BS,
        behaviour_logp_BS=behaviour_logp_BS,
        response_start_B=prompt_len_B,
        response_len_B=response_len_B,
        rewards_B=rewards_B,
        advantages_B=np.asarray(advantages_B.detach().cpu(), dtype=np.float32),
        group_index_B=group_index_B,
        policy_version_B=np.array([c.policy_version for _, c in completions], dtype=np.int64),
        uids=tuple(c.uid for _, c in completions),
        num_response_tokens=max(1, int(response_len_B.max())),
        prompt_texts=tuple(groups[g].prompt.text for g, _ in completions),
        response_texts=tuple(c.response_text for _, c in completions),
    )
