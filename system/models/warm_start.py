"""Supervised warm start of the tiny policy on the task's reference answers.

Each step draws a batch of prompts, builds ``prompt + reference + <eos>`` and minimises the
cross-entropy of the answer tokens only (prompt positions are masked), with AdamW and a
linear decay of the learning rate to zero. A few hundred steps teach the answer format and
part of the arithmetic, so RL starts from a non-zero but far-from-perfect reward.
"""

import random

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from system.data.prompt_source import PromptSource

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


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    prompts: PromptSource,
    num_steps: int,
    lr: float,
    seed: int,
    batch_size: int = 64,
) -> list[float]:
    """Train ``model`` in place for ``num_steps``; returns the loss of every step."""
    rng = random.Random(f"warm-start/{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / max(num_steps, 1))
    model.train()
    losses = []
    for _ in range(num_steps):
        batch = [prompts[rng.randrange(len(prompts))] for _ in range(batch_size)]
        input_ids, labels = answer_batch(tokenizer, batch)
        loss = model(input_ids=input_ids, attention_mask=input_ids.ne(tokenizer.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses
