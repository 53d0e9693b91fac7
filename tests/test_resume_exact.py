"""Resume is exact: a run stopped at step k and resumed reproduces the uninterrupted run's steps.

The real stack on a private loopback Ray cluster (vLLM FP8 rollout worker, 2-rank FSDP2
learner on gloo, the correction service with AIS on), synchronous (``async.max_lag=0``, one
worker), so the schedule of generate calls is fixed; every prompt samples with a seed derived
from the run seed, its id and the policy version, so the samples do not depend on the worker
process that draws them.

* Run A trains 6 steps uninterrupted (checkpoints at 2, 4, 6). Run B trains 3 steps, stops
  (final checkpoint at 3, damaged so that its ranks refuse it) and ``--resume``s to 6 from step 2:
  B's steps 3-6 equal A's, bit for bit, in every compared metric (loss, its parts, learning
  rate, grad norm, rewards, mismatch, AIS). (One resumed run for both claims, the exact resume
  and the fall-back past a refused checkpoint: each real run costs a vLLM engine and two ranks,
  ~55 CPU seconds of a 2-core AMD EPYC VM's suite before its first step.)
* Each part of the checkpoint is shown to matter: A's step-4 checkpoint with one part taken
  from the step-2 checkpoint (model, optimiser state, schedule, sampler, AIS state) resumes
  into different steps 5-6, and a checkpoint whose policy version, buffer or any other part is
  stale or missing is refused with an error naming it. (The driver's RNG states are saved
  but nothing draws from them; the sampling randomness is stateless, see above.)
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from fault_scenarios import (  # benchmarks/bench_fault_tolerance.py measures the same
    COMPARED,
    RESUME,
)
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

from actors.trainer import Trainer
from system import controller_state, run_state
from system.config.loading import resolve_config
from system.learner.checkpoint_files import file_crc32
from system.types import Prompt, RolloutGroup

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


def train(run_dir: Path, max_steps: int, resume: bool = False) -> list[dict]:
    """Every run starts with ``RESUME``'s forced FP8 kernel (the same in every run compared); a resume asks
    for ``auto`` and must keep the kernel its run used (read back from ``rollout_workers.json``)."""
    overrides = [o for o in RESUME if not (resume and o.startswith("rollout.fp8_kernel="))]
    cfg = resolve_config(overrides=[f"output_dir={run_dir}", f"max_steps={max_steps}", *overrides])
    trainer = Trainer(cfg, resume=resume)
    try:
        trainer.run()
    finally:
        trainer.shutdown()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def compared(record: dict) -> dict:
    return {k: record[k] for k in COMPARED}


@pytest.fixture(scope="module")
def uninterrupted(loopback_ray, tmp_path_factory) -> tuple[Path, list[dict]]:
    run = tmp_path_factory.mktemp("uninterrupted")
    return run, train(run, 6)


def damage_weights(learner: Path) -> None:
    """64 bytes of 0xFF (NaNs) in the middle of the largest model weight of the DCP checkpoint ``learner``,
    its CRCs rewritten to match: nothing a file check can see, only the load's finiteness check."""
    import pickle

    from system.learner.checkpoint_files import checkpoint_problems

    with open(learner / ".metadata", "rb") as f:
        meta = pickle.load(f)
    length, name, offset = max((info.length, info.relative_path, info.offset)
                               for index, info in meta.storage_data.items() if index.fqn.startswith("model."))
    with open(learner / name, "r+b") as f:
        f.seek(offset + length // 2)
        f.write(b"\xff" * 64)
    trainer_json = json.loads((learner / "trainer.json").read_text())
    trainer_json["crc32"][name] = file_crc32(str(learner / name))
    (learner / "trainer.json").write_text(json.dumps(trainer_json))
    assert checkpoint_problems(str(learner)) == []


def test_a_stopped_run_resumed_past_a_checkpoint_its_ranks_refuse_equals_the_uninterrupted_one(uninterrupted,
                                                                                             tmp_path, caplog):
    """Run B stops at step 3 (its final checkpoint; the one before is step 2's) and is resumed to step 6.
    B's step-3 checkpoint holds NaNs in a weight, its CRCs rewritten (:func:`damage_weights`): the rank
    holding that shard refuses it, the resume falls back to step 2 (the path through ``Trainer._start``
    with the fallen-back controller state), sets step 3 aside, drops step 3's record, and trains steps
    3-6 exactly as the uninterrupted run A did. (A resume from an undamaged checkpoint, and its line: the
    stale-part tests below.)"""
    _, full = uninterrupted
    assert all(k in full[0] for k in COMPARED), [k for k in COMPARED if k not in full[0]]
    # synchronous mode (async.max_lag 0): every step trains only samples of its own version
    assert [r["staleness/lag_max"] for r in full] == [0] * 6
    assert all(r["staleness/sequences_lag_0"] == r["learner/num_sequences"] for r in full)
    # AIS v2: alpha_0 = 0 and beta = 0.5, so the first alpha is half the first alpha_raw
    assert full[0]["ais/alpha"] == 0.5 * full[0]["ais/alpha_raw"]
    run = tmp_path / "stopped"
    first = train(run, 3)
    assert [compared(r) for r in first] == [compared(r) for r in full[:3]]  # the run itself is deterministic
    forced = json.loads((run / "rollout_workers.json").read_text())["fp8_kernel"]["rollout-0"]
    newest = run_state.checkpoint_dir(run, 3)  # written at the end of the run (checkpoint_every is 2)
    assert run_state.checkpoint_dir(run, 2).is_dir() and newest.is_dir()
    damage_weights(Path(run_state.learner_dir(newest)))
    with caplog.at_level("WARNING", logger="actors.trainer"):
        resumed = train(run, 6, resume=True)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("resuming at step 2: dropped 1 metrics lines") for m in said), said
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert [compared(r) for r in resumed] == [compared(r) for r in full]
    assert [p.name for p in (run / "checkpoints" / run_state.ABANDONED_DIR).glob("*/step_*")] == ["step_00000003"]
    kept = json.loads((run / "rollout_workers.json").read_text())["fp8_kernel"]["rollout-0"]
    # the resume asked for auto and kept the kernel of the run's first attempt, whatever its own probe says
    assert (forced["pinned"], kept["pinned"], kept["kernel"]) == (False, True, forced["kernel"])


# ---- each part of the checkpoint matters -------------------------------------------------------


def swap_learner_part(ckpt: Path, donor: Path, part: str, scratch: Path) -> None:
    """Replace ``part`` ("model" or "optim") of ``ckpt``'s DCP learner state with ``donor``'s."""
    states = {}
    for name, src in (("ckpt", ckpt), ("donor", donor)):
        dcp_to_torch_save(run_state.learner_dir(src), scratch / f"{name}.pt")
        states[name] = torch.load(scratch / f"{name}.pt", weights_only=False)
    merged = {**states["ckpt"], part: states["donor"][part]}
    torch.save(merged, scratch / "merged.pt")
    learner = Path(run_state.learner_dir(ckpt))
    trainer = json.loads((learner / "trainer.json").read_text())
    shutil.rmtree(learner)
    torch_save_to_dcp(scratch / "merged.pt", learner)
    # a consistent stale checkpoint: its file list names the new files with their sizes and CRCs (else
    # it is refused as replaced)
    trainer["files"] = {p.name: p.stat().st_size for p in sorted(learner.iterdir())}
    trainer["crc32"] = {p.name: file_crc32(str(p)) for p in sorted(learner.iterdir())}
    (learner / "trainer.json").write_text(json.dumps(trainer))


def swap_trainer_json(ckpt: Path, donor: Path, key: str) -> None:
    path = Path(run_state.learner_dir(ckpt)) / "trainer.json"
    mine, theirs = json.loads(path.read_text()), json.loads((Path(run_state.learner_dir(donor)) / "trainer.json").read_text())
    mine[key] = theirs[key]
    path.write_text(json.dumps(mine))


def edit_controller(ckpt: Path, edit) -> None:
    """Change the controller half and write it back as a run would (a consistent, if stale, checkpoint)."""
    state = controller_state.load_controller_state(ckpt)
    edit(state)
    controller_state.save_controller_state(ckpt, state)


def resume_copy(source: Path, dest: Path, keep_step: int, donor_step: int = 2) -> tuple[Path, Path]:
    """A copy of run ``source`` cut back to its checkpoint ``keep_step`` (later checkpoints and
    metrics removed), and its checkpoint ``donor_step`` moved out of the way: (ckpt, donor)."""
    shutil.copytree(source, dest)
    donor = dest / "donor"
    run_state.checkpoint_dir(dest, donor_step).rename(donor)
    for ckpt in (dest / "checkpoints").iterdir():
        if ckpt.name != f"step_{keep_step:08d}":
            shutil.rmtree(ckpt)
    lines = (dest / "metrics.jsonl").read_text().splitlines()[:keep_step]
    (dest / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_state.checkpoint_dir(dest, keep_step), donor


VARIANTS = {
    "optimizer": lambda ck, donor, scratch: swap_learner_part(ck, donor, "optim", scratch),
    "sampler": lambda ck, donor, scratch: edit_controller(
        ck, lambda s: s.update(sampler={**controller_state.load_controller_state(donor)["sampler"],
                                        "state": s["sampler"]["state"]})),
    "ais": lambda ck, donor, scratch: edit_controller(
        ck, lambda s: s.update(correction=controller_state.load_controller_state(donor)["correction"])),
}
"""One part of each kind, each through the whole stack: the learner's DCP half (the optimiser: the
part whose staleness shows latest), the correction service's state, the controller's sampler. The
model weights and the LR schedule go through the same DCP save / load as the optimiser; that a
resumed learner takes the identical next step (model, optimiser, LR) is ``test_learner_fsdp``'s
checkpoint round trip, and that they matter at all is the first test here (a resume that ignored
them would not reproduce the uninterrupted run)."""


@pytest.mark.parametrize("part", sorted(VARIANTS))
def test_a_stale_part_changes_the_resumed_run(part, uninterrupted, tmp_path, caplog):
    """Steps 5-6 resumed from A's step-4 checkpoint with ``part`` from step 2 differ from A's.

    (Two steps: a step's metrics are measured before its update, so a stale optimiser state
    shows in the step after. ``sampler``: the cursor from step 2 with step 4's ledger would
    re-serve prompts already trained: the checkpoint is refused when read, before any actor
    starts, naming the disagreement.)
    """
    source, full = uninterrupted
    if part == "ais":  # the AIS state (the alpha EMA) after step 2 must differ from the one after step 4
        assert full[1]["ais/alpha"] != full[3]["ais/alpha"], "alpha equal at steps 2 and 4: nothing to swap"
    run = tmp_path / "run"
    ckpt, donor = resume_copy(source, run, keep_step=4)
    VARIANTS[part](ckpt, donor, tmp_path)
    shutil.rmtree(donor)
    if part == "sampler":  # the cursor is behind the ledger: refused before a prompt is trained twice
        before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
        with pytest.raises(run_state.CheckpointError, match="no usable checkpoint.*would be issued a second time"):
            Trainer(resolve_config(overrides=[f"output_dir={run}", "max_steps=6", *RESUME]), resume=True)
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing touched
        return
    with caplog.at_level("WARNING", logger="actors.trainer"):
        resumed = train(run, 6, resume=True)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("resuming at step 4") for m in said), said  # said however little was set aside
    assert [compared(r) for r in resumed[4:]] != [compared(r) for r in full[4:]]


def test_missing_or_inconsistent_parts_are_refused(uninterrupted, tmp_path, monkeypatch):
    source, _ = uninterrupted
    ckpt, donor = resume_copy(source, tmp_path / "run", keep_step=4)
    controller = controller_state.load_controller_state(ckpt)
    for key in controller_state.CONTROLLER_KEYS:
        state = {k: v for k, v in controller.items() if k != key}
        with pytest.raises(ValueError, match=f"lacks {key}"):
            controller_state.check_controller_state(state, ckpt)
    with pytest.raises(ValueError, match="lacks rng.numpy"):
        controller_state.check_controller_state({**controller, "rng": {"python": 0, "torch": 0}}, ckpt)
    with pytest.raises(ValueError, match="lacks correction.ais"):
        controller_state.check_controller_state({**controller, "correction": {}}, ckpt)
    # a buffer from another moment than the ledger: a group the ledger does not know, or one missing
    stray = RolloutGroup(prompt=Prompt("e7-7", "1+1=", "2"), completions=(), policy_version=4)
    with pytest.raises(ValueError, match="buffer holds"):
        controller_state.check_controller_state({**controller, "buffer": [*controller["buffer"], stray]}, ckpt)
    ledger = {**controller["sampler"], "state": {**controller["sampler"]["state"], "e7-7": "generated"}}
    with pytest.raises(ValueError, match="buffer holds"):  # the ledger says generated, the buffer lost it
        controller_state.check_controller_state({**controller, "sampler": ledger}, ckpt)
    # the policy version: the learner half at step 4, the controller claiming step 2
    edit_controller(ckpt, lambda s: s.update(step=2))
    import actors.trainer as trainer_module

    services = []  # the refusal comes before the correction service (which opens the W&B run) is made
    real_service = trainer_module.CorrectionService
    monkeypatch.setattr(trainer_module, "CorrectionService", type("Spy", (), {
        "options": staticmethod(lambda **kw: services.append(kw) or real_service.options(**kw))}))
    with pytest.raises(ValueError, match="learner at version 4 but controller at step 2"):
        train(tmp_path / "run", 6, resume=True)
    assert services == []
