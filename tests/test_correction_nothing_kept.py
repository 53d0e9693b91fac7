"""When a run stops because its correction keeps nothing (``system.correction.nothing_kept``)."""

import pytest

from system.config import ConfigError, RunConfig, resolve_config
from system.correction.nothing_kept import NothingKeptError, NothingKeptGuard

KEPT = {"correction/keep_token_frac": 0.75, "mismatch/kl_k1": 0.04, "mismatch/frac_outside_5x": 0.01}
NOTHING = {**KEPT, "correction/keep_token_frac": 0.0}
EMPTY = {**KEPT, "correction/keep_token_frac": None}  # a batch without a valid token


def test_consecutive_steps_that_keep_nothing_count_and_a_step_that_keeps_any_resets():
    guard = NothingKeptGuard(limit=2, method="seq-mis hi=1.000001")
    guard.observe(1, NOTHING)
    guard.observe(2, NOTHING)
    assert guard.streak == 2  # at the limit: not yet past it
    guard.observe(3, {**KEPT, "correction/keep_token_frac": 1e-6})  # one kept token of a million resets
    assert guard.streak == 0
    guard.observe(4, NOTHING)
    guard.observe(5, EMPTY)  # neither counts nor resets
    guard.observe(6, NOTHING)
    assert guard.streak == 2
    with pytest.raises(NothingKeptError) as err:
        guard.observe(7, NOTHING)
    said = str(err.value)
    # the streak is steps 4, 6 and 7 (5 had no valid token: skipped): it began at step 4
    assert "kept no token for 3 consecutive steps (steps 4-7; method seq-mis hi=1.000001" in said
    assert "kl_k1 0.04, tokens outside 5x 0.01" in said and "correction.max_nothing_kept_steps=2" in said


def test_a_limit_of_zero_stops_at_the_first_step_and_none_never_stops():
    with pytest.raises(NothingKeptError, match="for 1 consecutive steps"):
        NothingKeptGuard(limit=0).observe(1, NOTHING)
    guard = NothingKeptGuard(limit=None)
    for step in range(1, 1001):
        guard.observe(step, NOTHING)
    assert guard.streak == 1000


def test_missing_or_non_finite_diagnostics_are_said_as_such():
    with pytest.raises(NothingKeptError, match=r"kl_k1 n/a, tokens outside 5x inf"):
        NothingKeptGuard(limit=0).observe(1, {"correction/keep_token_frac": 0.0,
                                               "mismatch/frac_outside_5x": float("inf")})


def test_the_setting_defaults_to_ten_accepts_null_and_refuses_negatives_and_booleans():
    assert RunConfig().correction.max_nothing_kept_steps == 10
    assert resolve_config([], ["correction.max_nothing_kept_steps=null"]).correction.max_nothing_kept_steps is None
    assert resolve_config([], ["correction.max_nothing_kept_steps=0"]).correction.max_nothing_kept_steps == 0
    for bad in ("-1", "true", "1.5"):
        with pytest.raises(ConfigError, match=r"correction\.max_nothing_kept_steps"):
            resolve_config([], [f"correction.max_nothing_kept_steps={bad}"])


def test_the_method_label_names_the_type_and_every_set_field():
    cfg = resolve_config([], ["correction.method.type=icepop", "correction.method.lo=0.4"])
    assert cfg.correction.method.label() == "icepop self_normalize=False lo=0.4 hi=5.0"
    assert RunConfig().correction.method.label() == "seq-mis self_normalize=False hi=3.0"  # lo, veto unset


def test_a_streak_survives_a_resume_so_a_run_checkpointed_often_still_stops():
    """Found by a review: the streak was not in the checkpoint, so a run resumed every 2 steps with
    limit 3 never stopped however long nothing was kept. Restored from ``state_dict`` at each
    "resume", the 4th nothing-kept step in a row raises, naming the step the streak began."""
    guard = NothingKeptGuard(limit=3, method="seq-mis")
    with pytest.raises(NothingKeptError, match=r"4 consecutive steps \(steps 1-4"):
        for step in range(1, 13):
            guard.observe(step, NOTHING)
            if step % 2 == 0:  # a checkpoint, then a resume into a new driver
                saved = guard.state_dict()
                guard = NothingKeptGuard(limit=3, method="seq-mis")
                guard.load_state_dict(saved)
    fresh = NothingKeptGuard(limit=3)
    fresh.load_state_dict(None)  # a checkpoint written before the streak was saved: no streak
    assert (fresh.streak, fresh.first_step) == (0, None)


def test_the_controller_snapshot_carries_the_guards():
    from types import SimpleNamespace

    from actors.run_checkpoint import controller_snapshot

    parts = SimpleNamespace(state_dict=lambda: {}, groups=lambda: [])
    snap = controller_snapshot(4, parts, parts, {"ais": {}}, None, guards={"nothing_kept": {"streak": 2, "first_step": 3}})
    assert snap["guards"] == {"nothing_kept": {"streak": 2, "first_step": 3}}
