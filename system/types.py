"""Frozen records that cross actor boundaries: prompts, completions, groups, policy versions.

Token sequences are stored as read-only numpy arrays, which travel through Ray's object store
without a copy; every completion carries the ``policy_version`` of the weights that produced it.
"""

from dataclasses import dataclass, field

import numpy as np


def frozen_array(values, dtype) -> np.ndarray:
    """A read-only 1-D numpy copy of ``values``."""
    arr = np.array(values, dtype=dtype).reshape(-1)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True)
class Prompt:
    """One task instance: the text the policy sees and the reference its reward is scored against."""

    prompt_id: str
    text: str
    reference: str


@dataclass(frozen=True)
class Completion:
    """One sampled response with its behaviour log-probs (processed, after temperature)."""

    prompt_id: str
    sample_index: int
    prompt_token_ids: np.ndarray  # int32 [P]
    response_token_ids: np.ndarray  # int32 [T]
    behaviour_logprobs: np.ndarray  # float32 [T], log mu of each sampled token
    response_text: str
    reward: float
    policy_version: int
    finish_reason: str = "length"
    worker_id: str = ""

    def __post_init__(self) -> None:
        if len(self.response_token_ids) != len(self.behaviour_logprobs):
            raise ValueError(
                f"completion {self.prompt_id}/{self.sample_index}: {len(self.response_token_ids)} "
                f"response tokens but {len(self.behaviour_logprobs)} behaviour log-probs"
            )

    @property
    def uid(self) -> str:
        return f"{self.prompt_id}#{self.sample_index}"


@dataclass(frozen=True)
class RolloutGroup:
    """The G completions of one prompt, all generated with the same policy version."""

    prompt: Prompt
    completions: tuple[Completion, ...]
    policy_version: int
    worker_id: str = ""
    stats: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c in self.completions:
            if c.prompt_id != self.prompt.prompt_id:
                raise ValueError(f"group of {self.prompt.prompt_id} holds a completion of {c.prompt_id}")

    @property
    def rewards(self) -> np.ndarray:
        return np.array([c.reward for c in self.completions], dtype=np.float32)


@dataclass(frozen=True)
class PolicyVersion:
    """A set of exported weights and the learner step that produced them."""

    version: int
    num_parameters: int
