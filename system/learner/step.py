"""One optimiser step on this rank's shard: micro-batched loss and backward, clip, AdamW, schedule.

Why the R-rank gradient equals the one-process gradient: the global loss is

    L = sum_r sum_m L[r, m],   L[r, m] = aggregate(l_BT of micro-batch m on rank r, N_tok, N_seq)

where ``N_tok`` / ``N_seq`` are the GLOBAL normalisers (valid tokens / sequences of the whole
batch, before any weight masks a token: spec section 5). So ``grad L = sum_{r,m} grad L[r, m]``.
``backward`` sums over micro-batches on a rank; FSDP2's reduce-scatter AVERAGES over the R
ranks, so each rank back-propagates ``R * L[r, m]``:  (1/R) sum_r R sum_m grad L[r, m] = grad L.

Valid tokens (spec section 0): response tokens whose behaviour and proximal log-probs are both
finite; everything else is replaced by 0 before any arithmetic and excluded from the loss.
A non-finite global gradient norm skips the optimiser step (every rank sees the same norm).

Mini-batches (``train_updates``): with ``learner.mini_batches`` = M, each epoch takes M steps;
step k trains on the k-th contiguous row slice of every rank's shard, so "the global batch"
above becomes the union of those slices over the ranks, and ``N_tok`` / ``N_seq`` are counted
on it alone (all-reduced once per batch; still before any weight masks a token). The shards are
cut so that this union is the k-th run of consecutive rows of the batch, as one process would
train it (``batch.shard_rows``): the updates do not depend on the number of ranks.

Weights in flight: ``weights_BT`` may be a zero-argument callable instead of a tensor (the
correction call still running). It is called once, right after the first micro-batch's forward
pass, the first point where a weight is needed (its loss), so the call overlaps that forward.
On several ranks the callable is itself collective (rank 0 waits, then broadcasts): every rank
reaches it at the same point of the same schedule.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from system.config.learner import LearnerConfig
from system.correction.ratios import valid_tokens
from system.learner.batch import micro_batch_slices, mini_batch_slices
from system.learner.forward import ShardTensors, response_logprobs
from system.learner.logprobs import Sampling
from system.learner.step_metrics import MetricSums, combine_updates
from system.losses.aggregation import LossNormalisers, aggregate
from system.losses.registry import policy_token_loss


@dataclass(frozen=True)
class Trainee:
    """What an optimiser step trains and how: the model, its optimiser and LR schedule, the learner's
    config, and the rollout's sampling (temperature, top-p, top-k: ``forward.response_logprobs``
    applies the same truncation to the current log-probs)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    cfg: LearnerConfig
    sampling: float | Sampling


def mini_batch_normalisers(
    shard: ShardTensors, proximal_logp_BT: torch.Tensor, slices: list[slice]
) -> list[LossNormalisers]:
    """The normalisers of each mini-batch: mini-batch k is the rows ``slices[k]`` of EVERY rank's
    shard, so its counts are this shard's counts of those rows summed over all ranks (one
    all-reduce; collective: call on every rank with the same number of slices). The valid
    tokens are counted before any weight masks a token, as ``loss_normalisers`` does."""
    valid_BT = valid_tokens(shard.response_mask_BT, shard.behaviour_logp_BT, proximal_logp_BT)
    counts_K = torch.stack([  # [K, 2]: valid tokens, sequences
        torch.stack([valid_BT[rows].sum(), (valid_BT[rows].sum(dim=1) >= 1).sum()]) for rows in slices
    ]).to(torch.int64)
    if dist.is_initialized():
        dist.all_reduce(counts_K, op=dist.ReduceOp.SUM)
    return [LossNormalisers(int(tok), int(seq)) for tok, seq in counts_K.tolist()]


Weights = torch.Tensor | Callable[[], torch.Tensor]
"""The correction weights of a shard ``[B, T]``, or a callable that returns them (in flight)."""


class _WeightsOnce:
    """A callable weights source resolved once (the first caller waits; the rest reuse the tensor)."""

    def __init__(self, fetch: Callable[[], torch.Tensor], shape: tuple[int, ...]) -> None:
        self.fetch, self.shape, self.value = fetch, shape, None

    def get(self) -> torch.Tensor:
        if self.value is None:
            value = self.fetch()
            if tuple(value.shape) != self.shape:
                raise ValueError(f"weights have shape {tuple(value.shape)}, expected the shard's [B, T] = {self.shape}")
            self.value = value
        return self.value


def _checked_weights(weights_BT: torch.Tensor, valid_BT: torch.Tensor) -> torch.Tensor:
    if weights_BT.shape != valid_BT.shape:
        raise ValueError(f"weights have shape {tuple(weights_BT.shape)}, expected [B, T] = {tuple(valid_BT.shape)}")
    bad = valid_BT & ~(torch.isfinite(weights_BT) & (weights_BT >= 0))
    if bad.any():
        raise ValueError(f"{int(bad.sum())} correction weights on valid tokens are negative or non-finite")
    return torch.where(valid_BT, weights_BT.float(), 0.0).detach()


def global_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip in place to ``max_norm``; returns the pre-clip L2 norm over ALL ranks' shards."""
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def train_step(
    trainee: Trainee,
    shard: ShardTensors,
    proximal_logp_BT: torch.Tensor,
    weights_BT: Weights,
    normalisers: LossNormalisers,
) -> dict[str, float]:
    """One optimiser step; returns metrics reduced over all ranks. Collective: call on every rank.

    ``weights_BT``: a tensor, or a callable called after the first micro-batch's forward."""
    model, optimizer, scheduler, cfg, sampling = (trainee.model, trainee.optimizer, trainee.scheduler, trainee.cfg,
                                                 trainee.sampling)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if proximal_logp_BT.shape != shard.response_mask_BT.shape:
        raise ValueError(
            f"proximal log-probs have shape {tuple(proximal_logp_BT.shape)}, expected the shard's "
            f"[B, T] = {tuple(shard.response_mask_BT.shape)}"
        )
    valid_BT = valid_tokens(shard.response_mask_BT, shard.behaviour_logp_BT, proximal_logp_BT)
    proximal_valid_BT = torch.where(valid_BT, proximal_logp_BT, 0.0).detach()
    w_BT = _checked_weights(weights_BT, valid_BT) if isinstance(weights_BT, torch.Tensor) else None
    num_tok, num_seq = max(1, normalisers.num_valid_tokens), max(1, normalisers.num_sequences)
    sums = MetricSums(proximal_logp_BT.device)
    optimizer.zero_grad(set_to_none=True)
    for rows in micro_batch_slices(shard.num_sequences, cfg.micro_batch_size):
        current_BT, entropy_BT = response_logprobs(model, shard, rows, sampling, with_entropy=True)
        if w_BT is None:  # in flight until now: the first loss needs them
            w_BT = _checked_weights(weights_BT(), valid_BT)
        loss_BT, stats = policy_token_loss(
            current_BT, proximal_valid_BT[rows], shard.advantages_B[rows], w_BT[rows], valid_BT[rows], cfg.loss
        )
        loss = aggregate(loss_BT, valid_BT[rows], cfg.aggregation, num_tok, num_seq)
        (loss * world_size).backward()
        sums.add_micro_batch(loss, valid_BT[rows], w_BT[rows], entropy_BT, stats)
    if w_BT is None:  # no micro-batch (an empty shard): still take part in the weights' collective
        _checked_weights(weights_BT(), valid_BT)
    grad_norm = global_grad_norm(model, cfg.grad_clip)
    lr = scheduler.get_last_lr()[0]
    stepped = bool(torch.isfinite(grad_norm))
    if stepped:
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    metrics = sums.reduce()
    metrics.update(grad_norm=float(grad_norm), lr=float(lr), skipped_step=float(not stepped))
    return metrics


def train_updates(
    trainee: Trainee,
    shard: ShardTensors,
    proximal_logp_BT: torch.Tensor,
    weights_BT: Weights,
    normalisers: LossNormalisers,
) -> dict[str, float]:
    """Every optimiser step of one batch: ``cfg.updates_per_batch`` epochs, each of ``cfg.mini_batches``
    steps on consecutive row slices of this shard (the same slices in every epoch, mini-batch k
    being slice k of every rank's shard). Collective: call on every rank.

    ``normalisers`` are the global batch's counts. With one mini-batch they are used as given (counts
    below this shard's own, negative ones included, raise ValueError);
    with several, each mini-batch's are counted over its own global rows
    (``mini_batch_normalisers``) and must add up to ``normalisers`` (else ValueError: the counts
    do not belong to this batch). Every update uses the same proximal log-probs and weights, so
    the PPO / CTPO clip can act from the second update on (spec section 5). Metrics:
    ``combine_updates`` (means over the updates, ``last/<key>`` of the last update).
    """
    cfg = trainee.cfg
    expected = tuple(shard.response_mask_BT.shape)
    if tuple(proximal_logp_BT.shape) != expected:
        raise ValueError(f"proximal log-probs have shape {tuple(proximal_logp_BT.shape)}, expected the shard's "
                         f"[B, T] = {expected}")
    weights = _WeightsOnce(weights_BT if callable(weights_BT) else (lambda: weights_BT), expected)
    if not callable(weights_BT):
        weights.get()  # a tensor: its shape is checked now, a call in flight's when it returns
    slices = mini_batch_slices(shard.num_sequences, cfg.mini_batches)
    if len(slices) == 1:  # global counts: no rank can check them whole, but none may be below its own
        valid_BT = valid_tokens(shard.response_mask_BT, shard.behaviour_logp_BT, proximal_logp_BT)
        own = (int(valid_BT.sum()), int((valid_BT.sum(dim=1) >= 1).sum()))
        if normalisers.num_valid_tokens < own[0] or normalisers.num_sequences < own[1]:
            raise ValueError(
                f"the batch's normalisers say {normalisers.num_valid_tokens} valid tokens in "
                f"{normalisers.num_sequences} sequences, fewer than this shard's own {own[0]} in {own[1]}: "
                "they were not computed from this batch and these proximal log-probs")
        norms = [normalisers]
    else:
        norms = mini_batch_normalisers(shard, proximal_logp_BT, slices)
        total = (sum(n.num_valid_tokens for n in norms), sum(n.num_sequences for n in norms))
        if total != (normalisers.num_valid_tokens, normalisers.num_sequences):
            raise ValueError(
                f"the mini-batches hold {total[0]} valid tokens in {total[1]} sequences but the batch's "
                f"normalisers say {normalisers.num_valid_tokens} in {normalisers.num_sequences}: "
                "they were not computed from this batch and these proximal log-probs"
            )
    per_update = []
    for _ in range(cfg.updates_per_batch):
        for rows, norm in zip(slices, norms, strict=True):
            # fetched by the first step after its first forward; later steps get the fetched tensor
            per_update.append(train_step(
                trainee, shard.rows(rows), proximal_logp_BT[rows], lambda rows=rows: weights.get()[rows], norm))
    return combine_updates(per_update, epochs=cfg.updates_per_batch)
