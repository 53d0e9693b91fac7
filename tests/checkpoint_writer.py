"""Helper process of ``tests/test_checkpoint_kill.py``: writes run checkpoints in a loop until killed,
resuming from the newest complete checkpoint it finds (model, AdamW state, schedule).

Checkpoint ``k`` holds a model whose every parameter equals ``k`` (and AdamW state from k
steps), written exactly as the trainer writes one: the learner half with DCP
(``system.learner.checkpoint.save_checkpoint``, a 1-rank gloo group), then
``controller.pkl`` (``system.controller_state.save_controller_state``) with ``step = k``.

    python tests/checkpoint_writer.py RUN_DIR

The test starts it as a ``multiprocessing`` forkserver child (torch, DCP and the checkpoint modules
imported once by the server, not at each of its 12+ restarts) and reads the steps from a pipe.
"""

import sys
from collections.abc import Callable

import torch
from torch import nn

from system import controller_state, run_state
from system.learner import distributed
from system.learner.checkpoint import load_checkpoint, save_checkpoint

WIDTH = 1024  # 4 linear layers of 1024 x 1024: 4.2M parameters, ~50 MB with the AdamW state


def build() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0)
    return model, optimizer, scheduler


def main(run_dir: str, done: Callable[[int], None] | None = None) -> None:
    """Write checkpoints 1, 2, ... (after the newest complete one) until killed; ``done(step)`` after
    each (default: print it)."""
    done = done or (lambda step: print(step, flush=True))
    distributed.init_process_group(0, 1, distributed.find_free_port())
    model, optimizer, scheduler = build()
    latest = run_state.latest_run_checkpoint(run_dir)
    step = 0
    if latest is not None:  # continue as a resumed run does
        step = load_checkpoint(run_state.learner_dir(latest), model, optimizer, scheduler)["policy_version"]
    while True:
        step += 1
        model(torch.ones(1, WIDTH)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(step))
        ckpt = run_state.checkpoint_dir(run_dir, step)
        save_checkpoint(run_state.learner_dir(ckpt), model, optimizer, scheduler, {"policy_version": step})
        controller_state.save_controller_state(ckpt, {"step": step})
        done(step)


if __name__ == "__main__":
    main(sys.argv[1])
