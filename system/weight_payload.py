"""The wire format of exported policy weights: numpy arrays (bf16 as an int16 view) plus dtypes.

Numpy arrays travel through Ray's object store without a copy; torch tensors are pickled. Torch is
imported by the two codecs only, so a process that only passes payloads on (the simulated actors of the
tests and benchmarks) starts without it (3.3 s of CPU each on a 2-core AMD EPYC VM).
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

_VIEW = {"bfloat16": "int16"}
"""Dtypes numpy lacks, carried bit-exactly as a numpy view of the same width."""


@dataclass(frozen=True)
class WeightPayload:
    """Full (unsharded) weights of one policy version."""

    policy_version: int
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]

    @property
    def num_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def encode_weights(state: "Mapping[str, torch.Tensor]", policy_version: int) -> WeightPayload:
    """Detach every tensor to CPU numpy; bf16 is carried bit-exactly as int16."""
    import torch

    arrays, dtypes = {}, {}
    for name, tensor in state.items():
        t = tensor.detach().to("cpu").contiguous()
        dtypes[name] = str(t.dtype).removeprefix("torch.")
        if dtypes[name] in _VIEW:
            t = t.view(getattr(torch, _VIEW[dtypes[name]]))
        arrays[name] = t.numpy()
    return WeightPayload(policy_version=policy_version, arrays=arrays, dtypes=dtypes)


def decode_weights(payload: WeightPayload) -> "Iterator[tuple[str, torch.Tensor]]":
    """Yield ``(name, tensor)`` in the original dtypes (zero-copy where the array allows it)."""
    import torch

    for name, arr in payload.arrays.items():
        dtype = getattr(torch, payload.dtypes[name])
        t = torch.from_numpy(np.array(arr, copy=not arr.flags.writeable))
        if payload.dtypes[name] in _VIEW:
            t = t.view(dtype)
        yield name, t
