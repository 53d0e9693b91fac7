"""Exactly-once sampler/ledger and the staleness-bounded buffer (Ray-free)."""

import numpy as np
import pytest

from system.data.buffer import TrajectoryBuffer
from system.data.sampler import PromptSampler
from system.types import Completion, Prompt, RolloutGroup


class ListSource:
    def __init__(self, n):
        self.items = [Prompt(f"p{i}", f"{i}+0=", str(i)) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def group(prompt: Prompt, version: int) -> RolloutGroup:
    c = Completion(prompt.prompt_id, 0, np.array([1], np.int32), np.array([2], np.int32),
                   np.array([-0.1], np.float32), "x", 0.0, version)
    return RolloutGroup(prompt, (c,), version)


def test_epoch_is_a_permutation_and_ids_are_unique():
    s = PromptSampler(ListSource(5), seed=3)
    first = s.next_prompts(5)
    second = s.next_prompts(5)
    # Every index once per epoch; ids carry the epoch so a prompt seen twice is two samples.
    assert sorted(p.text for p in first) == sorted(f"{i}+0=" for i in range(5))
    assert sorted(p.text for p in second) == sorted(f"{i}+0=" for i in range(5))
    ids = [p.prompt_id for p in first + second]
    assert len(set(ids)) == 10 and all(i.startswith("e0-") for i in ids[:5]) and all(i.startswith("e1-") for i in ids[5:])


def test_ledger_balances_and_rejects_duplicates():
    s = PromptSampler(ListSource(10), seed=0)
    ps = s.next_prompts(6)
    for p in ps[:4]:
        assert s.mark_generated(p.prompt_id)
    assert not s.mark_generated(ps[0].prompt_id)  # a retried call's late duplicate
    s.mark_trained([ps[0].prompt_id, ps[1].prompt_id])
    s.mark_dropped(ps[2].prompt_id, "stale")
    c = s.counts()
    assert c == {"issued": 6, "in_flight": 2, "buffered": 1, "trained": 2, "dropped": 1,
                 "duplicates": 1, "dropped/stale": 1}
    assert c["issued"] == c["in_flight"] + c["buffered"] + c["trained"] + c["dropped"]
    with pytest.raises(AssertionError):
        s.mark_trained([ps[0].prompt_id])  # never trained twice


def test_requeue_serves_lost_prompts_first_under_the_same_id():
    s = PromptSampler(ListSource(10), seed=0)
    lost = s.next_prompts(3)
    s.requeue([p.prompt_id for p in lost[:2]])
    again = s.next_prompts(3)
    assert [p.prompt_id for p in again[:2]] == [p.prompt_id for p in lost[:2]]
    assert again[2].prompt_id not in {p.prompt_id for p in lost}
    assert s.counts()["issued"] == 4


def test_state_dict_round_trip_continues_identically():
    a = PromptSampler(ListSource(7), seed=1)
    a.next_prompts(9)
    b = PromptSampler(ListSource(7), seed=1)
    b.load_state_dict(a.state_dict())
    assert [p.prompt_id for p in a.next_prompts(8)] == [p.prompt_id for p in b.next_prompts(8)]
    with pytest.raises(ValueError, match="seed"):
        PromptSampler(ListSource(7), seed=2).load_state_dict(a.state_dict())


def test_buffer_enforces_max_lag_at_batch_time():
    buf = TrajectoryBuffer(max_lag=1)
    src = ListSource(4)
    for i, v in enumerate([0, 1, 2, 2]):
        buf.add(group(src[i], v))
    # learner at version 2: lag of version 0 is 2 > 1 -> stale; versions 1, 2 are admissible.
    groups, stale = buf.take(2, learner_version=2)
    assert [g.policy_version for g in stale] == [0]
    assert [g.policy_version for g in groups] == [1, 2]
    groups, stale = buf.take(2, learner_version=3)
    assert groups == [] and stale == [] and len(buf) == 1


def test_sync_mode_drops_everything_not_fresh():
    buf = TrajectoryBuffer(max_lag=0)
    src = ListSource(2)
    buf.add(group(src[0], 4))
    buf.add(group(src[1], 5))
    groups, stale = buf.take(1, learner_version=5)
    assert [g.policy_version for g in groups] == [5] and [g.policy_version for g in stale] == [4]


def test_a_cursor_behind_its_ledger_refuses_to_issue_an_id_twice():
    """A sampler restored with an old cursor but a newer ledger (a corrupt checkpoint) must not
    silently serve prompts that were already trained."""
    s = PromptSampler(ListSource(10), seed=0)
    old = s.state_dict()  # cursor 0
    trained = s.next_prompts(3)
    for p in trained:
        s.mark_generated(p.prompt_id)
    s.mark_trained([p.prompt_id for p in trained])
    stale = {**old, "state": s.state_dict()["state"]}
    # refused when read: the three trained ids lie at or past cursor 0 (first: the first one drawn)
    with pytest.raises(ValueError, match=f"3 ids at or past it already issued \\(first {trained[0].prompt_id};"):
        s.load_state_dict(stale)
    # the other way: a cursor ahead of its ledger (the ledger lost the ids it issued)
    s2 = PromptSampler(ListSource(10), seed=0)
    s2.next_prompts(2)
    with pytest.raises(ValueError, match="2 ids before it not in the ledger"):
        s2.load_state_dict({**s2.state_dict(), "state": {}})
    # and should a state slip past the check, drawing still refuses to issue an id twice
    s3 = PromptSampler(ListSource(10), seed=0)
    s3.state = dict(stale["state"])
    with pytest.raises(RuntimeError, match=f"prompt {trained[0].prompt_id} would be issued a second time"):
        s3.next_prompts(1)


def test_a_resume_refuses_a_prompt_source_that_changed_under_the_same_size():
    """Found by a review: only the prompt count was checked, so a data file edited or replaced with as
    many rows resumed on other prompts (their ids, ``e<epoch>-<index>``, are positions)."""
    a = PromptSampler(ListSource(7), seed=1)
    a.next_prompts(3)
    state = a.state_dict()
    edited = ListSource(7)
    edited.items[6] = Prompt("p6", "6+0=", "7")  # one reference changed (the last row is always sampled)
    with pytest.raises(ValueError, match="other prompts than the configured task's"):
        PromptSampler(edited, seed=1).load_state_dict(state)
    PromptSampler(ListSource(7), seed=1).load_state_dict(state)  # the same source resumes
    old = {k: v for k, v in state.items() if k != "fingerprint"}  # a checkpoint from before the fingerprint
    PromptSampler(edited, seed=1).load_state_dict(old)


def test_finished_epochs_are_folded_into_counts_and_the_ledger_stays_one_epoch_long():
    """The driver's ledger held one entry per prompt ever issued (17 MiB over 1,500 default steps,
    growing for ever; benchmarks/bench_memory_growth.py). Now, when an epoch starts, the earlier epochs'
    trained and dropped prompts become counts; prompts of an old epoch still in flight stay.
    Source of 5, 4 epochs: per epoch issue 5, generate all, train 4 and drop 1; but in epoch 0 one prompt
    (the last) stays generated and untrained until the end."""
    s = PromptSampler(ListSource(5), seed=0)
    sizes, late = [], None
    for epoch in range(4):
        ps = s.next_prompts(5)
        assert {p.prompt_id.split("-")[0] for p in ps} == {f"e{epoch}"}
        for p in ps:
            assert s.mark_generated(p.prompt_id)
        if epoch == 0:
            late = ps[-1].prompt_id  # generated, trained only after epoch 3
            ps = ps[:-1]
        s.mark_trained([p.prompt_id for p in ps[:-1]])
        s.mark_dropped(ps[-1].prompt_id, "stale")
        sizes.append(len(s.state))
    # epoch 0: 5 entries; from epoch 1 on: this epoch's 5 + the late one of epoch 0
    assert sizes == [5, 6, 6, 6]
    assert s.folded == {"trained": 3 + 4 + 4, "dropped": 1 + 1 + 1}
    c = s.counts()
    assert c["issued"] == 20 and c["buffered"] == 1 and c["in_flight"] == 0
    assert c["trained"] == 3 + 4 + 4 + 4 and c["dropped"] == 1 + 1 + 1 + 1
    assert c["issued"] == c["in_flight"] + c["buffered"] + c["trained"] + c["dropped"]
    assert not s.mark_generated("e1-0")  # a late duplicate of a folded (trained) prompt: still a duplicate
    s.mark_trained([late])  # the old epoch's prompt in flight is still in the ledger
    # the checkpoint carries the folded counts; one written before the folding (no "folded") loads as none
    b = PromptSampler(ListSource(5), seed=0)
    b.load_state_dict(s.state_dict())
    assert b.counts() == s.counts()
    old = {k: v for k, v in s.state_dict().items() if k != "folded"}
    b.load_state_dict(old)
    assert b.counts()["issued"] == len(s.state)


def test_a_resume_that_changed_the_group_size_drops_the_buffered_groups_of_the_old_size():
    """Found by a review: a resume with another ``rollout.group_size`` trained batches mixing both sizes
    (the checkpoint keeps its buffered groups), whose sequence count the ranks might not divide. The
    old-size groups are dropped with a reason, the ledger still balances, the new-size ones stay."""
    from actors.run_checkpoint import drop_other_group_sizes

    sampler, buf = PromptSampler(ListSource(6), seed=0), TrajectoryBuffer(max_lag=1)
    prompts = sampler.next_prompts(4)
    for i, p in enumerate(prompts):
        c = Completion(p.prompt_id, 0, np.array([1], np.int32), np.array([2], np.int32), np.array([-0.1], np.float32),
                       "x", 0.0, 0)
        g = RolloutGroup(p, (c, c) if i < 3 else (c,), 0)  # three groups of 2 (the old size), one of 1
        assert sampler.mark_generated(p.prompt_id)
        buf.add(g)
    assert drop_other_group_sizes(sampler, buf, group_size=1) == 3
    assert [g.prompt.prompt_id for g in buf.groups()] == [prompts[3].prompt_id]
    counts = sampler.counts()
    assert counts["dropped/group_size_changed"] == 3 and counts["buffered"] == 1
    assert counts["issued"] == counts["trained"] + counts["dropped"] + counts["in_flight"] + counts["buffered"]
    assert drop_other_group_sizes(sampler, buf, group_size=1) == 0  # nothing else to drop
