"""The tensor names a weight payload must carry for the rollout engine (checked at every load).

vLLM's in-place reload only logs (and aisrl's quiet console hides) a parameter it was not given, and
keeps that parameter's old values: a learner-side rename (a wrapper's prefix, say) would leave stale
layers with no error. So every load is checked against the names of the model's own checkpoint
(``*.safetensors`` headers in the model directory, read once at engine start).
"""

import json
import struct
from pathlib import Path

TIED_HEAD = "lm_head.weight"


def checkpoint_tensor_names(model_dir: str | Path) -> frozenset[str]:
    """The tensor names of every ``*.safetensors`` file in ``model_dir`` (read from their headers:
    8 bytes of little-endian length, then a JSON object keyed by name; ``__metadata__`` is not a
    tensor). Empty when there is none (the check is then skipped)."""
    names: set[str] = set()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        names.update(k for k in header if k != "__metadata__")
    return frozenset(names)


def payload_name_problems(expected: frozenset[str], given: set[str], tied_embeddings: bool) -> str | None:
    """What is wrong with the names ``given`` for a model whose checkpoint holds ``expected`` (None: fine).
    Only weights and biases (``*.weight``, ``*.bias``) are compared: buffers such as rotary tables are in
    some checkpoints and not in the learner's state, or the reverse, and the engine computes them; a
    rename (a wrapper's prefix) changes every weight. With tied embeddings the head is completed from the
    embedding, so ``lm_head.weight`` may be absent from either side."""
    if not expected:
        return None
    want, have = ({n for n in names if n.endswith((".weight", ".bias"))} for names in (expected, given))
    if tied_embeddings:
        want.discard(TIED_HEAD)
        have.discard(TIED_HEAD)
    missing, unknown = sorted(want - have), sorted(have - want)
    if not missing and not unknown:
        return None
    parts = []
    if missing:
        parts.append(f"{len(missing)} of the model's tensors missing (e.g. {', '.join(missing[:3])})")
    if unknown:
        parts.append(f"{len(unknown)} the model does not have (e.g. {', '.join(unknown[:3])})")
    return "; ".join(parts) + ": the engine would keep stale values for the missing ones"
