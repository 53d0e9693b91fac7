"""A resume whose chosen checkpoint the learners cannot load falls back to the next older usable one.

Found by a probe: a learner half from another model (or values the load refuses) ended the resume
with a CheckpointException traceback cut to its header, although an older checkpoint was whole, and
halves from different steps were refused where the README promised a fall-back. ``Trainer._restore``
runs here on stand-ins for the learner group, sampler and buffer (no Ray); the checkpoints are the
real file layout of ``test_run_state``.
"""

import logging
from pathlib import Path

import pytest
import ray
from test_run_state import make_checkpoint  # the real file layout, built by hand

from actors.trainer import Trainer
from system import run_state
from system.config import RunConfig
from system.correction.nothing_kept import NothingKeptGuard
from system.learner.checkpoint import CheckpointContentError


class Learners:
    """Loads a checkpoint's learner half: raises like a rank for the ``refused`` ones, else returns
    the version in ``versions`` (default: the checkpoint's step)."""

    def __init__(self, refused=(), versions=None, io_error=()):
        self.refused, self.versions, self.io_error, self.loaded = set(refused), versions or {}, set(io_error), []

    def load_checkpoint(self, path: str) -> int:
        name = Path(path).parent.name
        self.loaded.append(name)
        if name in self.refused:
            cause = CheckpointContentError(
                f"{path}: DCP could not load it (rank 0: ValueError: Size mismatch between saved "
                "torch.Size([15, 128]) and current: torch.Size([15, 64]) for model.lm_head.weight)")
            raise ray.exceptions.RayTaskError("LearnerRank.load_checkpoint", "Traceback ...", cause)
        if name in self.io_error:
            cause = RuntimeError(f"{path}: DCP could not load it (rank 1: OSError: [Errno 5] Input/output error)")
            raise ray.exceptions.RayTaskError("LearnerRank.load_checkpoint", "Traceback ...", cause)
        return self.versions.get(name, int(name.split("_")[1]))


class Sampler:
    state: dict = {}

    def load_state_dict(self, state):
        self.loaded = state

    def requeue(self, ids):
        pass


class Buffer:
    restored: list = []

    def restore(self, groups):
        self.restored = groups

    def groups(self):
        return list(self.restored)


@pytest.fixture(autouse=True)
def keep_global_rng():
    """``_restore`` sets the process's random / numpy / torch generators from the checkpoint: put them back."""
    import random

    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def restoring(run_dir, learners) -> Trainer:
    trainer = Trainer.__new__(Trainer)
    trainer.run_dir, trainer.learners, trainer.sampler, trainer.buffer = Path(run_dir), learners, Sampler(), Buffer()
    trainer.cfg = RunConfig()
    trainer.nothing_kept = NothingKeptGuard(trainer.cfg.correction.max_nothing_kept_steps)
    trainer.ckpt, saved, _ = run_state.checkpoint_to_resume(run_dir, max_steps=100)
    trainer.step = saved["step"]
    return trainer, saved


def test_a_learner_half_that_fails_to_load_falls_back_to_an_older_checkpoint(tmp_path, caplog):
    for step in (2, 4, 6):
        make_checkpoint(tmp_path, step)
    learners = Learners(refused={"step_00000006"})
    trainer, saved = restoring(tmp_path, learners)
    with caplog.at_level(logging.WARNING):
        used = trainer._restore(saved)
    assert learners.loaded == ["step_00000006", "step_00000004"]
    assert used["step"] == 4 and trainer.step == 4 and trainer.ckpt.name == "step_00000004"
    assert trainer.sampler.loaded == used["sampler"]
    assert ("checkpoint step_00000006: the learner half failed to load (CheckpointContentError: " in caplog.text
            and "Size mismatch between saved torch.Size([15, 128])" in caplog.text
            and "resuming from step_00000004" in caplog.text)


def test_an_io_error_is_no_reason_to_fall_back(tmp_path):
    """Found by a review: falling back on ANY load error would set a good newest checkpoint aside (and
    drop its metrics) after one passing read error. Only content the learner refuses falls back."""
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4)
    learners = Learners(io_error={"step_00000004"})
    trainer, saved = restoring(tmp_path, learners)
    with pytest.raises(run_state.CheckpointError, match=r"step_00000004/learner: the learner half failed to load "
                                                        r"\(RuntimeError: .*Input/output error"):
        trainer._restore(saved)
    assert learners.loaded == ["step_00000004"]


def test_halves_from_different_steps_fall_back_too(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4)
    learners = Learners(versions={"step_00000004": 2})  # a learner half copied from step 2
    trainer, saved = restoring(tmp_path, learners)
    assert trainer._restore(saved)["step"] == 2 and trainer.ckpt.name == "step_00000002"


def test_no_loadable_checkpoint_is_refused_naming_each(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4)
    trainer, saved = restoring(tmp_path, Learners(refused={"step_00000004", "step_00000002"}))
    with pytest.raises(run_state.CheckpointError) as info:
        trainer._restore(saved)
    message = str(info.value)
    assert message.startswith("--resume: no usable checkpoint under ")
    assert "step_00000004: the learner half failed to load" in message
    assert "step_00000002: the learner half failed to load" in message
