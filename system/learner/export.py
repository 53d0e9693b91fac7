"""Export the policy's full (unsharded) weights on rank 0 as a bf16 ``WeightPayload`` for rollout.

Floating-point tensors are cast from the fp32 master weights to bf16 (round to nearest even);
any integer tensor keeps its dtype.

Collective: every rank calls ``export_weights``; FSDP2 all-gathers each parameter to rank 0's
CPU (``full_state_dict=True, cpu_offload=True``), the other ranks get ``None``. Keys keep the
Hugging Face names of the unwrapped model (``fully_shard`` adds no prefix), which is what
vLLM's ``reload_weights`` expects. ``lm_head.weight`` is always present: should a model with tied
embeddings leave it out of its state dict, it is filled in from ``model.embed_tokens.weight``
(vLLM would otherwise keep a stale head).
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from system.weight_payload import WeightPayload, encode_weights

EXPORT_DTYPE = torch.bfloat16
_HEAD = "lm_head.weight"


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full fp32 state dict on rank 0 (CPU), empty on the others. Collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def _with_head(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    if _HEAD in state:
        return state
    names = [k for k in state if k.endswith("embed_tokens.weight")]
    tied = getattr(model.config, "tie_word_embeddings", False)
    if not (tied and len(names) == 1):
        raise ValueError(f"the exported state has no {_HEAD} and no single tied embedding to copy it from")
    return {**state, _HEAD: state[names[0]]}


def export_weights(model: nn.Module, policy_version: int) -> WeightPayload | None:
    """The bf16 payload on rank 0, None elsewhere. Collective: call on every rank."""
    state = full_state_dict(model)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank != 0:
        return None
    state = _with_head(state, model)
    cast = {k: v.to(EXPORT_DTYPE) if v.is_floating_point() else v for k, v in state.items()}
    return encode_weights(cast, policy_version)
