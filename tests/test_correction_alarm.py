"""The drift alarm: thresholds on kl_k1 / ess_seq / keep_seq_frac and the cause from the lag split."""

import numpy as np
import pytest
from pydantic import ValidationError

from system.config import resolve_config
from system.config.correction import AlarmConfig, CorrectionConfig
from system.correction.alarm import (
    CAUSE_BOTH,
    CAUSE_LAG0,
    CAUSE_STALENESS,
    CAUSE_UNDETERMINED,
    drift_alarm,
    kl_by_lag,
    likely_cause,
)
from system.correction.service import CorrectionCore

CFG = AlarmConfig()  # kl_k1_max 0.5, ess_seq_min 0.5, keep_seq_frac_min 0.8


def metrics(kl=0.01, ess=0.95, keep=0.99, by_lag=None):
    out = {"mismatch/kl_k1": kl, "mismatch/ess_seq": ess, "correction/keep_seq_frac": keep}
    for lag, value in (by_lag or {0: kl}).items():
        out[f"mismatch_by_lag/{lag}/kl_k1"] = value
        out[f"mismatch_by_lag/{lag}/n_sequences"] = 4  # other by-lag keys are ignored
    return out


def test_quiet_below_every_threshold_and_at_the_thresholds():
    assert drift_alarm(metrics(), CFG) == (0, None)
    # the comparisons are strict: a value exactly at its threshold does not fire
    assert drift_alarm(metrics(kl=0.5, ess=0.5, keep=0.8), CFG) == (0, None)


def test_disabled_never_fires():
    assert drift_alarm(metrics(kl=5.0, ess=0.0, keep=0.0), AlarmConfig(enabled=False)) == (0, None)


def test_none_and_missing_values_are_not_checked():
    empty = {"mismatch/kl_k1": None, "mismatch/ess_seq": None, "correction/keep_seq_frac": None}
    assert drift_alarm(empty, CFG) == (0, None)
    assert drift_alarm({}, CFG) == (0, None)


def test_non_finite_values_fire():
    """A NaN or infinite reading with tokens present is a mismatch beyond float range (e.g. log-probs
    of +-1e308 whose difference overflows): it fires, naming the value, never passes as 'fine'."""
    fired, message = drift_alarm({"mismatch/kl_k1": float("nan")}, CFG)
    assert fired == 1 and message.startswith("drift alarm: kl_k1 nan (not finite); likely cause: undetermined")
    fired, message = drift_alarm(metrics(kl=float("inf"), ess=float("nan"), keep=0.9, by_lag={0: 0.6}), CFG)
    assert fired == 1
    assert message.startswith("drift alarm: kl_k1 inf (not finite), ess_seq nan (not finite); likely cause: "
                              "lag-0 mismatch")


def test_lag0_mismatch_is_quantization():
    """Only lag 0, kl_0 = 0.6 > 0.5: above K/2 = 0.25 with no staleness at all."""
    fired, message = drift_alarm(metrics(kl=0.6, by_lag={0: 0.6}), CFG)
    assert fired == 1
    assert message.startswith("drift alarm: kl_k1 0.6 > 0.5; likely cause: lag-0 mismatch (quantization/kernels")
    assert message.endswith("kl_k1 by lag 0:0.6") and "\n" not in message


def test_growth_with_lag_is_staleness():
    """kl by lag 0.05, 0.3, 0.9 (slope 0.425 > 0); lag 0 small: 0.05 <= K/2 = 0.25 and < 0.5 x 0.55."""
    m = metrics(kl=0.55, by_lag={0: 0.05, 1: 0.3, 2: 0.9})
    fired, message = drift_alarm(m, CFG)
    assert fired == 1 and likely_cause(m, CFG) == CAUSE_STALENESS
    assert "likely cause: staleness (" in message and message.endswith("kl_k1 by lag 0:0.05 1:0.3 2:0.9")
    # the slope, not monotonicity: a noisy dip at lag 2 still reads as growth
    assert likely_cause(metrics(kl=0.6, by_lag={0: 0.01, 1: 0.3, 2: 0.2, 3: 0.6}), CFG) == CAUSE_STALENESS


def test_both_causes():
    """lag 0 at 0.4 > K/2 = 0.25, and kl grows to 0.8 at lag 1."""
    assert likely_cause(metrics(kl=0.6, by_lag={0: 0.4, 1: 0.8}), CFG) == CAUSE_BOTH


def test_lag0_half_of_the_overall_kl_counts_as_lag0_mismatch():
    """kl_0 = 0.2 is below K/2 = 0.25 but >= 0.5 x 0.3 overall; flat in lag (slope 0). The alarm
    is set off by ess_seq 0.3 < 0.5."""
    m = metrics(kl=0.3, ess=0.3, by_lag={0: 0.2, 1: 0.2})
    fired, message = drift_alarm(m, CFG)
    assert fired == 1 and message.startswith("drift alarm: ess_seq 0.3 < 0.5; likely cause: lag-0 mismatch")
    # 0.2 < 0.5 x 0.5: no longer lag-0 mismatch, and flat: undetermined
    assert likely_cause(metrics(kl=0.5, ess=0.3, by_lag={0: 0.2, 1: 0.2}), CFG) == CAUSE_UNDETERMINED


def test_one_stale_lag_without_lag0_is_undetermined():
    m = metrics(kl=0.7, keep=0.5, by_lag={2: 0.7})
    fired, message = drift_alarm(m, CFG)
    assert fired == 1 and likely_cause(m, CFG) == CAUSE_UNDETERMINED
    assert message.startswith("drift alarm: kl_k1 0.7 > 0.5, keep_seq_frac 0.5 < 0.8; likely cause: undetermined")


def test_kl_by_lag_parses_sorts_and_drops_none():
    m = {"mismatch_by_lag/10/kl_k1": 0.3, "mismatch_by_lag/2/kl_k1": 0.1, "mismatch_by_lag/3/kl_k1": None,
         "mismatch_by_lag/2/kl_k3": 9.0, "mismatch/kl_k1": 0.2}
    assert kl_by_lag(m) == {2: 0.1, 10: 0.3}
    assert list(kl_by_lag(m)) == [2, 10]


def test_alarm_config_fields_and_overrides():
    cfg = CorrectionConfig()
    assert cfg.alarm == AlarmConfig(enabled=True, kl_k1_max=0.5, ess_seq_min=0.5, keep_seq_frac_min=0.8)
    run = resolve_config([], ["correction.alarm.kl_k1_max=0.2", "correction.alarm.enabled=false"])
    assert run.correction.alarm.kl_k1_max == 0.2 and run.correction.alarm.enabled is False
    for bad in ({"ess_seq_min": 1.5}, {"keep_seq_frac_min": -0.1}, {"kl_k1_max": 0.0}):
        with pytest.raises(ValidationError):
            AlarmConfig(**bad)


def _arrays(delta_by_lag: dict[int, float], rows_per_lag=4, length=5):
    """mu = -1 everywhere; old = mu + delta for the rows of each lag, so kl_k1 of lag L = -delta_L."""
    lag_B = np.repeat(np.array(list(delta_by_lag), np.int64), rows_per_lag)
    delta_B = np.repeat(np.array(list(delta_by_lag.values()), np.float32), rows_per_lag)
    mu_BT = np.full((lag_B.size, length), -1.0, np.float32)
    old_BT = mu_BT + delta_B[:, None]
    return mu_BT, old_BT, np.ones_like(mu_BT, dtype=bool), lag_B


@pytest.mark.parametrize("deltas, fired, cause", [
    ({0: -0.01, 1: -0.02}, 0, None),                   # kl 0.015: quiet
    ({0: -0.8}, 1, CAUSE_LAG0),                         # kl 0.8 at lag 0 alone
    ({0: -0.01, 1: -0.6, 2: -1.5}, 1, CAUSE_STALENESS),  # kl 0.01, 0.6, 1.5 by lag
])
def test_service_reports_the_alarm_every_step(deltas, fired, cause):
    cfg = CorrectionConfig(method={"type": "seq-tis"})  # keeps every sequence: only kl / ess can fire
    result = CorrectionCore(cfg).process(*_arrays(deltas))
    assert result.metrics["mismatch/alarm"] == fired
    assert result.alarm_cause == cause
    assert (result.alarm is not None) == bool(fired)
    if fired:
        assert result.alarm.startswith("drift alarm: ") and f"likely cause: {cause} (" in result.alarm
    off = CorrectionCore(CorrectionConfig(method={"type": "seq-tis"}, alarm={"enabled": False}))
    quiet = off.process(*_arrays(deltas))
    assert quiet.metrics["mismatch/alarm"] == 0 and quiet.alarm is None and quiet.alarm_cause is None


def test_a_batch_without_lag0_borrows_the_last_lag0_kl():
    """A learner-bound run trains whole batches at lag 3: alone that reads 'undetermined'. With the
    lag-0 kl of an earlier batch (0.02) as lag 0, kl grows from 0.02 to 0.6 (slope > 0) and lag 0
    is small (0.02 <= K/2 = 0.25 and < 0.5 x 0.6): staleness. With an earlier lag 0 of 0.55 > K/2
    and 0.55 -> 0.6 still growing: both."""
    m = metrics(kl=0.6, by_lag={3: 0.6})
    assert likely_cause(m, CFG) == CAUSE_UNDETERMINED
    assert likely_cause(m, CFG, kl0_before=0.02) == CAUSE_STALENESS
    assert likely_cause(m, CFG, kl0_before=0.55) == CAUSE_BOTH
    fired, message = drift_alarm(m, CFG, kl0_before=0.02)
    assert fired == 1 and message.endswith("kl_k1 by lag 0:0.02 (an earlier batch) 3:0.6")
    # a batch that has lag 0 uses its own
    assert likely_cause(metrics(kl=0.6, by_lag={0: 0.6}), CFG, kl0_before=0.01) == CAUSE_LAG0


def test_service_remembers_the_last_lag0_kl_across_batches_and_checkpoints():
    # batch 1: lag 0 at kl 0.01 (quiet); batch 2: lag 3 alone at kl 0.8 (fires): staleness, read
    # against batch 1's lag 0 (by hand: 0.01 -> 0.8 grows, 0.01 small). A fresh core says undetermined.
    cfg = CorrectionConfig(method={"type": "seq-tis"})
    core = CorrectionCore(cfg)
    assert core.process(*_arrays({0: -0.01})).alarm is None
    stale = core.process(*_arrays({3: -0.8}))
    # the message says how old the borrowed figure is (a probe: the default run's alarms at step 40-149 all
    # quoted step 1's lag 0 as "an earlier batch")
    assert stale.alarm_cause == CAUSE_STALENESS and "0:0.01 (1 batch earlier) 3:0.8" in stale.alarm
    assert CorrectionCore(cfg).process(*_arrays({3: -0.8})).alarm_cause == CAUSE_UNDETERMINED
    restored = CorrectionCore(cfg)
    restored.load_state_dict(core.state_dict())  # batch 3 of the run, after batches 1 and 2
    again = restored.process(*_arrays({3: -0.8}))
    assert again.alarm_cause == CAUSE_STALENESS and "0:0.01 (2 batches earlier) 3:0.8" in again.alarm
    older = CorrectionCore(cfg)  # a checkpoint written before the age was kept: said as before
    older.load_state_dict({k: v for k, v in core.state_dict().items() if k != "kl0_age"})
    assert "0:0.01 (an earlier batch) 3:0.8" in older.process(*_arrays({3: -0.8})).alarm
