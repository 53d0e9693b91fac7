"""The test process ends with pytest's own exit status (``tests/conftest.py`` skips interpreter
finalization once pytest has reported): a failing test still fails the run, a passing one passes."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(tmp_path, body: str, *extra_paths: str) -> subprocess.CompletedProcess:
    """pytest in a fresh process on one test with ``body``, beside a copy of this suite's conftest."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_one.py").write_text(f"def test_one():\n    {body}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_one.py"), *extra_paths],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("body", "expected_rc", "summary"),
                         [("assert 1 + 1 == 3", 1, "1 failed"), ("assert 1 + 1 == 2", 0, "1 passed")])
def test_exit_status_is_pytests(tmp_path, body, expected_rc, summary):
    done = run_pytest(tmp_path, body)
    assert done.returncode == expected_rc, done.stdout + done.stderr
    assert summary in done.stdout


def test_a_usage_error_found_in_the_session_still_prints_its_message(tmp_path):
    """pytest prints "file or directory not found" after the unconfigure hooks: the process must
    then exit normally (status 4, the message kept)."""
    done = run_pytest(tmp_path, "pass", str(tmp_path / "not_there.py"))
    assert done.returncode == 4, done.stdout + done.stderr
    assert "not found" in done.stdout + done.stderr
