"""The controller: two loops joined by the trajectory buffer.

    rollout loop (thread)                         train loop (caller's thread), one step
    ─────────────────────                         ──────────────────────────────────────
    newer weights? offer them to every worker     buffer.take(B, version k)  (stale groups dropped)
    sampler ─prompts─▶ worker with room (admitted) ─▶ collate, ray.put(batch)
    worker ─groups─▶ ledger.mark_generated         ─▶ publish version k+1: the reference its weights
            ─▶ buffer.add                               WILL have (offered while the step runs)
                                                   ─▶ ONE call to the learner group (every rank;
                                                        the batch by reference, fetched by Ray before
                                                        the step starts): proximal log-probs,
                                                        all-gather; rank 0 ─▶ correction service from
                                                        a thread of its own (weights, metrics, dumps;
                                                        it reads the batch from the object store, the
                                                        log-probs and weights travel packed; its
                                                        handle given to rank 0 once, at the start),
                                                        in flight during the update's first forward;
                                                        broadcast weights, update, export (version k+1)
                                                   ◀── rank 0: metrics; beside them its export thread
                                                       returns the weights (rank 0's ``weights`` call,
                                                       submitted with the step): once the object
                                                       exists, workers waiting for it adopt it
                                                   ─▶ step record to the service (not awaited)

The driver makes one blocking call per step (``PendingStep.result``); no token array passes
through it after the batch is put, and the record reaches the sinks while the next step runs
(``actors.step_records``: each step checks, with ``ray.wait(timeout=0)``, the records sent before;
a record the service could not write stops the run, and a checkpoint waits for every record first).

Queueing ahead (``async.queue_ahead``, with ``async.max_lag >= 1``; off by default): while step k
runs, the driver waits on the buffer; if the batch of step k+1 is complete before step k ends, it
is put and step k+1 is submitted at once, so it waits in the learners' queue and starts the moment
step k ends (no driver round trip between steps; ``pipeline/queued_ahead`` = 1). The staleness
bound is the same (the batch is checked against the version step k+1 trains), but batches are
taken as soon as they are admissible, so they hold fewer lag-0 samples than when the driver takes
them after step k (then the worker often has time to sample with version k+1). Not across a
checkpoint (the learners must be idle at the saved version), the last step, or a stop request.

Workers hold up to ``rollout.calls_per_worker`` generate calls: the next one is queued behind the
running one, so a worker starts it the moment the previous returns (no round trip through this
loop). Weights are *offered* to a worker beside its calls as soon as the step producing them is
submitted, and a call adopts the newest offered version whose weights exist by the time it starts
(``system.rollout.weight_mailbox``); a call that needs a version still being trained waits for it
inside the worker (that wait is reported with its groups and counted in ``time/rollout_idle``).
So no version waits for a driver round trip after its step ends, and queueing a call early never
makes its samples staler than sending it at the last moment would.

Admission (``async.max_lag``): a generate call is sent to a worker offered version ``v`` only
if the step that will consume its groups, ``k = steps_started + (buffered + in flight) // B``,
satisfies ``k - v <= max_lag`` (queued calls count as in flight); the call requires version
``k - max_lag`` (the worker waits for it, and refuses to sample below it), and holds at most the
prompts step k's batch still lacks (when B is not a multiple of ``rollout.prompts_per_call``, a call
never straddles two steps, whose second would find its groups too stale). ``max_lag = 0`` is the
synchronous on-policy mode. The buffer re-checks the bound at batch time, so no trained sample
ever exceeds it.
"""

import logging
import threading
import time

import ray

from actors.placement import follow_target, rollout_capacity
from actors.rollout_pool import GenerateCall, RolloutPool, WorkerSlot
from actors.shared_state import SharedState
from actors.weight_sync import WeightTransport
from system.config import RunConfig
from system.data.buffer import TrajectoryBuffer
from system.data.sampler import PromptSampler
from system.types import RolloutGroup

log = logging.getLogger(__name__)

LAUNCHES_PER_TICK = 16
"""Workers launched per turn of the rollout loop at most: a probe's `aisrl scale --workers 4096` created
4095 actors in one turn, and the running step waited 8.8 s for its batch meanwhile."""


class RolloutLoop:
    """Keeps every admitted worker generating; owns every call made to the workers.

    A worker that dies (its process or node lost) has its in-flight prompts handed back to
    the sampler, which serves them again under the same ids (a late duplicate result is
    discarded by the ledger), and a replacement is launched; it receives the current weights
    before its first generate. ``desired_workers`` can change while the job runs.
    """

    def __init__(self, cfg: RunConfig, pool: RolloutPool, sampler: PromptSampler,
                 buffer: TrajectoryBuffer, state: SharedState, transport: WeightTransport) -> None:
        self.cfg, self.pool, self.sampler, self.buffer, self.state = cfg, pool, sampler, buffer, state
        self.runtime = pool.runtime  # every Ray call goes through it (``actors.runtime``)
        self.transport = transport
        self.desired_workers = cfg.rollout.num_workers
        """The floor set by the config or ``aisrl scale``; ``target_workers`` adds the cluster's capacity."""
        self.target_workers = cfg.rollout.num_workers
        self._capacity_checked = 0.0
        self.control = None  # an actors.control.RunControl handle, polled for ``aisrl scale``
        self._control_ref: ray.ObjectRef | None = None
        self._control_asked = float("-inf")
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._last_alive = time.monotonic()
        self._lost_since_ready = False  # the worker-timeout clock runs only after a loss
        self._start_failures = 0  # workers in a row that died before they were ready
        self.thread = threading.Thread(target=self._run, name="rollout-loop", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.tick(timeout=0.05)
        except BaseException as exc:  # surfaced to the train loop, which fails the run
            self.error = exc
            with self.state.cond:
                self.state.cond.notify_all()

    def tick(self, timeout: float) -> None:
        """One pass of the loop: scaling, weights, dispatch, then collect what returned (waiting up to
        ``timeout`` seconds for a result, or for new weights when nothing is in flight)."""
        self._poll_control()
        self._follow_cluster()
        self._reconcile()
        self.transport.maintain(self.pool)
        self._push_weights()
        self._dispatch()
        self._collect(timeout)

    def _poll_control(self, every_s: float = 0.25) -> None:
        """Adopt the worker count last set with ``aisrl scale`` (one outstanding query at a time, at most
        one every ``every_s``: the loop ticks every 5 ms while a worker has room)."""
        if self.control is None:
            return
        if self._control_ref is None:
            if time.monotonic() - self._control_asked < every_s:
                return
            self._control_asked = time.monotonic()
            self._control_ref = self.control.desired.remote()
            return
        if self.runtime.poll(self._control_ref):
            desired = self.runtime.get(self._control_ref)
            if desired != self.desired_workers:
                log.warning("scaling rollout workers %d -> %d", self.desired_workers, desired)
            self.desired_workers, self._control_ref = desired, None

    def _follow_cluster(self, every_s: float = 2.0) -> None:
        """``target_workers``: ``desired_workers``, or with ``rollout.follow_cluster`` the rollout
        resource's capacity when larger (checked every ``every_s``; a new node is used as it joins)."""
        r = self.cfg.rollout
        if not r.follow_cluster:
            self.target_workers = self.desired_workers
            return
        now = time.monotonic()
        if now - self._capacity_checked >= every_s:
            self._capacity_checked = now
            capacity = rollout_capacity(self.runtime.cluster_resources(), self.cfg)
            target = follow_target(self.desired_workers, capacity, r.max_workers)
            if target != self.target_workers:
                log.warning("rollout capacity %d in the cluster: %d -> %d workers", capacity,
                            self.target_workers, target)
            self.target_workers = target
        self.target_workers = max(self.target_workers, self.desired_workers)

    def _reconcile(self) -> None:
        """Launch or retire workers toward ``target_workers``; fail if workers were lost and none has
        been alive for ``rollout.worker_timeout_s``.

        Following the cluster, a drop in capacity retires only workers still starting (not yet
        placed, e.g. replacements launched before the drop was seen): the workers of a departed
        node die with it and are not replaced, while retiring ready ones could pick idle, healthy
        workers before the dead ones are noticed. The
        failure clock runs only after a loss: a pool that is still being provisioned (scaled up
        from 0, or waiting for the autoscaler) waits as long as it takes.
        """
        live = len(self.pool.live())
        if live < self.target_workers:  # a few at a time: the loop keeps serving the workers it has
            self.pool.launch(min(self.target_workers - live, LAUNCHES_PER_TICK))
        elif live > self.target_workers:
            self.pool.retire(live - self.target_workers, starting_only=self.cfg.rollout.follow_cluster)
        for slot in [s for s in self.pool.slots_now() if s.retiring and not s.calls
                     and self.transport.releases(s.worker_id)]:
            with self.state.cond:  # its pause so far still counts (``RolloutSince.idle_s``)
                self._end_pause(slot)
            self.pool.remove(slot)
        if self.pool.ready() or not self._lost_since_ready or self.target_workers == 0:
            # scaled to 0 (``aisrl scale --workers 0``): no worker is expected, so none is missed
            self._last_alive = time.monotonic()
            self._lost_since_ready = False
        elif time.monotonic() - self._last_alive > self.cfg.rollout.worker_timeout_s:
            raise RuntimeError(
                f"no rollout worker has been alive for {self.cfg.rollout.worker_timeout_s:.0f} s "
                f"({self.pool.failures} lost); resume later with `aisrl train --resume {self.cfg.output_dir}`"
            )

    def _push_weights(self) -> None:
        with self.state.cond:
            offers = sorted(self.state.offers.items())  # the last finished version and those in training
        for slot in self.pool.slots_now():
            # a starting worker gets the versions once it is ready: pushing every version to it
            # meanwhile would queue one load per version behind its engine build
            if slot.starting is not None:
                continue
            for version, ref in offers:  # oldest first: a worker that held none gets the finished one too
                if slot.policy_version < version:
                    self.transport.push(slot.handle, ref, version)
                    slot.policy_version = version

    def _inflight_prompts(self) -> int:
        return sum(len(c.prompts) for s in self.pool.busy() for c in s.calls)

    def _consuming_step(self) -> tuple[int, int]:
        """The learner version the next dispatched prompts will be trained from (0-based), and how many
        prompts that step's batch still lacks (a call takes no more: it never straddles two steps, so
        the version it requires holds for all its prompts)."""
        with self.state.cond:
            queued = len(self.buffer) + self._inflight_prompts()
            batch = self.cfg.prompts_per_step
            return self.state.steps_started + queued // batch, batch - queued % batch

    def _dispatch(self) -> None:
        """Fill every worker with room up to ``rollout.calls_per_worker`` admitted calls. A call requires
        the oldest version the bound allows for the step that consumes it; the worker samples with the
        newest offered version that exists by then (an offer may precede its weights, see
        ``system.rollout.weight_mailbox``)."""
        depth, max_lag = self.cfg.rollout.calls_per_worker, self.cfg.async_.max_lag
        for slot in self.pool.with_room():
            while len(slot.calls) < depth:
                consuming_step, room = self._consuming_step()
                if consuming_step - slot.policy_version > max_lag or consuming_step >= self.cfg.max_steps:
                    break
                with self.state.cond:
                    prompts = self.sampler.next_prompts(min(self.cfg.rollout.prompts_per_call, room))
                    self._end_pause(slot)
                min_version = max(0, consuming_step - max_lag)
                slot.calls.append(GenerateCall(slot.handle.generate.remote(prompts, min_version), prompts))

    def _end_pause(self, slot: WorkerSlot) -> None:
        """Add the idle time of ``slot`` (if idle) to ``rollout_idle_s``; called holding ``state.cond``."""
        if slot.idle_since is not None:
            self.state.rollout_idle_s += time.monotonic() - slot.idle_since
            slot.idle_since = None

    def _collect(self, timeout: float) -> None:
        refs = self.pool.pending_refs()
        if not refs:
            with self.state.cond:  # woken by new weights or a started step
                self.state.cond.wait(timeout)
            return
        if self.pool.with_room():  # a worker with room may be admitted as soon as a step starts
            timeout = min(timeout, 0.005)
        ready, _ = self.runtime.wait(refs, timeout)
        for ref in ready:
            slot = self.pool.by_ref(ref)
            try:
                result = self.runtime.get(ref)
            except self.runtime.actor_died as exc:
                self._worker_lost(slot, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - e.g. a worker refusing stale weights
                if not self.stop.is_set():
                    raise  # the loop fails, and with it the run (``take_batch`` raises it)
                self._failed_while_draining(slot, ref, exc)
                continue
            if ref == slot.starting:
                self._start_failures = 0
                self.pool.mark_ready(slot, result)
                if self.pool.failures:
                    self.pool.replacement_seconds.append(time.monotonic() - slot.launched_at)
                continue
            slot.calls = [c for c in slot.calls if c.ref != ref]
            if not slot.calls:
                with self.state.cond:  # the step record reads it (``RolloutSince.idle_s``)
                    slot.idle_since = time.monotonic()
            self._accept(result)

    def _accept(self, groups: list[RolloutGroup]) -> None:
        with self.state.cond:
            self.state.rollout_idle_s += sum(g.weights_wait_s for g in groups)  # waited inside the worker
            for g in groups:
                if self.sampler.mark_generated(g.prompt.prompt_id):
                    self.buffer.add(g)
                    self.state.generated_tokens += sum(len(c.response_token_ids) for c in g.completions)
            self.state.cond.notify_all()

    def _failed_while_draining(self, slot: WorkerSlot, ref, exc: BaseException) -> None:
        """A call (or a worker's start) that failed once the run was ending: its prompts are handed back
        (the final ledger drops them) instead of failing the end of the run (its checkpoint, report
        and ledger); the loop itself may have stopped on the same error already."""
        log.warning("rollout worker %s: a call failed while the run was ending (%s: %s)", slot.worker_id,
                    type(exc).__name__, str(exc)[:200])
        if ref == slot.starting:
            self.pool.remove(slot)  # killed too: shutdown no longer sees it
            return
        failed = [c for c in slot.calls if c.ref == ref]
        slot.calls = [c for c in slot.calls if c.ref != ref]
        with self.state.cond:
            self.sampler.requeue([p.prompt_id for c in failed for p in c.prompts])

    def _worker_lost(self, slot: WorkerSlot, exc: BaseException) -> None:
        if slot.starting is not None and not self.stop.is_set():  # it never became ready (while the run
            # ends, a worker that could not start fails nothing: a review found the drain raising here,
            # which cost the run its final checkpoint and report)
            self._start_failures += 1
            limit = self.cfg.rollout.max_start_failures
            if self._start_failures >= limit:
                self.pool.remove(slot)
                cause = " ".join(str(exc).split())[-1500:]
                raise RuntimeError(
                    f"{self._start_failures} rollout workers in a row failed to start (rollout.max_start_failures="
                    f"{limit}); the last, {slot.worker_id}: {type(exc).__name__}: {cause}")
        if self.stop.is_set():  # the run ends (or failed: a probe saw "replacing it" after its failure line)
            log.info("rollout worker %s lost (%s) while the run stops; its %d prompts are re-issued to the ledger",
                     slot.worker_id, type(exc).__name__, len(slot.inflight_prompts()))
        else:
            log.warning("rollout worker %s lost (%s); re-issuing its %d prompts and replacing it",
                        slot.worker_id, type(exc).__name__, len(slot.inflight_prompts()))
        with self.state.cond:
            self.sampler.requeue([p.prompt_id for p in slot.inflight_prompts()])
        self.pool.failures += 1
        self._lost_since_ready = True
        # killed too: Ray's actor error also covers an actor it cannot reach that may still run and
        # hold its node's GPU and rollout resource, which its replacement then could not get
        self.pool.remove(slot)

    def drain(self, timeout: float) -> None:
        """Stop dispatching; collect (and account for) what is still in flight."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        if self.thread.ident is not None:  # started (a run that failed while building may not have)
            self.thread.join(timeout=timeout)  # a tick stuck in a Ray call must not hold the end of the run
            if self.thread.is_alive():
                log.warning("the rollout loop did not stop within %.0f s; its calls in flight are handed back",
                            timeout)
        while self.pool.busy() and time.monotonic() < deadline and not self.thread.is_alive():
            self._collect(timeout=0.5)
        with self.state.cond:
            for slot in self.pool.busy():
                self.sampler.requeue([p.prompt_id for p in slot.inflight_prompts()])
