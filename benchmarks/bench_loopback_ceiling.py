"""What one machine's loopback can carry, beside ``bench_weight_transport.py``'s collective figures.

For the same bytes (512 MiB by default), best of 3 after a warm-up round:

* ``memcpy``: ``np.copyto`` in one process (the reference of the issue's ">= 0.5 of memcpy");
* ``tcp``: one process ``sendall``s to another over a 127.0.0.1 socket (``recv_into`` a buffer);
* ``gloo``: ``torch.distributed`` broadcast of ONE tensor from rank 0 to 1 and to 2 receivers
  (gloo bound to loopback), the floor under ``system.weight_broadcast``, which adds a header,
  chunks and the sender's staging copy.

Run: ``.venv/bin/python benchmarks/bench_loopback_ceiling.py [--mib 512]``.
"""

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import emit, positive_int  # noqa: E402

from system.learner.distributed import find_free_port  # noqa: E402

ROUNDS = 4  # the first is a warm-up


def _tcp_receiver(port: int, nbytes: int, ready) -> None:
    with socket.create_server(("127.0.0.1", port)) as server:
        ready.put(True)
        conn, _ = server.accept()
        buf = memoryview(bytearray(nbytes))
        for _ in range(ROUNDS):
            got = 0
            while got < nbytes:
                got += conn.recv_into(buf[got:], nbytes - got)
            conn.sendall(b"k")
        conn.close()


def tcp_gbps(nbytes: int) -> float:
    ctx, port = mp.get_context("spawn"), find_free_port()
    ready = ctx.Queue()
    proc = ctx.Process(target=_tcp_receiver, args=(port, nbytes, ready))
    proc.start()
    ready.get(timeout=60)
    data, times = np.ones(nbytes, np.uint8), []
    with socket.create_connection(("127.0.0.1", port)) as conn:
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            conn.sendall(memoryview(data))
            conn.recv(1)
            times.append(time.perf_counter() - t0)
    proc.join(timeout=60)
    return nbytes / min(times[1:]) / 1e9


def _gloo_member(rank: int, world: int, port: int, nbytes: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(nbytes, dtype=torch.uint8) if rank == 0 else torch.empty(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(ROUNDS):
        dist.barrier()
        t0 = time.perf_counter()
        dist.broadcast(t, 0)
        dist.barrier()  # every receiver holds the tensor
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(nbytes / min(times[1:]) / 1e9)
    dist.destroy_process_group()


def gloo_gbps(nbytes: int, receivers: int) -> float:
    ctx, port = mp.get_context("spawn"), find_free_port()
    out = ctx.Queue()
    procs = [ctx.Process(target=_gloo_member, args=(r, receivers + 1, port, nbytes, out)) for r in range(receivers + 1)]
    for p in procs:
        p.start()
    value = out.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    return value


def memcpy_gbps(nbytes: int) -> float:
    src, dst, times = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8), []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / min(times[1:]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=positive_int, default=512, help="MiB per transfer")
    args = parser.parse_args()
    nbytes = args.mib << 20
    memcpy = memcpy_gbps(nbytes)
    rows = {"tcp_one_stream": tcp_gbps(nbytes), "gloo_broadcast_1_receiver": gloo_gbps(nbytes, 1),
            "gloo_broadcast_2_receivers": gloo_gbps(nbytes, 2)}
    emit("loopback_ceiling_cpu", {"bytes": nbytes, "memcpy_GBps": memcpy,
                                  "GBps_per_receiver": rows,
                                  "fraction_of_memcpy": {k: v / memcpy for k, v in rows.items()}})


if __name__ == "__main__":
    main()
