"""The CUDA paths of the Ray-free core against the CPU: correction core, and a learner rank on NCCL.

Skipped without CUDA (the CPU suite covers the same code on CPU). On a GPU machine, run with the
rest of the device check: ``bash benchmarks/gpu_check.sh`` (see ``benchmarks/README.md``).

- Correction: every method's weights and keep mask, section 1's diagnostics (also per lag), the
  method statistics and one AIS update, on CUDA and on CPU from the same float64 batch. They must
  agree to 1e-10 relative: both compute in float64 and differ only in the order of their sums (a
  GPU reduces in a tree), where a mean of d near 0 cancels to a few 1e-13 relative at worst; the
  selection of the exact median is exact on both, and the keep masks must be equal.
- Learner: ``LearnerCore`` on one CUDA rank (NCCL, FSDP2, float32 parameters, TF32 off) trains two
  updates on the tiny model of ``test_learner_step``; loss and gradient norm must match that
  test's naive one-process CPU reference to float32 rounding over a different summation order
  (rel 1e-4), and the exported weights the reference's parameters (atol 1e-3 x lr, as there).
"""

import math

import numpy as np
import pytest
import torch

DEVICE = "cuda"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (runs in benchmarks/gpu_check.sh)")]

from system.config.correction import METHOD_TYPES, AISConfig  # noqa: E402
from system.correction import compute_diagnostics, compute_log_ratios, method_statistics  # noqa: E402
from system.correction.ais import AdaptiveIS  # noqa: E402
from system.correction.diagnostics import diagnostics_by_lag_of  # noqa: E402
from system.correction.methods import compute_weights_and_keep, default_method_configs  # noqa: E402


def _batch(num_seq: int = 96, seq_len: int = 300, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mu = -torch.empty(num_seq, seq_len, dtype=torch.float64).exponential_(1.0, generator=g)
    old = mu + 0.3 * torch.randn(num_seq, seq_len, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, seq_len + 1, (num_seq,), generator=g)
    mask = torch.arange(seq_len)[None, :] < lengths[:, None]
    mu[0, 3] = float("nan")  # an invalid token, excluded and counted
    lag = torch.randint(0, 3, (num_seq,), generator=g)
    adv = torch.randn(num_seq, generator=g, dtype=torch.float64)
    return mu, old, mask, lag, adv


def _assert_same(cpu, gpu, path="") -> None:
    if isinstance(cpu, dict):
        assert cpu.keys() == gpu.keys(), path
        for key in cpu:
            _assert_same(cpu[key], gpu[key], f"{path}/{key}")
    elif isinstance(cpu, float) and isinstance(gpu, float) and not (math.isnan(cpu) and math.isnan(gpu)):
        assert gpu == pytest.approx(cpu, rel=1e-10, abs=1e-300), path
    else:
        assert cpu == gpu, path


@pytest.mark.parametrize("method_type", sorted(METHOD_TYPES))
def test_correction_core_on_cuda_matches_cpu(method_type):
    mu, old, mask, lag, adv = _batch()
    method = default_method_configs()[method_type]
    out = {}
    for device in ("cpu", DEVICE):
        ratios = compute_log_ratios(mu.to(device), old.to(device), mask.to(device))
        w_BT, keep_BT = compute_weights_and_keep(ratios, method, torch.float64)
        ais = AdaptiveIS(AISConfig(per_lag=True)).update(ratios, w_BT, keep_BT, adv.to(device), lag.to(device))
        out[device] = {
            "w": w_BT.cpu(), "keep": keep_BT.cpu(), "alpha_B": ais.alpha_B.cpu(),
            "scalars": {"diagnostics": compute_diagnostics(ratios),
                        "by_lag": diagnostics_by_lag_of(ratios, lag.to(device)),
                        "statistics": method_statistics(ratios, w_BT), "ais": ais.metrics},
        }  # fmt: skip
    torch.testing.assert_close(out[DEVICE]["w"], out["cpu"]["w"], rtol=1e-10, atol=0.0)
    assert torch.equal(out[DEVICE]["keep"], out["cpu"]["keep"])
    torch.testing.assert_close(out[DEVICE]["alpha_B"], out["cpu"]["alpha_B"], rtol=1e-10, atol=1e-300)
    _assert_same(out["cpu"]["scalars"], out[DEVICE]["scalars"])


def test_learner_rank_on_cuda_matches_naive_cpu_reference(tmp_path):
    from test_learner_step import (
        TEMPERATURE,
        make_batch,
        make_weights,
        reference_step,
        save_tiny_model,
    )
    from transformers import Qwen2ForCausalLM

    from system.config.learner import LearnerConfig
    from system.config.rollout import RolloutConfig
    from system.config.run import RunConfig
    from system.learner.core import LearnerCore
    from system.learner.distributed import find_free_port
    from system.losses.aggregation import loss_normalisers
    from system.weight_payload import decode_weights

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model_dir = save_tiny_model(tmp_path / "m")
    lr, clip = 1e-2, 0.5
    cfg = RunConfig(learner=LearnerConfig(num_ranks=1, lr=lr, grad_clip=clip, micro_batch_size=5, param_dtype="float32"),
                    rollout=RolloutConfig(temperature=TEMPERATURE, group_size=4), prompts_per_step=3)
    core = LearnerCore(cfg, model_dir, rank=0, world_size=1, master_port=find_free_port())
    try:
        assert core.device.type == DEVICE and torch.distributed.get_backend() == ("nccl" if DEVICE == "cuda" else "gloo")
        ref = Qwen2ForCausalLM.from_pretrained(model_dir)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.0)
        batch = make_batch()
        w = make_weights(batch)
        old_BT = core.compute_proximal_logprobs(batch)
        arrays = batch.response_arrays()
        norms = loss_normalisers(arrays.mask_BT, arrays.behaviour_BT, old_BT)
        for _ in range(2):  # the second update has cur != old
            metrics = core.train_step(batch, w, norms, proximal_logp=old_BT)
            ref_loss, ref_norm = reference_step(ref, ref_opt, batch, old_BT, w, clip)
            assert metrics["loss"] == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
            assert metrics["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
        exported = dict(decode_weights(core.export_weights()))
        for name, p in ref.named_parameters():
            if name.endswith("k_proj.bias"):  # exact gradient 0: rounding noise (test_learner_step)
                continue
            # bf16 export: one bf16 rounding (2**-8 relative) on top of the lr-scaled tolerance
            torch.testing.assert_close(exported[name].float(), p.detach(), rtol=2**-8, atol=1e-3 * lr, msg=name)
    finally:
        core.close()
    assert np.isfinite(old_BT).sum() > 0
