"""The correction service's core: per global batch, diagnostics + the configured method's weights + AIS.

Per step: ``LogRatios`` once from (mu, old, mask); every section 1 diagnostic (also by lag);
the method's weights and statistics; AIS's three diagnostics and its state update (the
mixing ``omega = 1 + alpha (w - 1)`` is applied only when ``correction.ais.enabled``);
metrics streamed to the sink as soon as they exist, under ``mismatch/``, ``correction/``
and ``ais/``. The caller writes batch dumps (``system.report.dump``) from the same arrays.
"""

from dataclasses import dataclass

import numpy as np
import torch

from system.config.correction import CorrectionConfig
from system.correction import (
    AdaptiveIS,
    ais_diagnostics,
    compute_diagnostics,
    compute_log_ratios,
    compute_weights,
    diagnostics_by_lag_of,
    method_statistics,
)

BY_LAG_KEYS = ("n_sequences", "kl_k1", "kl_k3", "abs_diff_mean", "frac_outside_5x")


@dataclass(frozen=True)
class CorrectionResult:
    weights_BT: np.ndarray  # float32, 0 at invalid tokens
    metrics: dict[str, float | int | None]
    token_ratios: np.ndarray  # float64, exp(dc) of every valid token (the W&B histogram)


def flatten(prefix: str, values: dict) -> dict[str, float | int | None]:
    """``{"a": 1, "b": {"c": 2}}`` -> ``{"prefix/a": 1, "prefix/b/c": 2}``."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flatten(f"{prefix}/{key}", value))
        else:
            out[f"{prefix}/{key}"] = value
    return out


class CorrectionCore:
    def __init__(self, cfg: CorrectionConfig) -> None:
        self.cfg = cfg
        self.ais = AdaptiveIS(cfg.ais)

    def process(self, behaviour_BT: np.ndarray, proximal_BT: np.ndarray, mask_BT: np.ndarray,
                lag_B: np.ndarray) -> CorrectionResult:
        """Weights and metrics of one global batch (advances the AIS state once)."""
        ratios = compute_log_ratios(torch.tensor(behaviour_BT), torch.tensor(proximal_BT),
                                    torch.tensor(mask_BT))
        w_BT = compute_weights(ratios, self.cfg.method)
        metrics = flatten("mismatch", compute_diagnostics(ratios))
        metrics.update(flatten("correction", method_statistics(ratios, w_BT)))
        ais_state = self.ais.update(ais_diagnostics(ratios, c=self.cfg.ais.c))
        metrics.update(flatten("ais", ais_state))
        metrics["ais/enabled"] = int(self.cfg.ais.enabled)
        if self.cfg.ais.enabled:
            w_BT = self.ais.omega(w_BT, ratios.valid_BT, ais_state["alpha"])
        by_lag = diagnostics_by_lag_of(ratios, torch.tensor(lag_B))
        for lag, diag in by_lag.items():
            metrics.update({f"mismatch_by_lag/{lag}/{k}": diag[k] for k in BY_LAG_KEYS})
        metrics["correction/applied_weight_mean"] = (
            float(w_BT[ratios.valid_BT].double().mean()) if ratios.num_tokens else None
        )
        return CorrectionResult(w_BT.detach().to(torch.float32).numpy(), metrics,
                                ratios.rho_BT[ratios.valid_BT].numpy())

    def state_dict(self) -> dict:
        return {"ais": self.ais.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.ais.load_state_dict(sd["ais"])
