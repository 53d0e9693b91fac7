"""``summary.json`` of a batch dump: section 1 diagnostics, AIS diagnostics, every method, by lag."""

import numpy as np
import torch

from system.correction import (
    LogRatios,
    ais_diagnostics,
    ais_estimate,
    compute_diagnostics,
    compute_log_ratios,
    compute_weights,
    default_method_configs,
    diagnostics_by_lag_of,
    method_statistics,
)
from system.report.dump import BatchDump, count_positive_logp


def dump_ratios(dump: BatchDump) -> LogRatios:
    """The per-token log-ratios of a dump (computed once, shared by summary and samples)."""
    return compute_log_ratios(
        torch.from_numpy(dump.behaviour_BT),
        torch.from_numpy(dump.proximal_BT),
        torch.from_numpy(dump.mask_BT),
    )


def methods_table(ratios: LogRatios) -> dict[str, dict]:
    """What every section 2 method would keep at its default thresholds."""
    table = {}
    for name, method in default_method_configs().items():
        w_BT = compute_weights(ratios, method)
        table[name] = method_statistics(ratios, w_BT)
    return table


def build_summary(dump: BatchDump, ratios: LogRatios | None = None) -> dict:
    """Every key of section 1 at the top level, plus ``ais``, ``methods`` and ``by_lag``."""
    ratios = ratios if ratios is not None else dump_ratios(dump)
    summary = dict(compute_diagnostics(ratios))
    # AIS v2 bias / noise / alpha_raw of the default method (seq-mis, hi = 3); null without advantages
    seq_mis = default_method_configs()["seq-mis"]
    summary["ais"] = {**ais_diagnostics(ratios), **ais_estimate(ratios, seq_mis, dump.advantage)}
    summary["methods"] = methods_table(ratios)
    # a dump without ``lag`` is all lag 0 (spec section 6): by_lag["0"] is then the whole batch
    summary["by_lag"] = diagnostics_by_lag_of(ratios, torch.from_numpy(dump.lag.astype(np.int64)))
    # non-finite rewards are left out of the mean and counted; a non-finite advantage makes the ais
    # estimate null (``ais_estimate``): counted, so the report says why
    if dump.reward is not None:
        finite = np.isfinite(dump.reward)
        # float64: a float32 sum of large finite rewards would overflow to inf (then null, uncounted)
        summary["reward_mean"] = float(np.mean(dump.reward[finite], dtype=np.float64)) if finite.any() else None
        summary["reward_nonfinite"] = int((~finite).sum())
    if dump.advantage is not None:
        summary["advantage_nonfinite"] = int((~np.isfinite(dump.advantage)).sum())
    # log-probs above 0 stay valid tokens (spec section 0: validity is finiteness), counted and said
    summary["logp_above_zero"] = {key: count_positive_logp(values, dump.mask_BT)
                                  for key, values in dump.logps().items()}
    summary["n_rows"] = int(dump.shape[0])  # every response of the dump (n_sequences: those with a valid token)
    if dump.ignored_keys:
        summary["ignored_keys"] = list(dump.ignored_keys)
    return summary
