"""Config of the prompt source (a union on ``type``) and its verifiable reward (a union on ``type``)."""

import string
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from system.config.base import StrictModel, expand_home


class ArithmeticTaskConfig(StrictModel):
    type: Literal["arithmetic"] = "arithmetic"
    """Synthetic multi-digit addition prompts generated from a seed (the embedded default)."""
    num_digits: int = Field(default=2, ge=1, le=9)
    """Digits of each operand."""
    num_prompts: int = Field(default=100_000, ge=1, le=10_000_000)
    """Size of the prompt pool (at most 10 M: the sampler holds a permutation of it, 8 bytes a prompt);
    an epoch ends after this many prompts."""

    def answer_chars(self) -> int:
        """Characters of the longest reference answer: the n + 1 digits of a sum of two n-digit numbers."""
        return self.num_digits + 1


class ScratchpadAdditionTaskConfig(StrictModel):
    type: Literal["addition-scratchpad"] = "addition-scratchpad"
    """Synthetic addition answered with a written tape, one line per column (a long response):
    ``"4729+3856="`` -> ``".472+.385|1|5...;..47+..38|0|85..;...4+...3|1|585.;....+....|0|8585>08585"``."""
    num_digits: int = Field(default=4, ge=1, le=9)
    """Digits of each operand; the reference is ``3 n^2 + 6 n + 1`` characters (= tokens of the tiny
    model's character tokenizer): 73 for 4 digits, 106 for 5, 145 for 6."""
    num_prompts: int = Field(default=100_000, ge=1, le=10_000_000)
    """Size of the prompt pool (at most 10 M: the sampler holds a permutation of it, 8 bytes a prompt);
    an epoch ends after this many prompts."""

    def answer_chars(self) -> int:
        """Characters of the longest reference answer: the tape's ``3 n^2 + 6 n + 1``."""
        return 3 * self.num_digits**2 + 6 * self.num_digits + 1


class JsonlTaskConfig(StrictModel):
    type: Literal["gsm8k"] = "gsm8k"
    """GSM8K-style rows (``question``, ``answer`` ending in ``#### <number>``) from jsonl or parquet."""
    path: str = Field(min_length=1)
    """Path of a ``.jsonl`` or ``.parquet`` file."""
    prompt_template: str = "Question: {question}\nAnswer:"
    """Template formatting each row's ``question`` into the prompt."""
    chat_template: bool = False
    """Send each prompt as one user turn in the model's chat template, the assistant's turn opened
    (Instruct models; the tokenizer must have a template). The learner scores the same token ids."""

    def answer_chars(self) -> int:
        """0: a dataset's answers are not known before it is read."""
        return 0

    @field_validator("path")
    @classmethod
    def _home(cls, value: str) -> str:
        return expand_home(value)  # "~/data/x.jsonl": the home directory, not "./~"

    @model_validator(mode="after")
    def _suffix(self) -> "JsonlTaskConfig":
        if not self.path.endswith((".jsonl", ".parquet")):
            raise ValueError(f"path must end in .jsonl or .parquet, got {self.path!r}")
        try:
            parsed = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(self.prompt_template)
                      if name is not None]
        except ValueError as exc:  # an unmatched brace
            raise ValueError(f"prompt_template: {exc} (write a literal brace as {{{{ or }}}})") from None
        fields = {name for name, _, _ in parsed}
        if fields != {"question"}:
            raise ValueError(f"prompt_template must hold the placeholder {{question}} and no other, got "
                             f"{sorted(fields) or 'none'} (write a literal brace as {{{{ or }}}})")
        for name, spec, conversion in parsed:
            if spec or conversion:  # "{question:>{width}}" / "{question!x}" fail only when a prompt is made
                raise ValueError(f"prompt_template: write the placeholder as plain {{question}}, got "
                                 f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                                 "(no format spec or conversion)")
        return self


TaskConfig = Annotated[ArithmeticTaskConfig | ScratchpadAdditionTaskConfig | JsonlTaskConfig,
                      Field(discriminator="type")]


class DigitMatchReward(StrictModel):
    type: Literal["digit-match"] = "digit-match"
    """Partial credit: fraction of answer digits right in place, 1.0 for an exact answer."""


class MathAnswerReward(StrictModel):
    type: Literal["math-answer"] = "math-answer"
    """1.0 if the number right after the last ``####`` equals the reference (without a ``####``: the last
    number; a markdown ``#### Heading`` line is not a marker), else 0; see ``rewards/math_answer.py``."""
    format_bonus: float = Field(default=0.0, ge=0.0, le=1.0)
    """Reward for a well-formed ``#### <number>`` answer that is wrong."""


class ScratchpadReward(StrictModel):
    type: Literal["scratchpad"] = "scratchpad"
    """Partial credit for the scratchpad task: half for the tape lines (one per column) right in place, half for
    the digits of the final sum right in place (``system/rewards/scratchpad.py``)."""


RewardConfig = Annotated[DigitMatchReward | MathAnswerReward | ScratchpadReward, Field(discriminator="type")]


class DataConfig(StrictModel):
    task: TaskConfig = Field(default_factory=ArithmeticTaskConfig)
    """Where prompts and reference answers come from."""
    reward: RewardConfig = Field(default_factory=DigitMatchReward)
    """How a completion is scored against its reference."""
    overlong_prompts: Literal["error", "skip"] = "error"
    """A dataset prompt that leaves less than ``rollout.max_new_tokens`` of the model's context for its
    response (its response would stop at the context; vLLM refuses a prompt of ``max_model_len``
    tokens or more): ``error`` refuses the run at start, naming the file and the longest prompts; ``skip`` leaves
    them out of the prompt pool, counted as ``ledger/skipped_overlong`` (``system.data.context_fit``)."""
