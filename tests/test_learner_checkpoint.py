"""Finding checkpoints: only complete, published ``step_*`` directories count (no process group needed);
hyperparameters and a step-0 checkpoint on load (the last on a 1-rank gloo group).

The save/load round trip itself runs on 2 gloo ranks in ``test_learner_fsdp``.
"""

import shutil

import pytest

from system.learner.checkpoint import load_checkpoint
from system.learner.checkpoint_files import is_complete


def _fake_checkpoint(path, metadata=True, trainer=True):
    path.mkdir(parents=True)
    if metadata:
        (path / ".metadata").write_bytes(b"")
    if trainer:
        (path / "trainer.json").write_text("{}")


def test_a_checkpoint_is_complete_only_with_its_metadata_and_trainer_state(tmp_path):
    """(The run picks among complete ones: ``system.run_state.complete_run_checkpoints``.)"""
    _fake_checkpoint(tmp_path / "step_00000010")
    _fake_checkpoint(tmp_path / "step_00000020", trainer=False)  # killed before trainer.json
    _fake_checkpoint(tmp_path / "step_00000040", metadata=False)  # DCP never finished
    assert is_complete(str(tmp_path / "step_00000010"))
    assert not is_complete(str(tmp_path / "step_00000020"))
    assert not is_complete(str(tmp_path / "step_00000040"))
    assert not is_complete(str(tmp_path / "missing"))


def test_loading_an_incomplete_checkpoint_is_an_error(tmp_path):
    _fake_checkpoint(tmp_path / "step_00000001", metadata=False)
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        load_checkpoint(str(tmp_path / "step_00000001"), model=None, optimizer=None, scheduler=None)


def _trained(lr, warmup, weight_decay, steps):
    import torch

    from system.config.learner import LearnerConfig
    from system.learner.optim import build_scheduler

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = build_scheduler(optimizer, LearnerConfig(lr=lr, warmup_steps=warmup))
    for _ in range(steps):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return model, optimizer, scheduler


def test_a_resumed_run_takes_its_configs_lr_warmup_and_weight_decay(tmp_path):
    """Found by a review: loading the optimiser and scheduler state restored the saved lr, warm-up and
    weight decay, so ``--resume DIR learner.lr=...`` was silently ignored."""
    import copy

    import torch

    from system.learner.checkpoint import keep_hyperparameters

    _, saved_opt, saved_sched = _trained(lr=1e-3, warmup=10, weight_decay=0.1, steps=3)
    saved = copy.deepcopy((saved_opt.state_dict(), saved_sched.state_dict()))
    # the same config: exactly the saved state (warm-up step 3 of 10: lr = 1e-3 * 4 / 10)
    _, opt, sched = _trained(lr=1e-3, warmup=10, weight_decay=0.1, steps=0)
    with keep_hyperparameters(opt, sched):
        opt.load_state_dict(copy.deepcopy(saved[0]))
        sched.load_state_dict(copy.deepcopy(saved[1]))
    assert opt.param_groups[0]["lr"] == pytest.approx(4e-4) == saved_opt.param_groups[0]["lr"]
    assert sched.last_epoch == 3 and sched.get_last_lr() == [pytest.approx(4e-4)]
    # a new config: lr 5e-4, no warm-up, weight decay 0; the moments and step counts stay the saved ones
    _, opt, sched = _trained(lr=5e-4, warmup=0, weight_decay=0.0, steps=0)
    with keep_hyperparameters(opt, sched):
        opt.load_state_dict(copy.deepcopy(saved[0]))
        sched.load_state_dict(copy.deepcopy(saved[1]))
    group = opt.param_groups[0]
    assert (group["lr"], group["initial_lr"], group["weight_decay"]) == (5e-4, 5e-4, 0.0)
    assert sched.last_epoch == 3 and sched.lr_lambdas[0].warmup_steps == 0 and sched.base_lrs == [5e-4]
    first = next(iter(opt.state.values()))
    assert float(first["step"]) == 3.0
    assert torch.equal(first["exp_avg"], saved[0]["state"][0]["exp_avg"])  # the saved moments, bit for bit
    assert torch.equal(first["exp_avg_sq"], saved[0]["state"][0]["exp_avg_sq"])
    assert first["exp_avg"].abs().sum() > 0  # (and not the zeros of a fresh optimiser)
    sched.step()  # the schedule goes on from the saved position under the new config
    assert group["lr"] == 5e-4 and sched.last_epoch == 4


def test_a_load_that_fails_leaves_the_configs_hyperparameters():
    """Found by a review: a load failing after the optimiser state was taken left the failed checkpoint's
    lr and weight decay in place, and a resume that then falls back to an older checkpoint would have
    kept them as "the config's"."""
    import copy

    from system.learner.checkpoint import keep_hyperparameters

    _, saved_opt, saved_sched = _trained(lr=1e-3, warmup=10, weight_decay=0.1, steps=3)
    _, opt, sched = _trained(lr=5e-4, warmup=0, weight_decay=0.0, steps=0)
    with pytest.raises(RuntimeError, match="the load failed here"):
        with keep_hyperparameters(opt, sched):
            opt.load_state_dict(copy.deepcopy(saved_opt.state_dict()))
            sched.load_state_dict(copy.deepcopy(saved_sched.state_dict()))
            assert opt.param_groups[0]["weight_decay"] == 0.1  # the checkpoint's, for now
            raise RuntimeError("the load failed here")
    group = opt.param_groups[0]
    assert (group["initial_lr"], group["weight_decay"]) == (5e-4, 0.0)
    assert sched.lr_lambdas[0].warmup_steps == 0


def test_a_failed_save_raises_the_first_ranks_own_error_naming_the_checkpoint(tmp_path):
    """Found by a probe: a full disk during a checkpoint printed DCP's text (every rank's traceback),
    cut to one line before the cause; now the lowest failed rank's error, an OSError kept as one."""
    from torch.distributed.checkpoint.api import CheckpointException

    from system.learner.checkpoint import write_failure

    full = OSError(28, "No space left on device", "/runs/a/checkpoints/step_00000005.partial/__1_0.distcp")
    exc = CheckpointException("save failed", {1: (full, None), 3: (ValueError("x"), None)})
    err = write_failure("/runs/a/checkpoints/step_00000005.partial", exc)
    assert isinstance(err, OSError) and err.errno == 28 and err.filename == full.filename
    assert str(err) == ("[Errno 28] No space left on device (checkpoint /runs/a/checkpoints/step_00000005.partial, "
                        "rank 1 and 1 more): '/runs/a/checkpoints/step_00000005.partial/__1_0.distcp'")
    # torch's writer reports a full disk as a RuntimeError: the message says how much room is left
    torn = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    other = write_failure(str(tmp_path / "c.partial"), CheckpointException("save failed", {0: (torn, None)}))
    free = shutil.disk_usage(tmp_path).free / 2**20
    assert isinstance(other, RuntimeError) and str(other) == (
        f"checkpoint {tmp_path / 'c.partial'}, rank 0: RuntimeError: [enforce fail at inline_container.cc:672] . "
        f"unexpected pos 704 vs 598; {free:.1f} MiB free on its file system" + (" (full)" if free < 1 else ""))


def test_a_checkpoint_saved_before_any_update_resumes_as_a_fresh_optimiser(tmp_path):
    """Found by a review: a run stopped before step 1 checkpoints step 0; torch's ``get_state_dict`` gives an
    optimiser without state a zero-gradient step (lr 0) first, so that checkpoint held AdamW ``step`` 1 and
    the resumed first update was 0.74x the uninterrupted run's (step 2's bias correction)."""
    import torch

    from system.learner import distributed
    from system.learner.checkpoint import save_checkpoint

    distributed.init_process_group(0, 1, distributed.find_free_port())
    try:
        saved_model, saved_opt, saved_sched = _trained(lr=1e-3, warmup=0, weight_decay=0.1, steps=0)
        save_checkpoint(str(tmp_path / "step_0"), saved_model, saved_opt, saved_sched,
                        {"policy_version": 0, "optimizer_step": 0})
        model, opt, sched = _trained(lr=1e-3, warmup=0, weight_decay=0.1, steps=0)
        assert load_checkpoint(str(tmp_path / "step_0"), model, opt, sched)["optimizer_step"] == 0
        assert len(opt.state) == 0  # as an optimiser that never stepped
        fresh, fresh_opt, _ = _trained(lr=1e-3, warmup=0, weight_decay=0.1, steps=0)
        for m, o in ((model, opt), (fresh, fresh_opt)):  # one update each: the same parameters after it
            m(torch.ones(1, 3)).sum().backward()
            o.step()
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True))
        assert float(next(iter(opt.state.values()))["step"]) == 1.0
    finally:
        distributed.destroy_process_group()
