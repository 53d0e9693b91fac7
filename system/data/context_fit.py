"""Dataset prompts that the model's context cannot hold, found before anything starts.

vLLM refuses a prompt of ``max_model_len`` tokens or more (no room for one generated token); at
run time that is an error inside a generate call, which ends the run, and the prompt would be
issued first again on every resume; a prompt that leaves less than ``rollout.max_new_tokens`` of the
context gets its response cut at the context without a word. So at start every prompt of a dataset
task (``gsm8k``) is tokenised as the rollout workers will send it (the chat template when
``data.task.chat_template``), and those with ``tokens + rollout.max_new_tokens > context``, under
``data.overlong_prompts``:

* ``error`` (default, as verl's ``truncation: error``): the run is refused, naming the file, how
  many prompts and the longest ones;
* ``skip``: they are left out of the prompt pool and counted (``OverlongPrompts.skipped``).

The context is ``max_model_len`` as vLLM (0.32) derives it from the model's config and tokenizer
(``context_length``). A synthetic task's prompts are alike in form: on a pretrained model its longest
(of the first ``SYNTHETIC_SAMPLE``) plus ``rollout.max_new_tokens`` must fit the context
(``check_synthetic_fit``); the tiny model's own check is in the config.
"""

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from system.data.prompt_source import PromptSource
from system.types import Prompt

log = logging.getLogger(__name__)

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
"""The config keys vLLM takes the model's context from (the smallest present wins; ``model_max_length``,
when set, overrides them)."""

UNSCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
"""RoPE kinds whose ``max_position_embeddings`` already counts the scaling (vLLM does not apply their
``factor`` again)."""


def _rope_parameter_sets(hf_config) -> list[dict]:
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    if not isinstance(params, dict) or not params:
        return []
    nested = [p for p in params.values() if isinstance(p, dict) and p]  # one set per layer type
    return nested if nested and len(nested) == len(params) else [params]


def context_length(hf_config) -> int | None:
    """``max_model_len`` as vLLM 0.32 derives it for a generating model when none is given
    (``ModelConfig.get_and_verify_max_len`` -> ``_get_and_verify_max_len``), None when the config names
    no length: the smallest of ``LENGTH_KEYS`` (``model_max_length`` overriding), times the RoPE
    ``factor`` unless the kind already counts it (``UNSCALED_ROPE``; none for Gemma 3), and for LongRoPE
    ``original_max_position_embeddings``. The tokenizer's ``model_max_length`` does not bound it: vLLM
    reads the tokenizer's config only for pooling models with absolute position embeddings (a review
    found the check refusing prompts vLLM takes, e.g. a 131 072-position model whose tokenizer says 16 384)."""
    for key in (*LENGTH_KEYS, "original_max_position_embeddings"):  # a probe: "2" * 2048 as a context
        _check_number(key, getattr(hf_config, key, None))
    found = [v for k in LENGTH_KEYS if isinstance(v := getattr(hf_config, k, None), int | float) and v > 0]
    if not found:
        return None
    override = getattr(hf_config, "model_max_length", None)  # 0 or below: not set (a probe's -5 won)
    length = override if isinstance(override, int | float) and override > 0 else min(found)
    rope = _rope_parameter_sets(hf_config)
    if rope and "gemma3" not in str(getattr(hf_config, "model_type", "")):
        factor = 1.0
        for params in rope:
            if params.get("rope_type", params.get("type")) not in UNSCALED_ROPE:
                factor = params.get("factor", factor)
        _check_number("the RoPE factor", factor, positive=True)
        length *= factor if factor is not None else 1.0
    if any(p.get("rope_type", p.get("type")) == "longrope" for p in rope):
        length = getattr(hf_config, "original_max_position_embeddings", None) or length
    return int(length)


def _check_number(key: str, value, positive: bool = False) -> None:
    """A length or RoPE factor of the model's config: None, or a finite real number (``positive``: > 0). A
    probe's config with factor "2" made the context the string repeated 2048 times, one with factor -2
    refused every prompt as too long; a length of 0 or below counts as not given, as before."""
    if value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        raise ValueError(f"the model's config.json: {key} is {value!r}; expected a finite number"
                         f"{' > 0' if positive else ''} (fix the model's config, or set model.path to another model)")


@dataclass(frozen=True)
class OverlongPrompts:
    """The prompts a run samples from, and those left out (``data.overlong_prompts=skip``)."""

    source: PromptSource
    skipped: tuple[tuple[str, int], ...] = ()
    """``(prompt_id, tokens)`` of each prompt left out."""


class KeptPrompts:
    """``source`` without some indices, re-indexed from 0 (the same prompts at the same index on every run)."""

    def __init__(self, source: PromptSource, kept: Sequence[int]) -> None:
        self._source, self._kept = source, list(kept)

    def __len__(self) -> int:
        return len(self._kept)

    def __getitem__(self, index: int) -> Prompt:
        return self._source[self._kept[index]]


def fit_to_context(source: PromptSource, count_tokens: Callable[[list[Prompt]], list[int]], limit: int,
                   policy: str, where: str, room: int = 1, batch: int = 1024) -> OverlongPrompts:
    """Every prompt of ``source`` that leaves less than ``room`` tokens of the context ``limit``
    (``count_tokens`` of a batch of prompts; ``tokens + room > limit``): ValueError naming ``where``
    under ``policy`` ``error``, left out and counted under ``skip``. ``room`` is the response budget
    (``rollout.max_new_tokens``); 1 finds only what vLLM refuses (a prompt of ``limit`` tokens or more)."""
    if policy not in ("error", "skip"):
        raise ValueError(f"data.overlong_prompts must be error or skip, got {policy!r}")
    kept, over = [], []
    for start in range(0, len(source), batch):
        prompts = [source[i] for i in range(start, min(start + batch, len(source)))]
        for offset, (prompt, tokens) in enumerate(zip(prompts, count_tokens(prompts), strict=True)):
            (over if tokens + room > limit else kept).append((start + offset, prompt.prompt_id, tokens))
    if not over:
        return OverlongPrompts(source)
    over.sort(key=lambda o: -o[2])
    longest = ", ".join(f"{pid} ({tokens})" for _, pid, tokens in over[:3])
    if room <= 1:
        said = (f"{where}: {len(over)} of {len(source)} prompts have at least {limit} tokens, the model's context "
                f"(vLLM cannot sample from them); the longest: {longest}")
        fix = "Shorten them, use a model with a longer context"
    else:
        said = (f"{where}: {len(over)} of {len(source)} prompts leave less than rollout.max_new_tokens ({room}) of "
                f"the model's {limit}-token context for a response (their responses would stop at the context "
                f"without a word); the longest: {longest}")
        fix = (f"Shorten them, lower rollout.max_new_tokens to {limit - over[0][2]} or less" if over[0][2] < limit
               else "Shorten them") + ", use a model with a longer context"
    if policy == "error":
        raise ValueError(f"{said}. {fix}, or set data.overlong_prompts=skip to leave them out (counted)")
    if not kept:
        raise ValueError(f"{said}: every prompt is too long, none is left to train on")
    return OverlongPrompts(KeptPrompts(source, [i for i, _, _ in kept]),
                           tuple((pid, t) for _, pid, t in sorted(over)))


def token_counter(model_dir: str, chat_template: bool, trust_remote_code: bool = False):
    """``(count_tokens, context)`` for the model in ``model_dir``: prompts tokenised as the rollout
    workers send them (text with the tokenizer's special tokens, as vLLM adds them; or the chat
    template's ids), and the context vLLM will give it."""
    from system.models.hf_files import load_config, load_tokenizer
    from system.rollout.chat import chat_prompt_ids

    tokenizer = load_tokenizer(model_dir, trust_remote_code)
    hf_config = load_config(model_dir, trust_remote_code)
    context = context_length(getattr(hf_config, "text_config", None) or hf_config)

    def count_tokens(prompts: list[Prompt]) -> list[int]:
        if chat_template:
            return [len(chat_prompt_ids(tokenizer, p.text)) for p in prompts]
        return [len(ids) for ids in tokenizer([p.text for p in prompts], add_special_tokens=True)["input_ids"]]

    return count_tokens, context


SYNTHETIC_SAMPLE = 2048
"""Prompts of a synthetic task whose lengths are counted (all alike in form: the first ones stand for all)."""


def check_synthetic_fit(source: PromptSource, model_dir: str, cfg) -> None:
    """ValueError when a synthetic task's prompts and ``rollout.max_new_tokens`` do not fit a pretrained
    model's context. Found by probe 10: at a 16-token context, ``max_new_tokens=16`` after 6-token prompts
    cut 285 of 512 responses without a word, and 20-token prompts failed inside vLLM after start-up,
    naming no field (the tiny model's config has its own check)."""
    count_tokens, context = token_counter(model_dir, getattr(cfg.data.task, "chat_template", False),
                                          getattr(cfg.model, "trust_remote_code", False))
    if context is None:
        return
    sample = [source[i] for i in range(min(len(source), SYNTHETIC_SAMPLE))]
    longest, room = max(count_tokens(sample)), cfg.rollout.max_new_tokens
    if longest + room > context:
        fix = (f"lower rollout.max_new_tokens to {context - longest} or less" if longest < context
               else "shorten the task's prompts")
        raise ValueError(f"model.path {model_dir}: its context is {context} tokens; data.task ({cfg.data.task.type}) "
                         f"prompts take up to {longest} and rollout.max_new_tokens is {room}: responses would stop "
                         f"at the context without a word (a prompt of {context} tokens or more, vLLM refuses); "
                         f"{fix}, or use a model with a longer context")


def fit_dataset_prompts(source: PromptSource, model_dir: str, cfg) -> OverlongPrompts:
    """A dataset task's prompts checked against the model's context (``fit_to_context`` under
    ``data.overlong_prompts``); a synthetic task's against a pretrained model's (``check_synthetic_fit``)."""
    task = cfg.data.task
    if task.type != "gsm8k":
        if cfg.model.type == "pretrained":
            check_synthetic_fit(source, model_dir, cfg)
        return OverlongPrompts(source)
    count_tokens, context = token_counter(model_dir, task.chat_template,
                                          getattr(cfg.model, "trust_remote_code", False))
    if context is None:
        log.warning("the model's config names no context length; prompts are not checked against it")
        return OverlongPrompts(source)
    room = cfg.rollout.max_new_tokens
    fitted = fit_to_context(source, count_tokens, context, cfg.data.overlong_prompts, f"data.task.path {task.path}",
                            room=room)
    if fitted.skipped:
        log.warning("data.overlong_prompts=skip: %d prompts of %s leave less than rollout.max_new_tokens (%d) of "
                    "the %d-token context and are left out (ledger/skipped_overlong); the longest: %s",
                    len(fitted.skipped), task.path, room, context,
                    ", ".join(f"{pid} ({n})" for pid, n in sorted(fitted.skipped, key=lambda s: -s[1])[:3]))
    return fitted
