"""CTPO: the PPO surrogate on the cumulative (prefix-product) token ratio (spec section 4, arXiv 2605.07331).

With t the 1-indexed position among the valid tokens of a response and
delta_s = clamp(cur - old, -20, 20) at valid tokens (0 elsewhere):

    lr[i,t] = sg(min(sum_{s<=t} delta_s, 10)) + cur[i,t] - sg(cur[i,t])
        (the value is the capped prefix sum; the gradient reaches only the current token)
    clipped lr: clamp(lr, -c_lo * t**p, +c_hi * t**p)          [c_lo 0.025, c_hi 0.05, p 0.5]
    obj = min(r * A, r_clip * A),  r = exp(lr),  r_clip = exp(clipped lr)
    dual clip, A < 0:  obj = max(obj, exp(c_dual * t**p) * A)   [c_dual 0.05]
    loss[i,t] = -w[i,t] * obj at valid tokens, 0 elsewhere

Clip fractions count the tokens whose gradient a clip cuts: ``high`` (A > 0, lr above its
bound), ``low`` (A < 0, lr below its bound), ``dual`` (A < 0, the dual bound selected);
each overall and by position bucket (t <= 128, <= 512, <= 2048, > 2048). A token with a
non-finite ``cur`` or ``old`` is treated as not valid.

Shapes: the README's suffix legend (B responses, T response positions).
"""

import torch

from system.config.learner import CTPOLossConfig
from system.correction.ratios import LOG_RATIO_CLAMP
from system.correction.reductions import (
    LENGTH_BUCKETS,
    as_float,
    count_by_bucket,
    fraction_by_bucket,
)
from system.losses.policy_gradient import token_loss_inputs

PREFIX_LOG_RATIO_CAP = 10.0
"""Cap on the cumulative log-ratio before ``exp``."""
CTPO_POSITION_BUCKETS = tuple(key for key, _ in LENGTH_BUCKETS)
"""The keys of the ``*_by_pos`` clip fractions."""


def _clip_statistics(valid_BT, pos_BT, ratio_BT, high_BT, low_BT, dual_BT) -> dict:
    """Clip fractions overall and by position bucket, and the mean ratio, as python numbers."""
    n = int(valid_BT.sum().item())
    out: dict = {"num_tokens": n, "num_tokens_by_pos": count_by_bucket(pos_BT, valid_BT)}
    for key, hit_BT in (("high", high_BT), ("low", low_BT), ("dual", dual_BT)):
        out[f"clip_frac_{key}"] = int(hit_BT.sum().item()) / n if n else None
        out[f"clip_frac_{key}_by_pos"] = fraction_by_bucket(hit_BT, pos_BT, valid_BT)
    out["ratio_mean"] = as_float(torch.where(valid_BT, ratio_BT, 0.0).sum() / n) if n else None
    return out


def _cumulative_log_ratio(current_BT, proximal_BT, valid_BT) -> torch.Tensor:
    """``sg(min(prefix sum of clamped cur - old, 10)) + cur - sg(cur)``; 0-valued steps where not valid."""
    current_valid_BT = torch.where(valid_BT, current_BT, 0.0)  # replaced before any arithmetic
    proximal_valid_BT = torch.where(valid_BT, proximal_BT, 0.0)
    step_BT = (current_valid_BT.detach() - proximal_valid_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    prefix_BT = step_BT.cumsum(dim=1).clamp(max=PREFIX_LOG_RATIO_CAP)
    return prefix_BT + (current_valid_BT - current_valid_BT.detach())


def ctpo_token_loss(
    current_logp_BT: torch.Tensor,
    proximal_logp_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    weights_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    cfg: CTPOLossConfig,
) -> tuple[torch.Tensor, dict]:
    """Per-token CTPO loss (gradient through ``current_logp`` only) and its clip statistics."""
    current_BT, proximal_BT, valid_BT = token_loss_inputs(
        current_logp_BT, proximal_logp_BT, advantages_B, weights_BT, valid_BT)
    dtype = current_BT.dtype
    lr_BT = _cumulative_log_ratio(current_BT, proximal_BT, valid_BT)
    pos_BT = valid_BT.cumsum(dim=1).to(dtype)
    scale_BT = pos_BT.pow(cfg.p)
    lr_clip_BT = torch.clamp(lr_BT, min=-cfg.c_lo * scale_BT, max=cfg.c_hi * scale_BT)
    adv_BT = advantages_B.detach().to(dtype)[:, None].expand_as(lr_BT)
    ratio_BT = lr_BT.exp()
    objective_BT = torch.minimum(ratio_BT * adv_BT, lr_clip_BT.exp() * adv_BT)
    dual_log_bound_BT = cfg.c_dual * scale_BT
    negative_BT = adv_BT < 0
    objective_BT = torch.where(
        negative_BT, torch.maximum(objective_BT, dual_log_bound_BT.exp() * adv_BT), objective_BT
    )
    weights_BT = torch.where(valid_BT, weights_BT.detach().to(dtype), 0.0)
    loss_BT = torch.where(valid_BT, -weights_BT * objective_BT, 0.0)
    with torch.no_grad():
        stats = _clip_statistics(
            valid_BT,
            pos_BT,
            ratio_BT,
            high_BT=valid_BT & (adv_BT > 0) & (lr_BT > cfg.c_hi * scale_BT),
            low_BT=valid_BT & negative_BT & (lr_BT < -cfg.c_lo * scale_BT),
            dual_BT=valid_BT & negative_BT & (torch.maximum(lr_BT, lr_clip_BT) > dual_log_bound_BT),
        )
    return loss_BT, stats
