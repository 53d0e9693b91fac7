"""Export the policy's full (unsharded) weights on rank 0 as a bf16 ``WeightPayload`` for rollout.

Floating-point tensors are cast from the fp32 master weights to bf16 (round to nearest even);
any integer tensor keeps its dtype.

Collective: every rank calls ``export_weights``; rank 0 gets the payload, the other ranks ``None``.
The gather is ONE collective per 512 MiB bucket (:func:`gather_state_bf16`; one for the tiny
model): every rank casts its FSDP2 shards (dim-0 chunks, ``torch.chunk`` semantics) to bf16, packs
them into one byte buffer padded to the chunk size, and rank 0 gathers the buffers and cuts them
back into full tensors. It replaced DCP's
``get_model_state_dict(full_state_dict=True)``, which all-gathers each parameter in turn: 27
collectives for the default tiny model, 39 ms per export on 2 gloo ranks against 6 ms on one
(2-core AMD EPYC). A layout the packing does not cover (a parameter sharded other than on dim 0
of a 1-D mesh) takes that per-parameter path, and both give the same bits. Keys keep the
Hugging Face names of the unwrapped model (``fully_shard`` adds no prefix), which is what
vLLM's ``reload_weights`` expects. ``lm_head.weight`` is always present: should a model with tied
embeddings leave it out of its state dict, it is filled in from ``model.embed_tokens.weight``
(vLLM would otherwise keep a stale head).
"""

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, Shard

from system.weight_payload import WeightPayload, encode_weights

EXPORT_DTYPE = torch.bfloat16
_HEAD = "lm_head.weight"


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full fp32 state dict on rank 0 (CPU), empty on the others. Collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def _chunk_rows(dim0: int, world_size: int, rank: int) -> int:
    """Rows of a ``dim0``-row tensor on ``rank``: ``torch.chunk`` into chunks of ``ceil(dim0 / W)``
    rows, trailing ranks empty (FSDP2's dim-0 sharding)."""
    chunk = math.ceil(dim0 / world_size)
    return max(0, min(chunk, dim0 - rank * chunk))


def _packable(tensor: torch.Tensor, world: int) -> bool:
    """A plain tensor (the same on every rank) or a DTensor sharded on dim 0 of a 1-D mesh over
    the whole default group of ``world`` ranks (the gather runs on that group)."""
    if not isinstance(tensor, DTensor):
        return True
    return (tensor.device_mesh.ndim == 1 and tensor.device_mesh.size() == world and len(tensor.placements) == 1
            and tensor.placements[0] == Shard(0) and tensor.dim() >= 1)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


GATHER_BUCKET_BYTES = 512 << 20
"""At most this many bytes gathered on rank 0 per collective (all ranks' padded shards): one
gather for models up to ~250 M parameters, and bounded device memory on rank 0 for larger ones."""


def _buckets(layout: list[tuple], world: int, limit: int) -> list[list[int]]:
    """Consecutive tensors (indices into ``layout``) whose gathered bytes stay within ``limit``
    (a tensor larger than ``limit`` alone)."""
    buckets, current, size = [], [], 0
    for i, (_, shape, dtype, chunk) in enumerate(layout):
        nbytes = world * chunk * math.prod(shape[1:]) * dtype.itemsize
        if current and size + nbytes > limit:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    return buckets + ([current] if current else [])


def first_names(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each name's first name (in state order) for the same tensor object: a parameter listed under two
    names (tied embeddings) maps both to the first. Pass ``state_dict(keep_vars=True)``: a plain
    ``state_dict()`` detaches every name on its own, so tied names are different objects there. By
    object identity, every rank decides alike (a storage address could not: a rank whose shard of a
    small tensor is empty has none, and ranks that disagreed on the layout would deadlock the gather)."""
    first: dict[int, str] = {}
    return {name: first.setdefault(id(t), name) for name, t in state.items()}


def gather_state_bf16(state: dict[str, torch.Tensor], bucket_bytes: int = GATHER_BUCKET_BYTES,
                      into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor] | None:
    """A model's full ``state`` (its ``state_dict()``) on rank 0 (CPU; floating tensors cast to
    bf16), None on the others, by one gather per bucket of at most ``bucket_bytes`` (one bucket
    for small models). Collective; every tensor must be :func:`_packable`, which
    :func:`export_weights` checks (a decision every rank makes alike, from the placements).

    Rank r's buffer for a bucket: for each sharded tensor in it (state-dict order), its local
    chunk cast, padded to ``ceil(dim0 / W)`` rows, as bytes; every rank's buffer has the same
    length. Plain tensors (buffers, unsharded parameters) are not sent: rank 0 has them.
    ``into`` (rank 0): flat uint8 destinations by name; a gathered tensor whose destination has its
    size is assembled there (and returned as a view of it) instead of in new memory.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    first_name = first_names(state)  # a tensor listed under two names (tied embeddings) is gathered once
    layout = [(name, tuple(t.shape), EXPORT_DTYPE if t.is_floating_point() else t.dtype, math.ceil(t.shape[0] / world))
              for name, t in state.items()
              if isinstance(t, DTensor) and first_name[name] == name]  # (name, full shape, dtype, padded rows)
    full = {}
    for bucket in _buckets(layout, world, bucket_bytes):
        pieces = []
        for i in bucket:
            name, shape, dtype, chunk = layout[i]
            local = state[name].to_local().detach()
            rows = _chunk_rows(shape[0], world, rank)
            # by element count, so a tensor with no elements (a zero trailing dim) passes on every rank
            if local.numel() != rows * math.prod(shape[1:]):
                raise RuntimeError(f"{name}: local shard {tuple(local.shape)} on rank {rank} of {world} is not "
                                   f"rows {rows} of the dim-0 chunking of {shape}")
            padded = local.new_zeros((chunk, *shape[1:]), dtype=dtype)
            if local.numel():
                padded[:rows] = local.reshape(rows, *shape[1:])
            pieces.append(_as_bytes(padded))
        flat = torch.cat(pieces)
        if dist.is_initialized() and world > 1:
            parts = [torch.empty_like(flat) for _ in range(world)] if rank == 0 else None
            dist.gather(flat, parts, dst=0)
        else:
            parts = [flat]
        if rank != 0:
            continue
        parts, offset = [p.cpu() for p in parts], 0
        for i in bucket:
            name, shape, dtype, chunk = layout[i]
            row_bytes = math.prod(shape[1:]) * dtype.itemsize
            pieces = [p[offset:offset + _chunk_rows(shape[0], world, r) * row_bytes] for r, p in enumerate(parts)]
            dest = (into or {}).get(name)
            if dest is not None and dest.numel() == math.prod(shape) * dtype.itemsize:
                data = torch.cat(pieces, out=dest)
            else:
                data = torch.cat(pieces)
            offset += chunk * row_bytes
            full[name] = data.view(dtype).reshape(shape)
    if rank != 0:
        return None
    out = {}
    for name, t in state.items():  # state-dict order, plain tensors from rank 0's own copy
        if isinstance(t, DTensor):
            out[name] = full[first_name[name]]
        else:
            plain = t.detach().to("cpu")
            out[name] = plain.to(EXPORT_DTYPE) if plain.is_floating_point() else plain
    return out


def _with_head(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    if _HEAD in state:
        return state
    names = [k for k in state if k.endswith("embed_tokens.weight")]
    tied = getattr(model.config, "tie_word_embeddings", False)
    if not (tied and len(names) == 1):
        raise ValueError(f"the exported state has no {_HEAD} and no single tied embedding to copy it from")
    return {**state, _HEAD: state[names[0]]}


def _export_sizes(local: dict[str, torch.Tensor], model: nn.Module) -> dict[str, int]:
    """The bytes of each array the export will hold, from the (sharded) state: full shapes, bf16 for
    floating tensors, the head :func:`_with_head` adds when the state has none."""
    sizes = {name: t.numel() * (EXPORT_DTYPE if t.is_floating_point() else t.dtype).itemsize for name, t in local.items()}
    embeds = [k for k in local if k.endswith("embed_tokens.weight")]
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if _HEAD not in sizes and tied and len(embeds) == 1:
        sizes[_HEAD] = sizes[embeds[0]]
    return sizes


def _placed(cast: dict[str, torch.Tensor], dests: dict[str, torch.Tensor], sizes: dict[str, int]) -> dict:
    """``cast`` with every tensor in its destination (copied there unless the gather assembled it there
    already). Only when the export holds exactly the arrays ``sizes`` announced (the destinations'
    offsets were laid out for those): otherwise every tensor left in a destination is copied out, so
    the payload owns its memory and nothing of it sits at an offset the broadcast did not expect."""
    final = {k: v.numel() * v.element_size() for k, v in cast.items()}
    if final != sizes:
        return {k: v.clone() if _inside(v, dests) else v for k, v in cast.items()}
    placed = {}
    for name, t in cast.items():
        dest = dests[name]
        if t.data_ptr() != dest.data_ptr():
            dest.copy_(_as_bytes(t))
        placed[name] = dest.view(t.dtype).reshape(t.shape)
    return placed


def _inside(t: torch.Tensor, dests: dict[str, torch.Tensor]) -> bool:
    """Whether ``t``'s data starts inside one of the (flat uint8) destinations."""
    return t.numel() > 0 and any(d.data_ptr() <= t.data_ptr() < d.data_ptr() + d.numel() for d in dests.values())


ExportInto = Callable[[dict[str, int]], "dict[str, np.ndarray] | None"]
"""Given the bytes of each array an export will hold, flat writable uint8 arrays to export into (or None)."""


def export_weights(model: nn.Module, policy_version: int, into: ExportInto | None = None) -> WeightPayload | None:
    """The bf16 payload on rank 0, None elsewhere. Collective: call on every rank.

    ``into`` (rank 0): given the bytes of each array the payload will hold (name -> bytes), returns a
    writable flat uint8 array per name to export into (``system.weight_generations.BroadcastSender
    .arena``: the shared segment the broadcast reads), or None; the payload's arrays are then views
    of those arrays, with the same bits as an export into new memory."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    local = model.state_dict(keep_vars=True)  # the parameters themselves: tied names are one object
    packable = all(_packable(t, world) for t in local.values())  # the same answer on every rank
    sizes = _export_sizes(local, model) if rank == 0 and into is not None else {}
    views = into(sizes) if sizes else None
    dests = {name: torch.from_numpy(v) for name, v in views.items()} if views else {}
    state = gather_state_bf16(local, into=dests) if packable else full_state_dict(model)
    if rank != 0:
        return None
    state = _with_head(state, model)
    cast = {k: v.to(EXPORT_DTYPE) if v.is_floating_point() else v for k, v in state.items()}
    return encode_weights(_placed(cast, dests, sizes) if dests else cast, policy_version)
