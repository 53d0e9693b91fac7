"""``RolloutGroup`` and ``GroupList`` pickle as columns (one bytes object per array field) and load back equal."""

import copy
import pickle

import numpy as np
import pytest

from system.types import Completion, GroupList, Prompt, RolloutGroup, frozen_array


def group(dtype=np.int32, lengths=(3, 0, 2)) -> RolloutGroup:
    prompt = Prompt("p7", "1+2=", "3")
    completions = tuple(
        Completion(prompt_id="p7", sample_index=i, prompt_token_ids=frozen_array([5, 6, i], np.int32),
                   response_token_ids=frozen_array(np.arange(n) + 10 * i, dtype),
                   behaviour_logprobs=frozen_array(-np.arange(n) / 4 - i, np.float32),
                   response_text=f"text {i}", reward=float(i) / 2, policy_version=3 + i,
                   finish_reason="stop" if i else "length", worker_id=f"w{i}")
        for i, n in enumerate(lengths))
    return RolloutGroup(prompt, completions, policy_version=3, worker_id="w0", weights_wait_s=0.25)


def assert_same(a: RolloutGroup, b: RolloutGroup, read_only: bool = True) -> None:
    assert (a.prompt, a.policy_version, a.worker_id, a.weights_wait_s) == (
        b.prompt, b.policy_version, b.worker_id, b.weights_wait_s)
    assert len(a.completions) == len(b.completions)
    for x, y in zip(a.completions, b.completions, strict=True):
        for name in ("prompt_id", "sample_index", "response_text", "reward", "policy_version", "finish_reason",
                     "worker_id"):
            assert getattr(x, name) == getattr(y, name), name
        for name in ("prompt_token_ids", "response_token_ids", "behaviour_logprobs"):
            u, v = getattr(x, name), getattr(y, name)
            assert u.dtype == v.dtype and u.tolist() == v.tolist(), name
            assert not read_only or not v.flags.writeable, name


def test_a_group_round_trips_through_pickle_as_columns():
    g = group()
    # the completions' arrays travel inside three bytes objects, not as 9 numpy arrays
    reduced = g.__reduce__()
    assert reduced[0].__name__ == "_unpack_group"
    heads, columns, prompt_per_group, scalars = reduced[1]
    assert all(isinstance(col[2], bytes) for col in columns.values())
    # the prompt ids differ per completion here ([5, 6, i]), so they are stored per completion: 3 x 3 int32
    assert not prompt_per_group and len(columns["prompt_token_ids"][2]) == 3 * 3 * 4
    assert_same(g, pickle.loads(pickle.dumps(g)))
    assert_same(g, copy.deepcopy(g))
    assert pickle.loads(pickle.dumps(g)).completions[1].uid == "p7#1"


def shared_prompt_group(pid: str, lengths: tuple[int, ...], worker: str = "w0") -> RolloutGroup:
    """A group as a worker makes it: one prompt token array shared by its completions."""
    ids = frozen_array([len(pid), 2, 3, 4, 5], np.int32)
    completions = tuple(
        Completion(prompt_id=pid, sample_index=i, prompt_token_ids=ids, response_token_ids=frozen_array(
                       np.arange(n) + i, np.int32), behaviour_logprobs=frozen_array(-np.arange(n) / 8, np.float32),
                   response_text="x" * n, reward=float(n % 2), policy_version=4, worker_id=worker)
        for i, n in enumerate(lengths))
    return RolloutGroup(Prompt(pid, f"q {pid}", "1"), completions, policy_version=4, worker_id=worker)


def test_a_call_result_round_trips_as_one_set_of_columns():
    groups = GroupList([shared_prompt_group("a", (2, 0, 3)), shared_prompt_group("bb", (1,)),
                        RolloutGroup(Prompt("empty", "", ""), (), 4), shared_prompt_group("c", (4, 4))])
    fn, (heads, columns, prompt_per_group, scalars) = groups.__reduce__()
    assert fn.__name__ == "_unpack_groups"
    # one bytes object per field for the whole call; the prompt ids once per group with completions:
    # 3 groups x 5 int32 = 60 bytes (not 6 completions x 20); responses 2+0+3+1+4+4 = 14 int32 = 56 bytes
    assert prompt_per_group and len(columns["prompt_token_ids"][2]) == 60
    assert len(columns["response_token_ids"][2]) == 56 and columns["behaviour_logprobs"][1] == [2, 0, 3, 1, 4, 4]
    assert [h[-1] for h in heads] == [3, 1, 0, 2]
    loaded = pickle.loads(pickle.dumps(groups))
    assert type(loaded) is list and len(loaded) == 4
    for a, b in zip(groups, loaded, strict=True):
        assert_same(a, b)
    # a group's completions share one prompt array again (as the worker made them)
    assert loaded[0].completions[0].prompt_token_ids is loaded[0].completions[2].prompt_token_ids
    assert loaded[3].completions[1].prompt_token_ids.tolist() == [1, 2, 3, 4, 5]


def test_a_call_result_with_mixed_dtypes_pickles_group_by_group():
    odd = group(dtype=np.int64)  # int64 response ids beside the int32 of the other group
    groups = GroupList([shared_prompt_group("a", (2, 1)), odd])
    assert groups.__reduce__()[0] is list
    loaded = pickle.loads(pickle.dumps(groups))
    assert_same(groups[0], loaded[0])
    assert_same(odd, loaded[1])


def test_mixed_dtypes_fall_back_to_field_by_field():
    g = group()
    odd = Completion(**{**g.completions[0].__dict__, "sample_index": 9,
                        "response_token_ids": frozen_array([1, 2, 3], np.int64)})
    mixed = RolloutGroup(g.prompt, (*g.completions, odd), 3, "w0", 1.5)
    assert mixed.__reduce__()[0] is RolloutGroup
    assert_same(mixed, pickle.loads(pickle.dumps(mixed)), read_only=False)  # numpy's own pickling


def test_columns_whose_lengths_disagree_are_refused():
    from system.types import _unpack_groups

    fn, (heads, columns, prompt_per_group, scalars) = GroupList([shared_prompt_group("a", (1,)), group()]).__reduce__()
    dtype, lengths, data = columns["behaviour_logprobs"]
    # completions: a#0 (1 token), then p7's three (3, 0, 2): shift one token between p7's first two
    columns["behaviour_logprobs"] = (dtype, [lengths[0], lengths[1] - 1, lengths[2] + 1, lengths[3]], data)
    with pytest.raises(ValueError, match=r"p7: response lengths \[3, 0, 2\] but behaviour log-prob lengths \[2, 1, 2\]"):
        _unpack_groups(heads, columns, prompt_per_group, scalars)


def test_a_group_pickled_by_the_earlier_layout_still_loads():
    """Found by a review: checkpoints written before ``GroupList`` hold their buffered groups as calls of
    ``_group_from_columns`` (one group's columns, prompt ids per completion, prompt_id among the
    scalars); without it every such controller.pkl read as "corrupt" and --resume found no checkpoint."""
    import system.types as types

    g = group()
    cs = g.completions
    columns = {name: ("<i4" if name != "behaviour_logprobs" else "<f4", [len(getattr(c, name)) for c in cs],
                      b"".join(getattr(c, name).tobytes() for c in cs))
               for name in ("prompt_token_ids", "response_token_ids", "behaviour_logprobs")}
    scalars = {name: [getattr(c, name) for c in cs] for name in ("prompt_id", "sample_index", "response_text",
                                                                  "reward", "policy_version", "finish_reason",
                                                                  "worker_id")}

    class Old:  # pickles exactly as RolloutGroup.__reduce__ of commit 90b4f03 did
        def __reduce__(self):
            return types._group_from_columns, (g.prompt, g.policy_version, g.worker_id, columns, scalars,
                                               g.weights_wait_s)

    blob = pickle.dumps(Old())
    assert b"_group_from_columns" in blob
    assert_same(g, pickle.loads(blob))
