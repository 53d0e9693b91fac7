"""``output_dir`` / ``--out`` that cannot be a run directory are refused before anything starts;
``--dry-run`` prints one JSON object and creates nothing."""

import json
import os

import pytest
from typer.testing import CliRunner

from actors.cli import app
from system.config import (
    ConfigError,
    RunConfig,
    check_output_dir,
    resolve_config,
)

# -- output_dir and --dry-run (issue 9 d, e) ------------------------------------------------------

runner = CliRunner()


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """Run from an empty directory: the default ``output_dir`` (``runs/default``) is relative, and a
    checkout where ``make demo`` ran holds a run there, which a new run (and its dry run) refuses."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_dry_run_prints_one_json_object_with_config_and_placement(elsewhere):
    result = runner.invoke(app, ["train", "--dry-run", "correction.method.type=icepop", "learner.num_ranks=4"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout is one document
    assert set(doc) == {"config", "placement"}
    want = resolve_config([], ["correction.method.type=icepop", "learner.num_ranks=4"])
    # the relative default output_dir, made absolute where the command ran (actors run elsewhere)
    assert doc["config"]["output_dir"] == str(elsewhere / "runs" / "default")
    assert RunConfig.model_validate(doc["config"]) == want.model_copy(update={"output_dir": doc["config"]["output_dir"]})
    assert doc["config"]["async"] == {"max_lag": 1, "queue_ahead": False}  # users' spelling
    roles = {r["role"]: r["count"] for r in doc["placement"]}
    assert roles == {"rollout_worker": 1, "learner_rank": 4, "correction_service": 1}


def test_dry_run_for_a_joined_cluster_says_what_each_role_asks_of_it(elsewhere):
    """Found by a review: with ray.address set the plan printed ``resources: {}`` for every role (the
    local plan), while on the cluster rollout workers and learner ranks go to the nodes offering
    the rollout / learner resources."""
    result = runner.invoke(app, ["train", "--dry-run", "ray.address=auto", "ray.rollout_resource=gen"])
    assert result.exit_code == 0, result.output
    roles = {r["role"]: r for r in json.loads(result.stdout)["placement"]}
    assert roles["rollout_worker"]["resources_if_the_cluster_offers_them"] == {"gen": 1.0}
    assert roles["learner_rank"]["resources_if_the_cluster_offers_them"] == {"learner": 1.0}
    assert all(r["resources"] is None for r in roles.values())  # decided by the cluster at run time


def test_dry_run_creates_nothing(tmp_path):
    out = tmp_path / "new" / "run"
    result = runner.invoke(app, ["train", "--dry-run", f"output_dir={out}"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "new").exists()


def _refused(result, needle):
    text = " ".join(result.stderr.split())  # rich wraps long lines
    return result.exit_code == 2 and needle in text and "Traceback" not in result.output


@pytest.mark.parametrize("dry", [["--dry-run"], []], ids=["dry-run", "train"])
def test_output_dir_that_is_a_file_or_below_one_is_refused_before_anything_starts(tmp_path, dry):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for path, why in ((a_file, "exists and is not a directory"), (a_file / "run", "cannot be created")):
        result = runner.invoke(app, ["train", *dry, f"output_dir={path}"])
        assert _refused(result, f"error: output_dir '{path}' {why}"), result.output
        assert result.stdout == ""
    assert a_file.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any permission bits")
def test_output_dir_in_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        result = runner.invoke(app, ["train", "--dry-run", f"output_dir={ro / 'run'}"])
        assert _refused(result, "is not writable"), result.output
        assert "output_dir" in result.stderr
    finally:
        ro.chmod(0o700)


def test_output_dir_that_cannot_be_written_is_refused_whoever_runs_the_tests(tmp_path, monkeypatch):
    # As root no permission bit blocks a write, so os.access stands in for a read-only parent.
    denied = {str(tmp_path / "ro")}
    real_access = os.access
    monkeypatch.setattr("system.config.paths.os.access", lambda p, mode: str(p) not in denied and real_access(p, mode))
    (tmp_path / "ro").mkdir()
    result = runner.invoke(app, ["train", "--dry-run", f"output_dir={tmp_path / 'ro' / 'new' / 'run'}"])
    assert _refused(result, f"output_dir '{tmp_path / 'ro' / 'new' / 'run'}' cannot be created: '{tmp_path / 'ro'}' is not writable"), result.output
    result = runner.invoke(app, ["train", "--dry-run", f"output_dir={tmp_path / 'ro'}"])
    assert _refused(result, f"output_dir '{tmp_path / 'ro'}' is not writable"), result.output


@pytest.mark.parametrize("dry", [["--dry-run"], []], ids=["dry-run", "train"])
def test_output_dir_the_permission_bits_allow_but_no_file_system_takes_is_refused(dry):
    """A probe (as root): ``output_dir=/proc/x`` passed ``--dry-run`` and failed the run with exit 1 after
    its cluster had started; the check now creates the directory (and removes it again)."""
    result = runner.invoke(app, ["train", *dry, "output_dir=/proc/aisrl-probe/run"])
    assert _refused(result, "error: output_dir '/proc/aisrl-probe/run' cannot be created"), result.output
    assert not os.path.exists("/proc/aisrl-probe")
    # an existing directory that holds no file (a later probe, as root: /proc and /sys/kernel passed
    # --dry-run); another user is refused by the permission bits first
    result = runner.invoke(app, ["train", *dry, "output_dir=/proc"])
    why = "cannot hold files" if os.geteuid() == 0 else "is not writable"
    assert _refused(result, f"error: output_dir '/proc' {why}"), result.output


def test_report_out_that_is_a_file_is_refused(tmp_path):
    dump = tmp_path / "d.npz"
    assert runner.invoke(app, ["demo-dump", str(dump), "--sequences", "4", "--max-len", "4"]).exit_code == 0
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for path, why in ((a_file, "exists and is not a directory"), (a_file / "o", "cannot be created")):
        result = runner.invoke(app, ["report", str(dump), "--out", str(path)])
        assert _refused(result, f"error: --out '{path}' {why}"), result.output


def test_check_output_dir_accepts_new_and_existing_directories(tmp_path):
    check_output_dir(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the write check's file is gone
    check_output_dir(tmp_path / "a" / "b" / "c")
    assert not (tmp_path / "a").exists()
    check_output_dir(tmp_path / "runs" / ".." / "y" / "z")  # the check creates and removes: nothing stays
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="output_dir: String should have at least 1 character"):
        resolve_config([], ["output_dir=''"])
    with pytest.raises(ConfigError, match="broken symbolic link"):
        (tmp_path / "link").symlink_to(tmp_path / "missing")
        check_output_dir(tmp_path / "link")
    with pytest.raises(ConfigError, match="output_dir"):
        check_output_dir(tmp_path / ("x" * 300))
