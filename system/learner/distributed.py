"""Process-group set-up of the learner ranks from explicit arguments: gloo on CPU, NCCL on GPU.

Every learner rank (one Ray actor each, or one process in tests) calls ``init_process_group``
with its own ``rank`` and the shared ``world_size``, ``master_addr`` and ``master_port``; the
address travels in the call, never through ``MASTER_ADDR``/``MASTER_PORT``. A world of size 1
still gets a (1-rank) process group, so FSDP2, DCP and the full-state-dict export run the same
code path for one rank as for many.

When the master address is a loopback address, gloo is pinned to the loopback interface
(``GLOO_SOCKET_IFNAME``, unless the user set it), so single-machine runs and tests keep all
traffic on 127.0.0.1.
"""

import ipaddress
import os
import socket
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it; racy by nature)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def backend_for_device(device: torch.device) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def learner_device(rank: int) -> torch.device:
    """The device of one rank: ``cuda:(rank mod visible GPUs)`` if CUDA is available, else CPU.

    Under Ray each learner actor sees exactly one GPU, so this is ``cuda:0`` there.
    """
    if torch.cuda.is_available():
        index = rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_process_group(
    rank: int,
    world_size: int,
    master_port: int,
    master_addr: str = "127.0.0.1",
    device: torch.device | None = None,
    timeout_s: float = 600.0,
    listen_fd: int | None = None,
) -> torch.device:
    """Join the learner's process group; returns this rank's device. Collective over all ranks.

    ``listen_fd``: rank 0's rendezvous socket, already listening on ``master_addr:master_port``
    (:func:`reserve_rendezvous`); the store listens on a duplicate of it, and the caller closes its
    own. Without it rank 0 binds the port now, which another process may have taken since it was
    chosen."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if not 0 < master_port < 65536:
        raise ValueError(f"master_port must be a TCP port in (0, 65536), got {master_port}")
    if listen_fd is not None and rank != 0:
        raise ValueError(f"only rank 0 hosts the rendezvous (listen_fd given to rank {rank})")
    if dist.is_initialized():
        raise ValueError("a default process group already exists in this process; destroy it first")
    device = device if device is not None else learner_device(rank)
    backend = backend_for_device(device)
    if backend == "gloo" and _is_loopback(master_addr):
        _pin_gloo_to_loopback()
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend=backend,
        store=_rendezvous_store(rank, world_size, master_addr, master_port, timeout, listen_fd),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    return device


def reserve_rendezvous(addr: str, world_size: int) -> tuple[int, int]:
    """Rank 0's rendezvous socket, listening on a free port of ``addr`` from now on (no other process
    can take the port between the choice and the process group): ``(fd, port)`` for
    :func:`init_process_group`'s ``listen_fd`` and ``master_port``."""
    return listening_fd(addr, 0, backlog=max(64, world_size))


def _rendezvous_store(rank: int, world_size: int, addr: str, port: int, timeout: timedelta,
                      listen_fd: int | None = None) -> dist.TCPStore:
    """The TCP store of the rendezvous; rank 0 hosts it on ``addr`` only (on ``listen_fd`` when given).

    ``init_method="tcp://addr:port"`` makes rank 0's store listen on every interface (``*:port``)
    whatever ``addr`` says; binding the socket ourselves and handing it to the store (which owns
    and closes it from then on) keeps a private cluster's rendezvous on 127.0.0.1, and a
    cluster's on the address it configured.
    """
    if rank != 0:
        return dist.TCPStore(addr, port, world_size, False, timeout)
    # a duplicate of the caller's socket (the caller closes its own): the store owns what it is given
    fd, port = (os.dup(listen_fd), port) if listen_fd is not None else listening_fd(addr, port, backlog=max(64, world_size))
    # not closed here if the store fails: it may have closed the socket already (a review: libuv closes
    # a handle it fails to wrap), and closing its number again could close another thread's file
    return dist.TCPStore(addr, port, world_size, True, timeout, wait_for_workers=False, master_listen_fd=fd)


def listening_fd(addr: str, port: int, backlog: int = 64) -> tuple[int, int]:
    """A TCP socket listening on ``addr:port`` only (``port`` 0: a free one), detached for a
    ``TCPStore(master_listen_fd=...)``, which owns and closes it: ``(fd, port)``."""
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(backlog)
        port = int(sock.getsockname()[1])
    except BaseException:
        sock.close()
        raise
    return sock.detach(), port


def destroy_process_group(barrier: bool = False) -> None:
    """Destroy the default process group (no-op if there is none).

    With ``barrier`` (collective) every rank first waits for the others, so no rank tears down
    its connections (or the rendezvous store hosted by rank 0) while a peer still uses them.
    """
    if not dist.is_initialized():
        return
    if barrier:
        dist.barrier()
    dist.destroy_process_group()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _pin_gloo_to_loopback() -> None:
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    if names:
        os.environ["GLOO_SOCKET_IFNAME"] = names[0]


def any_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on any rank (an ``all_reduce`` MAX; the local flag without a process
    group). Collective: every rank gets the same answer, so all raise together or none does."""
    value = torch.tensor([int(flag)], dtype=torch.int64, device=device)
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def all_gather_rows(x_BT: np.ndarray, device: torch.device) -> np.ndarray:
    """Every rank's ``[B_r, T]`` block stacked in rank order, on every rank (collective).

    The blocks must have one shape (``shard_batch`` cuts equal shards). Without a process group
    (one rank) it is ``x_BT`` itself.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return np.asarray(x_BT)
    local = torch.from_numpy(np.array(x_BT, copy=True)).to(device)
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local)
    return torch.cat(parts).cpu().numpy()


def broadcast_array(x: np.ndarray | None, shape: tuple[int, ...], dtype, device: torch.device) -> np.ndarray:
    """Rank 0's array ``x`` on every rank (collective; the other ranks pass None, ``shape`` and ``dtype``)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return np.asarray(x, dtype=dtype)
    if dist.get_rank() == 0:
        if x is None or tuple(np.shape(x)) != tuple(shape):
            raise ValueError(f"rank 0 broadcasts an array of shape {tuple(shape)}, "
                             f"got {None if x is None else np.shape(x)}")
        t = torch.from_numpy(np.array(x, dtype=dtype, copy=True)).to(device)
    else:
        t = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype=dtype)).dtype, device=device)
    dist.broadcast(t, src=0)
    return t.cpu().numpy()
