"""``samples.json``: per sequence its headline numbers and a per-token table (column-oriented)."""

import numpy as np

from system.correction import LogRatios
from system.report.dump import BatchDump


def _col(values: np.ndarray) -> list:
    """Rounded floats, with non-finite values as None (JSON has no NaN)."""
    out = np.round(values.astype(np.float64), 6).tolist()
    if not np.isfinite(values).all():
        out = [v if np.isfinite(v) else None for v in out]
    return out


def sequence_order(dump: BatchDump, ratios: LogRatios) -> tuple[np.ndarray, np.ndarray]:
    """(mean |diff| per sequence over valid tokens, row order from worst to best)."""
    valid = ratios.valid_BT.numpy()
    absd = np.abs(ratios.d_BT.numpy().astype(np.float64))
    counts = valid.sum(1)
    mean_abs = np.where(counts > 0, (absd * valid).sum(1) / np.maximum(counts, 1), 0.0)
    return mean_abs, np.argsort(-mean_abs, kind="stable")


def build_samples(dump: BatchDump, ratios: LogRatios) -> list[dict]:
    """One record per response, worst mean |diff| first; per-token columns over masked positions."""
    mean_abs, order = sequence_order(dump, ratios)
    valid = ratios.valid_BT.numpy()
    rho = ratios.rho_BT.numpy()
    records = []
    for i in order:
        cols = np.flatnonzero(dump.response_mask[i])
        mu, old = dump.rollout_logp[i, cols], dump.train_logp[i, cols]
        diff = old - mu
        tokens = {
            "position": cols.tolist(),
            "valid": valid[i, cols].tolist(),
            "rollout_logp": _col(mu),
            "train_logp": _col(old),
            "diff": _col(diff),
            "p_rollout": _col(np.exp(mu.astype(np.float64))),
            "p_train": _col(np.exp(old.astype(np.float64))),
            "ratio": _col(np.where(valid[i, cols], rho[i, cols], np.nan)),
        }
        if dump.token_text is not None:
            tokens["token"] = dump.token_text[i, cols].tolist()
        elif dump.response_ids is not None:
            tokens["token_id"] = dump.response_ids[i, cols].tolist()
        records.append({
            "index": int(i),
            "uid": str(dump.uid[i]) if dump.uid is not None else str(i),
            "reward": float(dump.reward[i]) if dump.reward is not None else None,
            "lag": int(dump.lag[i]),
            "length": int(valid[i].sum()),
            "mean_abs_diff": float(mean_abs[i]),
            "tokens": tokens,
        })
    return records
