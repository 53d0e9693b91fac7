"""The flat layout of one policy version's arrays: each array, in name order, at a multiple of
``ALIGN`` bytes of one uint8 buffer. The weight broadcast sends versions in it
(``system.weight_broadcast``), and learner rank 0 exports straight into it
(``WeightBroadcast.arena``), so both sides must lay a version out the same way.
"""

import numpy as np

from system import shared_segment
from system.weight_payload import WeightPayload

ALIGN = 64
"""Every array starts at a multiple of this many bytes of the flat data."""


def offsets(sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    """Where each array of ``sizes`` (name -> bytes) starts in the flat data (names in sorted order,
    each at a multiple of ``ALIGN``), and the data's size: the layout of :func:`layout` and of
    :meth:`WeightBroadcast.arena`."""
    starts, offset = {}, 0
    for name in sorted(sizes):
        offset = -(-offset // ALIGN) * ALIGN
        starts[name] = offset
        offset += int(sizes[name])
    return starts, offset


def layout(payload: WeightPayload) -> tuple[dict, int]:
    """The header (JSON-ready) and the data size of ``payload``: arrays in name order, 64-byte aligned."""
    arrays = {name: np.asarray(a) for name, a in payload.arrays.items()}
    starts, nbytes = offsets({name: a.nbytes for name, a in arrays.items()})
    entries = [{"name": name, "dtype": arrays[name].dtype.str, "shape": list(arrays[name].shape),
                "offset": starts[name], "nbytes": int(arrays[name].nbytes), "torch_dtype": payload.dtypes[name]}
               for name in sorted(arrays)]
    return {"policy_version": payload.policy_version, "arrays": entries, "nbytes": nbytes}, nbytes


def fill(dst: np.ndarray, header: dict, payload: WeightPayload) -> int:
    """Write ``payload``'s arrays into the flat ``dst`` (uint8, ``header["nbytes"]``) at the header's
    offsets (``shared_segment.copy_pieces``), the alignment gaps zeroed. An array that already is
    its place in ``dst`` (exported into :meth:`WeightBroadcast.arena`) is not copied. Returns the
    bytes of the arrays it copied."""
    end, pairs = 0, []
    for e in header["arrays"]:
        dst[end:e["offset"]] = 0
        raw = np.ascontiguousarray(payload.arrays[e["name"]]).reshape(-1).view(np.uint8)
        place = dst[e["offset"]:e["offset"] + e["nbytes"]]
        if not _same_bytes(place, raw):
            pairs.append((place, raw))
        end = e["offset"] + e["nbytes"]
    dst[end:] = 0
    shared_segment.copy_pieces(pairs)
    return sum(raw.size for _, raw in pairs)


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two flat uint8 arrays are the same memory (start and length)."""
    return a.size == b.size and (a.size == 0 or a.ctypes.data == b.ctypes.data)
