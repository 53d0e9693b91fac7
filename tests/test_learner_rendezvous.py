"""Rank 0's rendezvous port is held from the moment it is chosen until the process group owns it.

``LearnerRank.rendezvous_address`` used to pick a free port (bind, read, close) and hand it to the
ranks; rank 0 bound it again only in ``connect``, seconds later while the ranks loaded, so any process
that took the port meanwhile (another run, a Ray worker) failed the run's start. Now rank 0 keeps
the socket listening (``reserve_rendezvous``) and the store listens on a duplicate (``listen_fd``).
"""

import errno
import os
import socket

import psutil
import pytest
import torch
import torch.distributed as dist

from system.learner import distributed


def test_a_reserved_port_cannot_be_taken_before_the_group_forms_on_it():
    fd, port = distributed.reserve_rendezvous("127.0.0.1", world_size=1)
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(OSError) as taken:  # what the other process would get: the port is ours
            other.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        other.close()
    distributed.init_process_group(0, 1, port, "127.0.0.1", listen_fd=fd)
    os.close(fd)  # the caller's own: the store listens on a duplicate
    try:
        t = torch.tensor([3.0])
        dist.all_reduce(t)  # the group works (one rank: the sum is the value)
        assert t.item() == 3.0
        mine = [c.laddr for c in psutil.Process().net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        # one listening socket (the store's duplicate of the reserved one), on loopback only
        assert mine == [("127.0.0.1", port)]
    finally:
        distributed.destroy_process_group()


def test_a_refused_call_leaves_no_socket_behind_once_the_caller_closes_its_own():
    fd, port = distributed.reserve_rendezvous("127.0.0.1", world_size=2)
    with pytest.raises(ValueError, match="only rank 0 hosts the rendezvous"):
        distributed.init_process_group(1, 2, port, "127.0.0.1", listen_fd=fd)
    os.fstat(fd)  # still the caller's (no store took a duplicate)
    os.close(fd)
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.1", port))  # the port is free again: no duplicate kept it
    finally:
        probe.close()
