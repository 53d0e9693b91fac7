"""A ``ray.address`` nobody answers on is refused in one line, before anything is built: ``ray.init``
retried it for ever ("Failed to get cluster ID from GCS server: TimedOut" every ~40 s; found by a probe)."""

import socket

import pytest
import ray
from typer.testing import CliRunner

from actors.cli import app
from actors.cluster import ClusterUnreachableError, check_address


def test_an_address_nobody_answers_on_is_refused(monkeypatch):
    with pytest.raises(ClusterUnreachableError, match=r"nothing answers at 127\.0\.0\.1:1 within 0\.5 s"):
        check_address("127.0.0.1:1", timeout_s=0.5)  # port 1: refused at once
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(ClusterUnreachableError, match=r"at 127\.0\.0\.1:1 \(from RAY_ADDRESS, which ray\.address=auto"):
        check_address("auto", timeout_s=0.5)
    monkeypatch.delenv("RAY_ADDRESS")
    assert check_address("auto") is None  # only ray.init can look a local cluster up


def test_an_address_something_listens_on_passes():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert check_address(f"127.0.0.1:{port}") == f"127.0.0.1:{port}"
        assert check_address(f"ray://127.0.0.1:{port}") == f"ray://127.0.0.1:{port}"


def test_train_refuses_it_before_building_or_creating_anything(tmp_path):
    result = CliRunner().invoke(app, ["train", "ray.address=127.0.0.1:1", f"output_dir={tmp_path / 'r'}"])
    assert result.exit_code == 2
    assert "ray.address: nothing answers at 127.0.0.1:1" in " ".join(result.output.split())
    assert not ray.is_initialized() and not (tmp_path / "r").exists()
