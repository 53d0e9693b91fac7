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


def test_an_update_that_leaves_non_finite_parameters_stops_the_run_at_once():
    """Found by a probe: an update that turned the parameters NaN passed the guard (its loss and
    gradient were finite) and its weights went to the rollout workers; only the next steps' NaN losses
    counted, up to ``max_nonfinite_steps`` later. It now stops at that step, whatever the limit."""
    guard = DivergenceGuard(limit=3)
    guard.observe(1, {**FINITE, "nonfinite_params": 0.0})
    with pytest.raises(TrainingDivergedError, match=r"step 2's update left non-finite parameters \(loss 0.5, "
                                                    r"grad_norm 1.0\)"):
        guard.observe(2, {**FINITE, "nonfinite_params": 1.0})


def test_non_finite_parameters_are_found_in_any_parameter():
    """One process (no process group): the flag is the local check."""
    import torch

    from system.learner.core import nonfinite_parameters

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    assert not nonfinite_parameters(model)
    for bad in (math.nan, math.inf, -math.inf):
        with torch.no_grad():
            model[1].bias[1] = bad
        assert nonfinite_parameters(model), bad
    with torch.no_grad():
        model[1].bias[1] = 3e38  # finite, but the norm of the whole overflows float32: diverged as well
        model[1].bias[0] = 3e38
    assert nonfinite_parameters(model)
