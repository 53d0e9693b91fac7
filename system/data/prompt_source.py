"""The prompt-source protocol and its registry keyed by the task config's ``type``.

A prompt source is a finite, indexable, deterministic sequence of :class:`Prompt`: the
controller (and its exactly-once sampler) addresses prompts by index, so a restarted run
sees the same prompt at the same index.
"""

from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from system.config.data import ArithmeticTaskConfig, JsonlTaskConfig, ScratchpadAdditionTaskConfig
from system.data.arithmetic import ArithmeticPrompts
from system.data.gsm8k import load_gsm8k
from system.data.scratchpad import ScratchpadAdditionPrompts
from system.types import Prompt


@runtime_checkable
class PromptSource(Protocol):
    """A finite sequence of prompts; ``source[i]`` is the same prompt on every call."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Prompt: ...


AnyTaskConfig = ArithmeticTaskConfig | ScratchpadAdditionTaskConfig | JsonlTaskConfig
"""Any member of the ``data.task`` union."""

_BUILDERS: dict[str, Callable[..., PromptSource]] = {
    "arithmetic": lambda task, seed: ArithmeticPrompts(task, seed),
    "addition-scratchpad": lambda task, seed: ScratchpadAdditionPrompts(task, seed),
    "gsm8k": lambda task, seed: load_gsm8k(task.path, task.prompt_template),
}


def build_prompt_source(task: AnyTaskConfig, seed: int) -> PromptSource:
    """The prompts of ``data.task``; ``seed`` fixes the synthetic pool (files ignore it)."""
    builder = _BUILDERS.get(task.type)
    if builder is None:
        raise ValueError(f"data.task.type {task.type!r} is not one of {sorted(_BUILDERS)}")
    return builder(task, seed)


def iter_prompts(task: AnyTaskConfig, seed: int) -> Iterator[Prompt]:
    """Every prompt of the task once, in index order."""
    source = build_prompt_source(task, seed)
    for i in range(len(source)):
        yield source[i]
