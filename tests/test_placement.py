"""Roles land where the config says: rollout workers on nodes offering the ``rollout`` resource,
learner ranks on ``learner`` nodes; with neither resource, everything shares one node.

Three simulated nodes on one machine (``ray.cluster_utils.Cluster``, bound to loopback).
"""

import pytest
import ray
from ray.cluster_utils import Cluster

from actors.cluster import private_cluster_environment
from actors.placement import (
    RoleOptions,
    actor_needs,
    gpu_shared,
    placement_hint,
    plan_placement,
    required_cpus,
    room_for,
    scale_up_note,
)
from system.config import resolve_config

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class WhereAmI:
    """Reports the node it was placed on (a stand-in actor: placement only, no work)."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@pytest.fixture(scope="module")
def cluster():
    private_cluster_environment()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    rollout = c.add_node(num_cpus=2, resources={"rollout": 2})
    learner = c.add_node(num_cpus=2, resources={"learner": 2})
    ray.init(address=c.address)
    yield c, rollout.node_id, learner.node_id
    ray.shutdown()
    c.shutdown()


def place(role_options, count):
    actors = [WhereAmI.options(**role_options.actor_options()).remote() for _ in range(count)]
    return set(ray.get([a.node.remote() for a in actors]))


def test_roles_go_to_their_node_groups(cluster):
    _, rollout_node, learner_node = cluster
    cfg = resolve_config([], ["rollout.num_workers=2", "learner.num_ranks=2"])
    roles = {r.role: r for r in plan_placement(cfg, ray.cluster_resources())}
    assert roles["rollout_worker"].resources == {"rollout": 1.0}
    assert roles["learner_rank"].resources == {"learner": 1.0}
    assert place(roles["rollout_worker"], 2) == {rollout_node}
    assert place(roles["learner_rank"], 2) == {learner_node}


def test_custom_resource_names_and_the_one_machine_default(cluster):
    cfg = resolve_config([], ["ray.rollout_resource=gpu_rollout"])
    roles = {r.role: r for r in plan_placement(cfg, ray.cluster_resources())}
    # No node offers "gpu_rollout": rollout workers are not pinned; learners still are.
    assert roles["rollout_worker"].resources == {} and roles["learner_rank"].resources == {"learner": 1.0}
    local = plan_placement(resolve_config(), None)
    assert all(r.resources == {} for r in local)
    # 1 rollout worker + 2 learner ranks, one CPU each, plus one for the driver.
    assert required_cpus(local) == 4


def test_a_private_cluster_too_small_for_the_roles_is_refused():
    """Found by a review: ``ray.num_cpus=1`` passed ``--dry-run`` and the run then waited for ever for its
    second learner rank; ``ray.learner_gpus=1`` on a machine without a GPU likewise."""
    from actors.placement import private_cluster_shortfall
    from system.config import ConfigError

    # default: 2 learner ranks + 1 rollout worker reserve 3 CPUs
    with pytest.raises(ConfigError, match=r"ray\.num_cpus \(2\) is below the 3 CPUs"):
        resolve_config([], ["ray.num_cpus=2"])
    cfg = resolve_config([], ["ray.num_cpus=3", "ray.learner_gpus=1"])
    assert private_cluster_shortfall(cfg, {"CPU": 3.0}) == [
        "the 2 learner rank(s) and 1 rollout worker(s) reserve 2 GPU but this machine's private cluster has 0 "
        "(set by ray.learner_gpus / ray.rollout_gpus)"]
    assert private_cluster_shortfall(cfg, {"CPU": 4.0, "GPU": 2.0}) == []
    assert private_cluster_shortfall(resolve_config([], []), {"CPU": 2.0})[0].startswith(
        "the 2 learner rank(s) and 1 rollout worker(s) reserve 3 CPU but")
    # a joined cluster may grow (autoscaling): not checked
    assert private_cluster_shortfall(resolve_config([], ["ray.address=auto", "ray.learner_gpus=1"]), {"CPU": 1.0}) == []


def test_room_for_more_workers_is_the_scarcest_resource_over_what_one_takes():
    # floor(5 / 2) = 2 CPU-wise, floor(1.5 / 0.5) = 3 GPU-wise: 2 fit; a resource the cluster lacks: 0
    assert room_for({"CPU": 2.0, "GPU": 0.5}, {"CPU": 5.0, "GPU": 1.5}) == 2
    assert room_for({"CPU": 1.0, "rollout": 1.0}, {"CPU": 8.0}) == 0
    assert room_for({"CPU": 1.0}, {"CPU": 2.9999999999}) == 3  # Ray's float sums of fractional amounts
    assert room_for({}, {}) is None  # an actor that reserves nothing is never short of room
    role = RoleOptions("rollout_worker", 3, num_cpus=1.0, num_gpus=0.0, resources={"rollout": 1.0})
    assert actor_needs(role) == {"CPU": 1.0, "rollout": 1.0}  # zero GPUs left out


def test_a_scale_up_beyond_the_room_says_how_many_fit_and_why_the_rest_wait():
    """Found by a probe: ``aisrl scale --workers 4096`` on a 2-CPU private cluster answered "0 ready
    now" and nothing about the 4094 workers that would never be placed."""
    needs = {"CPU": 1.0}
    assert scale_up_note(2, needs, {"CPU": 2.0}, private=True) is None  # both fit
    note = scale_up_note(4095, needs, {"CPU": 1.0}, private=True)
    assert note.startswith("the cluster has room for 1 more now (free: CPU 1; each worker takes CPU 1); "
                           "the other 4094 wait: this run's private cluster never grows")
    assert "until the cluster offers them" in scale_up_note(3, {"CPU": 1.0, "rollout": 1.0},
                                                          {"CPU": 4.0, "rollout": 1.0}, private=False)


@pytest.mark.parametrize(("learner_gpus", "rollout_gpus", "shared"), [
    (0.0, 0.0, False),  # CPU roles: nothing to share
    (1.0, 0.5, False),  # a rank holds a whole GPU: a worker's half lands on another one
    (0.5, 1.0, False),
    (1.0, 1.0, False),
    (0.5, 0.5, True),   # both ask for half a GPU: Ray may put a rank and a worker on one
    (0.25, 0.5, True),
])
def test_learner_ranks_and_rollout_workers_share_a_gpu_only_when_both_take_a_fraction(learner_gpus, rollout_gpus,
                                                                                       shared):
    """A reviewer's finding: a worker starting beside a rank on one GPU profiles vLLM's free memory while
    the rank loads; the trainer then starts the workers after the ranks (the old order)."""
    roles = {"learner_rank": RoleOptions("learner_rank", 2, 1.0, learner_gpus, {}),
             "rollout_worker": RoleOptions("rollout_worker", 1, 1.0, rollout_gpus, {})}
    assert gpu_shared(roles) is shared


def test_the_learner_ranks_start_warning_says_what_they_reserve_against_the_cluster():
    """Found by a review: on a joined cluster too small for ``learner.num_ranks`` (``sbatch --nodes=2`` of
    the SLURM script: 4 learner GPUs for 8 ranks) the start waited without a word; the stall warning
    now says so. 8 ranks x 1 GPU against 4: too little; against 8: enough in all."""
    ranks = RoleOptions("learner_rank", 8, 1.0, 1.0, {"learner": 1.0})
    small = {"CPU": 64.0, "GPU": 8.0, "learner": 4.0}
    assert placement_hint(ranks, small, "lower learner.num_ranks or add learner nodes") == (
        "the ranks reserve 8 x 1 CPU (the cluster has 64 in all), 8 x 1 GPU (the cluster has 8 in all), "
        "8 x 1 learner (the cluster has 4 in all): too little: lower learner.num_ranks or add learner nodes")
    assert placement_hint(ranks, {"CPU": 64.0, "GPU": 16.0, "learner": 8.0}, "x").endswith(
        "enough in all, unless other actors hold it; or a rank is slow to start (a model download)")
