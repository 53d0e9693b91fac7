"""Shared fixtures."""

import os
import sys

import pytest
import ray

from actors.cluster import private_cluster_environment
from actors.ray_internals import LOOPBACK_NODE


@pytest.fixture(scope="module")
def loopback_ray(tmp_path_factory):
    """A private Ray cluster on 127.0.0.1 for one test module (8 logical CPUs, 256 MiB object
    store, no dashboard), with its own model cache; shut down after the module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AISRL_CACHE_DIR", str(tmp_path_factory.mktemp("model-cache")))
        private_cluster_environment()
        ray.init(address="local", num_cpus=8, include_dashboard=False, object_store_memory=256 * 2**20,
                 **LOOPBACK_NODE, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()



@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The suite runs on two processes (``make test``: pytest-xdist, ``--dist loadgroup``). Every test
    that starts a Ray cluster in the test process (marker ``ray``, or the ``loopback_ray`` fixture) is
    in one group, run in order by one process, so at most one such cluster runs at a time (the
    simulated orchestration tests time their actors' stamps); every other module is a group of its
    own (its module fixtures are built once), run by whichever process is free. That includes the
    modules marked ``own_cluster`` (``aisrl`` and ``ray start`` in subprocesses, each with a cluster of
    its own: 4.3 of the Ray group's 13 minutes, run beside it instead of after it), so at most two
    clusters run at once.

    First among the hooks (``tryfirst``): xdist reads the marks in its own hook of this name. The
    grouping is checked as each worker's collection arrives (:func:`pytest_xdist_node_collection_finished`): with pytest 9.2 xdist's loadgroup
    silently grouped nothing (pytest-xdist issue 1386; ``pyproject.toml`` pins pytest below 9.2)."""
    for item in items:
        in_process = item.get_closest_marker("ray") and not item.get_closest_marker("own_cluster")
        ray_test = in_process or "loopback_ray" in getattr(item, "fixturenames", ())
        group = "ray" if ray_test else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """On the controller, for each worker's collection under ``--dist loadgroup``: stop the run when a
    test id lacks its group suffix (``@ray``, ``@tests/test_x.py``): xdist would then schedule the Ray
    tests on both processes at once (it did with pytest 9.2, without a word)."""
    if node.config.getoption("dist", None) != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid.rpartition("::")[2]]
    if ungrouped:
        pytest.exit(f"pytest-xdist did not group {len(ungrouped)} tests (e.g. {ungrouped[0]}) with pytest "
                    f"{pytest.__version__}: the Ray tests would run at once on both processes", returncode=3)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """The tiny default model's tokenizer (15 tokens), from a build without the warm start (only the
    tokenizer is needed: the warm start took 16 s)."""
    from transformers import AutoTokenizer

    from system.config import RunConfig
    from system.models.tiny import build_tiny_model

    cfg = RunConfig()
    untrained = cfg.model.model_copy(update={"warm_start_steps": 0})
    return AutoTokenizer.from_pretrained(build_tiny_model(untrained, cfg.data.task, cfg.seed,
                                                          tmp_path_factory.mktemp("tokenizer")))

# The end of the test process. After the last test this process still holds native runtimes
# that have no ordered teardown: counted at exit on the full suite (2026-11-24, AMD EPYC), the
# threads of Ray's GCS client and gRPC, gloo run loops and a torch TCP store (in-process
# learner and broadcast tests), wandb's service threads and OpenTelemetry exporters. One CI run
# crashed with a segmentation fault in interpreter finalization after "859 passed"; the tests'
# outcome was already final. So once pytest has reported a finished run (passed, failed, or
# nothing collected), the process ends with pytest's own exit status and skips finalization
# (atexit handlers included): a failing suite still fails. Other outcomes (usage errors found
# after the session started, interrupts, internal errors) exit normally, so pytest still prints
# their message after this hook.
_SESSION: list = []
_FINISHED_RUN = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    result = yield  # every plugin's sessionfinish ran (one that raised leaves nothing recorded)
    _SESSION.append(session)
    return result


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if not _SESSION or _SESSION[-1].exitstatus not in _FINISHED_RUN:
        return
    status = int(_SESSION[-1].exitstatus)  # read last, after every plugin's sessionfinish
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# ---- the real-engine tests' model and engines (tests/vllm_engines.py) --------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The real-engine tests' tiny model (``tests/vllm_engines.py``'s ``CFG``)."""
    import numpy as np
    from vllm_engines import CFG

    # The fused correction pass's library is loaded (and run) in this process before any engine is
    # built: a library that broke vLLM's engine construction (as numba's llvmlite did) fails here.
    from system.correction import fused
    from system.models.tiny import build_tiny_model

    if fused.available():
        fused.fused_sums(np.zeros((2, 3), np.float32), np.full((2, 3), -0.1, np.float32), np.ones((2, 3), bool))
    return build_tiny_model(CFG.model, CFG.data.task, CFG.seed, tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def bf16_engine(model_dir):
    from vllm_engines import CFG

    from system.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(model_dir, "bf16", CFG.rollout.engine, seed=0)


@pytest.fixture(scope="module")
def fp8_worker(model_dir):
    from vllm_engines import CFG

    from system.rollout.worker import RolloutWorkerCore

    return RolloutWorkerCore(CFG, model_dir, worker_id="w0")
