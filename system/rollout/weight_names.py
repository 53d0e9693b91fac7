"""The tensor names a weight payload must carry for the rollout engine (checked at every load).

vLLM's in-place reload only logs (and aisrl's quiet console hides) a parameter it was not given, and
keeps that parameter's old values: a learner-side rename (a wrapper's prefix, say) would leave stale
layers with no error. So every load is checked against the names of the Hugging Face model the learner
builds from the same directory (its ``state_dict`` keys, from an instance on the meta device: no
memory, no checkpoint layout to interpret), read once at engine start.
"""

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)
TIED_HEAD = "lm_head.weight"


def model_tensor_names(model_dir: str | Path, trust_remote_code: bool = False) -> frozenset[str]:
    """The ``state_dict`` names of the causal-LM class the learner builds from ``model_dir`` (a directory
    or a hub id), instantiated on the meta device. Empty, with a warning, when that fails (the check is
    then skipped, and says so)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        return frozenset(model.state_dict())
    except Exception as exc:  # noqa: BLE001 - the check is a guard; the engine works without it
        log.warning("cannot list the tensor names of %s (%s: %s); weight payloads are not checked by name",
                    model_dir, type(exc).__name__, str(exc)[:200])
        return frozenset()


def payload_name_problems(expected: frozenset[str], given: set[str], tied_embeddings: bool) -> str | None:
    """What is wrong with the names ``given`` for a model whose tensors are ``expected`` (None: fine).
    Only weights and biases (``*.weight``, ``*.bias``) are compared (buffers are the engine's own); a
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
