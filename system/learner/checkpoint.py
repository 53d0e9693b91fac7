"""Sharded checkpoints of the learner (model, AdamW state, schedule, counters) with DCP.

Layout of one checkpoint ``<root>/step_00000020/``: DCP's shard files and ``.metadata``
(model and optimiser state as sharded DTensors, reshardable to another world size on load)
plus ``trainer.json`` (optimiser step, policy version, scheduler state).

Atomicity: every rank writes into ``<path>.partial``; only after DCP has finished (its
coordinator writes ``.metadata`` after every rank's data) and rank 0 has written
``trainer.json`` does rank 0 ``os.rename`` the directory to ``<path>``. A rename within one
file system is atomic, so a process killed at any moment leaves either no ``<path>`` or a
complete one; ``latest_checkpoint`` ignores ``*.partial`` directories and any directory
without both ``.metadata`` and ``trainer.json``. ``trainer.json`` also lists every shard file
with its size, so a file truncated or lost after publication (a full disk, a bad copy) is
found by :func:`checkpoint_problems` before DCP tries to read it. Checkpoints need a file system shared by all
ranks (as DCP itself does on several nodes).
"""

import json
import os
import re
import shutil
import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

_TRAINER_FILE = "trainer.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_path(root: str, step: int) -> str:
    """``<root>/step_<step:08d>``, the name ``latest_checkpoint`` looks for."""
    return os.path.join(root, f"step_{step:08d}")


def is_complete(path: str) -> bool:
    """A published checkpoint: DCP metadata and trainer state both present."""
    return os.path.isfile(os.path.join(path, ".metadata")) and os.path.isfile(os.path.join(path, _TRAINER_FILE))


def latest_checkpoint(root: str) -> str | None:
    """The complete ``step_*`` checkpoint under ``root`` with the highest step, or None."""
    if not os.path.isdir(root):
        return None
    found = []
    for name in os.listdir(root):
        match = _STEP_DIR.match(name)
        if match and is_complete(os.path.join(root, name)):
            found.append((int(match.group(1)), os.path.join(root, name)))
    return max(found)[1] if found else None


def save_checkpoint(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    counters: dict[str, int],
) -> None:
    """Write a checkpoint to ``path`` atomically (see the module docstring). Collective."""
    path = os.path.abspath(path)
    partial, rank = path + ".partial", dist.get_rank()
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(os.path.dirname(path), exist_ok=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=partial)
    if rank == 0:
        files = {name: os.path.getsize(os.path.join(partial, name)) for name in sorted(os.listdir(partial))}
        trainer = {"counters": dict(counters), "scheduler": scheduler.state_dict(), "files": files}
        with open(os.path.join(partial, _TRAINER_FILE), "w") as f:
            json.dump(trainer, f)
        _publish(partial, path)
    dist.barrier()


def load_checkpoint(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, int]:
    """Restore model, optimiser and scheduler in place; returns the saved counters. Collective.

    The optimiser's moments and step counts and the scheduler's position come from the checkpoint;
    its hyperparameters (lr, betas, eps, weight decay, the warm-up's length) stay those the
    optimiser and scheduler were built with, i.e. the resumed run's config
    (:func:`keep_hyperparameters`): ``aisrl train --resume DIR learner.lr=...`` takes effect."""
    if not is_complete(path):
        raise ValueError(f"{path} is not a complete checkpoint (missing .metadata or {_TRAINER_FILE})")
    with keep_hyperparameters(optimizer, scheduler):
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        with open(os.path.join(path, _TRAINER_FILE)) as f:
            trainer = json.load(f)
        scheduler.load_state_dict(trainer["scheduler"])
    return {k: int(v) for k, v in trainer["counters"].items()}


@contextmanager
def keep_hyperparameters(optimizer: torch.optim.Optimizer,
                         scheduler: torch.optim.lr_scheduler.LambdaLR) -> Iterator[None]:
    """Around loading saved optimiser and scheduler state: afterwards, every param group's
    hyperparameters and the schedule's multipliers are those from before (the config's), and each
    group's lr is ``initial_lr * multiplier(saved step)``. (Loading alone would restore the saved
    lr, warm-up and weight decay: PyTorch's ``load_state_dict`` takes param groups and
    ``LambdaLR``'s multiplier objects whole.)"""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    multipliers = [dict(fn.__dict__) if not isinstance(fn, types.FunctionType) else None
                   for fn in scheduler.lr_lambdas]
    yield
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint has {len(optimizer.param_groups)} param groups, the model {len(groups)}")
    for fn, attrs in zip(scheduler.lr_lambdas, multipliers, strict=True):
        if attrs is not None:
            fn.__dict__.clear()
            fn.__dict__.update(attrs)
    scheduler.base_lrs = [g["initial_lr"] for g in groups]
    for group, fresh, fn in zip(optimizer.param_groups, groups, scheduler.lr_lambdas, strict=True):
        group.update(fresh)
        group["lr"] = fresh["initial_lr"] * fn(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def checkpoint_problems(path: str) -> list[str]:
    """What makes the checkpoint at ``path`` unusable: missing parts, an unreadable ``trainer.json``,
    shard files missing or of another size than written (empty list = usable as far as files tell)."""
    if not is_complete(path):
        return [f"{path}: missing .metadata or {_TRAINER_FILE}"]
    try:
        with open(os.path.join(path, _TRAINER_FILE)) as f:
            trainer = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"{os.path.join(path, _TRAINER_FILE)} is unreadable ({type(exc).__name__}: {exc})"]
    if not isinstance(trainer, dict) or not {"counters", "scheduler"} <= trainer.keys():
        return [f"{os.path.join(path, _TRAINER_FILE)} lacks counters or scheduler"]
    files = trainer.get("files", {})  # absent in checkpoints written before the list existed
    problems = []
    for name, size in files.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            problems.append(f"{file} is missing")
        elif os.path.getsize(file) != size:
            problems.append(f"{file} has {os.path.getsize(file)} bytes, {size} were written (truncated or replaced)")
    return problems


def _publish(partial: str, path: str) -> None:
    """Rename ``partial`` to ``path``; an existing ``path`` is moved aside first, then deleted."""
    stale = path + ".stale"
    if os.path.exists(path):
        shutil.rmtree(stale, ignore_errors=True)
        os.rename(path, stale)
    os.rename(partial, path)
    shutil.rmtree(stale, ignore_errors=True)
