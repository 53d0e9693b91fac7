"""Train-inference mismatch correction as pure torch functions (``CORRECTION_SPEC.md``).

(mu, old, mask) --compute_log_ratios--> LogRatios --compute_diagnostics--> dict (section 1)
                                                  --compute_weights------> w_BT (section 2)
                                                  --ais_diagnostics------> S, R, V (section 3)
AdaptiveIS.update(S, R, V) -> alpha;   AdaptiveIS.omega(w_BT, valid_BT, alpha) -> omega_BT
ctpo_token_loss: the CTPO surrogate (section 4)
"""

from system.correction.ais import AdaptiveIS, ais_diagnostics
from system.correction.ctpo import ctpo_token_loss
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
    compute_weights,
    default_method_configs,
)
from system.correction.ratios import LogRatios, compute_log_ratios, select_sequences

__all__ = [
    "DIAGNOSTIC_KEYS",
    "METHOD_REGISTRY",
    "AdaptiveIS",
    "CorrectionMethod",
    "LogRatios",
    "ais_diagnostics",
    "compute_diagnostics",
    "compute_log_ratios",
    "compute_weights",
    "ctpo_token_loss",
    "default_method_configs",
    "diagnostics_by_lag",
    "diagnostics_by_lag_of",
    "method_statistics",
    "select_sequences",
]
