"""The run directory's lifecycle: a new run never mixes with an old one (refused, or set aside with
``--overwrite`` and given back if the start fails), one process per directory, and never a run inside
another run's directory. (No Ray: the run directories are built by hand with the real file layout.)
"""

import pytest
from test_run_state import make_checkpoint

from system import run_state


def test_a_new_run_refuses_a_directory_that_holds_a_run(tmp_path):
    run_state.check_new_run_dir(tmp_path / "absent", overwrite=False)  # nothing there: fine
    run_state.check_new_run_dir(tmp_path, overwrite=False)  # an empty directory: fine
    (tmp_path / "config.json").write_text('{"max_steps": 3}')
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "notes.txt").write_text("mine")
    # no checkpoint (stopped at once before the first): --resume would be refused, so it is not offered
    with pytest.raises(ValueError, match=r"already holds a run \(config.json, metrics.jsonl\): it has no complete "
                                         r"checkpoint to continue from: pass --overwrite") as refused:
        run_state.check_new_run_dir(tmp_path, overwrite=False)
    assert "--resume" not in str(refused.value)
    assert (tmp_path / "config.json").read_text() == '{"max_steps": 3}'  # touched nothing
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'
    make_checkpoint(tmp_path, 2)
    with pytest.raises(ValueError, match=r"already holds a run \(config.json, metrics.jsonl, checkpoints\): continue "
                                         r"it with 'aisrl train --resume .*--overwrite"):
        run_state.check_new_run_dir(tmp_path, overwrite=False)
    aside = run_state.check_new_run_dir(tmp_path, overwrite=True)
    # only the run's own files went, set aside until the new run has started
    assert sorted(p.name for p in tmp_path.iterdir()) == [".replaced", "notes.txt"]
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "config.json", "metrics.jsonl"]
    # the new run failed to start: everything back as it was
    assert run_state.restore_replaced(tmp_path, aside) == ["checkpoints", "config.json", "metrics.jsonl"]
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n' and not aside.exists()
    # it started: the old run is deleted
    run_state.drop_replaced(run_state.check_new_run_dir(tmp_path, overwrite=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_one_process_per_run_directory(tmp_path):
    """Found by a review: nothing stopped two processes from using one run directory (a resume started
    twice; --overwrite while the old job still stops): their metrics interleave, they publish the same
    checkpoints, and --overwrite deletes the live run's files."""
    import subprocess
    import sys

    held = run_state.lock_run_dir(tmp_path / "run")
    probe = ("import sys; from system import run_state\n"
             "try:\n    run_state.lock_run_dir(sys.argv[1])\nexcept ValueError as e:\n    print(e); sys.exit(3)\n")
    other = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run")], capture_output=True, text=True)
    assert other.returncode == 3 and f"is in use by aisrl process {__import__('os').getpid()}" in other.stdout
    with pytest.raises(ValueError, match="is in use by"):  # a second handle in this process too
        run_state.lock_run_dir(tmp_path / "run")
    held.close()  # released (the OS also releases it when a process ends, however it ends)
    again = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run")], capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert run_state.existing_run(tmp_path / "run") == []  # the lock file is not a run artefact


def test_a_failed_start_removes_the_directory_it_created_and_only_that(tmp_path, monkeypatch):
    """Found by a probe: a refused start left a new output_dir holding only ``.aisrl.lock``. The Trainer
    (its start made to fail here) removes the lock file and the directory it created; a directory that
    was there before keeps what it holds, and one that got other files stays."""
    import actors.trainer as trainer_module
    from system.config import resolve_config

    def refuse(self, resume, overwrite):
        raise ValueError("refused")

    monkeypatch.setattr(trainer_module.Trainer, "_start", refuse)
    new = tmp_path / "new" / "run"
    with pytest.raises(ValueError, match="refused"):
        trainer_module.Trainer(resolve_config([], [f"output_dir={new}"]))
    assert not new.exists()  # the run directory it made is gone (its parent, made on the way, stays)
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(ValueError, match="refused"):
        trainer_module.Trainer(resolve_config([], [f"output_dir={mine}"]))
    assert mine.is_dir()  # the user's directory stays
    handle = run_state.lock_run_dir(tmp_path / "busy")
    (tmp_path / "busy" / "notes.txt").write_text("x")
    run_state.release_run_dir(handle, tmp_path / "busy", remove_dir=True)
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]  # not empty: kept


def test_a_lock_taken_on_a_lock_file_removed_meanwhile_is_taken_again(tmp_path, monkeypatch):
    """A failed start removes the lock file it holds (``release_run_dir``); a process that opened the file
    just before and locks it after holds a lock on a removed file, which guards nothing: a third
    process would create and lock a new one. ``lock_run_dir`` compares the inodes and locks again."""
    import fcntl
    import os

    real_flock, calls = fcntl.flock, []

    def flock_after_a_removal(fd, op):
        calls.append(op)
        if len(calls) == 1:  # the other process's failed start removes the file between open and flock
            os.unlink(tmp_path / "run" / run_state.LOCK_FILE)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_removal)
    handle = run_state.lock_run_dir(tmp_path / "run")
    assert len(calls) == 2  # locked twice: the second time on the file at the path
    assert os.fstat(handle.fileno()).st_ino == os.stat(tmp_path / "run" / run_state.LOCK_FILE).st_ino
    handle.close()


def test_a_file_system_without_locks_runs_unguarded_and_says_so(tmp_path, monkeypatch, caplog):
    """Some NFS mounts have no lock daemon (flock: ENOLCK): that is not "another process holds it"."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    handle = run_state.lock_run_dir(tmp_path / "run")
    assert handle is not None and "cannot lock .aisrl.lock (No locks available)" in caplog.text
    handle.close()


def test_a_run_left_in_replaced_is_never_deleted_and_a_failed_set_aside_is_rolled_back(tmp_path, monkeypatch):
    """Found by a review: an --overwrite killed mid-start left the old run in .replaced/, unseen; the next
    --overwrite deleted it. And a set-aside that failed half-way left the run split in two."""
    import os

    make_checkpoint(tmp_path, 2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    aside = run_state.check_new_run_dir(tmp_path, overwrite=True)  # ... and then the process was killed
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"holds \.replaced/ \(checkpoints, metrics.jsonl\): a run set aside"):
            run_state.check_new_run_dir(tmp_path, overwrite=overwrite)
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "metrics.jsonl"]  # untouched
    assert run_state.restore_replaced(tmp_path, aside) == ["checkpoints", "metrics.jsonl"]

    real = os.replace
    calls = []

    def failing_second(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(16, "Device or resource busy")  # e.g. a mount point
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing_second)
    with pytest.raises(OSError, match="busy"):
        run_state.check_new_run_dir(tmp_path, overwrite=True)
    monkeypatch.setattr(os, "replace", real)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "metrics.jsonl"]  # all back, no .replaced


def test_a_new_run_inside_another_runs_directory_is_refused(tmp_path):
    """Found by a probe: ``output_dir=RUN/report`` was accepted, and the outer run's ``--overwrite`` then
    deleted the nested run without a word (``RUN/checkpoints/step_00000200``: its ``--resume`` moved it
    aside). A directory above that holds a run's config.json and metrics or checkpoints refuses it."""
    outer = tmp_path / "sc"
    make_checkpoint(outer, 2)
    (outer / "config.json").write_text("{}")
    for nested in (outer / "report", outer / "checkpoints" / "step_00000200", outer / "a" / "b"):
        with pytest.raises(ValueError, match=f"is inside the run directory {outer}"):
            run_state.check_new_run_dir(nested, overwrite=True)
    # beside it, or above it, is fine: a parent without a run's config is no run
    assert run_state.check_new_run_dir(tmp_path / "other", overwrite=False) is None
    (tmp_path / "plain" / "checkpoints").mkdir(parents=True)
    assert run_state.check_new_run_dir(tmp_path / "plain" / "x", overwrite=False) is None
    # a dry run says so too, with or without --overwrite (exit 2, nothing written)
    from typer.testing import CliRunner

    from actors.cli import app

    for flags in ([], ["--overwrite"]):
        result = CliRunner().invoke(app, ["train", "--dry-run", *flags, f"output_dir={outer / 'report'}"])
        assert result.exit_code == 2 and "is inside the run directory" in " ".join(result.output.split()), result.output


