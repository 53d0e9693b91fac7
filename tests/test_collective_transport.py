"""The driver's side of ``weight_sync.type=collective``: which broadcast generation rank 0 hosts as
workers come and go, and when a retiring worker may be removed (never while a generation that the
staying workers use still holds it: its removal would fail their next broadcast). No Ray: rank 0's
and the workers' calls are the in-process stand-ins of ``tests/controller_fakes.py``."""

from types import SimpleNamespace

from controller_fakes import InProcessRuntime, Method

from actors.rollout_pool import WorkerSlot
from actors.weight_sync import CollectiveTransport
from system.config import resolve_config


def rank0(log: list, held: list):
    """Rank 0's broadcast calls; held (not returned) until released, as a rank busy with a step is."""
    return SimpleNamespace(
        open_broadcast=Method(lambda number, world: log.append(("open", number, world)) or f"gen-{number}", held),
        close_broadcast=Method(lambda: log.append(("close",)), held))


def slot(worker_id: str, log: list) -> WorkerSlot:
    handle = SimpleNamespace(join_broadcast=Method(lambda address, rank, *_: log.append(("join", worker_id, address,
                                                                                        rank))))
    return WorkerSlot(worker_id, handle, starting=None, launched_at=0.0)


def release(held: list) -> None:
    for ref in held[1:]:
        ref.release()
    del held[1:]


def test_generations_follow_the_ready_workers_down_to_none_and_hold_a_leaving_worker_until_rank_0_left():
    log, held = [], [True]
    cfg = resolve_config(overrides=["weight_sync.type=collective"])
    transport = CollectiveTransport(cfg, SimpleNamespace(ranks=[rank0(log, held)]), InProcessRuntime())
    a, b = slot("rollout-0", log), slot("rollout-1", log)
    pool = SimpleNamespace(ready=lambda: [a, b])

    transport.maintain(pool)  # generation 1 of rank 0 + 2 workers: opening until rank 0 answers
    assert log == [] and transport.generation == 1
    transport.maintain(pool)  # still opening: nothing more is asked
    release(held)
    transport.maintain(pool)
    assert log == [("open", 1, 3), ("join", "rollout-0", "gen-1", 1), ("join", "rollout-1", "gen-1", 2)]
    assert transport.members == ("rollout-0", "rollout-1") and transport.releases("rollout-1") is False

    b.retiring = True  # scaled 2 -> 1: generation 2 without it; it stays until rank 0 has left generation 1
    log.clear()
    transport.maintain(pool)
    assert transport.generation == 2 and not transport.releases("rollout-1")  # the open has not returned
    release(held)
    transport.maintain(pool)
    assert log == [("open", 2, 2), ("join", "rollout-0", "gen-2", 1)]
    assert transport.releases("rollout-1") and not transport.releases("rollout-0")

    a.retiring = True  # scaled 1 -> 0: generation 2 is closed, none opened
    pool = SimpleNamespace(ready=lambda: [a])
    log.clear()
    transport.maintain(pool)
    assert not transport.releases("rollout-0")
    release(held)
    transport.maintain(pool)
    assert log == [("close",)] and transport.members == () and transport.releases("rollout-0")
    transport.maintain(pool)
    transport.maintain(SimpleNamespace(ready=lambda: []))
    assert log == [("close",)] and transport.generation == 2  # closed once; nothing to re-form

