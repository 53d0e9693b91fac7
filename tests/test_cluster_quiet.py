"""``quiet_workers`` quiets this process too: its progress bars (tqdm had read ``TQDM_DISABLE`` at
import, so the tiny model's build printed "Writing model shards") and, off a terminal, the colour
codes of Ray's prefixes (found by a probe in a redirected log)."""

import os

from transformers.utils import logging as transformers_logging

from actors.cluster import quiet_workers


def test_quiet_workers_turns_off_this_processs_bars_and_ray_colours(monkeypatch):
    monkeypatch.delenv("AISRL_VERBOSE", raising=False)
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    for key in ("PYTHONWARNINGS", "TQDM_DISABLE", "TORCH_CPP_LOG_LEVEL", "TRANSFORMERS_VERBOSITY", "VLLM_LOGGING_LEVEL"):
        monkeypatch.delenv(key, raising=False)  # set here, restored after the test
    transformers_logging.enable_progress_bar()
    try:
        quiet_workers()  # pytest captures stdout and stderr: not a terminal
        assert not transformers_logging.is_progress_bar_enabled()
        assert os.environ["RAY_COLOR_PREFIX"] == "0" and os.environ["TQDM_DISABLE"] == "1"
    finally:
        transformers_logging.enable_progress_bar()


def test_verbose_keeps_the_bars(monkeypatch):
    monkeypatch.setenv("AISRL_VERBOSE", "1")
    transformers_logging.enable_progress_bar()
    quiet_workers()
    assert transformers_logging.is_progress_bar_enabled()


def test_the_actors_runtime_env_carries_the_quiet_environment_the_drivers_values_winning(monkeypatch):
    """On a joined cluster the actors start from the raylet's environment, not the driver's: their
    runtime_env carries the quiet settings (a probe saw progress bars, vLLM's FutureWarnings and torch's
    NUMA warning on the console of ``aisrl train ray.address=...``)."""
    from actors.cluster import QUIET_ENV, actor_env

    monkeypatch.delenv("AISRL_VERBOSE", raising=False)
    for key in QUIET_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")  # the user's choice wins
    env = actor_env(TMPDIR="/t")["env_vars"]
    assert env == {**QUIET_ENV, "VLLM_LOGGING_LEVEL": "INFO", "TMPDIR": "/t"}
    monkeypatch.setenv("AISRL_VERBOSE", "1")
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    assert actor_env()["env_vars"] == {"VLLM_LOGGING_LEVEL": "ERROR"}  # vLLM's reload lines stay off
