"""The correction service's core: per global batch, diagnostics + the configured method's weights + AIS.

Per step: ``LogRatios`` once from (mu, old, mask); every section 1 diagnostic (also by lag);
the method's weights w and keep mask k; AIS (version 2, our reconstruction, spec section 3)
from w, k and the advantages: its diagnostics and its state update every step, and the
mixing ``omega = k (1 + alpha (w - 1))`` applied only when ``correction.ais.enabled``.
Metrics, returned for the caller to stream: ``mismatch/...``, ``mismatch_by_lag/...``,
``ais/...`` (severity, reliability, variance_amplification, bias, noise, alpha_raw, alpha,
and ``ais/by_lag/<lag>/...`` with ``per_lag``), and the section 2 statistics of the APPLIED
weights under ``correction/...`` (omega when AIS is on, w otherwise), with those of the
method's own w under ``method_before_ais/...`` when AIS is on, and ``mismatch/alarm`` (0/1
every step: ``system.correction.alarm.drift_alarm`` on the metrics above, whose one-line message
and likely cause come back in the result for the caller to print and alert). The caller writes
batch dumps (``system.report.dump``) from the same arrays. The section 1 diagnostics come from
the fused pass when it is built (``system.correction.fused``; equal to the torch path to summation
order), else from the torch path.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from system.config.correction import CorrectionConfig
from system.correction import (
    AdaptiveIS,
    ais_diagnostics,
    compute_diagnostics,
    compute_log_ratios,
    compute_weights_and_keep,
    diagnostics_by_lag_of,
    fused,
    method_statistics,
    mix_weights,
)
from system.correction.alarm import drift_alarm, likely_cause


@dataclass(frozen=True)
class CorrectionResult:
    weights_BT: np.ndarray  # float32, 0 at invalid tokens
    metrics: dict[str, float | int | None]
    token_ratios: np.ndarray  # float64, exp(dc) of every valid token (the W&B histogram)
    alarm: str | None = None  # the drift alarm's one-line message when it fired (metrics["mismatch/alarm"] == 1)
    alarm_cause: str | None = None  # its likely cause (alarm.CAUSE_*), the key of its rate-limited W&B alert


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
        self.kl0_before: float | None = None  # lag-0 kl_k1 of the latest batch that had lag-0 responses
        self.kl0_age: int | None = None  # how many batches before the next one that batch was

    def process(self, behaviour_BT: np.ndarray, proximal_BT: np.ndarray, mask_BT: np.ndarray,
                lag_B: np.ndarray, advantage_B: np.ndarray | None = None) -> CorrectionResult:
        """Weights and metrics of one global batch (advances the AIS state once).

        ``advantage_B`` (float [B]) is what each response carries into the loss; AIS needs it.
        Without it AIS is skipped (its values None, its state untouched), which is refused
        when ``correction.ais.enabled``.
        """
        ratios = compute_log_ratios(torch.tensor(behaviour_BT), torch.tensor(proximal_BT),
                                    torch.tensor(mask_BT))
        # float64 for AIS's d_i (its w - 1), the weight dtype for everything else (as before)
        w64_BT, keep_BT = compute_weights_and_keep(ratios, self.cfg.method, torch.float64)
        w_BT = w64_BT.to(ratios.weight_dtype)
        diagnostics, by_lag = self._diagnostics(ratios, behaviour_BT, proximal_BT, mask_BT, lag_B)
        metrics = flatten("mismatch", diagnostics)
        applied_BT = w_BT
        if advantage_B is None:
            if self.cfg.ais.enabled:
                raise ValueError("correction.ais.enabled needs the advantages of the batch ('advantage')")
            none = dict.fromkeys(("bias", "noise", "alpha_raw"))  # alpha: the EMA, logged every step (section 3)
            metrics.update(flatten("ais", {**ais_diagnostics(ratios, self.cfg.ais.c), **none, "alpha": self.ais.alpha}))
        else:
            ais = self.ais.update(ratios, w64_BT, keep_BT, torch.tensor(advantage_B), torch.tensor(lag_B))
            metrics.update(flatten("ais", ais.metrics))
            if self.cfg.ais.enabled:
                applied_BT = mix_weights(w_BT, keep_BT, ais.alpha_B)
                metrics.update(flatten("method_before_ais", method_statistics(ratios, w_BT)))
        metrics["ais/enabled"] = int(self.cfg.ais.enabled)
        metrics.update(flatten("correction", method_statistics(ratios, applied_BT)))
        for lag, diag in by_lag.items():  # every section 1 key, as summary.json's by_lag
            metrics.update({f"mismatch_by_lag/{lag}/{k}": v for k, v in diag.items()})
        kl0_before = self.kl0_before
        metrics["mismatch/alarm"], alarm = drift_alarm(metrics, self.cfg.alarm, kl0_before, self.kl0_age)
        kl0 = metrics.get("mismatch_by_lag/0/kl_k1")
        if kl0 is not None and math.isfinite(kl0):
            self.kl0_before, self.kl0_age = float(kl0), 1  # one batch earlier for the next one
        elif self.kl0_age is not None:
            self.kl0_age += 1
        return CorrectionResult(applied_BT.detach().to(torch.float32).numpy(), metrics,
                                ratios.rho_BT[ratios.valid_BT].numpy(), alarm,
                                likely_cause(metrics, self.cfg.alarm, kl0_before) if alarm else None)

    @staticmethod
    def _diagnostics(ratios, behaviour_BT, proximal_BT, mask_BT, lag_B) -> tuple[dict, dict]:
        """Section 1's diagnostics of the batch and of each lag's responses (every key): from the fused
        pass when it is built (``system.correction.fused``: one pass over the batch, and one over each
        lag's rows when there are several lags), else from ``ratios``."""
        on_cpu = not isinstance(behaviour_BT, torch.Tensor) or behaviour_BT.device.type == "cpu"
        if on_cpu and fused.available():
            sums = fused.fused_sums(behaviour_BT, proximal_BT, mask_BT)
            return sums.diagnostics, fused.diagnostics_by_lag(behaviour_BT, proximal_BT, mask_BT, lag_B, sums)
        return compute_diagnostics(ratios), diagnostics_by_lag_of(ratios, torch.as_tensor(lag_B))

    def state_dict(self) -> dict:
        return {"ais": self.ais.state_dict(), "kl0_before": self.kl0_before, "kl0_age": self.kl0_age}

    def load_state_dict(self, sd: dict) -> None:
        self.ais.load_state_dict(sd["ais"])
        self.kl0_before = sd.get("kl0_before")  # absent in checkpoints written before it existed
        self.kl0_age = sd.get("kl0_age")  # absent before it existed: the alarm then says "an earlier batch"
