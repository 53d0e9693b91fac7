"""Sums of one train step's metrics over micro-batches, reduced once over all ranks.

Reported (global over the batch):

    loss               = sum_{r,m} L[r, m]                     (the global aggregated loss)
    entropy            = sum_valid H / num_valid_tokens        (tempered next-token entropy)
    weight_mean        = sum_valid w / num_valid_tokens
    keep_token_frac    = #(valid, w > 0) / num_valid_tokens
    num_valid_tokens, num_sequences (with >= 1 valid token)
    loss/<key>         = token-weighted mean of the surrogate's scalar stats (clip fractions ...):
                         sum_m stat[m] * n[m] / sum_m n[m], n[m] the tokens the surrogate counted in
                         micro-batch m (its ``num_tokens``: the valid tokens whose current log-prob is
                         finite too), reported as loss/tokens (and used to weight updates alike)
    loss/<key>/<bucket> its per-position-bucket stats (CTPO's ``clip_frac_{low,high,dual}_by_pos``,
                         spec section 4), each weighted by the bucket's tokens, which are reported as
                         loss/tokens_by_pos/<bucket>

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

The lines on loss/<key> above take the surrogate's stats to be means over the tokens it counted
(``None`` when it has none: weight 0); a dict of them is by position bucket, weighted by the counts in
its ``num_tokens_by_pos``. Keys starting with ``num_`` are counts and are not averaged.
"""

import torch
import torch.distributed as dist

_FIXED = ("loss", "num_valid_tokens", "num_sequences", "entropy_sum", "weight_sum", "kept_tokens")


class MetricSums:
    """Accumulates float64 sums on ``device``; ``reduce`` all-reduces them in one collective."""

    def __init__(self, device: torch.device) -> None:
        self._fixed_K = torch.zeros(len(_FIXED), dtype=torch.float64, device=device)
        self._stats: dict[str, list[float]] | None = None  # key -> [sum of value x weight, sum of weights]

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
        weighted = _weighted_stats(stats, valid_BT) if stats else {}
        if self._stats is None:
            self._stats = {key: [0.0, 0.0] for key in weighted}
        if set(weighted) != set(self._stats):
            raise ValueError(f"the loss reported stats {sorted(weighted)} after {sorted(self._stats)}")
        for key, (value, weight) in weighted.items():
            self._stats[key][0] += value * weight
            self._stats[key][1] += weight

    def reduce(self) -> dict[str, float]:
        """Global metrics (collective when a process group exists: call on every rank)."""
        stat_keys = sorted(self._stats or {})
        stat_values = torch.tensor([v for k in stat_keys for v in self._stats[k]], dtype=torch.float64)
        sums = torch.cat([self._fixed_K, stat_values.to(self._fixed_K.device)])
        if dist.is_initialized():
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        values = sums.tolist()
        total = dict(zip(_FIXED, values[:len(_FIXED)], strict=True))
        weighted = dict(zip(stat_keys, zip(values[len(_FIXED)::2], values[len(_FIXED) + 1::2], strict=True),
                            strict=True))
        n_tok = max(1.0, total["num_valid_tokens"])
        out = {
            "loss": total["loss"],
            "entropy": total["entropy_sum"] / n_tok,
            "weight_mean": total["weight_sum"] / n_tok,
            "keep_token_frac": total["kept_tokens"] / n_tok,
            "num_valid_tokens": total["num_valid_tokens"],
            "num_sequences": total["num_sequences"],
        }
        out.update({f"loss/{k}": s / w if w > 0 else 0.0 for k, (s, w) in weighted.items()})
        out.update({f"loss/tokens_by_pos/{k.rsplit('/', 1)[1]}": w for k, (_, w) in weighted.items()
                    if "_by_pos/" in k})
        scalar = [w for k, (_, w) in weighted.items() if "_by_pos/" not in k]
        if scalar:  # the tokens the surrogate counted (every scalar stat's weight)
            out[_LOSS_TOKENS] = max(scalar)
        return out


def _weighted_stats(stats: dict, valid_BT: torch.Tensor) -> dict[str, tuple[float, float]]:
    """``key -> (value, weight)`` of a surrogate's per-token-mean stats: a scalar weighted by the tokens the
    surrogate counted (its ``num_tokens``, else the valid tokens), a dict by bucket (``key/bucket``)
    weighted by ``num_tokens_by_pos[bucket]``; ``None`` (no token) is 0 with weight 0."""
    n = float(stats["num_tokens"]) if "num_tokens" in stats else float(valid_BT.sum())
    by_pos = stats.get("num_tokens_by_pos") or {}
    out = {}
    for key, value in stats.items():
        if key.startswith("num_"):
            continue
        if isinstance(value, dict):
            for bucket, frac in value.items():
                weight = float(by_pos.get(bucket, 0)) if frac is not None else 0.0
                out[f"{key}/{bucket}"] = (0.0 if frac is None else float(frac), weight)
        elif value is None:
            out[key] = (0.0, 0.0)
        elif isinstance(value, torch.Tensor) and value.numel() == 1:
            out[key] = (float(value.detach()), n)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = (float(value), n)
    return out


_TOKEN_MEANS = ("entropy", "weight_mean", "keep_token_frac")
"""Per-token means besides ``loss/<stat>``: averaged over updates by their valid tokens."""
_COUNTS = ("num_valid_tokens", "num_sequences")
_BUCKET_TOKENS = "loss/tokens_by_pos/"
_LOSS_TOKENS = "loss/tokens"
"""The tokens the surrogate counted (its stats' weight; the valid tokens but those whose current
log-prob is not finite)."""


def combine_updates(per_update: list[dict[str, float]], epochs: int) -> dict[str, float]:
    """The metrics of one batch from those of its updates, in order (see the module docstring)."""
    if not per_update or epochs < 1 or len(per_update) % epochs:
        raise ValueError(f"{len(per_update)} updates do not make {epochs} equal epochs")
    n_B = [max(0.0, m["num_valid_tokens"]) for m in per_update]
    n_total = sum(n_B)
    out: dict[str, float] = {}
    for key in per_update[-1]:
        values = [m[key] for m in per_update]
        if key in _COUNTS or key.startswith(_BUCKET_TOKENS) or key == _LOSS_TOKENS:
            out[key] = sum(values) / epochs
        elif "_by_pos/" in key:  # a bucket's mean over the updates, weighted by that bucket's tokens
            w_B = [m.get(_BUCKET_TOKENS + key.rsplit("/", 1)[1], 0.0) for m in per_update]
            total = sum(w_B)
            out[key] = sum(v * w for v, w in zip(values, w_B, strict=True)) / total if total else 0.0
        elif key.startswith("loss/") and all(_LOSS_TOKENS in m for m in per_update):  # by the counted tokens
            w_B = [m[_LOSS_TOKENS] for m in per_update]
            total = sum(w_B)
            out[key] = sum(v * w for v, w in zip(values, w_B, strict=True)) / total if total else 0.0
        elif key in _TOKEN_MEANS or key.startswith("loss/"):
            out[key] = sum(v * n for v, n in zip(values, n_B, strict=True)) / n_total if n_total else 0.0
        else:
            out[key] = sum(values) / len(values)
    out.update({f"last/{key}": value for key, value in per_update[-1].items()})
    out["updates"] = float(len(per_update))
    out["skipped_updates"] = float(sum(m.get("skipped_step", 0.0) for m in per_update))
    return out
