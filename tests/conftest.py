"""Shared fixtures."""

import pytest
import ray

from actors.cluster import use_loopback_only


@pytest.fixture(scope="module")
def loopback_ray(tmp_path_factory):
    """A private Ray cluster on 127.0.0.1 for one test module (8 logical CPUs, 256 MiB object
    store, no dashboard), with its own model cache; shut down after the module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AISRL_CACHE_DIR", str(tmp_path_factory.mktemp("model-cache")))
        use_loopback_only()
        ray.init(address="local", num_cpus=8, include_dashboard=False, object_store_memory=256 * 2**20,
                 _node_ip_address="127.0.0.1", log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()
