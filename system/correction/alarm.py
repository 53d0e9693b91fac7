"""Drift alarm: one line when the train-inference mismatch crosses a threshold, with its likely cause.

Inputs are the correction service's metrics of one step (``CorrectionCore.process``):

    kl      = mismatch/kl_k1                  mean(mu - old) over valid tokens (spec section 1)
    ess     = mismatch/ess_seq                sequence-level ESS fraction of rho_seq
    keep    = correction/keep_seq_frac        responses the APPLIED weights keep (omega with AIS)
    kl_L    = mismatch_by_lag/<L>/kl_k1       the same kl on the responses of lag L only

It fires (1) when any of

    kl > alarm.kl_k1_max        ess < alarm.ess_seq_min        keep < alarm.keep_seq_frac_min

holds; a value that is None (empty batch) or missing is not checked, and a value that is NaN or
infinite (a mismatch beyond float range) counts as crossed. The likely cause comes from
the lag split, with ``K = alarm.kl_k1_max``:

    lag-0 high    kl_0 exists and (kl_0 > K / 2, or kl > 0 and kl_0 >= 0.5 * kl): the policy that
                  generated and the one that scores disagree with NO staleness, so the mismatch
                  comes from the rollout engine itself (quantization, kernels, sampling precision)
    grows         at least two lags, and the least-squares slope of kl_L against L is > 0
                  (each lag one point)

    lag-0 high and not grows  -> "lag-0 mismatch"       (quantization/kernels)
    grows and not lag-0 high  -> "staleness"            (mismatch grows with lag; lag 0 small)
    both                      -> "lag-0 mismatch + staleness"
    neither                   -> "undetermined"         (one lag without lag 0, or flat in lag
                                                          with a small lag 0)

A batch without lag-0 responses (a learner-bound run at ``max_lag >= 2`` trains whole batches
of lag 2 or 3) cannot show lag 0 itself; the caller then passes ``kl0_before``, the lag-0 kl of
the latest batch that had one, which stands in for ``kl_0`` in both rules (the message says so, and,
given ``kl0_age``, how many batches before this one it was: in an asynchronous run at ``max_lag`` 1
only the first batch may have lag 0, and its figure then stands in for every later alarm's).

The message is one line: the crossed thresholds, the cause, and kl_k1 by lag.
"""

import math
import re

from system.config.correction import AlarmConfig

CAUSE_LAG0 = "lag-0 mismatch"
CAUSE_STALENESS = "staleness"
CAUSE_BOTH = "lag-0 mismatch + staleness"
CAUSE_UNDETERMINED = "undetermined"
_EXPLAIN = {
    CAUSE_LAG0: "quantization/kernels: the mismatch is there without staleness",
    CAUSE_STALENESS: "kl grows with lag while lag 0 is small: lower async.max_lag or correct harder",
    CAUSE_BOTH: "quantization/kernels at lag 0, growing further with lag",
    CAUSE_UNDETERMINED: "the lag split cannot tell",
}
_BY_LAG = re.compile(r"^mismatch_by_lag/(-?\d+)/kl_k1$")


def _number(metrics: dict, key: str) -> float | None:
    value = metrics.get(key)
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _reading(metrics: dict, key: str) -> float | None:
    """The value of ``key`` as a float, NaN and infinities kept; None when missing, None or a bool."""
    value = metrics.get(key)
    if value is None or isinstance(value, bool):
        return None
    return float(value)


def _crossed(name: str, value: float | None, bad, bound: float, sign: str) -> str | None:
    """``"name value sign bound"`` when ``bad(value)`` or the value is not finite; None otherwise."""
    if value is None:
        return None
    if not math.isfinite(value):
        return f"{name} {value} (not finite)"
    return f"{name} {value:.4g} {sign} {bound:g}" if bad(value) else None


def kl_by_lag(metrics: dict) -> dict[int, float]:
    """``{lag: kl_k1}`` from the ``mismatch_by_lag/<lag>/kl_k1`` metrics (None values left out), by lag."""
    out = {}
    for key in metrics:
        match = _BY_LAG.match(key)
        if match:
            value = _number(metrics, key)
            if value is not None:
                out[int(match.group(1))] = value
    return dict(sorted(out.items()))


def _slope(by_lag: dict[int, float]) -> float:
    lags, kls = list(by_lag), list(by_lag.values())
    mean_l, mean_k = sum(lags) / len(lags), sum(kls) / len(kls)
    var = sum((lag - mean_l) ** 2 for lag in lags)
    return sum((lag - mean_l) * (k - mean_k) for lag, k in zip(lags, kls, strict=True)) / var


def _with_lag0(metrics: dict, kl0_before: float | None) -> tuple[dict[int, float], bool]:
    """kl by lag, with ``kl0_before`` as lag 0 when the batch has none: (by_lag, borrowed)."""
    by_lag = kl_by_lag(metrics)
    if 0 in by_lag or kl0_before is None or not by_lag:
        return by_lag, False
    return {0: kl0_before, **by_lag}, True


def likely_cause(metrics: dict, cfg: AlarmConfig, kl0_before: float | None = None) -> str:
    """One of ``CAUSE_*`` from the lag split of kl_k1 (rules in the module docstring)."""
    by_lag, _ = _with_lag0(metrics, kl0_before)
    kl = _number(metrics, "mismatch/kl_k1")
    kl0 = by_lag.get(0)
    lag0_high = kl0 is not None and (kl0 > cfg.kl_k1_max / 2 or (kl is not None and kl > 0 and kl0 >= 0.5 * kl))
    grows = len(by_lag) >= 2 and _slope(by_lag) > 0
    if lag0_high and grows:
        return CAUSE_BOTH
    if lag0_high:
        return CAUSE_LAG0
    if grows:
        return CAUSE_STALENESS
    return CAUSE_UNDETERMINED


def drift_alarm(metrics: dict, cfg: AlarmConfig, kl0_before: float | None = None,
                kl0_age: int | None = None) -> tuple[int, str | None]:
    """``(1, one-line message)`` when a threshold is crossed, else ``(0, None)``; ``(0, None)`` when
    ``cfg.enabled`` is false. Pure: reads ``metrics`` only (rules in the module docstring)."""
    if not cfg.enabled:
        return 0, None
    checks = (
        _crossed("kl_k1", _reading(metrics, "mismatch/kl_k1"), lambda v: v > cfg.kl_k1_max, cfg.kl_k1_max, ">"),
        _crossed("ess_seq", _reading(metrics, "mismatch/ess_seq"), lambda v: v < cfg.ess_seq_min,
                 cfg.ess_seq_min, "<"),
        _crossed("keep_seq_frac", _reading(metrics, "correction/keep_seq_frac"),
                 lambda v: v < cfg.keep_seq_frac_min, cfg.keep_seq_frac_min, "<"),
    )
    crossed = [text for text in checks if text is not None]
    if not crossed:
        return 0, None
    cause = likely_cause(metrics, cfg, kl0_before)
    by_lag, borrowed = _with_lag0(metrics, kl0_before)
    earlier = " (an earlier batch)" if kl0_age is None else f" ({kl0_age} batch{'es' * (kl0_age != 1)} earlier)"
    lags = " ".join(f"{lag}:{value:.4g}{earlier if borrowed and lag == 0 else ''}"
                    for lag, value in by_lag.items()) or "none"
    return 1, (f"drift alarm: {', '.join(crossed)}; likely cause: {cause} ({_EXPLAIN[cause]}); "
               f"kl_k1 by lag {lags}")
