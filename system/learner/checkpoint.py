"""Sharded checkpoints of the learner (model, AdamW state, schedule, counters) with DCP.

Layout of one checkpoint ``<root>/step_00000020/``: DCP's shard files and ``.metadata``
(model and optimiser state as sharded DTensors, reshardable to another world size on load)
plus ``trainer.json`` (optimiser step, policy version, scheduler state).

Atomicity: every rank writes into ``<path>.partial``; only after DCP has finished (its
coordinator writes ``.metadata`` after every rank's data) and rank 0 has written
``trainer.json`` does rank 0 ``os.rename`` the directory to ``<path>``. A rename within one
file system is atomic, so a process killed at any moment leaves either no ``<path>`` or a
complete one; ``system.run_state`` ignores ``*.partial`` directories and any directory
without both ``.metadata`` and ``trainer.json``. ``trainer.json`` also lists every shard file
with its size and CRC-32, so a file truncated, lost or damaged after publication (a full disk, a
bad copy, flipped or zeroed bytes) is found by :func:`system.learner.checkpoint_files.checkpoint_problems` before DCP tries to read
it. The CRCs cost one read of each rank's own files at save (the ranks in parallel) and one read of
the whole checkpoint by the driver at resume (zlib's CRC-32 runs at ~6.7 GB/s from the page cache on
the AMD EPYC here; the storage's read speed bounds it on a cluster). A load refuses content that
cannot be this learner's (:class:`CheckpointContentError`: another model's shapes, NaN or infinite
parameters or moments, all ranks agreeing before any raises); an I/O error is not such content. Checkpoints need a file system shared by all
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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from system.learner import distributed
from system.learner.checkpoint_files import TRAINER_FILE, file_crc32, is_complete


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
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=partial)
    except CheckpointException as exc:
        raise write_failure(partial, exc) from None
    # each rank reads back the shard files it wrote (``__<rank>_<i>.distcp``; rank 0 also the rest, the
    # ``.metadata``), in parallel: no rank reads the whole checkpoint while the others wait
    names = sorted(os.listdir(partial))
    mine = {name: file_crc32(os.path.join(partial, name)) for name in names
            if _writer_rank(name, dist.get_world_size()) == rank}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if rank == 0:
        files = {name: os.path.getsize(os.path.join(partial, name)) for name in names}
        crc32 = {name: crc for part in every for name, crc in part.items()}
        trainer = {"counters": dict(counters), "scheduler": scheduler.state_dict(), "files": files, "crc32": crc32}
        with open(os.path.join(partial, TRAINER_FILE), "w") as f:
            json.dump(trainer, f)
        _publish(partial, path)
    dist.barrier()


def write_failure(partial: str, exc: CheckpointException) -> Exception:
    """The error of a failed DCP save to raise instead of DCP's (whose text is every rank's traceback:
    the cause, a full disk, fell past the console's one line): the lowest failed rank's own
    exception, naming the checkpoint. An ``OSError`` stays one (its number and file kept)."""
    failures = exc.failures or {}
    if not failures:
        return RuntimeError(f"checkpoint {partial}: the save failed ({' '.join(str(exc).split())[:300]})")
    rank = min(failures)
    cause = failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
    where = f"checkpoint {partial}, rank {rank}{f' and {len(failures) - 1} more' if len(failures) > 1 else ''}"
    if isinstance(cause, OSError):
        return OSError(cause.errno, f"{cause.strerror or cause} ({where})", cause.filename or partial)
    # torch's writer reports a full disk as "unexpected pos 704 vs 598": say how full the disk is
    text = " ".join(str(cause).split())
    return RuntimeError(f"{where}: {type(cause).__name__}: {text}{_free_space(partial)}")


def _free_space(path: str) -> str:
    """``"; N MiB free on its file system"`` for the directory holding ``path`` (empty if unknown)."""
    try:
        free = shutil.disk_usage(os.path.dirname(path) or ".").free
    except OSError:
        return ""
    return f"; {free / 2**20:.1f} MiB free on its file system" + (" (full)" if free < 2**20 else "")


_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")


def _writer_rank(name: str, world_size: int) -> int:
    """The rank that wrote DCP file ``name`` (``__<rank>_<i>.distcp``); rank 0 for any other file."""
    match = _SHARD.match(name)
    return int(match.group(1)) if match and int(match.group(1)) < world_size else 0


class CheckpointContentError(ValueError):
    """The checkpoint's content cannot be this learner's state (another model's shapes or names,
    NaN / inf values): a resume may fall back to an older checkpoint. Not raised for I/O errors."""


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
        raise ValueError(f"{path} is not a complete checkpoint (missing .metadata or {TRAINER_FILE})")
    with keep_hyperparameters(optimizer, scheduler):
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        try:
            dcp.load(state, checkpoint_id=path)
        except dcp.api.CheckpointException as exc:  # a BaseException whose text is every rank's traceback
            failures = [(rank, cause) for rank, (cause, _) in exc.failures.items()]
            rank, cause = next(((r, c) for r, c in failures if isinstance(c, (OSError, MemoryError))), failures[0])
            text = f"{path}: DCP could not load it (rank {rank}: {type(cause).__name__}: " \
                   f"{' '.join(str(cause).split())[:300]})"
            if isinstance(cause, (OSError, MemoryError)):  # the storage or the machine, not the content
                raise RuntimeError(text) from None
            raise CheckpointContentError(text) from None
        bad = _first_non_finite(state)
        device = next(model.parameters()).device
        if distributed.any_rank(bad is not None, device):  # every rank raises, or none: no rank left waiting
            raise CheckpointContentError(f"{path}: non-finite values in "
                             f"{bad if bad is not None else 'the shards of another rank'} (a damaged checkpoint)")
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        with open(os.path.join(path, TRAINER_FILE)) as f:
            trainer = json.load(f)
        scheduler.load_state_dict(trainer["scheduler"])
        if trainer["counters"].get("optimizer_step") == 0:
            # saved before any update (a run stopped before step 1): torch's get_state_dict gives an optimiser
            # without state one zero-gradient step (lr 0) to make some, so the checkpoint holds AdamW step 1
            # and zero moments, and a resumed first update would take step 2's bias correction (0.74x of the
            # uninterrupted run's); an optimiser that never stepped has no state
            optimizer.state.clear()
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
    try:
        yield
    except BaseException:  # a failed load: the config's hyperparameters back (a resume may try an older one)
        if len(groups) == len(optimizer.param_groups):
            for group, fresh in zip(optimizer.param_groups, groups, strict=True):
                group.update(fresh)
        for fn, attrs in zip(scheduler.lr_lambdas, multipliers, strict=True):
            if attrs is not None:
                fn.__dict__.clear()
                fn.__dict__.update(attrs)
        raise
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


def _first_non_finite(state: dict, prefix: str = "") -> str | None:
    """The dotted key of the first floating tensor of ``state`` (nested dicts) holding a NaN or an
    infinity in this rank's shard, or None."""
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found = _first_non_finite(value, f"{name}.")
            if found is not None:
                return found
        elif isinstance(value, torch.Tensor) and value.is_floating_point():
            local = value.to_local() if hasattr(value, "to_local") else value
            if local.numel() and not bool(torch.isfinite(local).all()):
                return name
    return None


def _publish(partial: str, path: str) -> None:
    """Rename ``partial`` to ``path``; an existing ``path`` is moved aside first, then deleted."""
    stale = path + ".stale"
    if os.path.exists(path):
        shutil.rmtree(stale, ignore_errors=True)
        os.rename(path, stale)
    os.rename(partial, path)
    shutil.rmtree(stale, ignore_errors=True)
