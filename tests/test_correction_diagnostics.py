"""Diagnostics of spec section 1 on batches small enough to derive every number by hand."""

import math

import numpy as np
import pytest
import torch

from system.correction import (
    DIAGNOSTIC_KEYS,
    compute_diagnostics,
    compute_log_ratios,
    diagnostics_by_lag,
    select_sequences,
)
from system.correction.reductions import kth_smallest, median_of_nonnegative

NAN, INF = float("nan"), float("inf")
E = math.e

# The 2x3 batch used throughout (float64, so every input is exact):
#   row 0: mu = -1, -2, -0.5   old = -1.5, -1, -0.5   mask 1 1 1  -> d = -0.5, 1, 0
#   row 1: mu = -0.5, NaN, -3  old = -0.5, -1, 7      mask 1 1 0  -> d = 0; NaN is non-finite
#                                                                    (counted); 7 is padding
# Valid tokens: n = 4 with d = [-0.5, 1, 0, 0]; T = [3, 1]; L = [0.5, 0].
MU = [[-1.0, -2.0, -0.5], [-0.5, NAN, -3.0]]
OLD = [[-1.5, -1.0, -0.5], [-0.5, -1.0, 7.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def hand_batch():
    return compute_log_ratios(
        torch.tensor(MU, dtype=torch.float64),
        torch.tensor(OLD, dtype=torch.float64),
        torch.tensor(MASK),
    )


def test_log_ratios_of_the_hand_batch():
    r = hand_batch()
    assert r.valid_BT.tolist() == [[True, True, True], [True, False, False]]
    assert r.d_BT.tolist() == [[-0.5, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert r.rho_BT.tolist() == [[math.exp(-0.5), E, 1.0], [1.0, 0.0, 0.0]]
    assert r.num_valid_B.tolist() == [3, 1] and r.seq_valid_B.tolist() == [True, True]
    assert r.seq_logratio_B.tolist() == [0.5, 0.0]
    assert r.rho_seq_B.tolist() == pytest.approx([math.exp(0.5), 1.0], rel=1e-15)
    assert r.nonfinite_tokens == 1 and r.nonfinite_B.tolist() == [0, 1]
    assert r.behaviour_BT.tolist() == [[-1.0, -2.0, -0.5], [-0.5, 0.0, 0.0]]
    assert r.proximal_BT.tolist() == [[-1.5, -1.0, -0.5], [-0.5, 0.0, 0.0]]
    assert r.num_tokens == 4 and r.num_sequences == 2


def test_every_diagnostic_of_the_hand_batch():
    got = compute_diagnostics(hand_batch())
    assert list(got) == list(DIAGNOSTIC_KEYS)
    want = {
        "n_sequences": 2,
        "n_tokens": 4,
        "nonfinite_tokens": 1,
        "kl_k1": -(-0.5 + 1.0) / 4,  # mean(-d)
        "kl_k2": 0.5 * (0.25 + 1.0) / 4,  # mean(d^2 / 2)
        "kl_k3": ((math.exp(-0.5) - 1 + 0.5) + (E - 1 - 1)) / 4,  # zero-d tokens add 0
        "chi2_token": (math.exp(-1) + E**2 + 1 + 1) / 4 - 1,  # mean(rho^2) - 1
        "chi2_seq": (E + 1) / 2 - 1,  # rho_seq^2 = e^1, 1
        # mu = [-1, -2, -.5, -.5] (mean -1), old = [-1.5, -1, -.5, -.5] (mean -0.875):
        # centred mu [0, -1, .5, .5], centred old [-.625, -.125, .375, .375];
        # cov sum 0.5, var sums 1.5 and 0.6875
        "logp_pearson": 0.5 / math.sqrt(1.5 * 0.6875),
        "abs_diff_mean": 1.5 / 4,  # |d| = .5, 1, 0, 0
        "abs_diff_median": (0.0 + 0.5) / 2,  # sorted 0, 0, .5, 1: the two middles averaged
        "abs_diff_max": 1.0,
        "prob_abs_diff_mean": (
            abs(math.exp(-1.5) - math.exp(-1)) + abs(math.exp(-1) - math.exp(-2))
        )
        / 4,
        "frac_outside_2x": 1 / 4,  # only |d| = 1 > log 2 = 0.693
        "frac_outside_5x": 0.0,  # log 5 = 1.609
        "ess_token": (math.exp(-0.5) + E + 2) ** 2 / (4 * (math.exp(-1) + E**2 + 2)),
        "ess_seq": (math.exp(0.5) + 1) ** 2 / (2 * (E + 1)),
    }
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    assert all(type(v) in (int, float) for v in got.values())


def test_empty_batch_gives_zero_counts_and_none_never_nan():
    mu = torch.tensor([[NAN, -1.0], [-2.0, -3.0]])
    got = compute_diagnostics(
        compute_log_ratios(mu, torch.zeros(2, 2), torch.tensor([[1, 0], [0, 0]]))
    )
    assert got["n_sequences"] == 0 and got["n_tokens"] == 0
    assert got["nonfinite_tokens"] == 1  # the NaN was masked in
    assert all(got[k] is None for k in DIAGNOSTIC_KEYS[3:])
    got = compute_diagnostics(
        compute_log_ratios(torch.zeros(0, 5), torch.zeros(0, 5), torch.zeros(0, 5))
    )
    assert got["n_tokens"] == 0 and got["kl_k1"] is None


def test_pearson_is_none_for_a_constant_side_and_one_for_a_shift():
    mask = torch.ones(2, 3)
    mu = torch.full((2, 3), 0.1, dtype=torch.float64)  # 0.1: its float mean is not exactly 0.1
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -4.0]], dtype=torch.float64)
    assert compute_diagnostics(compute_log_ratios(mu, old, mask))["logp_pearson"] is None
    assert compute_diagnostics(compute_log_ratios(old, mu, mask))["logp_pearson"] is None
    # old = mu - 0.25: perfectly correlated
    assert compute_diagnostics(compute_log_ratios(old, old - 0.25, mask))[
        "logp_pearson"
    ] == pytest.approx(1.0)
    one = compute_diagnostics(compute_log_ratios(old[:1, :1], old[:1, :1], mask[:1, :1]))
    assert one["n_tokens"] == 1 and one["logp_pearson"] is None


def test_nonfinite_counts_only_masked_in_tokens():
    mu = torch.tensor([[NAN, INF, -INF, -1.0], [-1.0, -1.0, NAN, -1.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0, -INF], [NAN, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 0, 1]])
    r = compute_log_ratios(mu, old, mask)
    # row 0: all four non-finite on one side; row 1: the NaNs are masked out
    assert r.nonfinite_tokens == 4 and r.num_valid_B.tolist() == [0, 2]
    assert compute_diagnostics(r)["n_sequences"] == 1


def test_diagnostics_by_lag_split_the_hand_batch():
    got = diagnostics_by_lag(
        torch.tensor(MU), torch.tensor(OLD), torch.tensor(MASK), torch.tensor([3, 1])
    )
    assert list(got) == ["1", "3"]
    # lag 1 = row 1: one token with d = 0 and the NaN
    assert (
        got["1"]["n_tokens"] == 1 and got["1"]["nonfinite_tokens"] == 1 and got["1"]["kl_k3"] == 0.0
    )
    assert got["1"]["ess_token"] == 1.0 and got["1"]["logp_pearson"] is None
    # lag 3 = row 0: d = -0.5, 1, 0
    assert got["3"]["kl_k1"] == pytest.approx(-0.5 / 3) and got["3"]["abs_diff_median"] == 0.5
    assert got["3"]["chi2_seq"] == pytest.approx(E - 1)
    assert list(
        diagnostics_by_lag(torch.tensor(MU), torch.tensor(OLD), torch.tensor(MASK), [10, 2])
    ) == ["2", "10"]


def test_select_sequences_equals_recomputing_on_the_rows():
    rng = np.random.default_rng(0)
    mu, old = -rng.exponential(size=(6, 5)), -rng.exponential(size=(6, 5))
    mask = rng.random((6, 5)) < 0.7
    rows = np.array([True, False, True, True, False, False])
    sub = compute_diagnostics(
        select_sequences(compute_log_ratios(mu, old, mask), torch.from_numpy(rows))
    )
    assert sub == compute_diagnostics(compute_log_ratios(mu[rows], old[rows], mask[rows]))


@pytest.mark.parametrize(
    "bad",
    [
        (torch.zeros(3), torch.zeros(3), torch.ones(3)),
        (torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3)),
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, 2)),
        (torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3), torch.ones(2, 3)),
    ],
)
def test_bad_shapes_and_dtypes_raise_value_error(bad):
    with pytest.raises(ValueError, match="behaviour_logp|proximal_logp|mask"):
        compute_log_ratios(*bad)


def test_bad_lag_raises_value_error():
    with pytest.raises(ValueError, match="lag"):
        diagnostics_by_lag(torch.tensor(MU), torch.tensor(OLD), torch.tensor(MASK), [0, 1, 2])
    with pytest.raises(ValueError, match="integer"):
        diagnostics_by_lag(torch.tensor(MU), torch.tensor(OLD), torch.tensor(MASK), [0.0, 1.0])


def test_median_is_numpys_for_odd_even_and_ties():
    # values of the valid entries; invalid entries are 0 by precondition
    for values, want in [
        ([3.0], 3.0),
        ([2.0, 1.0], 1.5),
        ([0.0, 0.0, 5.0, 5.0], 2.5),
        ([1.0, 1.0, 1.0, 4.0], 1.0),
    ]:
        padded = torch.tensor(values + [0.0] * 3, dtype=torch.float64)
        assert median_of_nonnegative(padded, len(values)) == want == np.median(values)
    assert median_of_nonnegative(torch.zeros(4, dtype=torch.float64), 0) is None


@pytest.mark.parametrize("layout", ["random", "sorted", "reversed", "ties", "periodic"])
def test_kth_smallest_on_large_arrays_is_exact(layout):
    # Large enough for the sampled bracket; the "periodic" layout defeats a strided sample
    # and must fall back to the exact answer.
    rng = np.random.default_rng(1)
    n = 200_003
    x = {
        "random": rng.exponential(size=n),
        "sorted": np.sort(rng.random(n)),
        "reversed": np.sort(rng.random(n))[::-1].copy(),
        "ties": rng.integers(0, 5, size=n).astype(np.float64),
        "periodic": np.tile(np.arange(12.0), n // 12 + 1)[:n] * (np.arange(n) % 12 != 0)
        + (np.arange(n) % 12 == 0) * 1e6,
    }[layout]
    ranks = [1, n // 3, n // 2, n // 2 + 1, n]
    got = kth_smallest(torch.from_numpy(x), ranks)
    assert got == [np.partition(x, k - 1)[k - 1] for k in ranks]


def test_kth_smallest_brackets_a_batch_whose_row_length_a_stride_would_divide(monkeypatch):
    # A [4096, 1024] batch of |d| (4 M tokens): 1 at columns 0, 256, 512, 768 and i.i.d. exponential
    # elsewhere. A stride of 4 M / 16384 = 256 would sample only those columns (all 1) and miss the
    # median's bracket, searching all 4 M values; the pseudo-random sample brackets it, so no
    # selection runs on more than a few percent of the values (counted), and the answer is exact.
    from system.correction import reductions

    rng = np.random.default_rng(3)
    x_BT = rng.exponential(size=(4096, 1024))
    x_BT[:, ::256] = 1.0
    sizes = []
    select = reductions._select
    monkeypatch.setattr(reductions, "_select", lambda v, r: sizes.append(v.numel()) or select(v, r))
    n = x_BT.size
    got = kth_smallest(torch.from_numpy(x_BT.reshape(-1)), [n // 2, n // 2 + 1])
    assert got == list(np.partition(x_BT.reshape(-1), [n // 2 - 1, n // 2])[[n // 2 - 1, n // 2]])
    assert max(sizes) < 0.05 * n, sizes


def test_valid_tokens_is_one_definition_for_numpy_and_torch():
    """Spec section 0: m = 1 and both log-probs finite. By hand: row 0 keeps t0 (t1 NaN mu, t2 off);
    row 1 keeps t1 only (t0 inf old, t2 -inf mu)."""
    from system.correction.ratios import valid_tokens

    mask = np.array([[1, 1, 0], [1, 1, 1]], dtype=np.uint8)
    mu = np.array([[-1.0, np.nan, -1.0], [-1.0, -2.0, -np.inf]])
    old = np.array([[-1.0, -1.0, np.nan], [np.inf, -2.0, -1.0]])
    want = np.array([[True, False, False], [False, True, False]])
    np.testing.assert_array_equal(valid_tokens(mask, mu, old), want)
    got = valid_tokens(torch.from_numpy(mask), torch.from_numpy(mu), torch.from_numpy(old))
    assert got.dtype == torch.bool and got.numpy().tolist() == want.tolist()
    # and compute_log_ratios counts the same tokens
    assert compute_log_ratios(torch.from_numpy(mu), torch.from_numpy(old), torch.from_numpy(mask)).num_tokens == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compute_log_ratios_keeps_exactly_the_tokens_valid_tokens_keeps(dtype):
    """``compute_log_ratios`` finds the valid tokens in its one pass over ``d`` (finite ``d`` in float64
    iff both log-probs are finite); it must select the very tokens ``valid_tokens`` selects, token for
    token, with NaN, +inf and -inf sprinkled over either input and the mask."""
    from system.correction.ratios import valid_tokens

    rng = np.random.default_rng(7)
    mu, old = (rng.normal(-1.0, 1.0, (16, 40)).astype(dtype) for _ in range(2))
    for x in (mu, old):
        x[rng.random(x.shape) < 0.05] = np.nan
        x[rng.random(x.shape) < 0.03] = np.inf
        x[rng.random(x.shape) < 0.03] = -np.inf
    mask = (rng.random((16, 40)) < 0.8).astype(np.uint8)
    want = valid_tokens(mask, mu, old)
    got = compute_log_ratios(torch.from_numpy(mu), torch.from_numpy(old), torch.from_numpy(mask)).valid_BT
    assert 0 < want.sum() < mask.sum()  # some excluded, some kept
    np.testing.assert_array_equal(got.numpy(), want)
