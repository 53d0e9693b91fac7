"""``samples.json``: a compact table of every response and full token tables of the worst ones.

Layout (``"layout": "aisrl.samples/2"``)::

    {"layout": ..., "worst_by": "mean_abs_diff", "worst_k": K, "n_rows": N,
     "sequences": {"index": [...], "uid": [...], "reward": [...], "lag": [...], "length": [...],
                   "nonfinite_tokens": [...], "seq_logratio": [...], "mean_abs_diff": [...],
                   "kept_seq_mis": [...]},                      # one entry per dump row, row order
     "worst": [{"index", "uid", "reward", "lag", "length", "nonfinite_tokens", "seq_logratio",
                "mean_abs_diff", "kept_seq_mis", ["prompt_text", "response_text",]
                "tokens": {"position", "valid", "rollout_logp", "train_logp", "diff",
                           "p_rollout", "p_train", "ratio", "token" | "token_id"}}, ...]}

``sequences`` is columnar (one list per field, ``pandas.DataFrame(samples["sequences"])``
loads it). ``length`` is ``T_i`` (valid tokens); ``seq_logratio`` is ``L_i``;
``mean_abs_diff`` is the mean of ``|proximal - behaviour|`` over the valid tokens; ``kept_seq_mis`` says
whether the default method (seq-mis, hi = 3) keeps the response. All three are ``null`` for a
row with no valid token, and so is a non-finite reward.

``worst``: the at most ``K`` (default 64) responses with the largest ``mean_abs_diff``, worst
first, ties by row index; rows without a valid token are never among them. Each carries its
per-token table over the masked-in positions (``valid`` is false, and ``diff`` / ``ratio``
``null``, at a token excluded for a non-finite log-prob). Only these K rows get token tables, so
the file is bounded by ``N`` + ``K * T`` values whatever the batch size.
"""

import numpy as np

from system.correction import LogRatios, compute_weights, default_method_configs
from system.report.dump import BEHAVIOUR_KEY, PROXIMAL_KEY, BatchDump

LAYOUT = "aisrl.samples/2"
DEFAULT_WORST_K = 64
WORST_BY = "mean_abs_diff"
_DIGITS = 6


def round_significant(values: np.ndarray, digits: int = _DIGITS) -> np.ndarray:
    """``values`` (float64) rounded to ``digits`` decimal places, or to ``digits`` significant digits where
    that keeps more (below 1: a ratio of 3e-7 or a probability of 1.5e-8 must not become 0, which a
    review found written as 0.0). Zeros, non-finite values and magnitudes beyond 1e+-290 are left as
    they are."""
    out = np.array(values, dtype=np.float64)
    flat = out.reshape(-1)
    idx = np.flatnonzero(np.isfinite(flat) & (flat != 0))
    exponent = np.floor(np.log10(np.abs(flat[idx])))
    keep = np.abs(exponent) < 290
    idx, exponent = idx[keep], exponent[keep]
    scale = 10.0 ** np.maximum(digits, digits - 1 - exponent)
    flat[idx] = np.round(flat[idx] * scale) / scale
    return out


def _col(values: np.ndarray) -> list:
    """Floats rounded to ``_DIGITS`` significant digits, as a list; non-finite values as None (JSON has no NaN)."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    out = round_significant(np.where(finite, values, 0.0)).tolist()
    if not finite.all():
        out = [v if ok else None for v, ok in zip(out, finite.tolist(), strict=True)]
    return out


def sequence_columns(dump: BatchDump, ratios: LogRatios) -> dict[str, np.ndarray]:
    """Per dump row (numpy, length N): the columns of ``samples["sequences"]``; NaN where undefined."""
    length = ratios.num_valid_B.numpy()
    has_tokens = length > 0
    sum_abs = ratios.d_BT.abs().sum(dim=1).numpy()
    mean_abs = np.where(has_tokens, sum_abs / np.maximum(length, 1), np.nan)
    seq_logratio = np.where(has_tokens, ratios.seq_logratio_B.numpy(), np.nan)
    w_BT = compute_weights(ratios, default_method_configs()["seq-mis"])
    kept = ((w_BT > 0) & ratios.valid_BT).any(dim=1).numpy()
    n = length.shape[0]
    return {
        "index": np.arange(n),
        "uid": dump.uid.astype(str) if dump.uid is not None else np.arange(n).astype(str),
        "reward": dump.reward if dump.reward is not None else np.full(n, np.nan),
        "lag": dump.lag,
        "length": length,
        "nonfinite_tokens": ratios.nonfinite_B.numpy(),
        "seq_logratio": seq_logratio,
        "mean_abs_diff": mean_abs,
        "kept_seq_mis": np.where(has_tokens, kept.astype(np.float64), np.nan),
    }


def worst_rows(columns: dict[str, np.ndarray], k: int) -> np.ndarray:
    """Row indices of the at most ``k`` largest ``mean_abs_diff``, worst first, ties by index."""
    mean_abs = columns["mean_abs_diff"]
    rows = np.flatnonzero(np.isfinite(mean_abs))
    order = rows[np.argsort(-mean_abs[rows], kind="stable")]
    return order[: max(k, 0)]


def _columns_json(columns: dict[str, np.ndarray]) -> dict[str, list]:
    kept = columns["kept_seq_mis"]
    return {
        "index": columns["index"].tolist(),
        "uid": columns["uid"].tolist(),
        "reward": _col(columns["reward"]),
        "lag": columns["lag"].tolist(),
        "length": columns["length"].tolist(),
        "nonfinite_tokens": columns["nonfinite_tokens"].tolist(),
        "seq_logratio": _col(columns["seq_logratio"]),
        "mean_abs_diff": _col(columns["mean_abs_diff"]),
        "kept_seq_mis": [None if np.isnan(v) else bool(v) for v in kept.tolist()],
    }


def token_table(dump: BatchDump, ratios: LogRatios, row: int) -> dict[str, list]:
    """Column-oriented per-token table of one response over its masked-in positions."""
    cols = np.flatnonzero(dump.mask_BT[row])
    behaviour = dump.behaviour_BT[row, cols].astype(np.float64)
    proximal = dump.proximal_BT[row, cols].astype(np.float64)
    valid = ratios.valid_BT[row].numpy()[cols]
    rho = ratios.rho_BT[row].numpy()[cols]
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(valid, proximal - behaviour, np.nan)
        table = {
            "position": cols.tolist(),
            "valid": valid.tolist(),
            BEHAVIOUR_KEY: _col(behaviour),
            PROXIMAL_KEY: _col(proximal),
            "diff": _col(diff),
            "p_rollout": _col(np.exp(behaviour)),
            "p_train": _col(np.exp(proximal)),
            "ratio": _col(np.where(valid, rho, np.nan)),
        }
    if dump.token_text is not None:
        table["token"] = dump.token_text[row, cols].astype(str).tolist()
    elif dump.response_ids is not None:
        table["token_id"] = dump.response_ids[row, cols].tolist()
    return table


def build_samples(dump: BatchDump, ratios: LogRatios, worst_k: int = DEFAULT_WORST_K) -> dict:
    """The ``samples.json`` object (see the module docstring); JSON-ready, no NaN anywhere."""
    columns = sequence_columns(dump, ratios)
    table = _columns_json(columns)
    worst = []
    for row in worst_rows(columns, worst_k).tolist():
        record = {key: values[row] for key, values in table.items()}
        for key in ("prompt_text", "response_text"):
            values = getattr(dump, key)
            if values is not None:
                record[key] = str(values[row])
        record["tokens"] = token_table(dump, ratios, row)
        worst.append(record)
    return {
        "layout": LAYOUT,
        "worst_by": WORST_BY,
        "worst_k": worst_k,
        "n_rows": len(table["index"]),
        "sequences": table,
        "worst": worst,
    }
