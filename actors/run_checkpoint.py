"""A run's checkpoint seen from the driver: load the learner half (falling back to an older
checkpoint when the learners refuse it), restore the controller half, and snapshot it for a save.

The files themselves (where each half lives, which checkpoint is usable, the CRC checks) are
``system.run_state`` and ``system.controller_state``; the learner half's contents are written and
read by the ranks (``system.learner.checkpoint``).
"""

import logging
import random
from pathlib import Path

import numpy as np
import ray
import torch

from actors.remote_errors import remote_error
from system import metrics_file, run_state
from system.learner.checkpoint import CheckpointContentError

log = logging.getLogger(__name__)


def load_learner_half(learners, run_dir: Path, ckpt: Path, saved: dict) -> tuple[Path, dict]:
    """Load ``ckpt``'s learner half into every rank of ``learners`` (an ``actors.learner_worker.LearnerGroup``);
    ``saved`` is its controller half. A learner half whose content the ranks refuse (a foreign model,
    values DCP or the finiteness check refuse) or whose version is not the controller's step is
    named, and the next older usable checkpoint is tried, as a damaged file is before anything
    starts. A storage, memory or rank failure is raised (``run_state.CheckpointError``) without a
    fall-back: a passing read error must not set a good newest checkpoint aside. Returns the
    checkpoint loaded and its controller half."""
    failed = []
    while True:
        problem = None
        try:
            version = learners.load_checkpoint(run_state.learner_dir(ckpt))
            if version != saved["step"]:
                problem = f"learner at version {version} but controller at step {saved['step']}"
        except ray.exceptions.RayTaskError as exc:
            problem = f"the learner half failed to load ({remote_error(exc, limit=300)})"
            if not isinstance(exc.cause, CheckpointContentError):  # storage, memory, a rank: no fall-back
                raise run_state.CheckpointError(f"{run_state.learner_dir(ckpt)}: {problem}") from None
        if problem is None:
            return ckpt, saved
        failed.append(f"{ckpt.name}: {problem}")
        older, older_saved, skipped = run_state.usable_run_checkpoint(run_dir, below=ckpt)
        failed += skipped
        if older is None:
            raise run_state.CheckpointError(f"--resume: no usable checkpoint under {run_dir / 'checkpoints'} "
                                            f"({'; '.join(failed)})")
        for reason in failed[-1 - len(skipped):]:
            log.warning("checkpoint %s; falling back to an older one", reason)
        log.warning("resuming from %s", older.name)
        ckpt, saved = older, older_saved


def restore_controller(saved: dict, sampler, buffer, group_size: int) -> None:
    """The controller half into the driver: the sampler (prompts issued but never returned are served
    again), the buffered groups (those of another ``group_size`` than this run's dropped:
    :func:`drop_other_group_sizes`), and the process's random / numpy / torch generators."""
    sampler.load_state_dict(saved["sampler"])
    sampler.requeue([pid for pid, s in sampler.state.items() if s == "issued"])
    buffer.restore(saved["buffer"])
    dropped = drop_other_group_sizes(sampler, buffer, group_size)
    if dropped:
        log.warning("dropped %d buffered groups of another rollout.group_size than %d (the resume changed it)",
                    dropped, group_size)
    random.setstate(saved["rng"]["python"])
    np.random.set_state(saved["rng"]["numpy"])
    torch.set_rng_state(saved["rng"]["torch"])


def drop_other_group_sizes(sampler, buffer, group_size: int) -> int:
    """Drop (reason ``group_size_changed``) the buffered groups of a size other than ``group_size``: a
    resume that changed ``rollout.group_size`` would otherwise train batches mixing both sizes, whose
    sequence count the ranks may not divide (a review found the odd total refused on the cluster with a
    misleading message). How many were dropped."""
    groups = buffer.groups()
    other = [g for g in groups if len(g.completions) != group_size]
    if other:
        for g in other:
            sampler.mark_dropped(g.prompt.prompt_id, "group_size_changed")
        buffer.restore([g for g in groups if len(g.completions) == group_size])
    return len(other)


def controller_snapshot(step: int, sampler, buffer, correction: dict, wandb_run_id: str | None,
                        guards: dict | None = None) -> dict:
    """The controller half of step ``step``'s checkpoint (``system.controller_state.CONTROLLER_KEYS``, and
    ``guards``: the driver's run guards' streaks, ``{"nothing_kept": ...}``; optional, a checkpoint of an
    earlier version has none); taken with the rollout loop held (the sampler and buffer must not move
    meanwhile)."""
    return {
        "step": step, "sampler": sampler.state_dict(), "buffer": buffer.groups(),
        "correction": correction, "wandb_run_id": wandb_run_id, "guards": dict(guards or {}),
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
    }


def set_aside_after_checkpoint(run_dir: Path, step: int, wandb_sent_through: int) -> None:
    """What a resume from step ``step`` does to the abandoned attempt's later output, said on the console
    (always, a probe): its metrics records past the step (and a line cut at the end) are dropped
    (``system.metrics_file.trim_metrics``), its later checkpoints moved aside and its later dumps
    deleted (``system.run_state.set_aside_after``)."""
    dropped = metrics_file.trim_metrics(run_dir, step, wandb_sent_through)
    moved, dumps = run_state.set_aside_after(run_dir, step)
    why = (f": dropped {dropped} metrics lines (records past that checkpoint, and a line cut at the end) and "
           f"{dumps} dumps written after it" if dropped or moved or dumps else "")
    if moved:
        why += f"; moved the later checkpoints {moved} to checkpoints/{run_state.ABANDONED_DIR}/"
    log.warning("resuming at step %d%s", step, why)
