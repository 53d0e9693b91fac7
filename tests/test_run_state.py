"""Resuming a run: a resume trims the records past its checkpoint, and a damaged checkpoint is
refused by name with a fall-back to the previous one (the directory's lifecycle: ``test_run_dir``).
(No Ray, no process group: the checkpoints here are built by hand with the real file layout.)
"""

import json
import pickle
import random
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from system import controller_state, run_state
from system.learner.checkpoint_files import checkpoint_problems


def valid_controller_state(step: int) -> dict:
    """A controller half that passes ``check_controller_state`` (empty buffer, no prompt generated)."""
    return {"step": step, "sampler": {"state": {"p0": "trained"}}, "buffer": [], "correction": {"ais": {}},
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
            "wandb_run_id": None}


def make_checkpoint(run_dir, step: int, shard: bytes = b"x" * 100):
    """Both halves of a checkpoint: a learner dir listing its shard's size, and controller.pkl."""
    ckpt = run_state.checkpoint_dir(run_dir, step)
    learner = ckpt / "learner"
    learner.mkdir(parents=True)
    (learner / "__0_0.distcp").write_bytes(shard)
    (learner / ".metadata").write_bytes(b"meta")
    files = {"__0_0.distcp": len(shard), ".metadata": 4}
    crc32 = {"__0_0.distcp": zlib.crc32(shard), ".metadata": zlib.crc32(b"meta")}  # as save_checkpoint records
    (learner / "trainer.json").write_text(json.dumps({"counters": {"policy_version": step}, "scheduler": {},
                                                      "files": files, "crc32": crc32}))
    controller_state.save_controller_state(ckpt, valid_controller_state(step))
    return ckpt


def test_a_failed_whole_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    """Found by a probe: a full disk left ``rollout_workers.json.tmp`` beside the record."""
    target = tmp_path / "rollout_workers.json"
    target.write_text("old")

    def full(self, text, *args, **kwargs):
        Path.open(self, "w").write(text[:3])  # part of it, then the disk is full
        raise OSError(28, "No space left on device")  # as a failed write says it: no file named

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match=r"\[Errno 28\] No space left on device: '.*/rollout_workers.json'"):
        run_state.write_text_whole(target, "new contents")
    monkeypatch.undo()
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["rollout_workers.json"]


def test_truncated_controller_state_is_refused_by_name(tmp_path):
    ckpt = make_checkpoint(tmp_path, 4)
    data = (ckpt / "controller.pkl").read_bytes()
    (ckpt / "controller.pkl").write_bytes(data[: len(data) // 2])
    with pytest.raises(run_state.CheckpointError, match=r"controller.pkl is truncated or corrupt"):
        controller_state.load_controller_state(ckpt)
    (ckpt / "controller.pkl").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(run_state.CheckpointError, match="holds a list"):
        controller_state.load_controller_state(ckpt)


def test_resume_falls_back_past_damaged_checkpoints(tmp_path):
    make_checkpoint(tmp_path, 2)
    c4, c6 = make_checkpoint(tmp_path, 4), make_checkpoint(tmp_path, 6)
    ckpt, state, skipped = run_state.usable_run_checkpoint(tmp_path)
    assert ckpt == c6 and state["step"] == 6 and skipped == []

    (c6 / "controller.pkl").write_bytes(b"\x80\x04\x95")  # truncated pickle
    shard = c4 / "learner" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:40])  # truncated shard
    ckpt, state, skipped = run_state.usable_run_checkpoint(tmp_path)
    assert ckpt.name == "step_00000002" and state["step"] == 2
    assert len(skipped) == 2
    assert skipped[0].startswith("step_00000006: ") and "controller.pkl is truncated" in skipped[0]
    assert skipped[1].startswith("step_00000004: learner half: ") and "has 40 bytes, 100 were written" in skipped[1]

    (run_state.checkpoint_dir(tmp_path, 2) / "learner" / "__0_0.distcp").unlink()
    ckpt, state, skipped = run_state.usable_run_checkpoint(tmp_path)
    assert ckpt is None and state == {} and "is missing" in skipped[2]


def test_same_size_damage_is_found_by_the_crc_of_either_half(tmp_path):
    """Found by a probe: bytes zeroed or flipped in place (the size unchanged) passed every check and the
    resume trained from them. Both halves carry CRC-32s of what was written; damage falls back."""
    make_checkpoint(tmp_path, 2)
    c4, c6 = make_checkpoint(tmp_path, 4), make_checkpoint(tmp_path, 6)
    shard = c6 / "learner" / "__0_0.distcp"
    shard.write_bytes(b"x" * 50 + b"\0" * 10 + b"x" * 40)  # 100 bytes, as written, 10 of them zeroed
    data = bytearray((c4 / "controller.pkl").read_bytes())
    at = data.index(b"trained")  # inside the pickled state: a byte that still unpickles
    data[at] = ord("T")
    (c4 / "controller.pkl").write_bytes(bytes(data))
    ckpt, state, skipped = run_state.usable_run_checkpoint(tmp_path)
    assert ckpt.name == "step_00000002" and state["step"] == 2
    assert skipped[0].startswith("step_00000006: learner half: ") and "bytes differ from those written" in skipped[0]
    assert f"{zlib.crc32(b'x' * 100):08x} was written" in skipped[0]
    assert skipped[1] == f"step_00000004: {c4 / 'controller.pkl'}: its bytes differ from those written " \
                         "(CRC-32 mismatch: damaged or replaced)"


def test_a_controller_half_written_before_the_crc_still_loads(tmp_path):
    ckpt = make_checkpoint(tmp_path, 3)
    state = valid_controller_state(3)
    (ckpt / "controller.pkl").write_bytes(pickle.dumps(state))  # the older format: the state dict itself
    assert controller_state.load_controller_state(ckpt)["step"] == 3


def test_checkpoint_to_resume_refuses_none_and_nothing_to_train(tmp_path):
    with pytest.raises(run_state.CheckpointError, match="no usable checkpoint under"):
        run_state.checkpoint_to_resume(tmp_path, max_steps=10)
    make_checkpoint(tmp_path, 2)
    c6 = make_checkpoint(tmp_path, 6)
    ckpt, state, skipped = run_state.checkpoint_to_resume(tmp_path, max_steps=7)
    assert ckpt == c6 and state["step"] == 6 and skipped == []
    with pytest.raises(ValueError, match="at step 6 and max_steps is 6: nothing to train.*max_steps=56"):
        run_state.checkpoint_to_resume(tmp_path, max_steps=6)
    # a damaged newer one the refusal fell back past is named in it (a probe: it was left out)
    (make_checkpoint(tmp_path, 8) / "controller.pkl").write_bytes(b"cut")
    with pytest.raises(ValueError, match=r"at step 6 and max_steps is 6: nothing to train.* \(skipped: step_00000008"):
        run_state.checkpoint_to_resume(tmp_path, max_steps=6)


def test_learner_half_problems(tmp_path):
    ckpt = make_checkpoint(tmp_path, 1)
    learner = str(ckpt / "learner")
    assert checkpoint_problems(learner) == []
    (ckpt / "learner" / "trainer.json").write_text("{not json")
    assert "trainer.json is unreadable" in checkpoint_problems(learner)[0]
    (ckpt / "learner" / "trainer.json").write_text("{}")
    assert "lacks counters or scheduler" in checkpoint_problems(learner)[0]


def test_a_refused_resume_touches_nothing(tmp_path, monkeypatch):
    """``--resume`` of a directory without a usable checkpoint exits 2 before anything starts,
    and leaves config.json as it was (the new overrides are not written)."""
    from typer.testing import CliRunner

    from actors.cli import app
    from system.config import RunConfig, dump_config

    monkeypatch.setenv("AISRL_VERBOSE", "1")  # train would otherwise quiet this (pytest's) process's environment
    run = tmp_path / "run"
    run.mkdir()
    saved = dump_config(RunConfig.model_validate({"output_dir": str(run), "max_steps": 3}))
    (run / "config.json").write_text(saved)
    make_checkpoint(run, 2)
    (run_state.checkpoint_dir(run, 2) / "controller.pkl").write_bytes(b"\x80\x04")  # truncated
    result = CliRunner().invoke(app, ["train", "--resume", str(run), "max_steps=9"])
    assert result.exit_code == 2, result.output
    assert "no usable checkpoint" in " ".join(result.output.split())
    assert "controller.pkl is truncated" in " ".join(result.output.split())
    assert (run / "config.json").read_text() == saved


def test_a_resume_with_nothing_left_to_train_is_refused_before_anything_starts(tmp_path, monkeypatch):
    """Found by a review: ``--resume`` of a run whose checkpoint is at step 2 with ``max_steps`` <= 2
    started the cluster, learners and workers, trained nothing and said "done" (exit 0). Now exit 2 up
    front, naming both steps; the directory is left as it was (nothing here starts Ray: it would fail
    later on the hand-made checkpoint)."""
    from typer.testing import CliRunner

    from actors.cli import app
    from system.config import RunConfig, dump_config

    monkeypatch.setenv("AISRL_VERBOSE", "1")
    run = tmp_path / "run"
    run.mkdir()
    saved = dump_config(RunConfig.model_validate({"output_dir": str(run), "max_steps": 2}))
    (run / "config.json").write_text(saved)
    make_checkpoint(run, 2)
    def files():  # the lock file of a run directory stays (it is only ever locked, never removed)
        return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.name != ".aisrl.lock")

    before = files()
    for steps in ("", "max_steps=1"):
        result = CliRunner().invoke(app, ["train", "--resume", str(run), *([steps] if steps else [])])
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert f"checkpoint is at step 2 and max_steps is {steps[-1:] or 2}: nothing to train" in text, text
    assert files() == before
    assert (run / "config.json").read_text() == saved


def test_a_resume_sets_aside_what_the_abandoned_attempt_wrote_past_its_checkpoint(tmp_path):
    """Found by a review: a resume from step 2 (step 4's shard damaged) left step 4 in place; the
    resumed run, republishing step 4's learner half beside the abandoned attempt's controller.pkl
    and then killed, left a 'complete' step 4 pairing new weights with the old ledger and buffer.
    Now the later checkpoints are moved aside (kept, never resumed from) and the later dumps go."""
    from system.report.dump import BEHAVIOUR_KEY, MASK_KEY, PROXIMAL_KEY, save_dump

    make_checkpoint(tmp_path, 2)
    c4 = make_checkpoint(tmp_path, 4)
    (c4 / "learner" / "__0_0.distcp").write_bytes(b"x" * 40)  # damaged: the resume takes step 2
    ckpt, state, _ = run_state.usable_run_checkpoint(tmp_path)
    assert state["step"] == 2
    for step in (2, 3, 4):
        save_dump(tmp_path / "dumps" / f"step_{step:06d}.npz", **{BEHAVIOUR_KEY: np.zeros((1, 1), np.float32),
                  PROXIMAL_KEY: np.zeros((1, 1), np.float32), MASK_KEY: np.ones((1, 1), bool)})
    (tmp_path / "dumps" / ".step_000005.npz.partial.npz").write_bytes(b"PK")  # the attempt killed mid-dump
    moved, dumps = run_state.set_aside_after(tmp_path, 2, now=1234)
    assert moved == ["step_00000004"] and dumps == 2
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["step_000002.npz"]
    assert (tmp_path / "checkpoints" / "abandoned" / "1234" / "step_00000004" / "controller.pkl").is_file()
    # the set-aside checkpoint is never a candidate again; the resumed one still is
    assert [p.name for p in run_state.complete_run_checkpoints(tmp_path)] == ["step_00000002"]
    assert run_state.set_aside_after(tmp_path, 2) == ([], 0)  # nothing more past step 2


def test_a_resume_keeps_the_fp8_kernels_the_run_chose(tmp_path, caplog):
    """``rollout_workers.json`` -> the pins a resumed run gives its workers (``system.rollout.fp8_kernels``)."""
    assert run_state.fp8_kernel_pins(tmp_path) == {}  # a run that never got a worker up
    record = {"requested": "fp8", "running": {"rollout-0": "fp8_per_channel"},
              "fp8_kernel": {"rollout-0": {"kernel": "upcast", "cpu": "A"}}}
    run_state.write_rollout_workers(tmp_path, record)
    assert run_state.fp8_kernel_pins(tmp_path) == {}  # written before pins existed: chosen anew
    run_state.write_rollout_workers(tmp_path, {**record, "fp8_kernel_pins": {"A": "rowwise", "B": "upcast"}})
    assert run_state.fp8_kernel_pins(tmp_path) == {"A": "rowwise", "B": "upcast"}  # the pins the run held
    assert not (tmp_path / "rollout_workers.json.tmp").exists()  # written, then renamed into place
    run_state.write_rollout_workers(tmp_path, {**record, "fp8_kernel_pins": {"A": "cutlass", "B": "upcast"}})
    with caplog.at_level("WARNING"):
        assert run_state.fp8_kernel_pins(tmp_path) == {"B": "upcast"}  # an unknown kernel is not pinned
    assert "unknown FP8 kernels {'A': 'cutlass'}" in caplog.text
    (tmp_path / "rollout_workers.json").write_text('{"fp8_kernel": ')  # torn (by hand: the writer renames)
    with caplog.at_level("WARNING"):
        assert run_state.fp8_kernel_pins(tmp_path) == {}
    assert "rollout_workers.json is unreadable" in caplog.text


def test_only_complete_published_step_directories_are_checkpoints(tmp_path):
    """Newest first; a ``.partial`` directory (killed before its rename), a half without the other and
    a directory of another name are never candidates."""
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 10)
    partial = make_checkpoint(tmp_path, 30)
    partial.rename(partial.with_name("step_00000030.partial"))
    (make_checkpoint(tmp_path, 20) / "learner" / "trainer.json").unlink()  # killed before trainer.json
    (make_checkpoint(tmp_path, 40) / "controller.pkl").unlink()  # the controller's half never written
    (tmp_path / "checkpoints" / "notes").mkdir()
    assert [p.name for p in run_state.complete_run_checkpoints(tmp_path)] == ["step_00000010", "step_00000002"]
    assert run_state.latest_run_checkpoint(tmp_path) == run_state.checkpoint_dir(tmp_path, 10)
    assert run_state.latest_run_checkpoint(tmp_path / "missing") is None
