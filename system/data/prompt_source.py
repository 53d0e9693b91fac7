"""The prompt-source protocol and its registry keyed by the task config's ``type``.

A prompt source is a finite, indexable, deterministic sequence of :class:`Prompt`: the
controller (and its exactly-once sampler) addresses prompts by index, so a restarted run
sees the same prompt at the same index.
"""

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from system.config.data import (
    ArithmeticTaskConfig,
    JsonlTaskConfig,
    ScratchpadAdditionTaskConfig,
    TaskConfig,
)
from system.data.arithmetic import ArithmeticPrompts
from system.data.gsm8k import load_gsm8k
from system.data.scratchpad import ScratchpadAdditionPrompts
from system.registry import Registry, config_types
from system.types import Prompt


@runtime_checkable
class PromptSource(Protocol):
    """A finite sequence of prompts; ``source[i]`` is the same prompt on every call."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Prompt: ...


AnyTaskConfig = ArithmeticTaskConfig | ScratchpadAdditionTaskConfig | JsonlTaskConfig
"""Any member of the ``data.task`` union."""

PROMPT_SOURCES: Registry[Callable[..., PromptSource]] = Registry("data.task.type", config_types(TaskConfig), {
    "arithmetic": lambda task, seed: ArithmeticPrompts(task, seed),
    "addition-scratchpad": lambda task, seed: ScratchpadAdditionPrompts(task, seed),
    "gsm8k": lambda task, seed: load_gsm8k(task.path, task.prompt_template),
})
"""Prompt-source builders (``(task, seed) -> PromptSource``) keyed by ``data.task.type``."""


def build_prompt_source(task: AnyTaskConfig, seed: int) -> PromptSource:
    """The prompts of ``data.task``; ``seed`` fixes the synthetic pool (files ignore it)."""
    return PROMPT_SOURCES[task.type](task, seed)


