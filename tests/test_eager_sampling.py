"""``system.rollout.eager_sampling``: Dynamo off for an eager engine's ``generate`` (vLLM compiles
an op of its sampler even when the engine runs eager; see the module). The engine-level check
(a real ``generate`` compiles nothing): ``tests/test_rollout_vllm.py``."""

import pytest
import torch
from torch._dynamo.utils import counters

from system.rollout.eager_sampling import eager_sampling


def compiled_rank(threshold: int):
    """A ``torch.compile``d function with a code object of its own (Dynamo caches per code object)."""
    ns = {}
    exec(f"def rank(x, v):\n    return (x > v + {threshold}).sum(-1)\n", ns)
    return torch.compile(ns["rank"], backend="eager")


def frames() -> int:
    return counters["frames"]["total"]


def test_inside_the_block_a_compiled_function_runs_eager_and_is_never_traced():
    x = torch.tensor([[0.5, -1.0, 2.0], [3.0, 1.0, 0.0]])
    v = torch.tensor([[0.0], [0.5]])
    # by hand: row 0 has 0.5 and 2.0 above 0.0, row 1 has 3.0 and 1.0 above 0.5
    fn, before = compiled_rank(0), frames()
    with eager_sampling(True):
        assert fn(x, v).tolist() == [2, 2]
    assert frames() == before and torch._dynamo.config.disable is False  # restored after the block
    # the control: the same kind of function, outside the block (or with the switch off), is traced
    other = compiled_rank(1)
    with eager_sampling(False):
        assert other(x, v).tolist() == [1, 1]  # above 1.0 / 1.5: 2.0; 3.0
    assert frames() == before + 1


def test_the_switch_is_restored_when_the_block_raises():
    with pytest.raises(KeyError, match="x"), eager_sampling(True):  # the error goes through, not swallowed
        raise KeyError("x")
    assert torch._dynamo.config.disable is False
