"""Learner rank actor (one per FSDP2 rank) and the group that drives all ranks in lock-step.

A step is one call to every rank (``LearnerGroup.submit``, awaited with ``PendingStep.result``); the ranks run
``system.learner.group_step.run_step`` together and rank 0 reaches the correction service
itself, so the batch's token arrays never travel back through the driver. Beside it, rank 0's
``weights(version)`` call (submitted with the step, on rank 0's export thread) returns the new
weights once the step has exported them, so their copy into the object store overlaps the next
step (``actors.export_handoff``).
"""

import logging
import os
import re
import threading
import time
from dataclasses import replace

import ray
import torch

from actors.cluster import actor_env
from actors.correction_call import CorrectionCall
from actors.export_handoff import ExportHandoff
from actors.placement import RoleOptions, placement_hint
from actors.remote_errors import process_death, remote_error
from system.config import RunConfig
from system.learner.batch import LearnerBatch
from system.learner.core import LearnerCore
from system.learner.distributed import reserve_rendezvous
from system.learner.group_step import run_step
from system.learner.step_outcome import StepOutcome
from system.weight_broadcast import GroupAddress
from system.weight_delta import DeltaEncoder
from system.weight_generations import BroadcastSender
from system.weight_payload import WeightPayload

log = logging.getLogger(__name__)


@ray.remote(concurrency_groups={"export": 1})
class LearnerRank:
    """One FSDP2 rank. Built in two phases, because the ranks may sit on different nodes: the group
    asks rank 0 where to meet (:meth:`rendezvous_address`: its node's address, as Ray knows it, and a
    port rank 0 listens on from then on), then every rank joins the process group there
    (:meth:`connect`)."""

    def __init__(self, cfg: RunConfig, model_dir: str, rank: int, world_size: int) -> None:
        if not torch.cuda.is_available():
            torch.set_num_threads(cfg.learner.cpu_threads)
        self.cfg, self.model_dir = cfg, model_dir
        self.rank, self.world_size = rank, world_size
        self.core: LearnerCore | None = None
        self.sender: BroadcastSender | None = None
        self.exports = ExportHandoff()
        self._returned: int | None = None  # the policy version the last ``weights`` call returned
        self._lending: int | None = None  # the version this step exported into the broadcast's segment
        self._listen_fd: int | None = None
        self.correction: CorrectionCall | None = None  # rank 0's call to the service, from use_service

    def rendezvous_address(self) -> tuple[str, int]:
        """Rank 0: ``(this node's address, a port on it)``, listened on from now on (a port only
        chosen here could be taken by another process before :meth:`connect` binds it). On a
        private single-machine cluster Ray's node address is 127.0.0.1, so the rendezvous stays on
        loopback there."""
        host = ray.util.get_node_ip_address()
        earlier, self._listen_fd = self._listen_fd, None  # a second call: the first socket is closed
        if earlier is not None:
            os.close(earlier)
        self._listen_fd, port = reserve_rendezvous(host, self.world_size)
        return host, port

    def connect(self, master_addr: str, master_port: int) -> None:
        """Join the process group hosted by rank 0 at ``master_addr:master_port`` and build the model
        (collective: every rank calls it together)."""
        cfg = self.cfg
        fd, self._listen_fd = self._listen_fd, None
        try:
            self.core = LearnerCore(cfg, self.model_dir, self.rank, self.world_size, master_port, master_addr, fd)
        finally:
            if fd is not None:  # the store listens on a duplicate of it
                os.close(fd)
        sync = cfg.weight_sync
        encoder = (DeltaEncoder(sync.rank, sync.full_every, cfg.seed, sync.full_above_error, sync.factors)
                   if sync.type == "delta" else None)
        self.sender = (BroadcastSender(sync.timeout_s, sync.chunk_mb << 20, encoder, sync.shared_memory)
                       if sync.type in ("collective", "delta") and self.rank == 0 else None)

    def policy_version(self) -> int:
        return self.core.policy_version

    def use_service(self, service: ray.actor.ActorHandle) -> None:
        """Rank 0: the run's correction service, called in every step. Handed over once: a process
        receiving an actor's handle imports that actor's module (Ray loads its class to build the
        handle's methods), which a simulated rank without torch paid on its first step (3.5 s on a
        2-core AMD EPYC VM), and a handle sent with every step is serialized with every step."""
        self.correction = CorrectionCall(service)

    def step(self, batch: LearnerBatch, holder: list, step: int) -> StepOutcome | None:
        """One policy-version step (``system.learner.group_step.run_step``), called on every rank at once.

        ``batch`` is the global ``LearnerBatch``, passed by reference: Ray makes it local before the call
        starts, so a step queued behind the running one has its batch fetched meanwhile. ``holder`` is
        ``[the same reference]``: a reference inside a list reaches the rank unresolved, so rank 0 can
        hand it to the correction service (:meth:`use_service`) without re-sending the batch. Returns
        rank 0's outcome without the payload (None on the other ranks); rank 0 hands the payload to its
        :meth:`weights` call for version ``step``.
        """
        self._lending = None  # first: a step failing before its export withdraws nothing of an earlier one
        try:
            return self._step(batch, holder, step)
        except BaseException as exc:  # its weights call then raises too, instead of waiting for ever
            if self.rank == 0:
                self.exports.fail(step, f"{type(exc).__name__}: {str(exc)[:300]}")
                if self._lending is not None:  # exported in place, but never handed on
                    self.sender.withdraw(self._lending)
            raise

    def _step(self, batch: LearnerBatch, holder: list, step: int) -> StepOutcome | None:
        if self.rank == 0 and self.correction is None:
            raise RuntimeError("learner rank 0 has no correction service: call use_service before the first step")

        def correct(proximal_BT):  # the call starts now; the update waits for it after its first forward
            return self.correction.start(step, batch, holder, proximal_BT, self.core.policy_version)

        # with a shared-memory generation rank 0 exports straight into the segment the workers copy from
        # (one full copy of the weights fewer per version); that version is lent until Ray has copied it
        # into the object store, which :meth:`weights` reports (``BroadcastSender.release``)
        def into(sizes: dict[str, int]):
            views = self.sender.arena(sizes, self.core.policy_version)
            self._lending = self.core.policy_version if views is not None else None
            return views

        into = into if self.sender is not None else None
        outcome = run_step(self.core, batch, self.rank, self.world_size, correct if self.rank == 0 else None, into)
        if self.rank != 0:
            return None
        sync = {"payload_bytes": outcome.payload.num_bytes}
        if self.sender is not None:  # the workers of the current generation receive it now
            sync.update(self.sender.send(outcome.payload))
        self.exports.put(step, outcome.payload)
        return replace(outcome, payload=None, weight_sync=sync)

    @ray.method(concurrency_group="export")
    def weights(self, step: int) -> WeightPayload:
        """Rank 0: policy version ``step``'s weights, returned once its step has exported them. A separate
        call on a thread of its own, so Ray's copy of them into the object store overlaps the next step
        instead of delaying its start; the caller (the driver) owns the result and hands the reference
        to the rollout workers unread. Raises if that step failed.

        One thread runs these calls, and Ray stores a call's return before the next call starts: so
        the payload the previous call returned has been copied out by now, and may be released (it
        may be made of views of the broadcast's shared segment, which its next version rewrites)."""
        if self.sender is not None and self._returned is not None:
            self.sender.release(self._returned)
        payload = self.exports.take(step)
        self._returned = payload.policy_version
        return payload

    def open_broadcast(self, number: int, world_size: int) -> GroupAddress:
        """Rank 0 with ``weight_sync.type=collective``: host broadcast generation ``number`` on this node
        (returns at once; the workers join in the background, see ``system.weight_broadcast``)."""
        return self.sender.open(f"generation-{number}", world_size, ray.util.get_node_ip_address(), number)

    def close_broadcast(self) -> None:
        """Rank 0: leave the current broadcast generation (every worker left), none replacing it."""
        self.sender.close()

    def export_weights(self):
        return self.core.export_weights()

    def save_checkpoint(self, path: str) -> None:
        self.core.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.core.load_checkpoint(path)

    def close(self) -> None:
        self.exports.close()
        if self.sender is not None:  # its segment's name too, if no version announced it yet
            self.sender.close()
        if self.core is not None:  # None: its connect never completed
            self.core.close()


class LearnerLostError(RuntimeError):
    """A learner rank died: FSDP2 cannot go on with fewer ranks, so the run stops (resume from a checkpoint)."""


class StepPartLostError(RuntimeError):
    """An actor the learner ranks call during a step (the correction service) died: the step cannot finish."""


_CLASS_NAME = re.compile(r"class_name:\s*(\w+)")
_ROLE = {"CorrectionService": "the correction service"}


def _part_lost(refs: list[ray.ObjectRef], ref: ray.ObjectRef, exc: BaseException) -> StepPartLostError:
    """A live rank's task failed because an actor it called died (``RayTaskError(ActorDiedError)``)."""
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None else exc
    named = _CLASS_NAME.search(str(cause))
    who = _ROLE.get(named.group(1), f"the {named.group(1)} actor") if named else "an actor the learners call"
    return StepPartLostError(f"{who} died during the step (learner rank {refs.index(ref)} was calling it), so "
                             f"the step cannot finish and the run stops ({remote_error(exc, limit=200)})")


def _lost(refs: list[ray.ObjectRef], ref: ray.ObjectRef, exc: BaseException) -> LearnerLostError:
    cause = process_death(str(exc)) or remote_error(exc) or type(exc).__name__
    return LearnerLostError(f"learner rank {refs.index(ref)} of {len(refs)} was lost ({type(exc).__name__}: {cause}); "
                            "the sharded learner cannot continue without it, so the run stops")


def gather(refs: list[ray.ObjectRef], settle_s: float = 2.0, stall_warning_s: float | None = None,
           what: str = "the learner ranks' call", hint=None) -> list:
    """``ray.get`` of every rank's result that fails as soon as ONE rank fails: the surviving ranks
    would otherwise wait in a collective for the dead one until the process-group timeout.

    A dead rank raises :class:`LearnerLostError` naming it (with Ray's reason, e.g. the error of
    a failed constructor); a live rank whose call to another actor (the correction service) hit
    that actor's death raises :class:`StepPartLostError` naming that actor. A rank's death can surface first as its peer's collective error
    (gloo fails at once), so on any error the other ranks get ``settle_s`` to show a death
    before the error is re-raised as it came. With ``stall_warning_s``, a console warning says when
    ``what`` has run that long (and again every that long): a hung rank or service is otherwise silent;
    ``hint``: a callable giving the warning's likely cause instead of the default one.
    """
    pending, started = list(refs), time.monotonic()
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=stall_warning_s)
        if not done:
            cause = hint() if hint is not None else "a hung rank, or the correction service rank 0 waits for"
            log.warning("%s has run for %.0f s; %d of %d learner rank(s) not done (%s)", what,
                        time.monotonic() - started, len(pending), len(refs), cause)
            continue
        try:
            ray.get(done)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc, ray.exceptions.RayActorError):  # the rank lives; an actor it called died
                raise _part_lost(refs, done[0], exc) from exc
            _settle(refs, pending, settle_s)
            raise
        except ray.exceptions.RayActorError as exc:
            raise _lost(refs, done[0], exc) from exc
        except ray.exceptions.RayError:
            _settle(refs, pending, settle_s)
            raise
    return ray.get(refs)


def _settle(refs: list[ray.ObjectRef], pending: list[ray.ObjectRef], settle_s: float) -> None:
    """After one rank's error: give the others ``settle_s`` to show a dead rank (raised as
    :class:`LearnerLostError`, the real cause); their other errors are read and dropped."""
    late, _ = ray.wait(pending, num_returns=len(pending), timeout=settle_s) if pending else ([], [])
    for ref in late:
        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError:
            pass
        except ray.exceptions.RayActorError as exc:
            raise _lost(refs, ref, exc) from exc
        except ray.exceptions.RayError:
            pass


class PendingStep:
    """A step running (or queued) on every rank: each rank's outcome reference, and rank 0's weights call's."""

    def __init__(self, outcomes: list[ray.ObjectRef], weights: ray.ObjectRef) -> None:
        self.outcomes, self._weights = outcomes, weights

    def on_done(self, callback) -> "threading.Event":
        """An event set (and ``callback()`` called, from Ray's thread) once rank 0's call has returned:
        a waiter can sleep on its own condition instead of polling the step."""
        finished = threading.Event()

        def mark(_future) -> None:
            finished.set()
            callback()

        self.outcomes[0].future().add_done_callback(mark)
        return finished

    @property
    def weights(self) -> ray.ObjectRef:
        """The reference the step's new weights will have (rank 0's ``weights`` call), known at submit:
        the rollout workers are offered it while the step runs."""
        return self._weights

    def result(self, stall_warning_s: float | None = None, what: str = "the step") -> StepOutcome:
        """Rank 0's outcome (the one blocking wait of a step), whose ``weights`` is the object-store
        reference of the new policy version's payload: the return value of a call the driver made,
        so the driver owns it (it outlives a rank that dies after the step) and never reads it.
        ``stall_warning_s``: warn when the step has run that long (:func:`gather`)."""
        outcome = gather(self.outcomes, stall_warning_s=stall_warning_s, what=what)[0]
        return replace(outcome, weights=self._weights)


class LearnerGroup:
    """R ranks, every method called on all of them (the cores' collectives need every rank)."""

    def __init__(self, cfg: RunConfig, model_dir: str, options: RoleOptions, actor_cls=LearnerRank,
                 meet: bool = True) -> None:
        """``actor_cls``: the Ray actor class of a rank (a simulated learner in orchestration benchmarks);
        ``meet`` False: the ranks are requested only, :meth:`meet` waits for them (the trainer launches
        the rollout workers in between, so they start while the ranks do, and after them in Ray's queue)."""
        world = cfg.learner.num_ranks
        self.options, self.stall_warning_s = options, cfg.report.stall_warning_s
        opts = {**options.actor_options(), "runtime_env": actor_env()}
        self.ranks = [actor_cls.options(**opts).remote(cfg, model_dir, r, world) for r in range(world)]
        self.met = False
        if meet:
            self.meet()

    def meet(self) -> None:
        """Wait for every rank to start and join the process group; every ``report.stall_warning_s`` the
        console says what the ranks reserve against what the cluster has (found by a review: a joined
        cluster too small for ``learner.num_ranks`` waited without a word, e.g. for its whole SLURM limit)."""
        # rank 0's node hosts the rendezvous: the ranks may be spread over several nodes
        what = f"the start of the {len(self.ranks)} learner rank(s)"
        master_addr, master_port = gather([self.ranks[0].rendezvous_address.remote()], stall_warning_s=self.stall_warning_s,
                                          what=what, hint=self._placement_hint)[0]
        gather([r.connect.remote(master_addr, master_port) for r in self.ranks], stall_warning_s=self.stall_warning_s,
               what=what, hint=self._placement_hint)
        self.met = True

    def _placement_hint(self) -> str:
        """What the ranks reserve, and what the cluster has in all (of which other actors hold some)."""
        return placement_hint(self.options, ray.cluster_resources(), "lower learner.num_ranks or add learner nodes")

    def use_service(self, service: ray.actor.ActorHandle) -> ray.ObjectRef:
        """Hand rank 0 the correction service it calls in every step (``LearnerRank.use_service``);
        the reference answers once it holds it (the trainer waits for it beside the workers' start)."""
        return self.ranks[0].use_service.remote(service)

    def submit(self, batch_ref: ray.ObjectRef, step: int) -> "PendingStep":
        """Start the whole step on every rank without waiting (Ray runs a caller's calls to an actor
        in order, so a step submitted while the previous one runs starts the moment it ends)."""
        outcomes = [r.step.remote(batch_ref, [batch_ref], step) for r in self.ranks]
        return PendingStep(outcomes, self.ranks[0].weights.remote(step))

    def export_weights(self) -> ray.ObjectRef:
        """A reference to the full weights (rank 0's payload); the driver never copies them."""
        refs = [r.export_weights.remote() for r in self.ranks]
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, fetch_local=False)
            if done[0] == refs[0]:
                continue  # rank 0's payload stays in the object store; its consumers see a failure
            try:
                ray.get(done)  # None on ranks > 0; raises if that rank died
            except ray.exceptions.RayActorError as exc:
                raise _lost(refs, done[0], exc) from exc
        return refs[0]

    def save_checkpoint(self, path: str) -> None:
        gather([r.save_checkpoint.remote(path) for r in self.ranks])

    def load_checkpoint(self, path: str) -> int:
        gather([r.load_checkpoint.remote(path) for r in self.ranks])
        return ray.get(self.ranks[0].policy_version.remote())

    def shutdown(self) -> None:
        """Close every rank (30 s at most), then kill it; ranks that never met are killed at once (a
        ``close`` would queue behind a ``connect`` still loading the model, or stuck on a dead peer)."""
        try:
            if self.met:
                ray.get([r.close.remote() for r in self.ranks], timeout=30)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # a rank already died (the run is failing): killing them all below is enough
        finally:
            for r in self.ranks:
                ray.kill(r, no_restart=True)
