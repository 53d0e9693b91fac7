"""The prompt-source protocol and its registry keyed by the task config's ``type``.

A prompt source is a finite, indexable, deterministic sequence of :class:`Prompt`: the
controller (and its exactly-once sampler) addresses prompts by index, so a restarted run
sees the same prompt at the same index.
"""

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from system.config.data import ArithmeticTaskConfig, JsonlTaskConfig, TaskConfig
from system.data.arithmetic import ArithmeticPrompts
from system.data.gsm8k import load_gsm8k
from system.types import Prompt


@runtime_checkable
class PromptSource(Protocol):
    """A finite sequence of prompts; ``source[i]`` is the same prompt on every call."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Prompt: ...


def build_prompt_source(task: TaskConfig, seed: int) -> PromptSource:
    """The prompt source of ``task`` (``seed`` fixes the synthetic pool; files ignore it)."""
    if isinstance(task, ArithmeticTaskConfig):
        return ArithmeticPrompts(task, seed)
    if isinstance(task, JsonlTaskConfig):
        return load_gsm8k(task.path, task.prompt_template)
    raise ValueError(f"data.task.type {getattr(task, 'type', task)!r} has no prompt source")


def iter_prompts(task: TaskConfig, seed: int) -> Iterator[Prompt]:
    """Every prompt of the task once, in index order."""
    source = build_prompt_source(task, seed)
    for i in range(len(source)):
        yield source[i]
