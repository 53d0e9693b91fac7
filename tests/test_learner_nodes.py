"""Learner ranks on another node: the process group meets at rank 0's node, not the driver's loopback.

Two simulated nodes on one machine at different loopback addresses (``ray.cluster_utils.Cluster``):
the head at 127.0.0.1 and a node at 127.0.0.2 offering the ``learner`` resource, where both real
learner ranks (tiny model, FSDP2 over gloo) are placed. Before the fix every rank met at
127.0.0.1 (the driver's idea of the master address), which on a real cluster is a different
machine's loopback for ranks on other nodes (found by a review: ``configs/multinode.yaml``'s 8
ranks over 2 learner nodes could never connect). Here rank 0's rendezvous store must listen on
its own node's address, 127.0.0.2, and the ranks must train a step together.
"""

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from actors.cluster import private_cluster_environment
from actors.learner_worker import LearnerGroup
from actors.placement import plan_placement
from system.config.loading import resolve_config
from system.models.model_dir import resolve_model_dir

NODE_IP = "127.0.0.2"


@pytest.mark.ray
def test_learner_ranks_meet_at_rank_0s_node(tmp_path, monkeypatch):
    monkeypatch.setenv("AISRL_CACHE_DIR", str(tmp_path / "cache"))
    private_cluster_environment()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"learner": 2}, node_ip_address=NODE_IP)
    group = None
    try:
        cfg = resolve_config([], [f"output_dir={tmp_path / 'run'}", f"ray.address={cluster.address}",
                                  "learner.num_ranks=2", "model.warm_start_steps=0", "prompts_per_step=2",
                                  "rollout.group_size=2"])
        ray.init(address=cluster.address)
        roles = {r.role: r for r in plan_placement(cfg, ray.cluster_resources())}
        assert roles["learner_rank"].resources == {"learner": 1.0}
        group = LearnerGroup(cfg, str(resolve_model_dir(cfg)), roles["learner_rank"])
        ips = ray.get([r.__ray_call__.remote(lambda self: ray.util.get_node_ip_address()) for r in group.ranks])
        assert ips == [NODE_IP, NODE_IP]
        pid = ray.get(group.ranks[0].__ray_call__.remote(lambda self: __import__("os").getpid()))
        listening = {c.laddr for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        store = [a for a in listening if a.ip == NODE_IP]
        assert store, f"rank 0 listens on {sorted(listening)}, not on its node's address {NODE_IP}"
        # (Ray's own worker server may listen on every interface for a non-127.0.0.1 node: not ours;
        # ``test_cluster_loopback`` checks a private cluster's whole process tree)
        assert ray.get([r.policy_version.remote() for r in group.ranks]) == [0, 0]
        ref = group.export_weights()  # a collective over both ranks (an all-gather of the shards)
        assert ray.get(ref).policy_version == 0
    finally:
        if group is not None:
            group.shutdown()
        ray.shutdown()
        cluster.shutdown()
