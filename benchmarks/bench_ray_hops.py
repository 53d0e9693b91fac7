"""The Ray floor under the orchestration benchmark's R = L cycle: each hop alone, on idle actors.

``bench_orchestration.py --parts timeline`` splits the R = L cycle into two links of hops (step end
-> the next generate starts sampling; a generate ends -> the next step reaches rank 0). This measures
what the same hops cost with nothing else in them, on a private loopback Ray cluster, wall-clock
stamps across processes of one machine, median of ``--rounds`` after warm-up rounds:

* ``call``: the driver submits a call to an idle actor -> the call starts in the actor (the step
  call reaching rank 0);
* ``return_small``: an actor's call returns a ~34 KB value (64 groups of 8 short completions) -> the
  driver's ``ray.wait`` on it wakes (a generate call's groups reaching the rollout loop);
* ``round_trip``: a no-op call's ``ray.get`` from the driver;
* ``borrowed_ready``: actor A's call (submitted by the driver, so the driver owns its result) returns
  a 2 MB payload -> actor B, blocked in ``ray.wait([ref], fetch_local=False)`` on that borrowed
  reference, wakes (rank 0's new weights reaching a waiting rollout worker); ``borrowed_got``: -> B
  holds the payload (its ``ray.get`` after the wait);
* ``direct_ready`` / ``direct_got``: the alternative where B asks A itself: B's call to A returns a
  reference A made with ``ray.put`` (A owns the payload; stamped before the put) -> B holds the
  reference / holds the payload (its ``ray.get`` of it). A hop of the owner (the driver) fewer.

The last JSON line carries every hop's median in ms. Run:
``.venv/bin/python benchmarks/bench_ray_hops.py [--rounds 30] [--name ray_hops_cpu_amx]``.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import emit, positive_int, result_name  # noqa: E402

WARMUP = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=30)
    parser.add_argument("--name", type=result_name, default="ray_hops_cpu")
    args = parser.parse_args()

    import ray

    from actors.cluster import use_loopback_only
    from actors.ray_internals import LOOPBACK_NODE

    use_loopback_only()
    ray.init(address="local", num_cpus=4, include_dashboard=False, object_store_memory=256 * 2**20,
             log_to_driver=False, **LOOPBACK_NODE)

    @ray.remote
    class Producer:
        def __init__(self) -> None:
            self.payload = np.ones(1_000_000, dtype=np.int16)  # 2 MB, as the benchmark's bf16 weights
            # ~34 KB pickled, as 64 groups x 8 completions: 512 distinct values (one object repeated would
            # pickle once, 1.1 KB)
            self.small = [i.to_bytes(2, "little") * 32 for i in range(512)]

        def started_at(self) -> float:
            return time.time()

        def noop(self) -> None:
            return None

        def small_return(self) -> tuple[float, list]:
            return time.time(), self.small

        def payload_return(self, delay_s: float) -> np.ndarray:
            time.sleep(delay_s)
            self.t_return = time.time()
            return self.payload

        def payload_ref(self, delay_s: float) -> list:
            time.sleep(delay_s)
            self.t_return = time.time()
            return [ray.put(self.payload)]

        def last_return(self) -> float:
            return self.t_return

    @ray.remote
    class Waiter:
        def wait_for(self, holder: list) -> tuple[float, float]:
            ray.wait(holder, timeout=None, fetch_local=False)
            ready = time.time()
            ray.get(holder[0])
            return ready, time.time()

        def pull(self, producer, delay_s: float) -> tuple[float, float]:
            inner = ray.get(producer.payload_ref.remote(delay_s))
            ready = time.time()
            ray.get(inner[0])
            return ready, time.time()

    producer, waiter = Producer.remote(), Waiter.remote()
    ray.get([producer.noop.remote(), waiter.wait_for.remote([ray.put(0)]), waiter.pull.remote(producer, 0.0)])

    hops: dict[str, list[float]] = {k: [] for k in ("call", "return_small", "round_trip", "borrowed_ready",
                                                    "borrowed_got", "direct_ready", "direct_got")}
    for i in range(WARMUP + args.rounds):
        keep = i >= WARMUP
        t0 = time.time()
        started = ray.get(producer.started_at.remote())
        ref = producer.small_return.remote()
        ray.wait([ref], timeout=None)
        woke = time.time()
        returned, _ = ray.get(ref)
        t2 = time.time()
        ray.get(producer.noop.remote())
        t3 = time.time()
        weights = producer.payload_return.remote(0.05)
        woke_b, got_b = ray.get(waiter.wait_for.remote([weights]))
        t_ret = ray.get(producer.last_return.remote())
        del weights
        woke_d, got_d = ray.get(waiter.pull.remote(producer, 0.05))
        t_ret_d = ray.get(producer.last_return.remote())
        if keep:
            hops["call"].append(started - t0)
            hops["return_small"].append(woke - returned)
            hops["round_trip"].append(t3 - t2)
            hops["borrowed_ready"].append(woke_b - t_ret)
            hops["borrowed_got"].append(got_b - t_ret)
            hops["direct_ready"].append(woke_d - t_ret_d)
            hops["direct_got"].append(got_d - t_ret_d)
    medians = {k: 1e3 * statistics.median(v) for k, v in hops.items()}
    for k, v in medians.items():
        print(f"{k:>15}: {v:6.2f} ms (median of {args.rounds})", file=sys.stderr)
    ray.shutdown()
    emit(args.name, {"rounds": args.rounds, "median_ms": medians,
                     "all_ms": {k: [round(1e3 * x, 3) for x in v] for k, v in hops.items()}})


if __name__ == "__main__":
    main()
