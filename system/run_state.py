"""The run directory and the controller half of a checkpoint (the learner half is DCP, ``system.learner.checkpoint``).

    <output_dir>/config.json              resolved config
    <output_dir>/metrics.jsonl            one record per learner step
    <output_dir>/dumps/step_XXXXXX.npz    batch dumps
    <output_dir>/report/                  mismatch report of the last dump
    <output_dir>/wandb/                   W&B files (offline runs to ``wandb sync``)
    <output_dir>/checkpoints/step_XXXXXXXX/learner/          DCP: model, optimiser, schedule
    <output_dir>/checkpoints/step_XXXXXXXX/controller.pkl    step, policy version, sampler,
                                                             buffer, AIS state, RNG, W&B run id

A checkpoint counts only once ``controller.pkl`` exists; it is written (temp file, then
rename) after the learner's half is complete, so a kill at any moment leaves either an
older complete checkpoint or a complete new one.
"""

import os
import pickle
import re
from pathlib import Path

from system.learner.checkpoint import is_complete

_STEP = re.compile(r"^step_(\d+)$")
CONTROLLER_FILE = "controller.pkl"


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:08d}"


def learner_dir(ckpt: str | Path) -> str:
    return str(Path(ckpt) / "learner")


def save_controller_state(ckpt: str | Path, state: dict) -> None:
    path = Path(ckpt) / CONTROLLER_FILE
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def load_controller_state(ckpt: str | Path) -> dict:
    with open(Path(ckpt) / CONTROLLER_FILE, "rb") as f:
        return pickle.load(f)


def is_complete_checkpoint(ckpt: str | Path) -> bool:
    return (Path(ckpt) / CONTROLLER_FILE).is_file() and is_complete(learner_dir(ckpt))


def latest_run_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP.match(p.name)) and is_complete_checkpoint(p)]
    return max(found)[1] if found else None
