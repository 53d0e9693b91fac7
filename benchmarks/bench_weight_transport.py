"""Weight transport, side by side in one run: bytes and seconds per sync by model size and workers.

For each size (bf16 parameters: 0.1 / 0.5 / 1.5 B by default) and each worker count (1 / 2 / 4):

* ``object_store``: a sender actor ``ray.put``s the payload (what learner rank 0 does), every
  worker actor ``ray.get``s it and copies it into buffers of its own (what loading into an
  engine costs at least), on a private loopback Ray cluster;
* ``collective``: ``system.weight_broadcast`` between processes, one sender and N receivers
  (gloo over loopback), the time of one ``send`` until every receiver holds its copy;
* ``collective_shm``: the same group with ``shared_memory`` (what ``weight_sync.type=collective``
  does when every worker is on learner rank 0's host): the sender writes the data into a shared
  segment, each receiver copies it out, an all-reduce says all copies are done;
* ``collective_shm_inplace``: the same shared group, but the sender writes each version straight
  into the segment (``WeightBroadcast.arena``, what learner rank 0's export does), so ``send`` copies
  nothing; its seconds INCLUDE that write (the export's own work), which the other rows leave out:
  every collective row also reports ``produce_seconds``, the sender's write of the version (into fresh arrays
  for the other transports, timed before the sync), so ``seconds`` here compares with
  ``seconds + produce_seconds`` of ``collective_shm`` as well as with its ``seconds`` alone;
* ``delta_shm``: what ``weight_sync.type=delta`` does on one host: the sender encodes each version
  as a delta against the workers' reconstruction (``system.weight_delta``: rank-4 factors per matrix,
  int8 rows for the rest; the warm-up round is the full version), sends it through the shared
  segment, and each worker decodes it into a full bf16 version; seconds from the encode until every
  worker holds its decoded copy (``wire_bytes_per_worker``: what reached each one);
* ``memcpy``: ``np.copyto`` of the same bytes in one process, the reference bandwidth.

For the collective rows, ``export_plus_sync_seconds`` is the version's write plus the sync
(what a learner pays from the optimizer step until every worker holds the version), and
``sync_only_fraction_of_memcpy`` the sync's share alone (for the in-place row: its seconds minus the
write into the segment, which every transport's export does in some form).

Reported per cell: the median seconds of a sync (after one warm-up), bytes moved, and the
per-worker bandwidth as a fraction of memcpy's. Synthetic payloads shaped like a transformer
(``tests/sim_learner.synthetic_weight_shapes``). Writes
``benchmarks/results/weight_transport_cpu.json``.

    python benchmarks/bench_weight_transport.py
    python benchmarks/bench_weight_transport.py --params 0.1 --workers 1 2 --repeats 3
"""

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from harness import emit, positive_float, positive_int, result_name  # noqa: E402
from sim_learner import synthetic_weight_shapes  # noqa: E402

from system.learner.distributed import find_free_port  # noqa: E402
from system.weight_broadcast import GroupAddress, WeightBroadcast  # noqa: E402
from system.weight_delta import DeltaDecoder, DeltaEncoder  # noqa: E402
from system.weight_payload import WeightPayload  # noqa: E402

GB = 1e9
TRANSPORTS = ("object_store", "collective", "collective_shm", "collective_shm_inplace", "delta_shm")


BF16_ONE_128TH = 0x3C00
"""bf16's bits of 2**-7: each array is filled with a normal number near it (bits ``0x3C00 + i``). The
bits 0-250 used before read as subnormal floats, on which x86 arithmetic is far slower: harmless to a
copy, but the delta codec computes with the values (5.1 s instead of 1.3 s to encode 0.1 B; Intel AMX)."""


def make_payload(params: float) -> WeightPayload:
    shapes = synthetic_weight_shapes(int(params))
    arrays = {name: np.full(shape, BF16_ONE_128TH + i % 251, dtype=np.int16)
              for i, (name, shape) in enumerate(shapes.items())}
    return WeightPayload(policy_version=1, arrays=arrays, dtypes={name: "bfloat16" for name in arrays})


def memcpy_seconds(nbytes: int, repeats: int) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _produce(source: WeightPayload, into: dict[str, np.ndarray] | None) -> WeightPayload:
    """A new version of ``source`` written array by array (what an export does): into fresh arrays,
    or into ``into``'s uint8 places (the shared segment's arena)."""
    arrays = {}
    for name, src in source.arrays.items():
        dst = np.empty_like(src) if into is None else into[name].view(src.dtype).reshape(src.shape)
        np.copyto(dst, src)
        arrays[name] = dst
    return WeightPayload(policy_version=source.policy_version, arrays=arrays, dtypes=source.dtypes)


def _sender(address: GroupAddress, params: float, rounds: int, times, inplace: bool = False,
            delta: bool = False) -> None:
    source = make_payload(params)
    sizes = {name: a.nbytes for name, a in source.arrays.items()}
    group = WeightBroadcast(address, 0, timeout_s=300.0)
    encoder = DeltaEncoder() if delta else None  # round 0 (the warm-up) goes in full, the rest as deltas
    for i in range(rounds):
        payload = None  # the previous version goes first: one alive at a time, as on learner rank 0
        if delta and i:
            for a in source.arrays.values():  # a new version differs from the last (untimed)
                a += 1
        produce_s = 0.0
        if not inplace:  # the version exists before the sync starts, as an export's result does
            t0 = time.perf_counter()
            payload = _produce(source, None)
            produce_s = time.perf_counter() - t0
        group._broadcast(_zero())  # a barrier: every receiver is ready for the round
        t0 = time.perf_counter()
        if inplace:
            arena = group.arena(sizes)
            if arena is None:
                raise RuntimeError("the shared segment could not be made: no in-place variant to measure")
            payload = _produce(source, arena)
            produce_s = time.perf_counter() - t0
        sent = group.send(encoder.encode(payload) if encoder is not None else payload)
        group._broadcast(_zero())  # the receivers hold their copy (they reach this after receive())
        times.put((time.perf_counter() - t0, produce_s, sent))


def _receiver(address: GroupAddress, rank: int, rounds: int, delta: bool = False) -> None:
    group = WeightBroadcast(address, rank, timeout_s=300.0)
    decoder = DeltaDecoder() if delta else None  # a full bf16 version out of each delta, for the engine
    for _ in range(rounds):
        group._broadcast(_zero())
        wire = group.receive()
        if decoder is not None:
            decoder.decode(wire)
        group._broadcast(_zero())


def _zero():
    import torch

    return torch.zeros(1, dtype=torch.int64)


def collective_seconds(params: float, workers: int, repeats: int, shared: bool = False,
                       inplace: bool = False, delta: bool = False) -> list[tuple[float, float, int]]:
    """(seconds of a sync, seconds the sender spent writing the version, bytes sent to each worker) per
    round after the warm-up."""
    ctx = mp.get_context("spawn")
    times = ctx.Queue()
    address = GroupAddress("127.0.0.1", find_free_port(), f"bench-{workers}", workers + 1, shared)
    rounds = repeats + 1
    procs = [ctx.Process(target=_sender, args=(address, params, rounds, times, inplace, delta))]
    procs += [ctx.Process(target=_receiver, args=(address, r, rounds, delta)) for r in range(1, workers + 1)]
    for p in procs:
        p.start()
    out = [times.get(timeout=900) for _ in range(rounds)]
    for p in procs:
        p.join(timeout=120)
    return out[1:]


def object_store_seconds(params: float, workers: int, repeats: int) -> list[float]:
    import ray

    @ray.remote(num_cpus=0)
    class Sender:
        def __init__(self, params: float) -> None:
            self.payload = make_payload(params)

        def put(self):
            return [ray.put(self.payload)]

    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self) -> None:
            self.buffers: dict[str, np.ndarray] = {}

        def load(self, holder: list) -> int:
            payload = ray.get(holder[0])
            for name, arr in payload.arrays.items():
                if name not in self.buffers:
                    self.buffers[name] = np.empty_like(arr)
                np.copyto(self.buffers[name], arr)
            return payload.num_bytes

    sender = Sender.remote(params)
    pool = [Worker.remote() for _ in range(workers)]
    ray.get([w.__ray_ready__.remote() for w in [sender, *pool]])
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        holder = ray.get(sender.put.remote())
        ray.get([w.load.remote(holder) for w in pool])
        times.append(time.perf_counter() - t0)
        del holder
    for actor in [sender, *pool]:
        ray.kill(actor)
    return times[1:]


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


def memory_needed(transport: str, workers: int, nbytes: int) -> float:
    """Bytes a cell holds at once: every worker's copy, plus the sender's payload and the store's copy
    (object store), or the sender's model stand-in, its version and the segment (collective); with
    deltas the sender's and every worker's float32 reconstruction too, and a worker's decoded version."""
    if transport == "object_store":
        return (workers + 2) * nbytes
    if transport == "delta_shm":
        return (5 + 3.5 * workers) * nbytes
    return (workers + 3) * nbytes


def measure(transport: str, params: float, workers: int, nbytes: int, copy_s: float, repeats: int) -> dict:
    """One cell: ``transport`` moving a ``params`` (billions) payload to ``workers`` workers."""
    if transport == "object_store":
        times = object_store_seconds(params * 1e9, workers, repeats)
        produce = None
    else:
        rounds = collective_seconds(params * 1e9, workers, repeats, transport != "collective",
                                    transport == "collective_shm_inplace", transport == "delta_shm")
        times, produce = [t for t, _, _ in rounds], [p for _, p, _ in rounds]
        wire = statistics.median(b for _, _, b in rounds)
    sec = statistics.median(times)
    row = {"params_b": params, "workers": workers, "transport": transport, "bytes_per_worker": nbytes,
           "seconds": sec, "all_seconds": [round(t, 4) for t in times],
           "produce_seconds": None if produce is None else statistics.median(produce),
           "seconds_include_produce": transport == "collective_shm_inplace",
           "per_worker_GB_per_s": nbytes / sec / GB, "memcpy_seconds": copy_s,
           "per_worker_fraction_of_memcpy": copy_s / sec}
    if produce is not None:  # the version's write and the sync, whichever side of the clock it is on
        row["wire_bytes_per_worker"] = wire  # what reached each worker (a delta: its factors and int8 rows)
        row["wire_fraction_of_full"] = wire / nbytes
        inplace = row["seconds_include_produce"]
        row["export_plus_sync_seconds"] = sec if inplace else sec + row["produce_seconds"]
        row["sync_only_seconds"] = sec - row["produce_seconds"] if inplace else sec
        row["sync_only_fraction_of_memcpy"] = copy_s / row["sync_only_seconds"]
    print(f"{params:g}B x {workers} {transport:22s} {sec:.3f} s  per worker "
          f"{row['per_worker_GB_per_s']:.2f} GB/s = {row['per_worker_fraction_of_memcpy']:.2f} memcpy"
          + ("" if produce is None else f"  (produce {row['produce_seconds']:.3f} s, export + sync "
                                          f"{row['export_plus_sync_seconds']:.3f} s, sync alone "
                                          f"{row['sync_only_fraction_of_memcpy']:.2f} memcpy, wire "
                                          f"{row['wire_fraction_of_full']:.3f} of the full bytes)"),
          file=sys.stderr, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=positive_float, nargs="+", default=[0.1, 0.5, 1.5], help="billions")
    parser.add_argument("--workers", type=positive_int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument("--name", type=result_name, default="weight_transport_cpu")
    args = parser.parse_args()
    rows, skipped = [], []
    available = _mem_available()
    sizes = {params: 2 * sum(int(np.prod(shape)) for shape in synthetic_weight_shapes(int(params * 1e9)).values())
             for params in args.params}
    copy_s = {params: memcpy_seconds(nbytes, args.repeats) for params, nbytes in sizes.items()}
    # the object store's cells first, then its cluster goes (its store's memory with it) before the
    # collective ones, whose sender holds the model stand-in, a version and the segment at once
    phases = [[t for t in args.transports if t == "object_store"], [t for t in args.transports if t != "object_store"]]
    for transports in filter(None, phases):
        if transports == ["object_store"]:
            import ray

            from actors.cluster import connect
            from system.config.cluster import RayConfig

            connect(RayConfig(object_store_gib=8.0), num_cpus=8)
        for params, nbytes in sizes.items():
            for workers in args.workers:
                # every worker's copy, plus the sender's payload and the store's copy (object store), or
                # the sender's model stand-in, its version and the segment (collective)
                for transport in transports:
                    need = memory_needed(transport, workers, nbytes)
                    if need > 0.7 * available:
                        skipped.append({"params_b": params, "workers": workers, "transport": transport, "reason":
                                        f"needs ~{need / GB:.1f} GB, {available / GB:.1f} GB available"})
                        print(f"{params:g}B x {workers} {transport}: skipped ({skipped[-1]['reason']})", file=sys.stderr)
                        continue
                    rows.append(measure(transport, params, workers, nbytes, copy_s[params], args.repeats))
        if transports == ["object_store"]:
            ray.shutdown()
    if not rows:  # every size skipped: an empty result would replace the last measured one
        raise SystemExit(f"nothing measured (every size x workers needs more memory than this machine has: "
                         f"{available / GB:.1f} GB available); results/{args.name}.json not written")
    emit(args.name, {"rows": rows, "skipped": skipped, "mem_available_bytes": available, "note": "synthetic transformer-shaped bf16 payloads; loopback; "
                                           "seconds = until every worker holds its own copy"})


if __name__ == "__main__":
    main()
