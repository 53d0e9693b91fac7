"""Supervised warm start of the tiny policy on the task's reference answers.

Each step draws a batch of prompts, builds ``prompt + reference + <eos>`` and minimises the
label-smoothed cross-entropy of the answer tokens only (prompt positions are masked), with
AdamW and a linear decay of the learning rate to zero.

Label smoothing ``eps`` caps what the model can learn to ``p(target) = 1 - eps + eps / V``
(V = vocabulary size): the warm-started policy mostly *knows* the answer (its greedy answer
is often right) but samples it rarely at temperature 1, so RL starts from a modest reward
and can raise it quickly by sharpening, which is what RL on a pretrained model mostly does.

Training runs on one intra-op thread: for a model this small, extra OpenMP threads only
spin, and on a loaded 2-core machine they made the warm start 10x slower (measured).
"""

import random
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from system.data.prompt_source import PromptSource
from system.types import Prompt

IGNORE = -100
"""Label of positions that carry no loss."""


def answer_batch(tokenizer: PreTrainedTokenizerFast, prompts: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids [B, L]`` and ``labels [B, L]`` (IGNORE outside the answers)."""
    rows, label_rows = [], []
    for p in prompts:
        prompt_ids = tokenizer.encode(p.text)
        answer_ids = tokenizer.encode(p.reference) + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        label_rows.append([IGNORE] * len(prompt_ids) + answer_ids)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, label_rows, strict=True)):
        input_ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(lab)] = torch.tensor(lab)
    return input_ids, labels


@contextmanager
def single_thread() -> Iterator[None]:
    """Run the body with one torch intra-op thread, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    prompts: PromptSource,
    num_steps: int,
    lr: float,
    seed: int,
    label_smoothing: float = 0.0,
    batch_size: int = 64,
) -> list[float]:
    """Train ``model`` in place for ``num_steps``; returns the loss of every step. A prompt whose
    text and reference hold more characters than ``tokenizer.model_max_length`` positions (each
    character is at least one token, so it cannot fit) is drawn again: the run's context check
    refuses or skips it later (``data.overlong_prompts``), and one such prompt must not pad every
    batch to its length (a 50 KB prompt asked for 160 GB). When draws keep finding none that fits
    (``MAX_DRAWS_PER_ROW`` a row), the warm start ends early (and the tiny model's build refuses the
    context, ``system.models.tiny``: an untrained model must not be trained on)."""
    with single_thread():
        return _train(model, tokenizer, prompts, num_steps, lr, seed, label_smoothing, batch_size)


MAX_DRAWS_PER_ROW = 100
"""Draws a warm-start row may take to find a prompt that fits before the warm start ends."""


def _draw(prompts: PromptSource, rng: random.Random, max_chars: int) -> Prompt | None:
    for _ in range(MAX_DRAWS_PER_ROW):
        prompt = prompts[rng.randrange(len(prompts))]
        if len(prompt.text) + len(prompt.reference) < max_chars:  # + <eos>
            return prompt
    return None


def _train(model, tokenizer, prompts, num_steps, lr, seed, label_smoothing, batch_size) -> list[float]:
    rng = random.Random(f"warm-start/{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / max(num_steps, 1))
    model.train()
    losses = []
    for _ in range(num_steps):
        batch = [_draw(prompts, rng, tokenizer.model_max_length) for _ in range(batch_size)]
        if any(p is None for p in batch):
            break  # (nearly) every prompt is too long to train on
        input_ids, labels = answer_batch(tokenizer, batch)
        logits = model(input_ids=input_ids, attention_mask=input_ids.ne(tokenizer.pad_token_id).long()).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE,
            label_smoothing=label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses
