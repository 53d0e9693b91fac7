"""A kill during checkpoint writing never leaves a checkpoint that loads wrong.

A helper process (``tests/checkpoint_writer.py``, forked from a forkserver that imported its modules once)
writes run checkpoints back to back, exactly
as the trainer does (DCP learner half into ``*.partial``, renamed when complete, then
``controller.pkl`` through a temp file); checkpoint ``k`` has every parameter equal to ``k``.
It is SIGKILLed at random moments, 12 times (more, up to 30, until 3 kills landed mid-write), each time restarted from the newest complete
checkpoint (as ``--resume`` does). After each kill the newest checkpoint that
``latest_run_checkpoint`` accepts must load completely with its two halves agreeing: every
parameter equal to its step, AdamW state for every parameter, the controller at the same
step, and no half-written directory counted. The test also checks that kills did land in
the middle of writes (half-written files were found), or it would prove nothing.
"""

import multiprocessing
import random
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint_writer  # noqa: E402
from checkpoint_writer import build  # noqa: E402

from system import controller_state, run_state  # noqa: E402
from system.learner import distributed  # noqa: E402
from system.learner.checkpoint import load_checkpoint  # noqa: E402

KILLS = 12
MAX_KILLS = 30
"""At least ``KILLS`` kills, more (up to ``MAX_KILLS``) until 3 of them landed mid-write: where a kill
lands depends on the machine's speed and load (a fresh-clone run beside heavy disk traffic had 2 of 12)."""


@pytest.fixture(scope="module")
def process_group():
    distributed.init_process_group(0, 1, distributed.find_free_port())
    yield
    distributed.destroy_process_group()


def half_written(run_dir: Path) -> list[str]:
    """Paths a kill left mid-write: DCP ``*.partial``/``*.stale`` dirs, ``controller.tmp``, a
    learner half without its ``controller.pkl``."""
    found = []
    for ckpt in (run_dir / "checkpoints").glob("step_*"):
        found += [p.name for p in ckpt.iterdir() if p.name.endswith((".partial", ".stale", ".tmp"))]
        if (ckpt / "learner").is_dir() and not (ckpt / run_state.CONTROLLER_FILE).exists():
            found.append(f"{ckpt.name} without controller")
    return found


def check_latest(run_dir: Path) -> int:
    ckpt = run_state.latest_run_checkpoint(run_dir)
    if ckpt is None:
        return 0
    controller = controller_state.read_controller_state(ckpt)  # its CRC checked (the writer's state is only the step)
    model, optimizer, scheduler = build()
    counters = load_checkpoint(run_state.learner_dir(ckpt), model, optimizer, scheduler)
    step = controller["step"]
    assert ckpt.name == f"step_{step:08d}" and counters["policy_version"] == step
    for p in model.parameters():
        assert torch.equal(p.detach(), torch.full_like(p, float(step)))
    assert len(optimizer.state) == len(list(model.parameters()))
    assert all(int(s["step"]) == step for s in optimizer.state.values())
    return step


def test_killed_writer_leaves_only_loadable_checkpoints(process_group, tmp_path):
    rng = random.Random(7)
    run_dir = tmp_path / "run"
    # a restart is a fork of a server that imported the writer's modules once, not a new interpreter
    # importing them (2.5 of the ~3 s of each). The list names installed modules only: Python 3.11's
    # forkserver imports the preload before it applies the parent's sys.path (tests/ is not on it), and
    # skips a module it cannot import silently
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(["torch._dynamo", "torch.distributed.checkpoint", "system.learner.checkpoint",
                                  "system.controller_state", "system.run_state"])
    steps, mid_write = [], 0
    for kill in range(MAX_KILLS):
        if kill >= KILLS and mid_write >= 3:
            break
        receive, send = forks.Pipe(duplex=False)
        proc = forks.Process(target=checkpoint_writer.main, args=(str(run_dir), send.send), daemon=True)
        proc.start()
        send.close()
        try:
            assert receive.poll(120) and receive.recv() >= 1, "the writer produced no checkpoint in 120 s"
            time.sleep(rng.uniform(0.0, 1.5))
        finally:
            proc.kill()  # SIGKILL
            proc.join()
            receive.close()
        mid_write += bool(half_written(run_dir))
        steps.append(check_latest(run_dir))
    assert all(s >= 1 for s in steps) and steps == sorted(steps)  # progress is never lost
    assert mid_write >= 3, f"only {mid_write} of {len(steps)} kills landed mid-write"
