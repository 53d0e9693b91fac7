"""``RolloutGroup`` pickles as columns (one bytes object per array field) and loads back equal."""

import copy
import pickle

import numpy as np
import pytest

from system.types import Completion, Prompt, RolloutGroup, frozen_array


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
    assert reduced[0].__name__ == "_group_from_columns"
    assert all(isinstance(col[2], bytes) for col in reduced[1][3].values())
    assert_same(g, pickle.loads(pickle.dumps(g)))
    assert_same(g, copy.deepcopy(g))
    assert pickle.loads(pickle.dumps(g)).completions[1].uid == "p7#1"


def test_mixed_dtypes_fall_back_to_field_by_field():
    g = group()
    odd = Completion(**{**g.completions[0].__dict__, "sample_index": 9,
                        "response_token_ids": frozen_array([1, 2, 3], np.int64)})
    mixed = RolloutGroup(g.prompt, (*g.completions, odd), 3, "w0", 1.5)
    assert mixed.__reduce__()[0] is RolloutGroup
    assert_same(mixed, pickle.loads(pickle.dumps(mixed)), read_only=False)  # numpy's own pickling


def test_columns_whose_lengths_disagree_are_refused():
    from system.types import _group_from_columns

    fn, (prompt, version, worker, columns, scalars, waited) = group().__reduce__()
    dtype, lengths, data = columns["behaviour_logprobs"]
    columns["behaviour_logprobs"] = (dtype, [lengths[0] - 1, lengths[1], lengths[2] + 1], data)
    with pytest.raises(ValueError, match="p7: response lengths"):
        _group_from_columns(prompt, version, worker, columns, scalars)
