"""The learner checkpoint's files, checked without torch: whether a checkpoint is complete, and what
makes one unusable (missing parts, sizes or CRC-32s other than written). The driver, ``aisrl`` and
the run's control actor read checkpoints through these (``system.run_state``) without importing
torch (~4 s of a 2-core VM per process); writing and loading them is ``system.learner.checkpoint``.
"""

import json
import os
import zlib

TRAINER_FILE = "trainer.json"
"""The trainer state beside DCP's files (optimiser step, policy version, scheduler, shard list)."""


def is_complete(path: str) -> bool:
    """A published checkpoint: DCP metadata and trainer state both present."""
    return os.path.isfile(os.path.join(path, ".metadata")) and os.path.isfile(os.path.join(path, TRAINER_FILE))


def file_crc32(path: str, chunk: int = 8 << 20) -> int:
    """CRC-32 of a file's bytes (zlib's, read in 8 MiB chunks)."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def checkpoint_problems(path: str) -> list[str]:
    """What makes the checkpoint at ``path`` unusable: missing parts, an unreadable ``trainer.json``,
    shard files missing, of another size or (where the checkpoint recorded it) another CRC-32 than
    written (empty list = usable as far as files tell)."""
    if not is_complete(path):
        return [f"{path}: missing .metadata or {TRAINER_FILE}"]
    try:
        with open(os.path.join(path, TRAINER_FILE)) as f:
            trainer = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"{os.path.join(path, TRAINER_FILE)} is unreadable ({type(exc).__name__}: {exc})"]
    if not isinstance(trainer, dict) or not {"counters", "scheduler"} <= trainer.keys():
        return [f"{os.path.join(path, TRAINER_FILE)} lacks counters or scheduler"]
    files = trainer.get("files", {})  # absent in checkpoints written before the list existed
    crc32 = trainer.get("crc32", {})  # absent in checkpoints written before the CRCs
    if not (isinstance(files, dict) and all(isinstance(v, int) for v in files.values())
            and isinstance(crc32, dict) and all(isinstance(v, int) for v in crc32.values())):
        return [f"{os.path.join(path, TRAINER_FILE)}: its files or crc32 list is not a table of numbers (damaged)"]
    problems = []
    for name, size in files.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            problems.append(f"{file} is missing")
        elif os.path.getsize(file) != size:
            problems.append(f"{file} has {os.path.getsize(file)} bytes, {size} were written (truncated or replaced)")
        elif name in crc32 and (got := file_crc32(file)) != crc32[name]:
            problems.append(f"{file}: its bytes differ from those written (CRC-32 {got:08x}, "
                            f"{crc32[name]:08x} was written: damaged or replaced)")
    return problems
