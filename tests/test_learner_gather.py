"""``gather``: how a step's failure is named (a dead rank, a dead actor a rank was calling, a rank's own error).

Found by a probe: killing the correction service mid-step was reported as "learner rank 0 of 2 was
lost" (a live rank's call to the dead service surfaces as ``RayTaskError(ActorDiedError)``, which
is also a ``RayActorError``). Tiny actors on a private loopback cluster stand in for the ranks and
the service (the real stack's version of this is the probe's; it takes a minute per run).
"""

import re
import time

import numpy as np
import pytest
import ray

from actors.correction_call import CorrectionCall
from actors.learner_worker import LearnerLostError, StepPartLostError, gather
from system.learner.collate import collate_groups
from system.types import Completion, Prompt, RolloutGroup

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class CorrectionService:  # named as the real one: the error names the actor by its class
    def process(self, step: int, holder: list, proximal_N: np.ndarray, version: int) -> tuple:
        time.sleep(holder[0])  # the stand-in's holder carries how long the call takes
        return np.ones_like(proximal_N), {}


@ray.remote(num_cpus=0)
class Rank:
    def step(self, service=None, seconds: float = 0.0, fail: bool = False) -> str:
        if fail:
            raise ValueError("a rank's own error")
        if service is not None:  # as rank 0's call: on the call's own thread, raised again by the wait
            # built here: a module-level helper would be pickled by reference, and Ray's workers cannot
            # import a test module (the decorated class itself travels by value)
            completion = Completion("a", 0, np.array([5]), np.array([6]), np.array([-0.5], np.float32), "", 1.0, 0)
            batch = collate_groups([RolloutGroup(Prompt("a", "", ""), (completion,), 0)], scale_advantages_by_std=False)
            weights_BT, _ = CorrectionCall(service).start(1, batch, [seconds], np.zeros((1, 1)), 0)()
            return "weights" if weights_BT.tolist() == [[1.0]] else f"unexpected {weights_BT}"
        time.sleep(seconds)
        return "done"

    def ready(self) -> bool:
        return True


@pytest.fixture
def ranks(loopback_ray):
    made = [Rank.remote(), Rank.remote()]
    ray.get([r.ready.remote() for r in made])
    yield made
    for r in made:
        ray.kill(r)


def test_a_dead_service_is_named_not_taken_for_a_lost_rank(ranks):
    service = CorrectionService.remote()
    refs = [ranks[0].step.remote(service, 30.0), ranks[1].step.remote(None, 30.0)]
    time.sleep(1.0)  # rank 0 is inside its call to the service
    ray.kill(service, no_restart=True)
    with pytest.raises(StepPartLostError) as info:
        gather(refs)
    message = str(info.value)
    assert message.startswith("the correction service died during the step (learner rank 0 was calling it)")
    assert "was lost" not in message and "\n" not in message and "\x1b[" not in message  # one plain line


def test_a_dead_rank_is_a_lost_rank(ranks):
    refs = [ranks[0].step.remote(None, 30.0), ranks[1].step.remote(None, 30.0)]
    time.sleep(1.0)
    ray.kill(ranks[1], no_restart=True)
    with pytest.raises(LearnerLostError, match="^learner rank 1 of 2 was lost"):
        gather(refs)


def test_a_rank_error_comes_through_as_it_came(ranks):
    refs = [ranks[0].step.remote(fail=True), ranks[1].step.remote()]
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        gather(refs, settle_s=5.0)
    assert isinstance(info.value, ValueError) and "a rank's own error" in str(info.value)
    assert gather([ranks[0].step.remote(), ranks[1].step.remote()]) == ["done", "done"]  # both still serve


def test_a_step_that_runs_long_is_said_on_the_console(ranks, caplog):
    """Found by a probe: a SIGSTOPped correction service stalled the run for 60 s without a word."""
    import logging

    refs = [ranks[0].step.remote(None, 3.0), ranks[1].step.remote(None, 0.1)]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="actors.learner_worker"):
        assert gather(refs, stall_warning_s=0.5, what="step 7") == ["done", "done"]
    elapsed = time.monotonic() - started
    warnings = [r.getMessage() for r in caplog.records if r.name == "actors.learner_worker"]
    # one per 0.5 s without a rank finishing: at least 2 before rank 0's 3 s (up to 5), at most one
    # per period
    assert 2 <= len(warnings) <= int(elapsed / 0.5) + 1, (warnings, elapsed)
    assert all(re.fullmatch(r"step 7 has run for \d+ s; [12] of 2 learner rank\(s\) not done \(a hung rank, or "
                            r"the correction service rank 0 waits for\)", w) for w in warnings), warnings
    assert "1 of 2" in warnings[-1]  # rank 1 (0.1 s) was done by the last one
