"""Sums of one train step's metrics over micro-batches, reduced once over all ranks.

Reported (global over the batch):

    loss               = sum_{r,m} L[r, m]                     (the global aggregated loss)
    entropy            = sum_valid H / num_valid_tokens        (tempered next-token entropy)
    weight_mean        = sum_valid w / num_valid_tokens
    keep_token_frac    = #(valid, w > 0) / num_valid_tokens
    num_valid_tokens, num_sequences (with >= 1 valid token)
    loss/<key>         = token-weighted mean of the surrogate's scalar stats (clip fractions ...):
                         sum_m stat[m] * n_valid[m] / num_valid_tokens

``combine_updates`` merges the metrics of every optimiser update of one batch (epochs x
mini-batches, ``learner.updates_per_batch`` x ``learner.mini_batches``):

    <key>              the mean over the updates: token-weighted (by each update's
                       num_valid_tokens) for per-token means (entropy, weight_mean,
                       keep_token_frac, loss/<stat> such as loss/clip_frac), plain for the
                       per-update values (loss, grad_norm, lr, skipped_step: any skipped
                       update makes it > 0, a non-finite one makes loss / grad_norm non-finite)
    num_valid_tokens, num_sequences   the whole batch's (summed over the mini-batches of one epoch)
    last/<key>         the same metric on the last update alone (the PPO clip acts only from
                       the second update: with two updates, loss/clip_frac is about half of
                       last/loss/clip_frac)
    updates, skipped_updates          optimiser updates attempted / skipped (non-finite gradient)

The line on loss/<key> above takes the surrogate's scalar stats to be means over the micro-batch's valid
tokens (``None`` when it has none: weight 0). Keys starting with ``num_`` are counts and are
left out (``num_valid_tokens`` covers them), as are non-scalar stats such as CTPO's
``*_by_pos`` buckets, whose per-bucket denominators are not reported.
"""

import torch
import torch.distributed as dist

_FIXED = ("loss", "num_valid_tokens", "num_sequences", "entropy_sum", "weight_sum", "kept_tokens")


class MetricSums:
    """Accumulates float64 sums on ``device``; ``reduce`` all-reduces them in one collective."""

    def __init__(self, device: torch.device) -> None:
        self._fixed_K = torch.zeros(len(_FIXED), dtype=torch.float64, device=device)
        self._stats: dict[str, float] | None = None

    def add_micro_batch(
        self,
        loss: torch.Tensor,
        valid_BT: torch.Tensor,
        weights_BT: torch.Tensor,
        entropy_BT: torch.Tensor | None,
        stats: dict,
    ) -> None:
        """Add one micro-batch (device tensors, no host sync) and its surrogate's stats."""
        entropy_sum = entropy_BT.detach()[valid_BT].sum() if entropy_BT is not None else loss.new_zeros(())
        values = (
            loss.detach(),
            valid_BT.sum(),
            (valid_BT.sum(dim=1) >= 1).sum(),
            entropy_sum,
            weights_BT[valid_BT].sum(),
            (valid_BT & (weights_BT > 0)).sum(),
        )
        self._fixed_K += torch.stack([v.to(torch.float64) for v in values])
        scalars = _scalar_stats(stats)
        if self._stats is None:
            self._stats = dict.fromkeys(scalars, 0.0)
        if set(scalars) != set(self._stats):
            raise ValueError(f"the loss reported stats {sorted(scalars)} after {sorted(self._stats)}")
        if scalars:
            n_valid = float(valid_BT.sum())
            for key, value in scalars.items():
                self._stats[key] += value * n_valid

    def reduce(self) -> dict[str, float]:
        """Global metrics (collective when a process group exists: call on every rank)."""
        stat_keys = sorted(self._stats or {})
        stat_values = torch.tensor([self._stats[k] for k in stat_keys], dtype=torch.float64)
        sums = torch.cat([self._fixed_K, stat_values.to(self._fixed_K.device)])
        if dist.is_initialized():
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        total = dict(zip(list(_FIXED) + [f"loss/{k}" for k in stat_keys], sums.tolist(), strict=True))
        n_tok = max(1.0, total["num_valid_tokens"])
        out = {
            "loss": total["loss"],
            "entropy": total["entropy_sum"] / n_tok,
            "weight_mean": total["weight_sum"] / n_tok,
            "keep_token_frac": total["kept_tokens"] / n_tok,
            "num_valid_tokens": total["num_valid_tokens"],
            "num_sequences": total["num_sequences"],
        }
        out.update({f"loss/{k}": total[f"loss/{k}"] / n_tok for k in stat_keys})
        return out


def _scalar_stats(stats: dict) -> dict[str, float]:
    """Per-token-mean stats as floats; ``None`` (no valid token) becomes 0 (its weight is 0 too)."""
    out = {}
    for key, value in stats.items():
        if key.startswith("num_"):
            continue
        if value is None:
            out[key] = 0.0
        elif isinstance(value, torch.Tensor) and value.numel() == 1:
            out[key] = float(value.detach())
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    return out


_TOKEN_MEANS = ("entropy", "weight_mean", "keep_token_frac")
"""Per-token means besides ``loss/<stat>``: averaged over updates by their valid tokens."""
_COUNTS = ("num_valid_tokens", "num_sequences")


def combine_updates(per_update: list[dict[str, float]], epochs: int) -> dict[str, float]:
    """The metrics of one batch from those of its updates, in order (see the module docstring)."""
    if not per_update or epochs < 1 or len(per_update) % epochs:
        raise ValueError(f"{len(per_update)} updates do not make {epochs} equal epochs")
    n_B = [max(0.0, m["num_valid_tokens"]) for m in per_update]
    n_total = sum(n_B)
    out: dict[str, float] = {}
    for key in per_update[-1]:
        values = [m[key] for m in per_update]
        if key in _COUNTS:
            out[key] = sum(values) / epochs
        elif key in _TOKEN_MEANS or key.startswith("loss/"):
            out[key] = sum(v * n for v, n in zip(values, n_B, strict=True)) / n_total if n_total else 0.0
        else:
            out[key] = sum(values) / len(values)
    out.update({f"last/{key}": value for key, value in per_update[-1].items()})
    out["updates"] = float(len(per_update))
    out["skipped_updates"] = float(sum(m.get("skipped_step", 0.0) for m in per_update))
    return out
