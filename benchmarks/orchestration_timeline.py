"""The orchestration benchmark's timeline (``bench_orchestration.py --parts timeline``): the driver's
hand-offs stamped beside the simulated actors' (``sim_actors.stamp``, one JSONL file, wall clock),
and the median latency of each hop of the R = L critical cycle's two links."""

import statistics

from sim_actors import stamp

import actors.trainer as trainer_module
from actors.trainer import Trainer


def stamp_driver(trainer: Trainer, path: str):
    """Wrap the driver's hand-offs of one trainer so each stamps ``path`` (``sim_actors.stamp``);
    returns the function that unwraps them all (some are module or shared-runtime attributes)."""
    loop, state = trainer.rollout, trainer.state
    undo = []

    def wrap(owner, name, before=None, after=None):
        inner = getattr(owner, name)
        had_own = name in vars(owner)
        undo.append(lambda: setattr(owner, name, inner) if had_own else delattr(owner, name))

        def wrapped(*args, **kwargs):
            if before:
                before(*args)
            result = inner(*args, **kwargs)
            if after:
                after(result)
            return result
        setattr(owner, name, wrapped)

    def push_before():
        version = max(state.offers)
        if any(s.starting is None and s.policy_version < version for s in loop.pool.slots_now()):
            stamp(path, "push", v=version)

    wrap(state, "publish", before=lambda version, ref: stamp(path, "publish", v=version),
         after=lambda _: stamp(path, "published"))
    # inside the hops: the rollout loop's wait returning a result and its get, the batch's collation,
    # its put (done when the learners' submit starts) and the step's calls sent
    wrap(loop.runtime, "wait", after=lambda res: res[0] and stamp(path, "wait_returned"))
    wrap(loop.runtime, "get", after=lambda res: isinstance(res, list) and stamp(path, "got"))
    wrap(trainer.learners, "submit", before=lambda *a: stamp(path, "put_done"), after=lambda _: stamp(path, "calls_sent"))
    wrap(trainer, "_complete", before=lambda sub: stamp(path, "complete", step=sub.step),
         after=lambda _: stamp(path, "completed"))
    wrap(trainer.records, "sent", before=lambda *a: stamp(path, "record_made"))
    wrap(loop, "_push_weights", before=push_before)
    wrap(loop, "_accept", before=lambda groups: stamp(path, "accept"))
    wrap(trainer, "_submit", after=lambda sub: sub is not None and stamp(path, "submitted", step=sub.step))

    def after_taken(result):
        if result[0]:
            stamp(path, "taken")
    wrap(trainer_module, "take_batch", after=after_taken)  # the trainer's names for them
    wrap(trainer_module, "collate_groups", after=lambda _: stamp(path, "collated"))

    def restore():
        for step in reversed(undo):
            step()
    return restore


def _finder(events: list[dict]):
    """``first(kind, after, **fields)``: the time of the first event of ``kind`` at or after ``after``
    whose fields match, None if there is none."""
    events = sorted(events, key=lambda e: e["t"])

    def first(kind, after, **fields):
        return next((e["t"] for e in events if e["kind"] == kind and e["t"] >= after
                     and all(e.get(k) == v for k, v in fields.items())), None)
    return first


def timeline_links(events: list[dict], first_step: int) -> dict:
    """Per hop, the median milliseconds over the steps from ``first_step``: link 1, step k ends (rank 0)
    -> the generate call with version k starts sampling (when version k was offered after the step:
    -> publish -> push -> offer -> adopted; when it was offered at submit: how long before the step's
    end the offer and the waiting call reached the worker); link 2, a generate call ends -> accept ->
    taken -> submitted -> the step call reaches rank 0."""
    first = _finder(events)

    link1 = {h: [] for h in ("end_to_publish", "publish_to_push", "push_to_offer", "offer_to_gen_start", "total",
                             "offer_before_end", "gen_call_before_end")}
    for step in sorted({e["step"] for e in events if e["kind"] == "step_end" and e["step"] >= first_step}):
        t_end = first("step_end", 0, step=step, rank=0)
        t_gen = t_end and first("gen_start", t_end, v=step)
        if t_end is None or t_gen is None:
            continue
        link1["total"].append(t_gen - t_end)
        t_offer = first("offer", 0, v=step)
        if t_offer is not None and t_offer < t_end:  # offered at submit (while the step ran)
            link1["offer_before_end"].append(t_end - t_offer)
            t_call = max((e["t"] for e in events if e["kind"] == "gen_call" and e["v"] <= step and e["t"] < t_end),
                         default=None)
            if t_call is not None:
                link1["gen_call_before_end"].append(t_end - t_call)
            continue
        t_pub = first("publish", t_end, v=step)  # offered after the step (the driver's round trip)
        t_push = t_pub and first("push", t_pub, v=step)
        t_offer = t_push and first("offer", t_push, v=step)
        if None in (t_pub, t_push, t_offer):
            continue
        for hop, dt in zip(("end_to_publish", "publish_to_push", "push_to_offer", "offer_to_gen_start"),
                           (t_pub - t_end, t_push - t_pub, t_offer - t_push, t_gen - t_offer), strict=True):
            link1[hop].append(dt)
    link2 = {h: [] for h in ("gen_end_to_accept", "accept_to_taken", "taken_to_submitted", "submitted_to_step_call",
                             "total")}
    start = first("step_call", 0, step=first_step, rank=0) or 0.0
    for e in (e for e in events if e["kind"] == "gen_end" and e["t"] >= start):
        t_acc = first("accept", e["t"])
        t_take = t_acc and first("taken", t_acc)
        t_sub = t_take and first("submitted", t_take)
        t_call = t_sub and first("step_call", t_sub, rank=0)
        if None in (t_acc, t_take, t_sub, t_call) or t_call - e["t"] > 0.25:  # not a batch's last call
            continue
        for hop, dt in zip(link2, (t_acc - e["t"], t_take - t_acc, t_sub - t_take, t_call - t_sub, t_call - e["t"]),
                           strict=True):
            link2[hop].append(dt)
    median = {name: {h: round(1e3 * statistics.median(v), 2) if v else None for h, v in link.items()}
              for name, link in (("step_end_to_generate", link1), ("generate_end_to_step", link2))}
    median["samples"] = {"step_end_to_generate": len(link1["total"]), "generate_end_to_step": len(link2["total"])}
    return median


LINK1_CHAIN = (("weights_return", "step"), ("load_start", "v"), ("load_got", "v"), ("gen_start", "v"))
"""Step k ends on rank 0 -> its export thread returns version k -> the worker sees the weights exist
and starts loading -> has them -> starts sampling with version k."""
LINK2_CHAIN = ("wait_returned", "got", "accept", "taken", "collated", "put_done", "calls_sent", "step_call")
"""A batch's last generate call ends -> the rollout loop's ``ray.wait`` returns it -> its groups are
unpickled -> accepted -> the batch taken -> collated -> put -> the step's calls sent -> rank 0 starts it."""


def timeline_hops(events: list[dict], first_step: int) -> dict:
    """The two links of :func:`timeline_links` cut at every stamp inside them (the driver's, rank 0's
    export and the worker's load): the median milliseconds of each hop, and the samples."""
    first = _finder(events)

    link1 = {f"{a[0]}->{b[0]}": [] for a, b in zip((("step_end", "step"), *LINK1_CHAIN), LINK1_CHAIN, strict=False)}
    for step in sorted({e["step"] for e in events if e["kind"] == "step_end" and e["step"] >= first_step}):
        times = [first("step_end", 0, step=step, rank=0)]
        for kind, key in LINK1_CHAIN:
            times.append(times[-1] and first(kind, times[-1], **{key: step}))
        if None not in times:
            for hop, dt in zip(link1, (b - a for a, b in zip(times, times[1:], strict=False)), strict=True):
                link1[hop].append(dt)
    link2 = {f"{a}->{b}": [] for a, b in zip(("gen_end", *LINK2_CHAIN), LINK2_CHAIN, strict=False)}
    start = first("step_call", 0, step=first_step, rank=0) or 0.0
    for e in (e for e in events if e["kind"] == "gen_end" and e["t"] >= start):
        times = [e["t"]]
        for kind in LINK2_CHAIN:
            times.append(times[-1] and first(kind, times[-1], **({"rank": 0} if kind == "step_call" else {})))
        if None in times or times[-1] - times[0] > 0.25:  # not a batch's last call
            continue
        for hop, dt in zip(link2, (b - a for a, b in zip(times, times[1:], strict=False)), strict=True):
            link2[hop].append(dt)
    return {name: {"median_ms": {h: round(1e3 * statistics.median(v), 2) if v else None for h, v in link.items()},
                   "samples": min((len(v) for v in link.values()), default=0)}
            for name, link in (("step_end_to_generate", link1), ("generate_end_to_step", link2))}
