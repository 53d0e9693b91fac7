"""The run directory and its checkpoints (the learner half is DCP, ``system.learner.checkpoint``; the
controller half ``controller.pkl``, ``system.controller_state``).

    <output_dir>/config.json              resolved config
    <output_dir>/metrics.jsonl            one record per learner step
    <output_dir>/dumps/step_XXXXXX.npz    batch dumps
    <output_dir>/report/                  mismatch report of the last dump
    <output_dir>/wandb/                   W&B files (offline runs to ``wandb sync``)
    <output_dir>/checkpoints/step_XXXXXXXX/learner/          DCP: model, optimiser, schedule
    <output_dir>/checkpoints/step_XXXXXXXX/controller.pkl    step, policy version, sampler,
                                                             buffer, AIS state, RNG, W&B run id

What a resumed run needs to continue exactly as the uninterrupted one: the learner half (model,
AdamW state, schedule, policy version) and ``controller_state.CONTROLLER_KEYS``; loading checks both
halves are there and agree (``controller_state.check_controller_state``), so a checkpoint that left a part out
fails to resume with a message naming the part instead of resuming into a different run.
The sampling randomness needs no state: every prompt's seed is derived from the run seed,
its prompt id and the policy version (``system.rollout.worker.prompt_seed``).

A checkpoint counts only once ``controller.pkl`` exists; it is written (temp file, then
rename) after the learner's half is complete, so a kill at any moment leaves either an
older complete checkpoint or a complete new one. A checkpoint damaged afterwards (a truncated
``controller.pkl`` or shard) is refused with a message naming the part, and resuming falls
back to the newest checkpoint that is whole (:func:`usable_run_checkpoint`).
"""

import contextlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

from system.config.rollout import KERNELS
from system.controller_state import CONTROLLER_FILE, CheckpointError, load_controller_state
from system.learner.checkpoint_files import checkpoint_problems, is_complete
from system.report.dump import numbered_dumps

log = logging.getLogger(__name__)
_STEP = re.compile(r"^step_(\d+)$")
def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:08d}"


def learner_dir(ckpt: str | Path) -> str:
    return str(Path(ckpt) / "learner")


def is_complete_checkpoint(ckpt: str | Path) -> bool:
    return (Path(ckpt) / CONTROLLER_FILE).is_file() and is_complete(learner_dir(ckpt))


def complete_run_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of ``run_dir``, newest (highest step) first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and is_complete_checkpoint(p)]
    return [p for _, p in sorted(found, reverse=True)]


def latest_run_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    found = complete_run_checkpoints(run_dir)
    return found[0] if found else None


def usable_run_checkpoint(run_dir: str | Path, below: Path | None = None) -> tuple[Path | None, dict, list[str]]:
    """The newest complete checkpoint whose two halves are whole: ``(path, controller state, skipped)``.

    Newer checkpoints that fail (a truncated ``controller.pkl``, a shard of the wrong size or CRC,
    parts that disagree) are skipped; ``skipped`` says which and why, newest first. ``(None, {},
    skipped)`` when none is usable. ``below``: only checkpoints older than that one (the next one to
    try when ``below`` failed to load).
    """
    skipped = []
    candidates = complete_run_checkpoints(run_dir)
    if below is not None:  # by step number (the path may be spelled otherwise)
        limit = int(_STEP.match(Path(below).name).group(1))
        candidates = [c for c in candidates if int(_STEP.match(c.name).group(1)) < limit]
    for ckpt in candidates:
        problems = checkpoint_problems(learner_dir(ckpt))
        if problems:
            skipped.append(f"{ckpt.name}: learner half: {'; '.join(problems)}")
            continue
        try:
            return ckpt, load_controller_state(ckpt), skipped
        except CheckpointError as exc:
            skipped.append(f"{ckpt.name}: {exc}")
    return None, {}, skipped


def checkpoint_to_resume(run_dir: str | Path, max_steps: int) -> tuple[Path, dict, list[str]]:
    """What ``--resume`` continues from: ``usable_run_checkpoint``, refused (before anything starts)
    when there is none (``CheckpointError``, naming what was skipped) or nothing is left to train
    (``ValueError``, naming ``max_steps``)."""
    run_dir = Path(run_dir)
    check_run_parts(run_dir)
    ckpt, saved, skipped = usable_run_checkpoint(run_dir)
    if ckpt is None:
        raise CheckpointError(f"--resume: no usable checkpoint under {run_dir / 'checkpoints'}"
                              + (f" ({'; '.join(skipped)})" if skipped else ""))
    if saved["step"] >= max_steps:  # naming what was skipped: a damaged newest one is news (a probe)
        raise ValueError(
            f"--resume {run_dir}: its checkpoint is at step {saved['step']} and max_steps is {max_steps}: "
            f"nothing to train; pass a larger max_steps (e.g. max_steps={saved['step'] + 50})"
            + (f" (skipped: {'; '.join(skipped)})" if skipped else ""))
    return ckpt, saved, skipped


ABANDONED_DIR = "abandoned"
"""``checkpoints/abandoned/<unix time>/``: where a resume moves the checkpoints past the one it starts from."""


def set_aside_after(run_dir: str | Path, step: int, now: float | None = None) -> tuple[list[str], int]:
    """What an abandoned attempt wrote past ``step`` (the checkpoint a resume starts from): its
    checkpoints ``step_N`` (N > step, complete or not: one the resume skipped as damaged, or one
    this attempt will publish again beside the old ``controller.pkl``) are moved to
    ``checkpoints/abandoned/<time>/`` (kept for inspection, never resumed from), its dumps
    ``dumps/step_N.npz`` are deleted (as its metrics records are, :func:`system.metrics_file.trim_metrics`), and so
    is the hidden partial file of a dump it was killed writing. Returns the names moved and the number of
    (complete) dumps deleted."""
    import time

    root = Path(run_dir)
    moved = []
    later = [p for p in (root / "checkpoints").glob("step_*")
             if (m := _STEP.match(p.name)) and int(m.group(1)) > step] if (root / "checkpoints").is_dir() else []
    if later:
        target = root / "checkpoints" / ABANDONED_DIR / str(int(now if now is not None else time.time()))
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(later):
            path.rename(target / path.name)
            moved.append(path.name)
    dumps = [p for n, p in numbered_dumps(root / "dumps") if n > step]
    # and a dump the attempt was writing when it was killed (a review: its hidden partial file stayed)
    partials = list((root / "dumps").glob(".step_*.npz.partial.npz")) if (root / "dumps").is_dir() else []
    for path in dumps + partials:
        path.unlink()
    return moved, len(dumps)


LOCK_FILE = ".aisrl.lock"


def lock_run_dir(run_dir: str | Path):
    """Hold ``<run_dir>/.aisrl.lock`` (an exclusive ``flock``) for this process's lifetime, or raise
    ``ValueError`` when another process holds it: two processes in one run directory (a resume
    started twice, ``--overwrite`` while the old job is still stopping) would interleave metrics,
    publish the same checkpoints and delete each other's files. Returns the open file (the lock
    lasts while it is open; the OS releases it when the process ends, however it ends)."""
    import fcntl

    root = Path(run_dir)
    for _ in range(5):
        root.mkdir(parents=True, exist_ok=True)
        handle = open(root / LOCK_FILE, "a+")  # noqa: SIM115 - held open on purpose
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held by another process (EWOULDBLOCK)
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ValueError(f"output_dir {run_dir} is in use by {holder}: wait for it to end (or stop it) before "
                             "starting, resuming or overwriting this run") from None
        except OSError as exc:  # a file system without locks (some NFS mounts: ENOLCK): go on unguarded, say so
            log.warning("output_dir %s: cannot lock %s (%s); nothing stops a second process from using this "
                        "run directory", run_dir, LOCK_FILE, exc.strerror or exc)
            break
        # a failed start removes the lock file it held (release_run_dir): a lock taken on that removed
        # file guards nothing, so take it again on the file now at the path
        try:
            if os.stat(root / LOCK_FILE).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    else:
        raise ValueError(f"output_dir {run_dir}: its lock file {LOCK_FILE} kept being replaced while this process "
                         "took it; is another aisrl starting there?")
    handle.seek(0)
    handle.truncate()
    handle.write(f"aisrl process {os.getpid()}\n")
    handle.flush()
    return handle


def release_run_dir(handle, run_dir: str | Path, remove_dir: bool = False) -> None:
    """Close the lock ``lock_run_dir`` returned; with ``remove_dir`` (a start that failed in a directory it
    created) remove the lock file, while still holding the lock, and then the directory when nothing
    else is in it (a refused start left a directory holding only the lock file; found by a probe)."""
    if remove_dir:
        with contextlib.suppress(OSError):
            (Path(run_dir) / LOCK_FILE).unlink()
    handle.close()
    if remove_dir:
        with contextlib.suppress(OSError):  # not empty: what is there stays
            Path(run_dir).rmdir()


ROLLOUT_WORKERS_FILE = "rollout_workers.json"
"""Every rollout worker's scheme and FP8 kernel decision, and the run's FP8 kernel pins."""
RUN_ARTEFACTS = ("config.json", "metrics.jsonl", "ledger.json", ROLLOUT_WORKERS_FILE, "control.json",
                 "checkpoints", "dumps", "report", "wandb")
"""What a run writes into its directory (the layout above)."""


def existing_run(run_dir: str | Path) -> list[str]:
    """The run artefacts already in ``run_dir`` (empty for a new or empty directory)."""
    root = Path(run_dir)
    return [name for name in RUN_ARTEFACTS if (root / name).exists()] if root.is_dir() else []


def enclosing_run(run_dir: str | Path) -> Path | None:
    """The nearest directory above ``run_dir`` that holds a run (its ``config.json`` and its
    ``metrics.jsonl`` or ``checkpoints``), or None."""
    for parent in Path(run_dir).expanduser().resolve().parents:
        if (parent / "config.json").is_file() and ((parent / "metrics.jsonl").is_file()
                                                   or (parent / "checkpoints").is_dir()):
            return parent
    return None


def check_not_nested(run_dir: str | Path) -> None:
    """Refuse a new run's directory inside another run's (``enclosing_run``)."""
    outer = enclosing_run(run_dir)
    if outer is not None:
        raise ValueError(f"output_dir {run_dir} is inside the run directory {outer} (its --overwrite would "
                         f"delete this run, its --resume move it aside): choose an output_dir outside it")


def remove_run_artefacts(run_dir: str | Path) -> list[str]:
    """Delete every run artefact in ``run_dir`` (symlinks as links, not their targets); the names."""
    root = Path(run_dir)
    found = existing_run(root)
    for name in found:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return found


REPLACED_DIR = ".replaced"
"""Where ``--overwrite`` keeps the old run's artefacts until the new run has started."""


def check_new_run_dir(run_dir: str | Path, overwrite: bool, command: str = "aisrl train") -> Path | None:
    """Refuse to start a new run where one already is (two runs' metrics, checkpoints and dumps
    would mix), unless ``overwrite``: then the old run's artefacts are moved aside into
    ``run_dir/.replaced/`` (returned; None when there was nothing), to be deleted once the new run
    has started (``drop_replaced``) or put back if it fails to (``restore_replaced``): a new run
    that fails at its model build or cluster start no longer costs the old run. ``command`` is the
    one the refusal tells to resume with (``aisrl submit`` checks a run directory it can read here)."""
    root = Path(run_dir)
    aside = root / REPLACED_DIR
    check_no_replaced_run(root)
    check_not_nested(root)
    found = existing_run(run_dir)
    if not found:
        return None
    if not overwrite:
        resume = (f"continue it with '{command} --resume {run_dir}', " if complete_run_checkpoints(run_dir)
                  else "it has no complete checkpoint to continue from: ")
        raise ValueError(f"output_dir {run_dir} already holds a run ({', '.join(found)}): {resume}pass --overwrite "
                         "to replace it, or choose another output_dir")
    aside.mkdir()
    moved = []
    try:
        for name in found:
            os.replace(root / name, aside / name)
            moved.append(name)
    except OSError:  # all or nothing: what moved goes back, the error is the user's to see
        for name in moved:
            os.replace(aside / name, root / name)
        aside.rmdir()
        raise
    return aside


RUN_PARTS = {"config.json": "file", "metrics.jsonl": "file", "ledger.json": "file", "checkpoints": "directory",
             "dumps": "directory", "report": "directory"}
"""What a run directory holds, and of which kind (``check_run_parts``)."""


def check_run_parts(run_dir: str | Path) -> None:
    """Refuse a run directory whose parts are of the wrong kind (``dumps`` a file, ``metrics.jsonl`` a
    directory: the run would start its cluster and fail at the first write, or lose its records)."""
    for name, kind in RUN_PARTS.items():
        path = Path(run_dir) / name
        if path.exists() and path.is_dir() != (kind == "directory"):
            raise ValueError(f"{path} is a {'directory' if path.is_dir() else 'file'}, not a {kind}: a run "
                             f"directory's {name} must be a {kind}; move it away and start again")


def check_no_replaced_run(run_dir: str | Path) -> None:
    """Refuse a directory holding ``.replaced/``: a run set aside by an ``--overwrite`` whose start was
    killed before it could finish or put it back. It is never deleted without the user's word."""
    aside = Path(run_dir) / REPLACED_DIR
    if aside.exists():
        held = sorted(p.name for p in aside.iterdir()) if aside.is_dir() else []
        raise ValueError(
            f"output_dir {run_dir} holds {REPLACED_DIR}/ ({', '.join(held) or 'empty'}): a run set aside by an "
            f"--overwrite whose start was interrupted; move its files back into {run_dir} to keep that run, "
            f"or delete {aside} to let it go, then start again")


def restore_replaced(run_dir: str | Path, aside: Path) -> list[str]:
    """Put the artefacts ``check_new_run_dir`` moved aside back (the new run failed to start); their names.
    One that cannot go back (a file of the failed start in its place) stays in ``.replaced/``, logged;
    the directory is then refused until the user decides (``check_no_replaced_run``)."""
    names = []
    for path in sorted(aside.iterdir()):
        try:
            os.replace(path, Path(run_dir) / path.name)
            names.append(path.name)
        except OSError as exc:
            log.error("--overwrite: could not put %s back (%s); it stays in %s", path.name, exc, aside)
    if not any(aside.iterdir()):
        aside.rmdir()
    return names


def undo_new_run(run_dir: str | Path, aside: Path | None) -> None:
    """A new run that failed to start: what it wrote is not a run (removed), and the run ``--overwrite``
    set aside in ``aside`` is put back (logged, never raised: the start's own error is the one to see)."""
    removed = remove_run_artefacts(run_dir)
    if removed:
        log.warning("the run failed to start; removed what it had written (%s)", ", ".join(removed))
    if aside is not None:
        try:
            back = restore_replaced(run_dir, aside)
            log.warning("--overwrite: the run this one was to replace is back in place (%s)", ", ".join(back))
        except OSError as exc:
            log.error("--overwrite: could not put the replaced run back from %s (%s)", aside, exc)


def drop_replaced(aside: Path | None) -> None:
    """Delete the replaced run's artefacts (the new run has started)."""
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def write_rollout_workers(run_dir: str | Path, record: dict) -> None:
    """``rollout_workers.json`` (``RolloutPool.workers_record``), written whole then renamed: a resume reads
    the FP8 kernel pins from it (:func:`fp8_kernel_pins`), and a kill mid-write must not tear them."""
    write_text_whole(Path(run_dir) / ROLLOUT_WORKERS_FILE, json.dumps(record, indent=1))


def write_ledger(run_dir: Path, counts: dict[str, int], failed: bool = False) -> None:
    """``ledger.json``: the prompts' counts. A failed run's are written as they stand (``in_flight`` and
    ``buffered`` may be non-zero; issued = in flight + buffered + trained + dropped); a failure to write
    them is a warning there, so it does not hide the run's own error."""
    try:
        write_text_whole(Path(run_dir) / "ledger.json", json.dumps(counts, indent=1))
    except OSError as exc:
        if not failed:
            raise
        log.warning("could not write ledger.json of the failed run (%s)", exc)


def write_text_whole(path: Path, text: str) -> None:
    """``path`` holds ``text`` or its old contents, never a part: written beside it, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)  # a full disk: no half-written temp file left beside it
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write names no file: this one
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise


def fp8_kernel_pins(run_dir: str | Path) -> dict[str, str]:
    """The FP8 kernel a run chose on each kind of CPU before it stopped (``fp8_kernel_pins`` of its
    ``rollout_workers.json``), which its resume keeps (``system.rollout.fp8_kernels``: a probe near the
    threshold could otherwise flip it). ``{}`` when there is no record (or one written before pins
    existed); an unreadable one is said and ignored (the kernel is then chosen anew), and so is a pin
    naming no kernel of this version."""
    path = Path(run_dir) / ROLLOUT_WORKERS_FILE
    if not path.exists():
        return {}
    try:
        pins = dict(json.loads(path.read_text()).get("fp8_kernel_pins") or {})
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        log.warning("--resume: %s is unreadable (%s); the FP8 kernel is chosen anew", path, exc)
        return {}
    unknown = {cpu: k for cpu, k in pins.items() if k not in KERNELS}
    if unknown:  # another version's name, or a hand edit: every worker would refuse it
        log.warning("--resume: %s pins unknown FP8 kernels %s; those CPUs choose anew", path, unknown)
    return {str(cpu): str(k) for cpu, k in pins.items() if k in KERNELS}
