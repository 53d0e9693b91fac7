"""Build the learner's policy: a Hugging Face causal LM with fp32 master weights, sharded by FSDP2.

Layout: ``fully_shard`` on every decoder layer (the classes the model lists in
``_no_split_modules``, e.g. ``Qwen2DecoderLayer``) and once at the root, which then owns the
embeddings, the final norm and ``lm_head``. Mixed precision: parameters are all-gathered and
computed in ``param_dtype`` (bf16 by default), gradients are reduce-scattered in fp32 and the
optimiser updates the fp32 shards.

FSDP2 needs a process group even for one rank: the caller initialises a 1-rank group
(``system.learner.distributed.init_process_group``), so every parameter is a DTensor for
every world size and one code path serves all of them.
"""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def param_dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a ``learner.param_dtype`` config value."""
    if name not in _DTYPES:
        raise ValueError(f"param_dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def load_causal_lm(model_dir: str, trust_remote_code: bool = False) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` of a local directory or hub id, in fp32, on CPU.

    Dropout is switched off (``eval()``; gradients still flow): the proximal recompute and the
    training forward must be the same deterministic function of the weights, or ``cur/old``
    would carry dropout noise.
    """
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, trust_remote_code=trust_remote_code
    )
    model.config.use_cache = False
    return model.eval()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: instances of the classes named in ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} lists no decoder-layer classes in _no_split_modules "
            f"({sorted(names)}); cannot choose FSDP2 units"
        )
    return layers


def shard_model(
    model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype, reshard_after_forward: bool = True
) -> nn.Module:
    """Apply FSDP2 in place: one unit per decoder layer, then the root. Returns the same module."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def build_fsdp_model(
    model_dir: str,
    device: torch.device,
    world_size: int,
    param_dtype: str = "bfloat16",
    trust_remote_code: bool = False,
) -> nn.Module:
    """Load and shard over a 1-D mesh of ``world_size`` ranks of ``device``'s type.

    ``fully_shard`` moves the shards to the mesh's device (the current CUDA device, or CPU).
    Needs an initialised default process group of ``world_size`` ranks. Collective.
    """
    model = load_causal_lm(model_dir, trust_remote_code)
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("fsdp",))
    return shard_model(model, mesh, param_dtype_of(param_dtype))
