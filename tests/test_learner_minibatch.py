"""Several optimiser updates per batch (epochs x mini-batches), one process, plain unsharded model.

Why the clip needs a second update (spec section 5): the first update's ``cur`` is computed
with the weights that produced ``old``, through the same micro-batches, so ``r = exp(cur - old)``
is exactly 1 and ``clip(r)`` never differs from ``r``. Only after an optimiser step can ``r`` leave
``[1 - eps_lo, 1 + eps_hi] = [0.8, 1.28]``.

How large the learning rate must be for that: Adam's first step moves EVERY parameter by
exactly ``lr`` (bias-corrected ``m / sqrt(v) = g / |g| = sign(g)``), whatever the gradient's
scale, so neither ``grad_clip`` nor the loss normaliser shrinks it. A token's log-prob then
moves by ``d = sum_j d logp / d theta_j * lr * sign(g_j)``, at most ``lr * |grad logp|_1``. The
clip acts on a token with ``A > 0`` once ``d > log 1.28 = 0.247``, with ``A < 0`` once
``d < log 0.8 = -0.223``. The tiny model (about 2e4 parameters) has ``|grad logp|_1`` of order
1e2, but the batch's tokens pull the shared weights in different directions, so the realised
``|d|`` is smaller: measured, ``lr = 1e-3`` moves the largest ``|log r|`` of the 31 valid tokens
to 0.20 (< 0.247: the clip never acts), ``lr = 1e-2`` to 0.85 (about 16 of 31 clipped). The
tests use ``lr = 1e-2``: about 3.4x past the bound on the largest token.
"""

import numpy as np
import pytest
import torch
from test_learner_step import (
    TEMPERATURE,
    make_batch,
    make_weights,
    reference_step,
    save_tiny_model,
)
from transformers import Qwen2ForCausalLM

from system.config.learner import CTPOLossConfig, LearnerConfig, PPOLossConfig
from system.learner.batch import mini_batch_slices, shard_batch, update_micro_slices
from system.learner.collate import collate_groups
from system.learner.forward import proximal_logprobs, shard_tensors
from system.learner.optim import build_optimizer, build_scheduler
from system.learner.step import Trainee, mini_batch_normalisers, train_step, train_updates
from system.learner.step_metrics import combine_updates
from system.losses.aggregation import LossNormalisers, loss_normalisers
from system.types import Completion, Prompt, RolloutGroup

LR = 1e-2  # see the module docstring: moves |log r| past log 1.28 after one Adam step


def _setup(tmp_path, **cfg_kwargs):
    cfg = LearnerConfig(num_ranks=1, lr=LR, micro_batch_size=5, param_dtype="float32", **cfg_kwargs)
    model = Qwen2ForCausalLM.from_pretrained(save_tiny_model(tmp_path / "m"))
    opt = build_optimizer(model, cfg)
    batch = make_batch()
    shard = shard_tensors(batch, torch.device("cpu"))
    old_BT = proximal_logprobs(model, shard, cfg.micro_batch_size, TEMPERATURE, cfg.mini_batches)
    arrays = batch.response_arrays()
    norms = loss_normalisers(arrays.mask_BT, arrays.behaviour_BT, old_BT.numpy())
    w_BT = torch.from_numpy(make_weights(batch))
    return cfg, model, opt, build_scheduler(opt, cfg), batch, shard, old_BT, w_BT, norms


def test_mini_batch_slices_are_contiguous_and_balanced():
    assert mini_batch_slices(10, 3) == [slice(0, 4), slice(4, 7), slice(7, 10)]
    assert mini_batch_slices(4, 1) == [slice(0, 4)]
    assert mini_batch_slices(4, 4) == [slice(k, k + 1) for k in range(4)]
    with pytest.raises(ValueError, match="cannot be split into 3 mini-batches"):
        mini_batch_slices(2, 3)
    with pytest.raises(ValueError, match=">= 1"):
        mini_batch_slices(2, 0)


def _hand_batch():
    """8 responses of known lengths (2 groups of 4); one NaN behaviour log-prob (row 2, t = 1)."""
    lengths = [3, 0, 2, 4, 1, 5, 2, 3]
    groups = []
    for g in range(2):
        completions = []
        for k in range(4):
            n = lengths[4 * g + k]
            mu = np.full(n, -0.5, np.float32)
            if (g, k) == (0, 2):
                mu[1] = np.nan
            completions.append(Completion(f"p{g}", k, np.array([1, 2]), np.arange(1, n + 1), mu, "", float(k), 0))
        groups.append(RolloutGroup(Prompt(f"p{g}", "", ""), tuple(completions), 0))
    return collate_groups(groups, scale_advantages_by_std=True)


def test_mini_batch_normalisers_by_hand():
    """2 ranks x 4 rows, 2 mini-batches: mini-batch k = rows 2k, 2k+1 of EACH rank's shard.

    Valid tokens per row (after the NaN behaviour token of row 2 and the NaN proximal token of
    row 5, t = 0): [3, 0, 1, 4 | 1, 4, 2, 3]. Mini-batch 0 = rows {0, 1, 4, 5}: 3 + 0 + 1 + 4 = 8
    tokens in 3 sequences (row 1 is empty); mini-batch 1 = rows {2, 3, 6, 7}: 1 + 4 + 2 + 3 = 10
    tokens in 4 sequences. They add up to the whole batch's 18 tokens in 7 sequences.
    """
    batch = _hand_batch()
    proximal_BT = np.full((batch.num_sequences, batch.num_response_tokens), -0.4, np.float32)
    proximal_BT[5, 0] = np.nan
    per_rank = []
    for rank in range(2):
        shard = shard_tensors(shard_batch(batch, rank, 2), torch.device("cpu"))
        slices = mini_batch_slices(shard.num_sequences, 2)
        per_rank.append(mini_batch_normalisers(shard, torch.from_numpy(proximal_BT[4 * rank: 4 * rank + 4]), slices))
    # what the all-reduce over the ranks adds up (no process group here: each rank's own counts)
    summed = [LossNormalisers(a.num_valid_tokens + b.num_valid_tokens, a.num_sequences + b.num_sequences)
              for a, b in zip(*per_rank, strict=True)]
    assert per_rank[0] == [LossNormalisers(3, 1), LossNormalisers(5, 2)]
    assert per_rank[1] == [LossNormalisers(5, 2), LossNormalisers(5, 2)]
    assert summed == [LossNormalisers(8, 3), LossNormalisers(10, 4)]
    arrays = batch.response_arrays()
    assert loss_normalisers(arrays.mask_BT, arrays.behaviour_BT, proximal_BT) == LossNormalisers(18, 7)


def test_mini_batches_match_the_naive_reference(tmp_path):
    """2 epochs x 2 mini-batches of 6 rows (micro-batches of 5 inside): each update equals the naive
    step on its rows alone, normalised by that mini-batch's valid tokens."""
    cfg, model, opt, sched, batch, shard, old_BT, w_BT, norms = _setup(tmp_path, updates_per_batch=2, mini_batches=2)
    ref = Qwen2ForCausalLM.from_pretrained(tmp_path / "m")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr, weight_decay=0.0)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    metrics = train_updates(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, w_BT, norms)
    ref_losses, ref_norms = [], []
    for _ in range(2):
        for rows in (slice(0, 6), slice(6, 12)):
            loss, norm = reference_step(ref, ref_opt, batch.rows(rows), old_BT[rows].numpy(), w_BT[rows].numpy(),
                                        cfg.grad_clip)
            ref_losses.append(loss)
            ref_norms.append(norm)
    assert metrics["updates"] == 4 and metrics["skipped_updates"] == 0 and metrics["skipped_step"] == 0
    assert metrics["last/loss"] == pytest.approx(ref_losses[-1], rel=1e-5, abs=1e-7)
    assert metrics["loss"] == pytest.approx(np.mean(ref_losses), rel=1e-5, abs=1e-7)
    assert metrics["last/grad_norm"] == pytest.approx(ref_norms[-1], rel=1e-5)
    assert metrics["grad_norm"] == pytest.approx(np.mean(ref_norms), rel=1e-5)
    # the whole batch's counts, not one mini-batch's
    assert (metrics["num_valid_tokens"], metrics["num_sequences"]) == (norms.num_valid_tokens, norms.num_sequences)
    assert metrics["last/num_valid_tokens"] < norms.num_valid_tokens
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        if name.endswith("k_proj.bias"):  # exact gradient 0, see test_learner_step
            bound = 1.01 * cfg.lr * 4
            assert (p - initial[name]).abs().max() <= bound and (q - initial[name]).abs().max() <= bound, name
            continue
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-3 * cfg.lr, msg=lambda m, n=name: f"{n}: {m}")


def test_weights_in_flight_are_fetched_once_after_the_first_forward_and_change_nothing(tmp_path):
    """A callable weights source (the correction call still running) is called exactly once, after
    the first micro-batch's forward pass (so the call overlaps it), and the updates are the same,
    bit for bit, as with the tensor given up front (2 epochs x 2 mini-batches)."""
    results = {}
    for mode in ("tensor", "in flight"):
        cfg, model, opt, sched, _, shard, old_BT, w_BT, norms = _setup(
            tmp_path / mode, updates_per_batch=2, mini_batches=2)
        forwards, fetched_at = [], []
        model.register_forward_hook(lambda *_, forwards=forwards: forwards.append(1))

        def fetch(w_BT=w_BT, forwards=forwards, fetched_at=fetched_at):
            fetched_at.append(len(forwards))
            return w_BT
        weights = w_BT if mode == "tensor" else fetch
        metrics = train_updates(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, weights, norms)
        results[mode] = (metrics, {n: p.detach().clone() for n, p in model.named_parameters()}, fetched_at)
    (m_tensor, p_tensor, _), (m_flight, p_flight, fetched_at) = results["tensor"], results["in flight"]
    assert fetched_at == [1]  # once, when one forward pass (the first micro-batch's) had run
    assert m_flight == m_tensor
    for name, p in p_tensor.items():
        assert torch.equal(p_flight[name], p), name
    # the fetched weights are checked like given ones
    cfg, model, opt, sched, _, shard, old_BT, w_BT, norms = _setup(tmp_path / "bad", mini_batches=2)
    with pytest.raises(ValueError, match="weights have shape"):
        train_updates(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, lambda: w_BT[:-1], norms)


def test_normalisers_of_another_batch_are_refused(tmp_path):
    cfg, model, opt, sched, _, shard, old_BT, w_BT, norms = _setup(tmp_path, mini_batches=2)
    wrong = LossNormalisers(norms.num_valid_tokens + 1, norms.num_sequences)
    with pytest.raises(ValueError, match="not computed from this batch"):
        train_updates(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, w_BT, wrong)
    with pytest.raises(ValueError, match="weights have shape"):
        train_updates(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, w_BT[:-1], norms)


def test_normalisers_below_the_shards_own_counts_are_refused_with_one_mini_batch(tmp_path):
    """Found by a review: with one mini-batch the counts were used as given, so (0, 0) or negative ones
    turned the token mean into a sum (24x the loss and gradient on its batch) and (1e6, 1e6) into 0,
    without a word; with several mini-batches the same counts were refused. A single rank's shard is the
    whole batch here, so its own counts are the global ones: fewer is impossible."""
    cfg, model, opt, sched, _, shard, old_BT, w_BT, norms = _setup(tmp_path, mini_batches=1)
    trainee = Trainee(model, opt, sched, cfg, TEMPERATURE)
    for wrong in (LossNormalisers(0, 0), LossNormalisers(-7, -1), LossNormalisers(norms.num_valid_tokens - 1,
                                                                                  norms.num_sequences)):
        with pytest.raises(ValueError, match=r"fewer than this shard's own \d+ in \d+: they were not computed"):
            train_updates(trainee, shard, old_BT, w_BT, wrong)
    train_updates(trainee, shard, old_BT, w_BT, norms)  # its own counts: accepted


@pytest.mark.parametrize("loss_cfg, clip_keys", [
    (PPOLossConfig(), ("clip_frac_low", "clip_frac_high")),
    (CTPOLossConfig(), ("clip_frac_low", "clip_frac_high", "clip_frac_dual")),
])
def test_the_clip_acts_from_the_second_update(tmp_path, loss_cfg, clip_keys):
    """Update 1: r == 1, no clip; update 2 (same batch, same old): the clip acts. ``train_updates``
    reports the mean over both updates (token-weighted: half the second's) and ``last/``."""
    cfg, model, opt, sched, _, shard, old_BT, w_BT, norms = _setup(tmp_path, loss=loss_cfg)
    first = train_step(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, w_BT, norms)
    second = train_step(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, w_BT, norms)
    assert first["loss/ratio_mean"] == 1.0
    assert all(first[f"loss/{k}"] == 0.0 for k in clip_keys)
    assert sum(second[f"loss/{k}"] for k in clip_keys) > 0.0
    if loss_cfg.type == "ppo":
        assert first["loss/clip_frac"] == 0.0 and second["loss/clip_frac"] > 0.0
        assert second["loss/clip_frac"] == pytest.approx(second["loss/clip_frac_low"] + second["loss/clip_frac_high"])

    cfg2, model2, opt2, sched2, _, shard2, old2, w2, norms2 = _setup(tmp_path / "again", loss=loss_cfg,
                                                                      updates_per_batch=2)
    both = train_updates(Trainee(model2, opt2, sched2, cfg2, TEMPERATURE), shard2, old2, w2, norms2)
    for k in clip_keys:
        assert both[f"last/loss/{k}"] == pytest.approx(second[f"loss/{k}"])
        assert both[f"loss/{k}"] == pytest.approx((first[f"loss/{k}"] + second[f"loss/{k}"]) / 2)
    assert both["last/loss"] == pytest.approx(second["loss"], rel=1e-6)
    assert both["updates"] == 2


def test_combine_updates_by_hand():
    """Token means weighted by each update's tokens, per-update values plainly, counts per epoch."""
    def update(n, clip, loss, skipped=0.0):
        return {"loss": loss, "num_valid_tokens": n, "num_sequences": 1.0, "entropy": 1.0, "grad_norm": 2.0,
                "lr": 0.1, "skipped_step": skipped, "loss/clip_frac": clip}
    # 2 epochs x 2 mini-batches of 10 and 30 tokens
    per_update = [update(10, 0.0, 1.0), update(30, 0.2, 2.0), update(10, 0.4, 3.0, 1.0), update(30, 0.6, 4.0)]
    out = combine_updates(per_update, epochs=2)
    assert out["loss/clip_frac"] == pytest.approx((0 * 10 + 0.2 * 30 + 0.4 * 10 + 0.6 * 30) / 80)
    assert out["loss"] == pytest.approx(2.5)
    assert out["skipped_step"] == 0.25 and out["skipped_updates"] == 1.0 and out["updates"] == 4.0
    assert out["num_valid_tokens"] == 40 and out["num_sequences"] == 2
    assert out["last/loss/clip_frac"] == 0.6 and out["last/num_valid_tokens"] == 30
    with pytest.raises(ValueError, match="equal epochs"):
        combine_updates(per_update[:3], epochs=2)


def test_update_micro_slices_are_each_mini_batchs_micro_batches():
    # 12 rows, 2 mini-batches of 6, micro-batches of 5: [0, 5) [5, 6) | [6, 11) [11, 12)
    assert update_micro_slices(12, 2, 5) == [slice(0, 5), slice(5, 6), slice(6, 11), slice(11, 12)]
    assert update_micro_slices(12, 1, 5) == [slice(0, 5), slice(5, 10), slice(10, 12)]
    assert update_micro_slices(7, 3, 2) == [slice(0, 2), slice(2, 3), slice(3, 5), slice(5, 7)]


def test_old_equals_cur_exactly_with_several_mini_batches(tmp_path, monkeypatch):
    """With the weights held still (lr 0), every update of every mini-batch sees cur == old bit for bit:
    the proximal recompute ran through the same micro-batches as the updates (mini-batches of 6 rows in
    micro-batches of 5). Through the whole shard's micro-batches instead, rows 5-11 came out up to
    2.4e-7 apart in fp32 on AMD EPYC (other batch shapes, other summation orders), so the clip could
    act on the first update."""
    import system.learner.step as step_module

    cfg, model, opt, sched, _, shard, old_BT, w_BT, norms = _setup(tmp_path, mini_batches=2, updates_per_batch=2)
    for group in opt.param_groups:
        group["lr"] = group["initial_lr"] = 0.0
    sched.base_lrs = [0.0 for _ in sched.base_lrs]  # the schedule would set it back at every step
    seen = []
    real = step_module.policy_token_loss

    def spy(cur_BT, old_rows_BT, adv_B, w_rows_BT, valid_rows_BT, loss_cfg):
        seen.append((cur_BT.detach()[valid_rows_BT], old_rows_BT[valid_rows_BT]))
        return real(cur_BT, old_rows_BT, adv_B, w_rows_BT, valid_rows_BT, loss_cfg)

    monkeypatch.setattr(step_module, "policy_token_loss", spy)
    out = train_updates(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, w_BT, norms)
    assert len(seen) == 2 * 4  # 2 updates x (2 micro-batches in each of 2 mini-batches)
    assert all(torch.equal(cur, old) for cur, old in seen)
    assert out["loss/ratio_mean"] == 1.0 and out["loss/clip_frac"] == 0.0


def test_surrogate_stats_are_weighted_by_their_own_tokens_and_by_position_bucket():
    """Found by a review: CTPO's clip fractions by position bucket (spec section 4: "log clip fractions by
    position bucket") never reached the metrics; and a stat was weighted by the micro-batch's valid tokens
    though the surrogate counted fewer (a token whose current log-prob is not finite). By hand, two
    micro-batches of 4 valid tokens each:
      m1: the surrogate counted 4 tokens, clip_frac 0.5; by position: <=128 1 of 2 hit, <=512 1 of 2
      m2: it counted 2 (two tokens with cur = -inf), clip_frac 1.0; by position: <=128 0 of 2, none beyond
    clip_frac = (0.5 * 4 + 1.0 * 2) / 6 = 2/3 (weighted by valid tokens it was (2 + 4) / 8 = 0.75);
    <=128: (1 + 0) / (2 + 2) = 0.25; <=512: 1 / 2 = 0.5; >2048: no token, 0 with 0 tokens."""
    from system.learner.step_metrics import MetricSums

    sums = MetricSums(torch.device("cpu"))
    valid = torch.ones(1, 4, dtype=torch.bool)
    w = torch.ones(1, 4)
    buckets = {"<=128": None, "<=512": None, "<=2048": None, ">2048": None}
    sums.add_micro_batch(torch.tensor(1.0), valid, w, None, {
        "num_tokens": 4, "clip_frac": 0.5, "num_tokens_by_pos": {"<=128": 2, "<=512": 2, "<=2048": 0, ">2048": 0},
        "clip_frac_high_by_pos": {**buckets, "<=128": 0.5, "<=512": 0.5}})
    sums.add_micro_batch(torch.tensor(1.0), valid, w, None, {
        "num_tokens": 2, "clip_frac": 1.0, "num_tokens_by_pos": {"<=128": 2, "<=512": 0, "<=2048": 0, ">2048": 0},
        "clip_frac_high_by_pos": {**buckets, "<=128": 0.0}})
    out = sums.reduce()
    assert out["loss/clip_frac"] == pytest.approx(2 / 3)
    assert out["loss/clip_frac_high_by_pos/<=128"] == pytest.approx(0.25)
    assert out["loss/clip_frac_high_by_pos/<=512"] == pytest.approx(0.5)
    assert out["loss/clip_frac_high_by_pos/>2048"] == 0.0 and out["loss/tokens_by_pos/>2048"] == 0.0
    assert (out["loss/tokens_by_pos/<=128"], out["loss/tokens_by_pos/<=512"]) == (4.0, 2.0)
    # over two updates, a bucket's fraction is weighted by that bucket's tokens in each
    first = {"num_valid_tokens": 8.0, "num_sequences": 2.0, "loss": 1.0, **out}
    second = {**first, "loss/clip_frac_high_by_pos/<=512": 1.0, "loss/tokens_by_pos/<=512": 6.0}
    both = combine_updates([first, second], epochs=1)
    assert both["loss/clip_frac_high_by_pos/<=512"] == pytest.approx((0.5 * 2 + 1.0 * 6) / 8)
    assert both["loss/tokens_by_pos/<=512"] == 8.0


def test_ctpo_reports_its_position_buckets_through_a_real_step(tmp_path):
    """The per-position clip fractions of CTPO reach the step's metrics (all four buckets; the tiny batch's
    responses are short, so every token is in <=128)."""
    from system.config.learner import CTPOLossConfig

    cfg, model, opt, sched, _, shard, old_BT, w_BT, norms = _setup(tmp_path, loss=CTPOLossConfig())
    metrics = train_updates(Trainee(model, opt, sched, cfg, TEMPERATURE), shard, old_BT, w_BT, norms)
    for kind in ("low", "high", "dual"):
        assert {f"loss/clip_frac_{kind}_by_pos/{b}" for b in ("<=128", "<=512", "<=2048", ">2048")} <= set(metrics)
    assert metrics["loss/tokens_by_pos/<=128"] == metrics["num_valid_tokens"]
    assert metrics["loss/tokens_by_pos/<=512"] == 0.0


def test_updates_are_combined_by_the_tokens_their_surrogate_counted():
    # update A counted 0 tokens (its stat 0.0 means nothing), update B 8 with clip_frac 0.5: 0.5, not 0.25
    base = {"num_valid_tokens": 8.0, "num_sequences": 2.0, "loss": 1.0}
    a = {**base, "loss/clip_frac": 0.0, "loss/tokens": 0.0}
    b = {**base, "loss/clip_frac": 0.5, "loss/tokens": 8.0}
    out = combine_updates([a, b], epochs=2)
    assert out["loss/clip_frac"] == 0.5 and out["loss/tokens"] == 4.0  # tokens per epoch, as the counts
