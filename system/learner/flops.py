"""Model FLOPs of a learner step and the device's peak: the arithmetic behind tokens/s and MFU.

PaLM's accounting (Chowdhery et al. 2022, appendix B), attention counted without the causal half:
a forward pass costs ``2 N D + 4 L d S D`` FLOPs and a training pass (forward + backward) three
times that, with N the parameters of the matrix products, D the tokens (padding excluded), L the
layers, d the hidden size and S the padded sequence length. A learner step is one proximal forward
plus ``u`` updates:

    F = (2 + 6 u) N D + (4 + 12 u) L d S D

MFU = F / (seconds x peak), the peak being the device's dense BF16 rate.
"""

import torch
from torch import nn

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}
"""Dense BF16 peaks from the vendors' data sheets (SXM parts; a PCIe H100 is lower: give it)."""


def matmul_parameters(model: nn.Module) -> int:
    """Parameters that take part in matrix products: every ``nn.Linear`` weight, once each (a tied
    ``lm_head`` counts once, as the product it is); not the embedding lookup, norms or biases.
    Global counts under FSDP2 (a DTensor's ``numel`` is the unsharded one)."""
    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    return total


def step_flops(n_matmul: int, layers: int, hidden: int, seq_len: int, tokens: int, updates: int = 1) -> float:
    """``F = (2 + 6 u) N D + (4 + 12 u) L d S D`` (module docstring)."""
    if min(n_matmul, layers, hidden, seq_len, tokens) < 0 or updates < 0:
        raise ValueError("step_flops takes non-negative sizes")
    return (2 + 6 * updates) * n_matmul * tokens + (4 + 12 * updates) * layers * hidden * seq_len * tokens


def peak_tflops(device: torch.device, given: float | None = None) -> float | None:
    """``given``; else the table's entry for the CUDA device's name; else None (CPU, unknown GPU)."""
    if given is not None:
        if not given > 0:
            raise ValueError(f"a peak must be a positive TFLOP/s figure, got {given}")
        return float(given)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)
