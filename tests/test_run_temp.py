"""``actors/run_temp.py``: the run's temporary directory (its service's and rollout workers' TMPDIR)
shares the compile cache of the driver's temp dir and leaves it in place when removed."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from actors.run_temp import compile_cache_name, make_run_temp, remove_run_temp


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """This process's temp dir for the test (what ``tempfile.gettempdir()`` returns)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_run_temp_links_the_shared_compile_cache_and_its_removal_keeps_the_cache(temp_root):
    name = compile_cache_name()
    run = Path(make_run_temp())
    assert run.parent == temp_root and run.name.startswith("aisrl-run-")
    assert (run / name).is_symlink() and (run / name).resolve() == (temp_root / name).resolve()
    (run / name / "kernel.so").write_text("compiled")  # what a worker's compile writes through the link
    (run / "vllm_dist_abc").write_text("")  # a rendezvous file: goes with the run
    remove_run_temp(str(run))
    assert not run.exists()
    assert (temp_root / name / "kernel.so").read_text() == "compiled"


def test_a_cache_name_taken_by_a_file_leaves_the_run_temp_without_a_link(temp_root):
    name = compile_cache_name()
    (temp_root / name).write_text("not a directory")
    run = Path(make_run_temp())
    assert run.is_dir() and not (run / name).exists()
    remove_run_temp(str(run))
    assert (temp_root / name).read_text() == "not a directory"


def test_torch_finds_its_cache_and_precompiled_headers_through_the_link(temp_root):
    """The link's name must be the one torch builds from ``TMPDIR``; a process started with the run
    temp as its TMPDIR (a rollout worker) resolves both inductor directories into the shared cache."""
    run = Path(make_run_temp())
    probe = ("import os; from torch._inductor.runtime.cache_dir_utils import default_cache_dir; "
             "from torch._inductor import codecache; "
             "print(os.path.realpath(default_cache_dir())); print(os.path.realpath(codecache._HEADER_DIR))")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "TMPDIR": str(run)}, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    shared = os.path.realpath(temp_root / compile_cache_name())
    assert out == [shared, os.path.join(shared, "precompiled_headers")]
    remove_run_temp(str(run))
