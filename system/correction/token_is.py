"""Token-level importance weights: none, truncated (token-tis) and masked (icepop) (spec section 2).

    none:       w = 1
    token-tis:  w = min(rho, C)                                    [C = 2]
    icepop:     w = rho if log lo <= d <= log hi else 0            [lo = 0.5, hi = 5]

The icepop band is tested in log space on the raw d (not on the ±20-clamped dc), so the
clamp never changes a decision; ``log lo`` and ``log hi`` are at the inputs' precision
(``log_threshold``). Each ``*_weights_BT`` returns a float64 [B, T] weight, 0 where not valid;
icepop's decision is ``icepop_keep_BT`` (bool [B, T]), the keep mask ``k`` of AIS (section 3).
none and token-tis reject nothing.

Shapes: the README's suffix legend (B responses, T response positions).
"""

import torch

from system.config.correction import IcePop, NoCorrection, TokenTIS
from system.correction.ratios import LogRatios, log_threshold


def no_correction_weights_BT(ratios: LogRatios, method: NoCorrection) -> torch.Tensor:
    """1 at every valid token."""
    return ratios.valid_BT.to(torch.float64)


def token_tis_weights_BT(ratios: LogRatios, method: TokenTIS) -> torch.Tensor:
    """Truncated token ratio ``min(rho, C)``."""
    return ratios.rho_BT.clamp(max=method.c)


def icepop_keep_BT(ratios: LogRatios, method: IcePop) -> torch.Tensor:
    """icepop's decision: a valid token with ``log lo <= d <= log hi``."""
    log_lo, log_hi = (log_threshold(x, ratios.weight_dtype) for x in (method.lo, method.hi))
    in_band_BT = (ratios.d_BT >= log_lo) & (ratios.d_BT <= log_hi)
    return ratios.valid_BT & in_band_BT


def icepop_weights_BT(ratios: LogRatios, method: IcePop) -> torch.Tensor:
    """Token ratio inside the band ``[lo, hi]``, 0 outside."""
    return torch.where(icepop_keep_BT(ratios, method), ratios.rho_BT, 0.0)
