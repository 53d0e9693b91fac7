"""A controlled perturbation of the rollout copy of the weights, for ablations only.

Real runs leave it off (``rollout.perturb_std = 0``). The correction ablation
(``benchmarks/bench_correction_ablation.py``) turns it on to push the train-inference
mismatch well beyond FP8's, into the ``kl_k1 > 0.1`` regime, while the learner trains the
unperturbed weights. Each floating tensor ``w`` becomes

    w' = w * (1 + sigma * eps),    eps ~ N(0, 1) elementwise,

with ``eps`` drawn from a generator seeded by ``(seed, tensor name)``: the same tensor gets
the same noise pattern in every worker and at every policy version, so the rollout engine
behaves like a fixed, biased inference kernel (as quantization does), not like fresh noise.

A non-stationary mismatch (``rollout.perturb_std_final``): sigma moves linearly with the policy
version v from ``perturb_std`` to ``perturb_std_final`` over ``perturb_ramp_versions`` versions,

    sigma(v) = s0 + (s1 - s0) * min(v / ramp, 1),

with the same fixed pattern, so the same bias grows (or shrinks) as training goes on.
"""

import hashlib
from pathlib import Path

import torch

from system.weight_payload import WeightPayload, decode_weights, encode_weights


def _tensor_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little")


def perturbation_sigma(version: int, start: float, final: float | None, ramp_versions: int) -> float:
    """``sigma(v)`` of the module docstring; ``start`` at every version when ``final`` is None."""
    if final is None:
        return start
    if ramp_versions < 1:
        raise ValueError(f"perturb_ramp_versions must be >= 1, got {ramp_versions}")
    return start + (final - start) * min(max(version, 0) / ramp_versions, 1.0)


def perturb_tensor(t: torch.Tensor, sigma: float, seed: int, name: str) -> torch.Tensor:
    """``t * (1 + sigma * eps)`` in float32, returned in ``t``'s dtype (non-float tensors unchanged)."""
    if not t.is_floating_point() or sigma == 0.0:
        return t
    gen = torch.Generator().manual_seed(_tensor_seed(seed, name) & ((1 << 63) - 1))
    eps = torch.randn(t.shape, generator=gen, dtype=torch.float32)
    return (t.float() * (1.0 + sigma * eps)).to(t.dtype)


def perturb_payload(payload: WeightPayload, sigma: float, seed: int) -> WeightPayload:
    """The payload with every floating tensor perturbed (see the module docstring)."""
    if sigma == 0.0:
        return payload
    state = {name: perturb_tensor(t, sigma, seed, name) for name, t in decode_weights(payload)}
    return encode_weights(state, payload.policy_version)


def model_dir_payload(model_dir: str | Path) -> WeightPayload:
    """Policy version 0: the weights of a model directory's ``*.safetensors`` files, in bf16."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weight files to perturb")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            state[name] = t.to(torch.bfloat16) if t.is_floating_point() else t
    return encode_weights(state, 0)
