"""Map the user's rollout precision to the vLLM quantization scheme the platform supports.

Measured on vLLM 0.32 (see STACK.md): on CPU only ``fp8_per_channel`` (online W8,
per-channel scales) works; ``fp8`` and ``fp8_per_tensor`` miss a CPU op and
``fp8_per_block`` needs Intel AMX. On CUDA, ``fp8`` (online, per-tensor) is the usual choice.
``bf16`` means no quantization: the weights run in bfloat16.
"""

from typing import Literal

_SCHEMES: dict[tuple[str, str], str | None] = {
    ("fp8", "cpu"): "fp8_per_channel",
    ("fp8", "cuda"): "fp8",
    ("bf16", "cpu"): None,
    ("bf16", "cuda"): None,
}


def resolve_quantization(requested: Literal["fp8", "bf16"], device: Literal["cpu", "cuda"]) -> str | None:
    """vLLM's ``quantization`` argument for ``rollout.quantization`` on ``device`` (None = bf16)."""
    if (requested, device) not in _SCHEMES:
        raise ValueError(
            f"rollout.quantization={requested!r} on device {device!r} is not supported; "
            f"choose from {sorted({r for r, _ in _SCHEMES})} on {sorted({d for _, d in _SCHEMES})}"
        )
    return _SCHEMES[requested, device]


def scheme_name(quantization: str | None) -> str:
    """Human-readable name of the scheme that ran: the vLLM method, or ``bf16``."""
    return quantization or "bf16"
