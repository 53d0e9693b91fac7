"""Aggregation of per-token losses (spec section 5): by hand, across micro-batches, all-masked."""

import pytest
import torch

from system.losses import AGGREGATION_MODES, aggregate

NAN = float("nan")
# 2 x 3 losses; row 0 has 3 valid tokens, row 1 has 1 (its NaN sits on a padding position)
LOSS = [[1.0, 2.0, 3.0], [4.0, NAN, NAN]]
VALID = [[True, True, True], [True, False, False]]


@pytest.mark.parametrize(
    "mode, want",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum", ((1 + 2 + 3) + 4) / 2),
    ],
)
def test_modes_by_hand(mode, want):
    loss = torch.tensor(LOSS, requires_grad=True)
    out = aggregate(loss, torch.tensor(VALID), mode)
    assert out.item() == pytest.approx(want)
    out.backward()
    assert torch.isfinite(loss.grad).all() and loss.grad[1, 1:].tolist() == [0.0, 0.0]


def test_rejected_tokens_still_count_in_the_token_mean():
    # a correction weight of 0 made token (0, 2) contribute 0; it stays in the denominator
    loss = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]])
    assert aggregate(loss, torch.tensor(VALID), "token-mean").item() == pytest.approx(7 / 4)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_global_counts_make_micro_batches_sum_to_the_global_mean(mode):
    torch.manual_seed(0)
    loss = torch.randn(6, 5, dtype=torch.float64)
    valid = torch.rand(6, 5) < 0.6
    valid[4] = False  # an empty response in the batch
    whole = aggregate(loss, valid, mode)
    num_tok, num_seq = float(valid.sum()), float((valid.sum(1) >= 1).sum())
    parts = [
        aggregate(loss[rows], valid[rows], mode, num_tok, num_seq)
        for rows in (slice(0, 2), slice(2, 5), slice(5, 6))
    ]
    assert sum(parts).item() == pytest.approx(whole.item(), rel=1e-12)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("counts", [(None, None), (0.0, 0.0), (10.0, 3.0)])
def test_all_masked_batch_gives_zero_with_a_graph_not_nan(mode, counts):
    loss = torch.full((2, 3), NAN, requires_grad=True)
    out = aggregate(loss * 2.0, torch.zeros(2, 3, dtype=torch.bool), mode, *counts)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert loss.grad.tolist() == [[0.0] * 3] * 2


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="learner.aggregation .token-sum. is not one of"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), "token-sum")
    with pytest.raises(ValueError, match="shape|same"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool), "token-mean")
    with pytest.raises(ValueError, match="num_valid_tokens_global"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), "token-mean", -1.0)
