"""A synthetic batch dump with a controlled mismatch, for demos, tests and benchmarks.

Not a model's output: the behaviour log-prob ``log mu`` is drawn as ``-Exp(1)`` per token and the
proximal (trainer's) one is ``log mu + sigma * (1 + lag) * N(0, 1)`` with rare heavy outliers, so the mismatch grows
with the policy lag the way staleness does.
"""

import numpy as np

from system.report.dump import dump_arrays
from system.types import CorrectionInput

_VOCAB = tuple("0123456789+=") + ("<eos>",)


def make_demo_dump(
    num_sequences: int = 64,
    max_len: int = 48,
    sigma: float = 0.05,
    max_lag: int = 2,
    outlier_frac: float = 0.01,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Arrays in the section 6 format (every optional key filled; the advantage is GRPO's of the reward
    within each group of 8)."""
    from system.losses.advantages import group_advantages  # torch: only when a demo dump is made

    if num_sequences < 1 or max_len < 1:
        raise ValueError("num_sequences and max_len must be >= 1")
    rng = np.random.default_rng(seed)
    n, t = num_sequences, max_len
    lengths = rng.integers(max(1, t // 4), t + 1, size=n)
    mask = np.arange(t)[None, :] < lengths[:, None]
    lag = rng.integers(0, max_lag + 1, size=n).astype(np.int32)
    behaviour = -rng.exponential(1.0, size=(n, t)).astype(np.float32)
    noise = rng.standard_normal((n, t)) * sigma * (1 + lag[:, None])
    outliers = rng.random((n, t)) < outlier_frac
    noise = noise + outliers * rng.normal(0.0, 2.0, size=(n, t))
    proximal = np.minimum(behaviour + noise, 0.0).astype(np.float32)
    behaviour, proximal = np.where(mask, behaviour, 0.0), np.where(mask, proximal, 0.0)
    ids = rng.integers(0, len(_VOCAB), size=(n, t)).astype(np.int32)
    token_text = np.array(_VOCAB, dtype=str)[ids]
    token_text = np.where(mask, token_text, "")
    groups = np.arange(n) // 8
    reward = rng.random(n).astype(np.float32)
    batch = CorrectionInput(
        behaviour_BT=behaviour.astype(np.float32), proximal_BT=proximal.astype(np.float32), mask_BT=mask, lag_B=lag,
        advantage_B=group_advantages(reward, groups, scale_by_std=True).numpy(), reward_B=reward,
        response_ids_BT=np.where(mask, ids, 0).astype(np.int32),
        uids=tuple(f"p{g}#{i % 8}" for i, g in enumerate(groups)),
        prompt_texts=tuple(f"{10 + g}+{20 + g}=" for g in groups),
        response_texts=tuple("".join(row[: length]) for row, length in zip(token_text, lengths, strict=True)))
    return dump_arrays(batch, token_text)
