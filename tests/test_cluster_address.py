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


def test_directories_the_run_writes_here_are_checked_naming_the_variable(tmp_path, monkeypatch):
    """Found by a probe: ``TMPDIR=/etc/passwd`` (a file) failed with 122 lines ending in
    ``NotADirectoryError: '/etc/passwd/ray'``; an unwritable HOME with 176 lines from the model cache,
    and with AISRL_CACHE_DIR set, from Ray writing its auth token under ~/.ray."""
    from actors.cluster import check_local_dirs, ray_writes_auth_token
    from system.config import ConfigError, resolve_config

    cfg = resolve_config([], [])
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # creatable: fine
    monkeypatch.setenv("TMPDIR", str(a_file))
    with pytest.raises(ConfigError, match=r"TMPDIR '.*a-file' exists and is not a directory"):
        check_local_dirs(cfg, tmp_path / "cache")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    check_local_dirs(cfg, tmp_path / "cache")  # every one creatable
    with pytest.raises(ConfigError, match=r"the model cache \(AISRL_CACHE_DIR.*'.*a-file/models' cannot be created"):
        check_local_dirs(cfg, a_file / "models")
    monkeypatch.setenv("HOME", str(a_file / "home"))
    assert ray_writes_auth_token()
    with pytest.raises(ConfigError, match=r"~/\.ray \(where Ray saves a private cluster's auth token"):
        check_local_dirs(cfg, tmp_path / "cache")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 32)  # a given token is not written
    assert not ray_writes_auth_token()
    check_local_dirs(cfg, tmp_path / "cache")
    joined = resolve_config([], ["ray.address=auto"])  # a joined cluster's token is the cluster's matter
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    check_local_dirs(joined, tmp_path / "cache")
    # Ray's temporary root is RAY_TMPDIR when set: TMPDIR is then not Ray's matter
    monkeypatch.setenv("TMPDIR", str(a_file))
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray-tmp"))
    check_local_dirs(joined, tmp_path / "cache")
    monkeypatch.setenv("RAY_TMPDIR", str(a_file))
    with pytest.raises(ConfigError, match=r"RAY_TMPDIR '.*a-file' exists and is not a directory"):
        check_local_dirs(joined, tmp_path / "cache")


def test_an_ipv6_address_in_brackets_is_reachable():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        server = socket.socket(socket.AF_INET6)
        server.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with server:
        server.listen()
        port = server.getsockname()[1]
        assert check_address(f"[::1]:{port}") == f"[::1]:{port}"


def test_a_machine_without_a_node_of_the_cluster_is_told_where_to_run(monkeypatch):
    """Found by a review: ``aisrl scale`` on a SLURM login node (the run directory is there, the cluster's
    nodes are not) ended in Ray's RuntimeError after a minute; it now says to run on a node. Ray's own
    message is what ``ray._private.services`` raises when no node of the cluster runs here."""
    import ray

    import actors.cluster as cluster

    def no_node(**_):
        raise RuntimeError("No node info found matching attributes: '10.0.0.9' when trying to resolve node to connect to.")

    monkeypatch.setattr(cluster, "set_local_only", lambda _on: None)
    monkeypatch.setattr(ray, "init", lambda **kw: no_node(**kw))
    with pytest.raises(ClusterUnreachableError, match=r"--address=10\.0\.0\.5:6379: this machine runs no node of "
                                                      r"that cluster.*srun --jobid=<job> --overlap"):
        cluster.join("10.0.0.5:6379", "--address")
    monkeypatch.setattr(ray, "init", lambda **kw: (_ for _ in ()).throw(RuntimeError("something else")))
    with pytest.raises(RuntimeError, match="something else"):  # any other error as it came
        cluster.join("10.0.0.5:6379", "--address")
