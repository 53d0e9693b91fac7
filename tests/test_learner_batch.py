"""Collation, response views, sharding, micro-batching and loss normalisers of the learner batch.

Expected arrays are written out by hand from the example groups below.
"""

import numpy as np
import pytest

from system.learner.batch import (
    micro_batch_slices,
    pack_response,
    response_view,
    rows_in_rank_order,
    shard_batch,
    shard_rows,
    unpack_response,
)
from system.learner.collate import collate_groups
from system.losses.aggregation import loss_normalisers
from system.types import Completion, Prompt, RolloutGroup


def _completion(prompt_id, k, prompt, response, mu, reward, version=0):
    return Completion(prompt_id, k, np.array(prompt), np.array(response), np.array(mu, np.float32),
                      "", reward, version)


def _hand_groups():
    """Group 0: prompt [5 6 7]; group 1: prompt [11 12], second response empty."""
    g0 = RolloutGroup(Prompt("a", "", ""), (
        _completion("a", 0, [5, 6, 7], [8, 9], [-0.1, -0.2], 1.0, version=3),
        _completion("a", 1, [5, 6, 7], [10], [-0.3], 0.0, version=3),
    ), policy_version=3)
    g1 = RolloutGroup(Prompt("b", "", ""), (
        _completion("b", 0, [11, 12], [13, 14, 15], [-0.4, -0.5, -0.6], 0.5, version=4),
        _completion("b", 1, [11, 12], [], [], 0.5, version=4),
    ), policy_version=4)
    return [g0, g1]


def test_collate_pads_and_aligns_behaviour_logprobs_with_their_tokens():
    batch = collate_groups(_hand_groups(), scale_advantages_by_std=True, pad_token_id=0)
    np.testing.assert_array_equal(batch.input_ids_BS, [
        [5, 6, 7, 8, 9], [5, 6, 7, 10, 0], [11, 12, 13, 14, 15], [11, 12, 0, 0, 0]])
    np.testing.assert_array_equal(batch.attention_mask_BS, [
        [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(batch.response_mask_BS, [
        [0, 0, 0, 1, 1], [0, 0, 0, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    # log mu of token 8 (position 3) sits at position 3, and so on.
    np.testing.assert_allclose(batch.behaviour_logp_BS, [
        [0, 0, 0, -0.1, -0.2], [0, 0, 0, -0.3, 0], [0, 0, -0.4, -0.5, -0.6], [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.response_start_B, [3, 3, 2, 2])
    np.testing.assert_array_equal(batch.response_len_B, [2, 1, 3, 0])
    np.testing.assert_array_equal(batch.group_index_B, [0, 0, 1, 1])
    np.testing.assert_array_equal(batch.policy_version_B, [3, 3, 4, 4])
    np.testing.assert_array_equal(batch.lag_B(5), [2, 2, 1, 1])
    # behaviour versions 3, 3, 4, 4: at learner version 3 the last two would be lag -1 (newer than the
    # learner); a probe found the service taking them
    with pytest.raises(ValueError, match=r"sequence b#0: behaviour policy version 4 against learner version 3 "
                                         r"\(2 sequence\(s\)\)"):
        batch.lag_B(3)
    with pytest.raises(ValueError, match="must be in 0 .. 2"):
        batch.lag_B(2**33)  # beyond int32: it wrapped
    np.testing.assert_allclose(batch.rewards_B, [1.0, 0.0, 0.5, 0.5])
    # GRPO: group 0 has mean 0.5 and population std 0.5 -> +-0.5 / (0.5 + 1e-6); group 1 is constant.
    a = 0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose(batch.advantages_B, [a, -a, 0.0, 0.0], rtol=1e-6)
    assert batch.uids == ("a#0", "a#1", "b#0", "b#1")
    assert batch.num_response_tokens == 3


def test_collate_matches_a_row_by_row_reference_on_random_ragged_groups():
    """The one-scatter collation against the plain per-row loop (written here) on 40 groups of 1-6
    completions with prompts of 1-9 and responses of 0-12 tokens."""
    rng = np.random.default_rng(7)
    groups = []
    for g in range(40):
        prompt = rng.integers(1, 1000, rng.integers(1, 10))
        completions = []
        for k in range(int(rng.integers(1, 7))):
            n = int(rng.integers(0, 13))
            completions.append(_completion(f"p{g}", k, prompt, rng.integers(1, 1000, n), -rng.random(n), float(k % 2)))
        groups.append(RolloutGroup(Prompt(f"p{g}", "", ""), tuple(completions), policy_version=0))
    batch = collate_groups(groups, scale_advantages_by_std=True, pad_token_id=-1)
    flat = [c for g in groups for c in g.completions]
    width = max(len(c.prompt_token_ids) + len(c.response_token_ids) for c in flat)
    ids, logp, mask = np.full((len(flat), width), -1), np.zeros((len(flat), width), np.float32), np.zeros((len(flat), width), bool)
    for b, c in enumerate(flat):
        p, t = len(c.prompt_token_ids), len(c.response_token_ids)
        ids[b, :p], ids[b, p:p + t] = c.prompt_token_ids, c.response_token_ids
        logp[b, p:p + t], mask[b, p:p + t] = c.behaviour_logprobs, True
    np.testing.assert_array_equal(batch.input_ids_BS, ids)
    np.testing.assert_array_equal(batch.behaviour_logp_BS, logp)
    np.testing.assert_array_equal(batch.response_mask_BS, mask)
    assert batch.input_ids_BS.dtype == np.int64 and batch.behaviour_logp_BS.dtype == np.float32


def test_response_arrays_are_the_response_only_view():
    batch = collate_groups(_hand_groups(), scale_advantages_by_std=False)
    arrays = batch.response_arrays()
    np.testing.assert_allclose(arrays.behaviour_BT, [
        [-0.1, -0.2, 0], [-0.3, 0, 0], [-0.4, -0.5, -0.6], [0, 0, 0]])
    np.testing.assert_array_equal(arrays.mask_BT, [
        [1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    np.testing.assert_array_equal(arrays.ids_BT, [
        [8, 9, 0], [10, 0, 0], [13, 14, 15], [0, 0, 0]])
    # Dr.GRPO: mean-centred only.
    np.testing.assert_allclose(batch.advantages_B, [0.5, -0.5, 0.0, 0.0])


def test_packed_response_tokens_are_row_major_and_unpack_to_zero_padding():
    """The correction call's packing of the hand batch: mask rows [1 1 0], [1 0 0], [1 1 1], [0 0 0]."""
    batch = collate_groups(_hand_groups(), scale_advantages_by_std=False)
    mask_BT = batch.response_arrays().mask_BT
    x_BT = np.array([[1, 2, 9], [3, 9, 9], [4, 5, 6], [9, 9, 9]], np.float64)  # 9: padding, never sent
    packed_N = pack_response(x_BT, mask_BT)
    assert packed_N.dtype == np.float32
    np.testing.assert_array_equal(packed_N, [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(unpack_response(packed_N, mask_BT, "x"),
                                  [[1, 2, 0], [3, 0, 0], [4, 5, 6], [0, 0, 0]])
    # the service's side: correction_input rebuilds the same [B, T] proximal log-probs
    np.testing.assert_array_equal(batch.correction_input(packed_N, 5).proximal_BT,
                                  [[1, 2, 0], [3, 0, 0], [4, 5, 6], [0, 0, 0]])
    with pytest.raises(ValueError, match=r"proximal log-probs: \(5,\) values packed, the batch has 6"):
        batch.correction_input(packed_N[:5], 5)
    with pytest.raises(ValueError, match="weights"):
        unpack_response(x_BT, mask_BT, "weights")  # [B, T] where packed values were expected


def test_response_view_matches_a_loop_and_the_torch_twin_on_random_ragged_rows():
    """The numpy view (driver, service, simulated ranks) and ``forward.gather_response`` (the learner's
    torch view) against a plain loop: ``x_BT[b, t] = x_BS[b, start_b + t]`` for t < len_b, else 0."""
    import torch

    from system.learner.forward import gather_response

    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.int64, np.bool_):
        B, S, T = 7, 12, 6
        start_B = rng.integers(1, 7, B)
        len_B = np.minimum(rng.integers(0, T + 1, B), S - start_B)
        x_BS = rng.normal(size=(B, S)).astype(dtype) if dtype != np.bool_ else rng.random((B, S)) < 0.5
        want = np.zeros((B, T), dtype=x_BS.dtype)
        for b in range(B):
            for t in range(len_B[b]):
                want[b, t] = x_BS[b, start_B[b] + t]
        got = response_view(x_BS, start_B, len_B, T)
        assert got.dtype == x_BS.dtype
        np.testing.assert_array_equal(got, want)
        twin = gather_response(torch.from_numpy(x_BS), torch.from_numpy(start_B), torch.from_numpy(len_B), T)
        np.testing.assert_array_equal(twin.numpy(), want)


def test_shard_keeps_global_advantages_and_widths():
    batch = collate_groups(_hand_groups(), scale_advantages_by_std=True)
    first, second = shard_batch(batch, 0, 2), shard_batch(batch, 1, 2)
    np.testing.assert_array_equal(second.input_ids_BS, batch.input_ids_BS[2:])
    np.testing.assert_array_equal(first.advantages_B, batch.advantages_B[:2])
    assert second.uids == ("b#0", "b#1")
    assert first.num_response_tokens == second.num_response_tokens == 3
    with pytest.raises(ValueError, match="does not split evenly"):
        shard_batch(batch, 0, 3)
    with pytest.raises(ValueError, match="rank"):
        shard_batch(batch, 2, 2)


def test_shard_rows_give_each_rank_its_part_of_every_global_mini_batch():
    # B = 12, R = 2, M = 2: one process's mini-batches are rows 0-5 and 6-11; each is split in two runs
    assert shard_rows(12, 0, 2, 2).tolist() == [0, 1, 2, 6, 7, 8]
    assert shard_rows(12, 1, 2, 2).tolist() == [3, 4, 5, 9, 10, 11]
    # one mini-batch: the contiguous blocks
    assert shard_rows(12, 1, 2).tolist() == [6, 7, 8, 9, 10, 11]
    # B = 14, R = 2, M = 3: a shard of 7 is sliced 3 / 2 / 2, so the global mini-batches are 6 / 4 / 4 rows:
    # 0-5 (rank 0: 0-2, rank 1: 3-5), 6-9 (6-7 | 8-9), 10-13 (10-11 | 12-13)
    assert shard_rows(14, 0, 2, 3).tolist() == [0, 1, 2, 6, 7, 10, 11]
    assert shard_rows(14, 1, 2, 3).tolist() == [3, 4, 5, 8, 9, 12, 13]
    order = rows_in_rank_order(14, 2, 3)
    assert sorted(order.tolist()) == list(range(14))  # every row once: the all-gather is put back in place
    gathered = np.concatenate([shard_rows(14, r, 2, 3) * 10 for r in range(2)])  # rank-order rows, tagged
    restored = np.empty_like(gathered)
    restored[order] = gathered
    assert restored.tolist() == [10 * i for i in range(14)]


def test_shard_batch_with_mini_batches_takes_rows_and_texts_in_shard_order():
    batch = collate_groups(_hand_groups(), scale_advantages_by_std=True)  # 4 rows: a#0 a#1 b#0 b#1
    first = shard_batch(batch, 0, 2, mini_batches=2)  # rows 0 and 2
    assert first.uids == ("a#0", "b#0")
    np.testing.assert_array_equal(first.input_ids_BS, batch.input_ids_BS[[0, 2]])
    np.testing.assert_array_equal(first.advantages_B, batch.advantages_B[[0, 2]])
    assert first.num_response_tokens == batch.num_response_tokens


def test_micro_batch_slices_cover_rows_in_order():
    assert micro_batch_slices(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_batch_slices(4, 8) == [slice(0, 4)]
    with pytest.raises(ValueError):
        micro_batch_slices(4, 0)


def test_collate_rejects_empty_input():
    with pytest.raises(ValueError, match="empty batch"):
        collate_groups([], scale_advantages_by_std=True)
    empty_prompt = RolloutGroup(Prompt("c", "", ""), (_completion("c", 0, [], [1], [-0.1], 0.0),), 0)
    with pytest.raises(ValueError, match="empty prompt"):
        collate_groups([empty_prompt], scale_advantages_by_std=True)


def test_loss_normalisers_count_valid_tokens_and_sequences():
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], bool)
    mu = np.array([[-0.1, np.nan, 0], [-0.3, 0, 0], [-0.4, -0.5, -0.6], [0, 0, 0]], np.float32)
    old = np.array([[-0.1, -0.2, 0], [np.inf, 0, 0], [-0.4, -0.5, -0.6], [0, 0, 0]], np.float32)
    norms = loss_normalisers(mask, mu, old)
    # valid: (0,0), (2,0), (2,1), (2,2); row 1's only token has old = inf.
    assert (norms.num_valid_tokens, norms.num_sequences) == (4, 2)
    with pytest.raises(ValueError, match="shape"):
        loss_normalisers(mask, mu[:, :2], old)
