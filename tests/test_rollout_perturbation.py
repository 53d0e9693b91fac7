"""The ablation's rollout-weight perturbation (``system.rollout.perturbation``), Ray-free (the worker test imports
vLLM's Python package, no engine)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from system.rollout.perturbation import (
    perturb_payload,
    perturb_tensor,
    perturbation_sigma,
)
from system.weight_payload import decode_weights, encode_weights


def relative_change(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||a|| (float64), the size of a perturbation."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(a64), 1e-30))


def test_relative_size_is_sigma_and_the_pattern_is_fixed_per_name():
    w = torch.randn(256, 256)
    a = perturb_tensor(w, 0.2, seed=0, name="layer.weight")
    # w' - w = sigma * eps * w, so ||w' - w|| / ||w|| = sigma * sqrt(mean(eps^2 w^2) / mean(w^2)) ~ sigma
    assert abs(relative_change(w.numpy(), a.numpy()) - 0.2) < 0.01
    assert torch.equal(a, perturb_tensor(w, 0.2, seed=0, name="layer.weight"))  # same in every worker
    assert not torch.equal(a, perturb_tensor(w, 0.2, seed=0, name="other.weight"))
    assert not torch.equal(a, perturb_tensor(w, 0.2, seed=1, name="layer.weight"))
    # multiplicative: a zero stays zero, signs flip only where eps < -1/sigma (never for sigma 0.2 in practice)
    z = torch.zeros(8)
    assert torch.equal(perturb_tensor(z, 0.2, 0, "z"), z)


def test_payload_keeps_dtypes_versions_and_integer_tensors():
    state = {"w": torch.randn(16, 16).to(torch.bfloat16), "ids": torch.arange(5)}
    payload = encode_weights(state, policy_version=7)
    out = perturb_payload(payload, 0.1, seed=3)
    assert out.policy_version == 7 and out.dtypes == payload.dtypes
    got = dict(decode_weights(out))
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["ids"], state["ids"])
    assert not torch.equal(got["w"], state["w"])
    assert perturb_payload(payload, 0.0, seed=3) is payload  # off: untouched
    ratio = (got["w"].float() / state["w"].float()).numpy() - 1.0
    # eps * sigma: std 0.1 over 256 samples (sampling error ~0.1 / sqrt(2 * 256) = 0.0044), plus bf16
    # rounding of the product (~0.004 relative, independent of eps): within 0.1 +- 0.015 (3.4 sigma)
    assert 0.085 < float(np.std(ratio)) < 0.115


def test_sigma_ramps_linearly_with_the_version_then_holds():
    # s0 = 0.1, s1 = 0.3 over 4 versions: 0.1, 0.15, 0.2, 0.25, 0.3, then 0.3 (by hand).
    got = [perturbation_sigma(v, 0.1, 0.3, 4) for v in range(7)]
    assert got == pytest.approx([0.1, 0.15, 0.2, 0.25, 0.3, 0.3, 0.3])
    assert perturbation_sigma(50, 0.2, None, 4) == 0.2  # no final: fixed
    assert perturbation_sigma(2, 0.3, 0.0, 4) == pytest.approx(0.15)  # a shrinking one
    with pytest.raises(ValueError, match="perturb_ramp_versions"):
        perturbation_sigma(1, 0.0, 0.3, 0)



def test_worker_perturbs_each_version_with_its_sigma(monkeypatch):
    from system.rollout import worker as worker_module

    seen = []
    monkeypatch.setattr(worker_module, "perturb_payload", lambda p, sigma, seed: seen.append(round(sigma, 6)) or p)
    core = worker_module.RolloutWorkerCore.__new__(worker_module.RolloutWorkerCore)  # no engine: _perturbed only
    core.cfg = SimpleNamespace(seed=0, rollout=SimpleNamespace(perturb_std=0.0, perturb_std_final=0.4,
                                                               perturb_ramp_versions=8))
    for version in (0, 2, 8, 12):
        core._perturbed(encode_weights({"w": torch.ones(2, 2)}, version))
    assert seen == [0.0, 0.1, 0.4, 0.4]  # 0.4 * min(v / 8, 1)
