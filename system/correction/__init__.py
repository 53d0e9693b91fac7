"""Train-inference mismatch correction as pure torch functions (``CORRECTION_SPEC.md``).

(mu, old, mask) --compute_log_ratios--> LogRatios --compute_diagnostics------> dict (section 1)
                                                  --compute_weights_and_keep--> w_BT, k_BT (section 2)
                                                  --ais_diagnostics----------> S, R, V (section 3)
AdaptiveIS.update(ratios, w, k, advantages, lag) -> alpha per response (AIS v2, our reconstruction)
mix_weights(w_BT, k_BT, alpha) -> omega_BT = k (1 + alpha (w - 1))
"""

from system.correction.ais import (
    AdaptiveIS,
    AISUpdate,
    ais_diagnostics,
    ais_estimate,
    estimate_alpha,
    mix_weights,
    oracle_alpha,
    sequence_deltas,
)
from system.correction.diagnostics import (
    DIAGNOSTIC_KEYS,
    compute_diagnostics,
    diagnostics_by_lag,
    diagnostics_by_lag_of,
)
from system.correction.method_statistics import method_statistics
from system.correction.methods import (
    METHOD_REGISTRY,
    CorrectionMethod,
    MethodWeights,
    compute_weights,
    compute_weights_and_keep,
    default_method_configs,
    keep_mask,
)
from system.correction.ratios import LogRatios, compute_log_ratios, select_sequences

__all__ = [
    "DIAGNOSTIC_KEYS",
    "METHOD_REGISTRY",
    "AISUpdate",
    "AdaptiveIS",
    "CorrectionMethod",
    "LogRatios",
    "MethodWeights",
    "ais_diagnostics",
    "ais_estimate",
    "compute_diagnostics",
    "compute_log_ratios",
    "compute_weights",
    "compute_weights_and_keep",
    "default_method_configs",
    "diagnostics_by_lag",
    "diagnostics_by_lag_of",
    "estimate_alpha",
    "keep_mask",
    "method_statistics",
    "mix_weights",
    "oracle_alpha",
    "select_sequences",
    "sequence_deltas",
]
