"""Per-token log-probs and entropies against naive references (full log_softmax, one sequence at a time)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from system.learner.batch import collate_groups
from system.learner.forward import proximal_logprobs, shard_tensors
from system.learner.logprobs import token_logprobs, token_logprobs_and_entropy
from system.types import Completion, Prompt, RolloutGroup


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).eval()


class _FixedLogits(nn.Module):
    """Every position predicts logits [0, log 2, log 4] over a vocabulary of 3."""

    def forward(self, input_ids, attention_mask):
        logits = torch.log(torch.tensor([1.0, 2.0, 4.0])).expand(*input_ids.shape, 3)
        return SimpleNamespace(logits=logits)


def _naive_logp_and_entropy(model, ids, temperature):
    """One unpadded sequence: full log_softmax of logits / temperature, read at the next token."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float() / temperature
    logsm = torch.log_softmax(logits, dim=-1)
    logp = [0.0] + [float(logsm[s - 1, ids[s]]) for s in range(1, len(ids))]
    ent = [0.0] + [float(-(logsm[s - 1].exp() * logsm[s - 1]).sum()) for s in range(1, len(ids))]
    return np.array(logp), np.array(ent)


def test_temperature_scaling_on_fixed_logits():
    ids = torch.tensor([[0, 2, 1]])
    mask = torch.ones_like(ids)
    # T = 1: p = (1, 2, 4) / 7.  T = 0.5: p ~ (1, 2, 4)^2 = (1, 4, 16) / 21.
    logp1 = token_logprobs(_FixedLogits(), ids, mask, temperature=1.0)
    np.testing.assert_allclose(logp1[0].numpy(), [0.0, math.log(4 / 7), math.log(2 / 7)], rtol=1e-6)
    logp_half, ent_half = token_logprobs_and_entropy(_FixedLogits(), ids, mask, temperature=0.5)
    np.testing.assert_allclose(logp_half[0].numpy(), [0.0, math.log(16 / 21), math.log(4 / 21)], rtol=1e-6)
    p = np.array([1, 4, 16]) / 21
    np.testing.assert_allclose(ent_half[0].numpy(), [0.0, -(p * np.log(p)).sum(), -(p * np.log(p)).sum()],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(_FixedLogits(), ids, mask, temperature=0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_padded_batch_matches_naive_full_log_softmax(temperature):
    model = _tiny_model()
    seqs = [[3, 7, 1, 9, 4, 2], [5, 6], [8, 8, 8, 1]]
    S = max(map(len, seqs))
    ids = torch.zeros(len(seqs), S, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, s in enumerate(seqs):
        ids[b, : len(s)], mask[b, : len(s)] = torch.tensor(s), 1
    with torch.no_grad():
        logp_BS, entropy_BS = token_logprobs_and_entropy(model, ids, mask, temperature)
    for b, s in enumerate(seqs):
        ref_logp, ref_ent = _naive_logp_and_entropy(model, s, temperature)
        np.testing.assert_allclose(logp_BS[b, : len(s)].numpy(), ref_logp, atol=2e-6)
        np.testing.assert_allclose(entropy_BS[b, : len(s)].numpy(), ref_ent, atol=2e-6)
    assert logp_BS.dtype == torch.float32


def test_logprobs_carry_gradient_to_the_weights():
    model = _tiny_model()
    ids = torch.tensor([[3, 7, 1, 9]])
    token_logprobs(model, ids, torch.ones_like(ids), 1.0).sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_proximal_recompute_reproduces_behaviour_logprobs_of_the_same_model():
    """Behaviour log-probs scored naively per sequence, collated, recomputed micro-batched: old == mu."""
    model, temperature = _tiny_model(seed=1), 0.8
    rng = np.random.default_rng(0)
    groups = []
    for g in range(3):
        prompt = rng.integers(1, 32, size=g + 2)
        completions = []
        for k in range(2):
            response = rng.integers(1, 32, size=int(rng.integers(1, 6)))
            logp, _ = _naive_logp_and_entropy(model, list(prompt) + list(response), temperature)
            completions.append(Completion(f"p{g}", k, prompt, response,
                                          logp[len(prompt):].astype(np.float32), "", float(k), 0))
        groups.append(RolloutGroup(Prompt(f"p{g}", "", ""), tuple(completions), 0))
    batch = collate_groups(groups, scale_advantages_by_std=True)
    old_BT = proximal_logprobs(model, shard_tensors(batch, torch.device("cpu")), 4, temperature)
    arrays = batch.response_arrays()
    np.testing.assert_allclose(old_BT.numpy(), arrays["behaviour_logp"], atol=2e-6)
    assert (old_BT.numpy()[~arrays["response_mask"]] == 0).all()
