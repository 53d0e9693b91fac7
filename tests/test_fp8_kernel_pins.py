"""The run's FP8 kernel pins in the rollout pool, with no Ray cluster (``tests/controller_fakes.py``)."""

from controller_fakes import FakeWorkerClass, InProcessRuntime

from actors.placement import RoleOptions
from actors.rollout_pool import RolloutPool
from system.config.loading import resolve_config


def test_the_first_fp8_kernel_chosen_on_a_kind_of_cpu_is_given_to_every_later_worker():
    """A worker's ``auto`` probe may land on either side of the kernel threshold; the run keeps the first
    choice per kind of CPU (``fp8_kernel_pins``) for replacements, scaled-up workers and a resume."""
    def kernel_of(worker_id, pins):  # what a real worker does with ``auto``: the pin, else its own probe
        cpu = "CPU-B" if worker_id == "rollout-2" else "CPU-A"
        probe_says = "vllm" if worker_id == "rollout-1" else "upcast"  # rollout-1's probe would flip
        return {"kernel": pins.get(cpu, probe_says), "cpu": cpu, "pinned": cpu in pins}

    cfg = resolve_config(overrides=["rollout.num_workers=1"])
    cls = FakeWorkerClass(kernel_of)
    pool = RolloutPool(cfg, "unused", RoleOptions("rollout_worker", 1, 1.0, 0.0, {}), cls, InProcessRuntime(),
                       fp8_kernel_pins={"CPU-C": "rowwise"})  # a resumed run's earlier choice on another CPU
    pool.start(1)
    assert cls.pins["rollout-0"] == {"CPU-C": "rowwise"}
    assert pool.fp8_kernel_pins == {"CPU-C": "rowwise", "CPU-A": "upcast"}
    for slot in pool.launch(2):  # a replacement on the same kind of CPU, and one on a new kind
        pool.mark_ready(slot, InProcessRuntime().get(slot.starting))
    assert cls.pins["rollout-1"] == {"CPU-C": "rowwise", "CPU-A": "upcast"}
    record = pool.workers_record()
    assert record["fp8_kernel"]["rollout-1"] == {"kernel": "upcast", "cpu": "CPU-A", "pinned": True}  # not vllm
    assert record["fp8_kernel"]["rollout-2"]["kernel"] == "upcast"  # CPU-B chose by its own probe
    assert record["fp8_kernel_pins"] == {"CPU-C": "rowwise", "CPU-A": "upcast", "CPU-B": "upcast"}
    assert pool.summary() == ("requested fp8, running {'rollout-0': 'fake', 'rollout-1': 'fake', 'rollout-2': 'fake'}"
                              " (rollout-0: FP8 kernel upcast) (rollout-1: FP8 kernel upcast, kept from this run)"
                              " (rollout-2: FP8 kernel upcast)")
