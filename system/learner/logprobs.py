"""Per-token log-probs (and optionally entropies) of the sampled tokens under the learner's model.

    logp[b, s] = log softmax(logits[b, s-1] / temperature)[input_ids[b, s]]
               = z[b, s-1, ids[b, s]] - logsumexp_v z[b, s-1, v],    z = logits / temperature
    logp[b, 0] = 0                                                     (no context)

    H[b, s] = logsumexp_v z - sum_v softmax(z)_v z_v                   (entropy of that distribution)

``temperature`` must be the rollout's sampling temperature: vLLM returns processed
(tempered) log-probs, and ``old/mu`` is only meaningful if both sides use the same one.

Memory: the model's logits come in ``param_dtype``; they are upcast once to an fp32
``[B, S, V]`` tensor ``z``. The log-prob is a gather minus a logsumexp, so no second fp32
``[B, S, V]`` log-softmax is kept; the entropy (no gradient) is computed in row chunks.
"""

import torch
from torch import nn

_ENTROPY_CHUNK_ROWS = 1024


def _scaled_logits_BSV(
    model: nn.Module, input_ids_BS: torch.Tensor, attention_mask_BS: torch.Tensor, temperature: float
) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids_BS.shape != attention_mask_BS.shape or input_ids_BS.dim() != 2:
        raise ValueError(
            f"input_ids_BS {tuple(input_ids_BS.shape)} and attention_mask_BS "
            f"{tuple(attention_mask_BS.shape)} must be equal [B, S] shapes"
        )
    logits_BSV = model(input_ids=input_ids_BS, attention_mask=attention_mask_BS.long()).logits
    return logits_BSV.float() / temperature


def _gather_logp_BS(z_BSV: torch.Tensor, input_ids_BS: torch.Tensor) -> torch.Tensor:
    """``logp_BS`` from the scaled logits; position 0 gets 0."""
    z_prev_BSV = z_BSV[:, :-1]
    target_BS = input_ids_BS[:, 1:].unsqueeze(-1)
    picked_BS = z_prev_BSV.gather(-1, target_BS).squeeze(-1)
    logp_BS = picked_BS - torch.logsumexp(z_prev_BSV, dim=-1)
    return torch.nn.functional.pad(logp_BS, (1, 0), value=0.0)


@torch.no_grad()
def _entropy_BS(z_BSV: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution predicting token s, at s (0 at s = 0)."""
    z_prev_NV = z_BSV[:, :-1].detach().reshape(-1, z_BSV.shape[-1])
    out_N = torch.empty(z_prev_NV.shape[0], dtype=torch.float32, device=z_BSV.device)
    for start in range(0, z_prev_NV.shape[0], _ENTROPY_CHUNK_ROWS):
        chunk_NV = z_prev_NV[start : start + _ENTROPY_CHUNK_ROWS]
        lse_N = torch.logsumexp(chunk_NV, dim=-1)
        p_NV = torch.exp(chunk_NV - lse_N[:, None])
        out_N[start : start + _ENTROPY_CHUNK_ROWS] = lse_N - (p_NV * chunk_NV).sum(-1)
    entropy_BS = out_N.reshape(z_BSV.shape[0], z_BSV.shape[1] - 1)
    return torch.nn.functional.pad(entropy_BS, (1, 0), value=0.0)


def token_logprobs(
    model: nn.Module, input_ids_BS: torch.Tensor, attention_mask_BS: torch.Tensor, temperature: float
) -> torch.Tensor:
    """fp32 ``logp_BS`` (carries gradient unless called under ``torch.no_grad``)."""
    z_BSV = _scaled_logits_BSV(model, input_ids_BS, attention_mask_BS, temperature)
    return _gather_logp_BS(z_BSV, input_ids_BS)


def token_logprobs_and_entropy(
    model: nn.Module, input_ids_BS: torch.Tensor, attention_mask_BS: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_BS, entropy_BS)`` from one forward; the entropy is detached."""
    z_BSV = _scaled_logits_BSV(model, input_ids_BS, attention_mask_BS, temperature)
    return _gather_logp_BS(z_BSV, input_ids_BS), _entropy_BS(z_BSV)
