"""When a run counts as diverged (``system.learner.divergence``): consecutive non-finite steps past the limit."""

import math

import pytest

from system.learner.divergence import DivergenceGuard, TrainingDivergedError

FINITE = {"loss": 0.5, "skipped_step": 0.0, "nonfinite_proximal_tokens": 0.0, "grad_norm": 1.0}


@pytest.mark.parametrize("bad", [{"loss": math.nan}, {"loss": math.inf}, {"skipped_step": 1.0},
                                 {"nonfinite_proximal_tokens": 3.0}])
def test_each_kind_of_non_finite_step_counts_and_a_finite_one_resets(bad):
    guard = DivergenceGuard(limit=2)
    guard.observe(1, {**FINITE, **bad})
    guard.observe(2, {**FINITE, **bad})
    assert guard.streak == 2  # at the limit: not yet past it
    guard.observe(3, FINITE)
    assert guard.streak == 0
    guard.observe(4, {**FINITE, **bad})
    guard.observe(5, {**FINITE, **bad})
    with pytest.raises(TrainingDivergedError, match=r"3 consecutive steps .*\(step 6: .*max_nonfinite_steps=2"):
        guard.observe(6, {**FINITE, **bad})


def test_a_limit_of_zero_stops_at_the_first_non_finite_step():
    guard = DivergenceGuard(limit=0)
    guard.observe(1, FINITE)
    with pytest.raises(TrainingDivergedError, match="1 consecutive steps"):
        guard.observe(2, {**FINITE, "skipped_step": 1.0})
