"""The PPO clipped surrogate with a correction weight, per token (spec section 5).

    r = exp(cur - old)        (cur - old clamped to [-20, 20] before exp, as in spec section 0)
    l[i,t] = -w[i,t] * min(r * A_i, clip(r, 1 - eps_lo, 1 + eps_hi) * A_i)   at valid tokens, 0 elsewhere

Defaults eps_lo = 0.2, eps_hi = 0.28 (DAPO-style asymmetric). Non-finite ``cur`` or ``old``
make a token not valid, and every excluded position is replaced by 0 before any arithmetic,
so neither the loss nor its gradient can carry a NaN. Statistics over the valid tokens:
``clip_frac`` (tokens whose gradient the clip cuts: A > 0 and r > 1 + eps_hi, counted in
``clip_frac_high``, or A < 0 and r < 1 - eps_lo, in ``clip_frac_low``), ``ratio_mean``,
``approx_kl_k1`` = mean(old - cur) and ``approx_kl`` = mean(r - 1 - log r) (k3).

Shapes: the README's suffix legend (B responses, T response positions).
"""

import torch

from system.config.learner import PPOLossConfig
from system.correction.ratios import LOG_RATIO_CLAMP, valid_tokens

_DEFAULT_PPO = PPOLossConfig()


def check_token_loss_shapes(current_BT, proximal_BT, advantages_B, weights_BT, valid_BT) -> None:
    """Every per-token input is [B, T] like ``current_BT``; advantages are [B]. Raises ValueError."""
    if current_BT.dim() != 2:
        raise ValueError(f"current_logp must be [B, T], got shape {tuple(current_BT.shape)}")
    for name, t in (("proximal_logp", proximal_BT), ("weights", weights_BT), ("valid", valid_BT)):
        if t.shape != current_BT.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but current_logp has {tuple(current_BT.shape)}"
            )
    if advantages_B.shape != current_BT.shape[:1]:
        raise ValueError(
            f"advantages must be [B] = [{current_BT.shape[0]}], got shape {tuple(advantages_B.shape)}"
        )


def token_loss_inputs(current_logp_BT, proximal_logp_BT, advantages_B, weights_BT, valid_BT):
    """Checked inputs of a token loss: (current at >= float32, detached proximal, valid), where valid
    also requires both log-probs finite (a NaN log-prob never reaches the loss or its gradient)."""
    check_token_loss_shapes(current_logp_BT, proximal_logp_BT, advantages_B, weights_BT, valid_BT)
    dtype = torch.promote_types(current_logp_BT.dtype, torch.float32)
    current_BT = current_logp_BT.to(dtype)
    proximal_BT = proximal_logp_BT.detach().to(dtype)
    valid_BT = valid_tokens(valid_BT, current_BT.detach(), proximal_BT)
    return current_BT, proximal_BT, valid_BT


def _statistics(valid_BT, log_ratio_BT, ratio_BT, low_BT, high_BT) -> dict:
    n = int(valid_BT.sum().item())
    if n == 0:
        keys = (
            "clip_frac",
            "clip_frac_low",
            "clip_frac_high",
            "ratio_mean",
            "approx_kl_k1",
            "approx_kl",
        )
        return {"num_tokens": 0, **dict.fromkeys(keys)}
    num_low, num_high = int(low_BT.sum().item()), int(high_BT.sum().item())
    k3_BT = torch.expm1(log_ratio_BT) - log_ratio_BT  # 0 where not valid (log ratio 0 there)
    return {
        "num_tokens": n,
        "clip_frac": (num_low + num_high) / n,
        "clip_frac_low": num_low / n,
        "clip_frac_high": num_high / n,
        "ratio_mean": float((torch.where(valid_BT, ratio_BT, 0.0).sum() / n).item()),
        "approx_kl_k1": float((-log_ratio_BT.sum() / n).item()),
        "approx_kl": float((k3_BT.sum() / n).item()),
    }


def ppo_token_loss(
    current_logp_BT: torch.Tensor,
    proximal_logp_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    weights_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    cfg: PPOLossConfig = _DEFAULT_PPO,
) -> tuple[torch.Tensor, dict]:
    """Per-token weighted PPO loss (0 at non-valid tokens) and its statistics as python numbers;
    ``cfg`` gives the clip range ``[1 - eps_lo, 1 + eps_hi]``.

        l = -w * min(r A, clip(r, 1 - eps_lo, 1 + eps_hi) A),  r = exp(clamp(cur - old, -20, 20))

    The ±20 pre-clamp is CTPO's (spec section 4), applied here too although section 5 writes
    ``r = exp(cur - old)``: it changes nothing unless the policy moved by more than e^20 on a token
    within one batch, and keeps r finite there (float32 exp overflows past 88, and inf * A = NaN at
    A = 0 would void a whole step)."""
    eps_lo, eps_hi = cfg.eps_lo, cfg.eps_hi
    current_BT, proximal_BT, valid_BT = token_loss_inputs(
        current_logp_BT, proximal_logp_BT, advantages_B, weights_BT, valid_BT)
    dtype = current_BT.dtype
    current_valid_BT = torch.where(valid_BT, current_BT, 0.0)
    proximal_valid_BT = torch.where(valid_BT, proximal_BT, 0.0)
    log_ratio_BT = (current_valid_BT - proximal_valid_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_BT = log_ratio_BT.exp()
    adv_BT = advantages_B.detach().to(dtype)[:, None].expand_as(ratio_BT)
    clipped_ratio_BT = ratio_BT.clamp(1.0 - eps_lo, 1.0 + eps_hi)
    objective_BT = torch.minimum(ratio_BT * adv_BT, clipped_ratio_BT * adv_BT)
    weights_BT = torch.where(valid_BT, weights_BT.detach().to(dtype), 0.0)
    loss_BT = torch.where(valid_BT, -weights_BT * objective_BT, 0.0)
    with torch.no_grad():
        stats = _statistics(
            valid_BT,
            log_ratio_BT.detach(),
            ratio_BT.detach(),
            low_BT=valid_BT & (adv_BT < 0) & (ratio_BT < 1.0 - eps_lo),
            high_BT=valid_BT & (adv_BT > 0) & (ratio_BT > 1.0 + eps_hi),
        )
    return loss_BT, stats
