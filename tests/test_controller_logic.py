"""The rollout loop's logic with no Ray cluster.

The real ``RolloutLoop``, ``RolloutPool``, sampler, buffer, shared state and object-store
transport run over an in-process runtime (``tests/controller_fakes.py``): a worker handle runs
each call the moment it is made and returns a completed reference, so every ``tick`` of the loop
is deterministic. Published "weights" are the version number itself; a fake worker adopts it.
"""

import re

import pytest
from controller_fakes import FakeWorkerClass, InProcessRuntime, Method, WorkerDied

from actors.controller import RolloutLoop
from actors.placement import RoleOptions
from actors.rollout_pool import RolloutPool
from actors.shared_state import SharedState, take_batch
from actors.weight_sync import ObjectStoreTransport
from system.config.loading import resolve_config
from system.data.buffer import TrajectoryBuffer
from system.data.prompt_source import build_prompt_source
from system.data.sampler import PromptSampler


def build(max_lag: int = 1, workers: int = 1, calls_per_worker: int = 2, transport=None):
    """A loop with B = 2 prompts per step, one 2-prompt call per step, ``workers`` started workers
    (weights through ``transport``, the object store's by default)."""
    cfg = resolve_config(overrides=[
        f"async.max_lag={max_lag}", "prompts_per_step=2", "rollout.prompts_per_call=2", "rollout.group_size=2",
        f"rollout.num_workers={workers}", "max_steps=50", f"rollout.calls_per_worker={calls_per_worker}"])
    cls = FakeWorkerClass()
    pool = RolloutPool(cfg, "unused", RoleOptions("rollout_worker", workers, 1.0, 0.0, {}), cls, InProcessRuntime())
    pool.start(workers)
    sampler = PromptSampler(build_prompt_source(cfg.data.task, cfg.seed), cfg.seed)
    buffer = TrajectoryBuffer(max_lag)
    state = SharedState(0, (0, 0))
    loop = RolloutLoop(cfg, pool, sampler, buffer, state, transport or ObjectStoreTransport())
    return cfg, cls, pool, sampler, buffer, state, loop


def ticks(loop: RolloutLoop, n: int = 6) -> None:
    for _ in range(n):
        loop.tick(timeout=0)


def test_admission_keeps_generation_within_max_lag():
    """max_lag 1, one worker at version 0: it may generate the batches of versions 0 and 1 (consumed
    by steps 1 and 2), then waits. Step 1 taking its batch frees nothing (the next batch, version 2,
    would be 2 versions ahead of the worker's weights); version 1 published -> weights pushed first,
    then one more call, with version 1, for version 2; then it waits again."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    ticks(loop)
    assert [e[0] for e in cls.log] == ["generate", "generate"] and len(buffer) == 4  # groups
    groups, _ = take_batch(cfg, buffer, sampler, state, 0, loop)
    assert len(groups) == 2 and state.steps_started == 1
    ticks(loop)
    assert len(cls.log) == 2  # still held back
    state.publish(1, 1)
    ticks(loop)
    assert cls.log[2:] == [("update", "rollout-0", 1), ("generate", "rollout-0", 1, cls.log[2 + 1][3])]
    ticks(loop)
    assert len(cls.log) == 4 and len(buffer) == 4
    counts = sampler.counts()
    # 6 prompts generated; the 2 of step 1 are taken but not yet marked trained
    assert (counts["issued"], counts["buffered"], counts["in_flight"], counts["trained"]) == (6, 6, 0, 0)


@pytest.mark.parametrize("depth", [1, 2])
def test_a_worker_holds_up_to_calls_per_worker_calls_and_queued_calls_count_for_admission(depth):
    """Calls that have not returned: with ``calls_per_worker`` 2 the worker gets the batches of steps 1
    and 2 at once (the second queued behind the first), with 1 only step 1's. max_lag 1 at version 0:
    when the first returns, its groups are buffered and the second is still in flight, so the next
    batch would be step 3's, two versions ahead: nothing more is sent until version 1 is offered;
    then one call (step 3's) goes, with version 1."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1, calls_per_worker=depth)
    worker = cls.handles["rollout-0"]
    worker.held[0] = True
    ticks(loop)
    slot = pool.slots["rollout-0"]
    assert len(slot.calls) == depth and not cls.log  # sent, none has run
    worker.held.pop(1).release()
    ticks(loop)
    # depth 2: step 2's call still in flight, step 3's not admitted (1 buffered + 1 in flight batch at
    # version 0: 2 ahead); depth 1: step 2's call sent now
    assert len(buffer) == 2 and len(slot.calls) == 1
    worker.held.pop(1).release()
    ticks(loop)
    assert len(buffer) == 4 and not slot.calls  # steps 1 and 2 generated; step 3 not admitted at version 0
    groups, _ = take_batch(cfg, buffer, sampler, state, 0, loop)
    ticks(loop)
    assert not slot.calls  # still two versions ahead: 1 step started + 2 buffered = step 3 at version 0
    state.publish(1, 1)
    ticks(loop)
    assert len(slot.calls) == 1 and slot.policy_version == 1  # step 3's call; step 4's would be 2 ahead
    worker.held.pop(1).release()
    assert cls.log[-1][:3] == ("generate", "rollout-0", 1) and ("update", "rollout-0", 1) in cls.log


def test_synchronous_mode_generates_only_with_the_weights_that_train_it():
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=0)
    ticks(loop)
    assert [e[:3] for e in cls.log] == [("generate", "rollout-0", 0)]  # the version-0 batch only
    take_batch(cfg, buffer, sampler, state, 0, loop)
    ticks(loop)
    assert len(cls.log) == 1
    state.publish(1, 1)
    ticks(loop)
    assert [e[:3] for e in cls.log[1:]] == [("update", "rollout-0", 1), ("generate", "rollout-0", 1)]


def test_a_lost_worker_is_replaced_and_its_prompts_served_again():
    """Worker 0 dies on its next calls (two, ``rollout.calls_per_worker``): their four prompts go back
    to the sampler, the failure is counted, a replacement (rollout-1) is launched, gets the current
    weights once ready, and is served the same prompt ids first; none is lost or duplicated."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    state.publish(3, 3)
    cls.handles["rollout-0"].dead = True
    loop.tick(timeout=0)  # push v3, dispatch two calls: the first fails when collected
    assert pool.failures == 1 and "rollout-0" not in pool.slots
    assert len(sampler.requeued) == 4
    requeued = list(sampler.requeued)
    ticks(loop)
    assert "rollout-1" in pool.slots and pool.slots["rollout-1"].starting is None
    generated = [e for e in cls.log if e[0] == "generate"]
    # latest weights, the lost prompts first, in their order
    assert [g[1:] for g in generated[:2]] == [("rollout-1", 3, requeued[:2]), ("rollout-1", 3, requeued[2:])]
    assert ("update", "rollout-1", 3) in cls.log
    assert sampler.counts()["duplicates"] == 0 and not sampler.requeued
    assert cls.handles["rollout-0"].killed  # an unreachable actor may live on, holding its resources


def test_a_worker_lost_while_the_run_stops_is_not_said_to_be_replaced(caplog):
    """A probe: after a learner rank's loss had failed the run, the console still said a rollout
    worker was lost and "replacing it". Once the loop is stopping (a failure, a stop, the drain) the
    loss is an info line; its prompts go back to the ledger as ever and nothing is launched."""
    import logging

    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    state.publish(3, 3)
    cls.handles["rollout-0"].dead = True
    loop._push_weights()
    loop._dispatch()  # two calls on rollout-0, failing when collected
    loop.stop.set()  # what the trainer does when its step loop raises
    with caplog.at_level(logging.INFO, logger="actors.controller"):
        loop._collect(timeout=0)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "actors.controller"]
    assert [level for level, _ in said] == [logging.INFO], said
    assert "while the run stops" in said[0][1] and "replacing" not in said[0][1]
    assert pool.failures == 1 and "rollout-0" not in pool.slots and len(sampler.requeued) == 4
    assert list(pool.slots) == []  # no replacement launched


def test_scaling_follows_desired_workers():
    """1 -> 3 launches two workers; 3 -> 1 retires two (idle ones first) and kills them."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    loop.desired_workers = 3
    ticks(loop)
    assert sorted(pool.slots) == ["rollout-0", "rollout-1", "rollout-2"]
    loop.desired_workers = 1
    ticks(loop)
    assert len(pool.slots) == 1
    assert sum(h.killed for h in cls.handles.values()) == 2
    # a large scale-up launches LAUNCHES_PER_TICK (16) per turn of the loop, which generates in between
    loop.desired_workers = 40
    ticks(loop, 1)
    assert len(pool.slots) == 1 + 16
    ticks(loop, 2)
    assert len(pool.slots) == 40



def test_a_retiring_worker_is_removed_only_when_the_transport_releases_it():
    """(A collective transport holds a worker while a broadcast generation it is in is still hosted.)"""
    held_back = {"rollout-0", "rollout-1"}

    class Holding(ObjectStoreTransport):
        def releases(self, worker_id: str) -> bool:
            return worker_id not in held_back

    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1, workers=2, transport=Holding())
    ticks(loop, 4)
    loop.desired_workers = 1
    ticks(loop, 4)
    assert len(pool.slots) == 2 and not any(h.killed for h in cls.handles.values())  # retiring, held back
    held_back.clear()
    ticks(loop, 4)
    assert len(pool.slots) == 1 and sum(h.killed for h in cls.handles.values()) == 1

@pytest.mark.parametrize("max_lag", [0, 1, 3])
def test_no_buffered_group_exceeds_the_bound_over_many_steps(max_lag):
    """Forty steps with two workers: every batch taken at version k holds groups of versions
    k - max_lag .. k only, and the ledger balances (issued = trained + buffered + in flight)."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=max_lag, workers=2)
    for k in range(40):
        ticks(loop, 3)
        groups, _ = take_batch(cfg, buffer, sampler, state, k, loop)
        assert all(k - max_lag <= g.policy_version <= k for g in groups), (k, [g.policy_version for g in groups])
        sampler.mark_trained([g.prompt.prompt_id for g in groups])
        state.publish(k + 1, k + 1)
    c = sampler.counts()
    assert c["trained"] == 80 and c["duplicates"] == 0
    assert c["issued"] == c["trained"] + c["buffered"] + c["in_flight"] + c["dropped"]


def test_a_call_requires_the_oldest_version_the_bound_allows_and_its_reported_wait_is_idle_time():
    """max_lag 1, B = one call: calls for the steps training from versions 0 and 1 require version 0;
    after step 1 is taken and versions 1 and 2 offered (their steps may still run), the calls for the
    steps training from versions 2 and 3 require 2 - 1 = 1 and 3 - 1 = 2 (not the newest offered for
    both: the first may sample with version 1 as soon as it exists). A worker's reported
    wait (``weights_wait_s`` on a call's first group) is added to ``rollout_idle_s``."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    worker = cls.handles["rollout-0"]
    ticks(loop)
    assert worker.min_versions == [0, 0]
    take_batch(cfg, buffer, sampler, state, 0, loop)
    state.publish(1, 1)  # submitted with step 1: version 1 still being trained
    state.publish(2, 2)  # and step 2 queued ahead
    worker.waited_s = 0.75
    idle_before = state.rollout_idle_s
    ticks(loop)
    assert worker.min_versions == [0, 0, 1, 2] and worker.version == 2  # offered 1 then 2
    # two calls, each reporting 0.75 s, on top of the driver's own (sub-second) idle accounting
    assert 2 * 0.75 <= state.rollout_idle_s - idle_before < 2 * 0.75 + 0.5


def test_a_worker_that_joins_is_offered_the_finished_version_and_those_in_training():
    """Versions 1 (its step ended) and 2 (its step running) known: a worker that becomes ready now is
    offered 1 and then 2, so its first call need not wait for step 2 when 1 satisfies the bound;
    versions older than the last finished one are no longer offered."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    state.publish(1, 1)
    state.finished(1)
    state.publish(2, 2)
    assert sorted(state.offers) == [1, 2]
    loop.desired_workers = 2
    ticks(loop)
    assert [e for e in cls.log if e[0] == "update" and e[1] == "rollout-1"] == [
        ("update", "rollout-1", 1), ("update", "rollout-1", 2)]


def test_a_call_failing_while_the_run_ends_is_handed_back_and_the_ledger_closes():
    """A generate call that fails with something other than a lost worker (here: stale weights refused)
    once the run is ending: the drain hands its prompts back instead of raising (the final checkpoint,
    report and ledger still happen), and ``drop_in_flight`` leaves no prompt in flight."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    worker = cls.handles["rollout-0"]
    worker.held[0] = True  # the next calls wait to be released
    ticks(loop, 2)
    [slot] = pool.slots_now()
    assert len(slot.calls) == 2
    for ref in worker.held[1:]:
        ref.error = RuntimeError("holds policy version 0, the controller requires >= 1")
        ref.ready = True
    loop.drain(timeout=1.0)  # the loop's thread never started: drain collects in this thread
    assert not slot.calls and sampler.counts()["in_flight"] == 4  # handed back, not raised
    assert sampler.drop_in_flight("in_flight_at_end") == 4
    c = sampler.counts()
    assert c["in_flight"] == 0 and c["dropped/in_flight_at_end"] == 4 and not sampler.requeued
    assert c["issued"] == c["trained"] + c["buffered"] + c["in_flight"] + c["dropped"]


def test_a_call_failing_during_the_run_still_fails_the_loop():
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    worker = cls.handles["rollout-0"]
    worker.held[0] = True
    ticks(loop, 2)
    worker.held[1].error, worker.held[1].ready = RuntimeError("refused"), True
    with pytest.raises(RuntimeError, match="refused"):
        ticks(loop, 1)


def test_a_call_never_straddles_two_steps():
    """Found by a review: B = 3 prompts per step, 2 per call, max_lag 0. The second call used to take
    2 prompts, one of step 0's batch and one of step 1's, all at version 0: step 1 (version 1)
    dropped that one as stale, every step. Now it takes the 1 prompt step 0 still lacks."""
    cfg = resolve_config(overrides=["async.max_lag=0", "prompts_per_step=3", "rollout.prompts_per_call=2",
                                    "rollout.group_size=2", "max_steps=50", "rollout.calls_per_worker=2"])
    cls = FakeWorkerClass()
    pool = RolloutPool(cfg, "unused", RoleOptions("rollout_worker", 1, 1.0, 0.0, {}), cls, InProcessRuntime())
    pool.start(1)
    sampler = PromptSampler(build_prompt_source(cfg.data.task, cfg.seed), cfg.seed)
    buffer, state = TrajectoryBuffer(0), SharedState(0, (0, 0))
    loop = RolloutLoop(cfg, pool, sampler, buffer, state, ObjectStoreTransport())
    for version in range(3):
        ticks(loop)
        calls = [e for e in cls.log if e[0] == "generate" and e[2] == version]
        assert [len(e[3]) for e in calls] == [2, 1]  # step `version`'s batch: 2 + 1 prompts
        groups, _ = take_batch(cfg, buffer, sampler, state, version, loop)
        assert len(groups) == 3
        sampler.mark_trained([g.prompt.prompt_id for g in groups])
        state.publish(version + 1, version + 1)
    assert sampler.counts()["dropped"] == 0 and sampler.counts()["trained"] == 9


def test_workers_that_keep_failing_to_start_fail_the_run_with_the_error():
    """Found by a review: a worker whose engine cannot be built died on ``ready`` and was relaunched
    forever while another worker stayed alive (the worker timeout never ran). Now the third in a
    row (rollout.max_start_failures=3) fails the loop with the last one's error; one coming up
    in between resets the count."""
    cfg, cls, pool, sampler, buffer, state, loop = build(max_lag=1)
    cfg = resolve_config(overrides=["prompts_per_step=2", "rollout.prompts_per_call=2", "rollout.group_size=2",
                                    "max_steps=50", "rollout.max_start_failures=3"])
    loop.cfg = pool.cfg = cfg
    broken = {"on": True}
    real_remote = cls.remote

    def remote(cfg_, model_dir, worker_id, fp8_kernel_pins=None):
        handle = real_remote(cfg_, model_dir, worker_id)
        if broken["on"]:
            def fail():
                raise WorkerDied(f"{worker_id}: engine build failed: no kernel for this CPU")
            handle.ready = Method(fail)
        return handle

    cls.remote = remote
    loop.desired_workers = 2  # one healthy worker (rollout-0) stays; the second keeps failing to start
    for _ in range(30):  # each tick launches a replacement and collects one result
        if pool.failures == 2:
            break
        loop.tick(timeout=0)
    assert loop._start_failures == 2 and pool.failures == 2
    broken["on"] = False  # the next one starts: the count resets
    ticks(loop, 6)
    assert loop._start_failures == 0 and len(pool.ready()) == 2
    broken["on"] = True
    loop.desired_workers = 3
    with pytest.raises(RuntimeError, match=r"3 rollout workers in a row failed to start.*no kernel for this CPU"):
        ticks(loop, 10)


def test_a_batch_that_does_not_come_is_said_on_the_console(caplog):
    """Found by a probe: a hung (SIGSTOPped) rollout worker stalled the run for 150 s without a word.
    No tick here, so no batch: the wait warns after ``report.stall_warning_s`` and again after each."""
    import logging
    import time

    cfg, cls, pool, sampler, buffer, state, loop = build()
    cfg = cfg.model_copy(update={"report": cfg.report.model_copy(update={"stall_warning_s": 0.1})})
    with caplog.at_level(logging.WARNING, logger="actors.shared_state"):
        until = time.perf_counter() + 0.6
        groups, waited = take_batch(cfg, buffer, sampler, state, 0, loop, give_up=lambda: time.perf_counter() > until,
                                    poll_s=0.02)
        quiet, _ = take_batch(cfg, buffer, sampler, state, 0, loop, give_up=lambda: time.perf_counter() > until + 0.3,
                              poll_s=0.02, warn=False)  # queued ahead: the running step's own wait warns
    assert groups == [] == quiet and waited >= 0.55
    warnings = [r.getMessage() for r in caplog.records if r.name == "actors.shared_state"]
    # one at every 0.1 s of the wait: as many as whole periods passed (a late poll on a busy machine,
    # or a garbage collection, merges two), at least 3 of the 6 periods of the first 0.6 s
    assert 3 <= len(warnings) <= int(waited / 0.1) + 1, (warnings, waited)
    assert re.fullmatch(r"no batch for step 1 after \d+ s: 0 of 2 groups buffered, 1 rollout worker\(s\) ready "
                        r"\(a worker stuck in a generate call, or too few workers for the batch\)", warnings[0])


def test_the_workers_get_the_runs_temporary_directory(tmp_path):
    """Found by a probe: every vLLM engine start left a ``vllm_dist_*`` rendezvous file in /tmp (187 from
    the sessions so far; a killed worker never removes its own): the workers run with the run's TMPDIR
    (the trainer removes it after the run; ``tests/test_e2e_train.py`` checks /tmp after a real run)."""
    cfg = resolve_config(overrides=["rollout.num_workers=2"])
    for tmp_dir, expected in ((str(tmp_path), [str(tmp_path)] * 2), (None, [None, None])):
        cls = FakeWorkerClass()
        pool = RolloutPool(cfg, "unused", RoleOptions("rollout_worker", 2, 1.0, 0.0, {}), cls, InProcessRuntime(),
                           tmp_dir=tmp_dir)
        pool.launch(2)
        assert [o["runtime_env"]["env_vars"].get("TMPDIR") for o in cls.options_seen] == expected

