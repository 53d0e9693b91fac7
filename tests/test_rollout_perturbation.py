"""The ablation's rollout-weight perturbation (``system.rollout.perturbation``), Ray- and vLLM-free."""

import numpy as np
import torch

from system.rollout.perturbation import perturb_payload, perturb_tensor, relative_change
from system.weight_payload import decode_weights, encode_weights


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
    assert 0.07 < float(np.std(ratio)) < 0.13  # eps * sigma, up to bf16 rounding
