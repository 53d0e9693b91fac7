"""Sums of one train step's metrics over micro-batches, reduced once over all ranks.

Reported (global over the batch):

    loss               = sum_{r,m} L[r, m]                     (the global aggregated loss)
    entropy            = sum_valid H / num_valid_tokens        (tempered next-token entropy)
    weight_mean        = sum_valid w / num_valid_tokens
    keep_token_frac    = #(valid, w > 0) / num_valid_tokens
    num_valid_tokens, num_sequences (with >= 1 valid token)
    loss/<key>         = token-weighted mean of the surrogate's scalar stats (clip fractions ...):
                         sum_m stat[m] * n_valid[m] / num_valid_tokens

The last line takes the surrogate's scalar stats to be means over the micro-batch's valid
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
        self._device = device
        self._fixed = dict.fromkeys(_FIXED, 0.0)
        self._stats: dict[str, float] | None = None

    def add_micro_batch(
        self,
        loss: torch.Tensor,
        valid_BT: torch.Tensor,
        weights_BT: torch.Tensor,
        entropy_BT: torch.Tensor | None,
        stats: dict,
    ) -> None:
        n_valid = float(valid_BT.sum())
        self._fixed["loss"] += float(loss.detach())
        self._fixed["num_valid_tokens"] += n_valid
        self._fixed["num_sequences"] += float((valid_BT.sum(dim=1) >= 1).sum())
        self._fixed["weight_sum"] += float(weights_BT[valid_BT].sum())
        self._fixed["kept_tokens"] += float((valid_BT & (weights_BT > 0)).sum())
        if entropy_BT is not None:
            self._fixed["entropy_sum"] += float(entropy_BT.detach()[valid_BT].sum())
        scalars = _scalar_stats(stats)
        if self._stats is None:
            self._stats = dict.fromkeys(scalars, 0.0)
        if set(scalars) != set(self._stats):
            raise ValueError(f"the loss reported stats {sorted(scalars)} after {sorted(self._stats)}")
        for key, value in scalars.items():
            self._stats[key] += value * n_valid

    def reduce(self) -> dict[str, float]:
        """Global metrics (collective when a process group exists: call on every rank)."""
        stat_keys = sorted(self._stats or {})
        values = [self._fixed[k] for k in _FIXED] + [self._stats[k] for k in stat_keys]
        sums = torch.tensor(values, dtype=torch.float64, device=self._device)
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
