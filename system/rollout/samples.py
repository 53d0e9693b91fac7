"""What the engine returns for one prompt: its token ids and ``n`` sampled responses.

``behaviour_logprobs`` are vLLM's *processed* log-probs of the sampled tokens: after
temperature (and top-k / top-p, renormalised over the kept tokens), i.e. log mu of the
distribution actually sampled.
They may hold ``-inf``/``nan`` (e.g. a token outside an FP8 model's support); they are kept
as they are, and the correction core masks non-finite values. A response may be only an
end-of-sequence token (``text == ""``).
"""

from dataclasses import dataclass

import numpy as np

from system.types import frozen_array


@dataclass(frozen=True)
class SampledResponse:
    """One sampled response: token ids (int32), their behaviour log-probs (float32), text."""

    response_token_ids: np.ndarray
    behaviour_logprobs: np.ndarray
    text: str
    finish_reason: str

    def __post_init__(self) -> None:
        if len(self.response_token_ids) != len(self.behaviour_logprobs):
            raise ValueError(
                f"{len(self.response_token_ids)} response tokens but "
                f"{len(self.behaviour_logprobs)} behaviour log-probs"
            )

    @classmethod
    def of(cls, token_ids, logprobs, text: str, finish_reason: str | None) -> "SampledResponse":
        return cls(frozen_array(token_ids, np.int32), frozen_array(logprobs, np.float32),
                   text, finish_reason or "length")


@dataclass(frozen=True)
class PromptSamples:
    """The prompt's token ids (int32) and its ``n`` responses."""

    prompt_token_ids: np.ndarray
    responses: tuple[SampledResponse, ...]
