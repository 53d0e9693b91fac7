"""The registry of correction methods and ``compute_weights``, the one entry point (spec section 2).

    w = registry[method.type](ratios, method)          token ([B, T]) or sequence ([B]) weights
    veto (optional):  w_i = 0 for a response with any valid token d < log(veto)
    self-normalisation (optional):  w /= mean(w) over valid tokens (token methods, ``none``
        included) or over sequences (sequence methods), after truncation, masking and veto;
        left as is when that mean is 0 (everything rejected)

The result is detached, >= 0, 0 at every non-valid token, in ``ratios.weight_dtype``.

``compute_weights_and_keep`` also returns the method's keep mask ``k`` (bool [B, T]): the
valid tokens the method did not reject (seq-mis / icepop / geo-rs outside their thresholds,
and the veto). It is the method's decision, not ``w > 0``: none and token-tis / seq-tis keep
every valid token. AIS (section 3) mixes only where ``k`` is 1.

Shapes: the README's suffix legend (B responses, T response positions).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from system.config.correction import (
    METHOD_TYPES,
    GeoRS,
    IcePop,
    MethodConfig,
    NoCorrection,
    SeqMIS,
    SeqTIS,
    TokenTIS,
)
from system.correction.ratios import LogRatios, log_threshold
from system.correction.sequence_is import (
    geo_rs_keep_B,
    geo_rs_weights_B,
    seq_mis_keep_B,
    seq_mis_weights_B,
    seq_tis_weights_B,
)
from system.correction.token_is import (
    icepop_keep_BT,
    icepop_weights_BT,
    no_correction_weights_BT,
    token_tis_weights_BT,
)
from system.registry import Registry


@dataclass(frozen=True)
class CorrectionMethod:
    """One registry entry: whether it weights tokens ([B, T]) or sequences ([B]), how, and
    which it keeps (a bool at the same level; None = it rejects nothing)."""

    level: Literal["token", "sequence"]
    weights: Callable[[LogRatios, MethodConfig], torch.Tensor]
    keep: Callable[[LogRatios, MethodConfig], torch.Tensor] | None = None


class MethodWeights(NamedTuple):
    """A method's weights and its keep mask, both [B, T] and 0 / False at every non-valid token."""

    w_BT: torch.Tensor
    """Detached weights >= 0 in ``ratios.weight_dtype``."""
    keep_BT: torch.Tensor
    """bool: the valid tokens the method (and the veto) did not reject."""


METHOD_REGISTRY: Registry[CorrectionMethod] = Registry("correction.method.type", METHOD_TYPES, {
    "none": CorrectionMethod("token", no_correction_weights_BT),
    "token-tis": CorrectionMethod("token", token_tis_weights_BT),
    "icepop": CorrectionMethod("token", icepop_weights_BT, icepop_keep_BT),
    "seq-tis": CorrectionMethod("sequence", seq_tis_weights_B),
    "seq-mis": CorrectionMethod("sequence", seq_mis_weights_B, seq_mis_keep_B),
    "geo-rs": CorrectionMethod("sequence", geo_rs_weights_B, geo_rs_keep_B),
})
"""Correction methods keyed by ``correction.method.type``."""


def _vetoed_B(ratios: LogRatios, veto: float) -> torch.Tensor:
    """Responses with any valid token whose log-ratio d is below ``log(veto)``."""
    return (ratios.valid_BT & (ratios.d_BT < log_threshold(veto, ratios.weight_dtype))).any(dim=1)


def _token_weights_BT(ratios: LogRatios, method: MethodConfig, entry: CorrectionMethod):
    w_BT = entry.weights(ratios, method)
    if method.veto is not None:
        w_BT = torch.where(_vetoed_B(ratios, method.veto)[:, None], 0.0, w_BT)
    if method.self_normalize:
        mean = w_BT.sum() / ratios.num_valid_B.sum().clamp(min=1)
        w_BT = torch.where(mean > 0, w_BT / mean, w_BT)
    return w_BT


def sequence_weights_B(ratios: LogRatios, method: MethodConfig) -> torch.Tensor:
    """A sequence-level method's weight of each response ([B], veto and self-normalisation applied).
    Reads only the per-response fields of ``ratios`` and ``valid_BT & d_BT`` for the veto, so a
    per-response summary (``system.correction.fused``: ``d`` = each response's minimum) works too."""
    entry = METHOD_REGISTRY[method.type]
    if entry.level != "sequence":
        raise ValueError(f"correction.method.type {method.type!r} weights tokens, not sequences")
    w_B = entry.weights(ratios, method)
    if method.veto is not None:
        w_B = torch.where(_vetoed_B(ratios, method.veto), 0.0, w_B)
    if method.self_normalize:
        num_sequences = ratios.seq_valid_B.sum().clamp(min=1)
        mean = torch.where(ratios.seq_valid_B, w_B, 0.0).sum() / num_sequences
        w_B = torch.where(mean > 0, w_B / mean, w_B)
    return w_B


def _sequence_weights_BT(ratios: LogRatios, method: MethodConfig, entry: CorrectionMethod):
    return torch.where(ratios.valid_BT, sequence_weights_B(ratios, method)[:, None], 0.0)


def compute_weights(ratios: LogRatios, method: MethodConfig, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The detached correction weight of every token (w_BT), 0 where not valid; in ``dtype`` (default
    ``ratios.weight_dtype``; the weights are computed in float64, so ``torch.float64`` loses nothing:
    AIS's ``w - 1`` needs that near w = 1, where float32 keeps ~7 digits of w but few of w - 1)."""
    entry = METHOD_REGISTRY[method.type]
    if entry.level == "token":
        w_BT = _token_weights_BT(ratios, method, entry)
    else:
        w_BT = _sequence_weights_BT(ratios, method, entry)
    return w_BT.to(dtype or ratios.weight_dtype)


def keep_mask(ratios: LogRatios, method: MethodConfig) -> torch.Tensor:
    """The method's keep mask k (bool [B, T]): valid, not rejected by the method, not vetoed."""
    entry = METHOD_REGISTRY[method.type]
    keep_BT = ratios.valid_BT
    if entry.keep is not None:
        decision = entry.keep(ratios, method)
        keep_BT = keep_BT & (decision if entry.level == "token" else decision[:, None])
    if method.veto is not None:
        keep_BT = keep_BT & ~_vetoed_B(ratios, method.veto)[:, None]
    return keep_BT


def compute_weights_and_keep(ratios: LogRatios, method: MethodConfig, dtype: torch.dtype | None = None) -> MethodWeights:
    """``compute_weights`` (in ``dtype``) and ``keep_mask`` together."""
    return MethodWeights(compute_weights(ratios, method, dtype), keep_mask(ratios, method))


def default_method_configs() -> dict[str, MethodConfig]:
    """One config per method type at its default thresholds (the report's per-method table)."""
    configs = (NoCorrection(), TokenTIS(), IcePop(), SeqTIS(), SeqMIS(), GeoRS())
    return {config.type: config for config in configs}
