"""Per-token log-probs and entropies against naive references (full log_softmax, one sequence at a time)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from system.learner.collate import collate_groups
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


def test_logprobs_carry_the_gradient_of_the_naive_log_softmax_to_the_weights():
    """The gradient of the summed log-probs (temperature 0.8) reaches every weight as autograd through the
    naive full log_softmax gives it, on a copy of the model (a review: the test only checked it was not 0)."""
    import copy

    model = _tiny_model()
    ref_model = copy.deepcopy(model)
    ids = torch.tensor([[3, 7, 1, 9]])
    token_logprobs(model, ids, torch.ones_like(ids), 0.8).sum().backward()
    logsm = torch.log_softmax(ref_model(input_ids=ids).logits[0].float() / 0.8, dim=-1)
    sum(logsm[s - 1, ids[0, s]] for s in range(1, ids.shape[1])).backward()
    grads = dict(ref_model.named_parameters())
    for name, param in model.named_parameters():
        if grads[name].grad is None:  # not on the path to the logits (none in this model)
            assert param.grad is None or not param.grad.any(), name
            continue
        torch.testing.assert_close(param.grad, grads[name].grad, atol=1e-6, rtol=1e-5, msg=name)
    assert model.lm_head.weight.grad.abs().sum() > 0


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
    np.testing.assert_allclose(old_BT.numpy(), arrays.behaviour_BT, atol=2e-6)
    assert (old_BT.numpy()[~arrays.mask_BT] == 0).all()


# ---------------------------------------------------------------- top-k / top-p (spec section 0)


class _GivenLogits(nn.Module):
    """Returns the logits it holds, whatever the input ids."""

    def __init__(self, logits_BSV):
        super().__init__()
        self.logits_BSV = logits_BSV

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=self.logits_BSV)


def _reference_kept(z, top_p, top_k):
    """The kept token ids of one row, by an explicit loop: most probable first (ties: lower id
    first); top-k keeps every token tied with the k-th; top-p then walks down the top-k
    survivors' renormalised probabilities (float64) and keeps each token while the mass before
    it is below top_p (so the token that reaches top_p is kept)."""
    V = len(z)
    order = sorted(range(V), key=lambda v: (-z[v], v))
    kept = list(order)
    if 0 < top_k < V:
        kth = z[order[top_k - 1]]
        kept = [v for v in order if z[v] >= kth]
    if top_p < 1.0:
        m = max(z[v] for v in kept)
        weights = {v: math.exp(z[v] - m) for v in kept}
        total = sum(weights.values())
        nucleus, mass = [], 0.0
        for v in kept:
            if mass >= top_p:
                break
            nucleus.append(v)
            mass += weights[v] / total
        kept = nucleus
    return set(kept)


def _reference_row(z, target, top_p, top_k):
    """(log-prob of ``target``, entropy) under the truncated, renormalised distribution of one row."""
    kept = _reference_kept(z, top_p, top_k)
    m = max(z[v] for v in kept)
    lse = m + math.log(sum(math.exp(z[v] - m) for v in kept))
    entropy = -sum(math.exp(z[v] - lse) * (z[v] - lse) for v in kept)
    return (z[target] - lse if target in kept else -math.inf), entropy


def _random_logits(kind, shape, seed):
    gen = torch.Generator().manual_seed(seed)
    if kind == "ties":  # few distinct values: the top-k and top-p boundaries fall inside tie groups
        return torch.randint(0, 5, shape, generator=gen).float() * 0.75
    return 2.0 * torch.randn(shape, generator=gen)


TRUNCATIONS = [(0.9, 0), (0.5, 0), (0.05, 0), (0.999, 0), (1.0, 3), (1.0, 1), (0.7, 4), (0.95, -1), (0.8, 50)]


@pytest.mark.parametrize("kind", ["continuous", "ties"])
@pytest.mark.parametrize(("top_p", "top_k"), TRUNCATIONS)
def test_truncated_logprobs_and_entropy_match_the_reference_loop(kind, top_p, top_k):
    B, S, V, temperature = 6, 12, 11, 0.7
    logits = _random_logits(kind, (B, S, V), seed=int(1000 * top_p) + top_k)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
    logp, entropy = token_logprobs_and_entropy(_GivenLogits(logits), ids, torch.ones_like(ids), temperature,
                                               top_p=top_p, top_k=top_k)
    assert torch.equal(logp, token_logprobs(_GivenLogits(logits), ids, torch.ones_like(ids), temperature,
                                            top_p=top_p, top_k=top_k))
    z = (logits / temperature).tolist()
    ref = np.array([[(0.0, 0.0)] + [_reference_row(z[b][s - 1], int(ids[b, s]), top_p, top_k) for s in range(1, S)]
                    for b in range(B)])
    np.testing.assert_array_equal(np.isneginf(logp.numpy()), np.isneginf(ref[..., 0]))
    np.testing.assert_allclose(logp.numpy(), ref[..., 0], atol=2e-6)
    np.testing.assert_allclose(entropy.numpy(), ref[..., 1], atol=1e-5)
    assert np.isfinite(entropy.numpy()).all()
    if top_p <= 0.95 or 0 < top_k < V:
        assert np.isneginf(logp.numpy()).any()  # some sampled ids fall outside: the cases are not trivial


@pytest.mark.parametrize("kind", ["continuous", "ties"])
@pytest.mark.parametrize(("top_p", "top_k"), TRUNCATIONS)
def test_kept_sets_of_every_row_match_the_reference(kind, top_p, top_k):
    """The whole kept set of each row (not only the sampled token), with rows in several chunks."""
    from system.learner import logprobs

    N, V = 200, 23
    z = _random_logits(kind, (N, V), seed=7 + top_k)
    cut_value, cut_index, lse, _ = logprobs._nucleus_N(z, top_p, top_k, with_entropy=False)
    kept = logprobs._kept(z, torch.arange(V)[None, :], cut_value, cut_index)
    for n in range(N):
        assert set(torch.nonzero(kept[n]).flatten().tolist()) == _reference_kept(z[n].tolist(), top_p, top_k), n
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(z.masked_fill(~kept, -math.inf), -1).numpy(), atol=1e-6)


def test_fast_path_is_unchanged_without_truncation(monkeypatch):
    """top_p = 1 and top-k off (0, -1 or >= V): today's formula, bit for bit, and no sort."""
    from system.learner import logprobs

    model, ids = _tiny_model(), torch.tensor([[3, 7, 1, 9, 4, 2], [5, 6, 8, 8, 8, 1]])
    mask = torch.ones_like(ids)
    expected = token_logprobs_and_entropy(model, ids, mask, 0.7)

    def no_sort(*args, **kwargs):
        raise AssertionError("the fast path must not build a kept set")

    monkeypatch.setattr(logprobs, "_nucleus_N", no_sort)
    for top_k in (0, -1, 32, 1000):
        got = token_logprobs_and_entropy(model, ids, mask, 0.7, top_p=1.0, top_k=top_k)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        assert torch.equal(token_logprobs(model, ids, mask, 0.7, top_k=top_k), expected[0])


@pytest.mark.parametrize(("top_p", "top_k"), [(0.9, 0), (0.6, 5), (1.0, 4)])
def test_truncated_gradient_matches_autograd_of_the_masked_log_softmax(monkeypatch, top_p, top_k):
    """cur carries gradient through z with K constant: the same gradient as autograd through
    log_softmax(z masked to K), finite, and exactly 0 from tokens outside K (their -inf is
    replaced by 0 before any arithmetic, as the loss does). Small chunks: the backward's
    chunking is covered too."""
    from system.learner import logprobs

    monkeypatch.setattr(logprobs, "_SORT_CHUNK_ELEMENTS", 3 * 32 + 5)  # ragged chunks of 3 rows
    B, S, V, temperature = 3, 7, 32, 0.8
    logits = _random_logits("continuous", (B, S, V), seed=5).requires_grad_(True)
    # The sampled ids: the 1st, 2nd, 3rd or 8th most probable token of the previous position.
    ranks = torch.tensor([0, 1, 2, 7])[torch.randint(0, 4, (B, S), generator=torch.Generator().manual_seed(3))]
    order = logits.detach().argsort(dim=-1, descending=True)
    ids = torch.nn.functional.pad(order[:, :-1].gather(-1, ranks[:, 1:, None]).squeeze(-1), (1, 0))
    logp = token_logprobs(_GivenLogits(logits), ids, torch.ones_like(ids), temperature, top_p, top_k)
    finite = torch.isfinite(logp.detach())
    assert finite[:, 1:].any() and (~finite).any()
    weights = torch.linspace(0.5, 1.5, B * S).reshape(B, S)
    (torch.where(finite, logp, 0.0) * weights).sum().backward()
    grad = logits.grad.clone()

    ref_logits = logits.detach().clone().requires_grad_(True)
    z = ref_logits / temperature
    kept = torch.tensor([[[v in _reference_kept(z[b, s].tolist(), top_p, top_k) for v in range(V)]
                          for s in range(S)] for b in range(B)])
    ref_logp = z.masked_fill(~kept, -math.inf).log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    ref_finite = finite[:, 1:]
    (torch.where(ref_finite, ref_logp, 0.0) * weights[:, 1:]).sum().backward()
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    torch.testing.assert_close(grad, ref_logits.grad, atol=1e-6, rtol=1e-5)


def test_sampling_settings_are_checked_and_threaded_into_the_proximal_recompute():
    """``proximal_logprobs`` with a ``Sampling`` reproduces behaviour log-probs of the same model
    sampled with the same temperature, top-p and top-k (-inf where a token is outside K)."""
    from system.config.rollout import RolloutConfig
    from system.learner.logprobs import Sampling

    for bad in (dict(temperature=0.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2), dict(top_k=1.5)):
        with pytest.raises(ValueError):
            Sampling(**bad)
    assert Sampling.of(0.7) == Sampling(0.7, 1.0, 0) and RolloutConfig().top_k == 0
    with pytest.raises(ValueError):
        RolloutConfig(top_k=-1)

    model, sampling = _tiny_model(seed=1), Sampling(temperature=0.8, top_p=0.7, top_k=6)
    rng = np.random.default_rng(0)
    groups = []
    for g in range(3):
        prompt = rng.integers(1, 32, size=g + 2)
        completions = []
        for k in range(2):
            response = rng.integers(1, 32, size=int(rng.integers(1, 6)))
            ids = torch.tensor([list(prompt) + list(response)])
            with torch.no_grad():
                z = (model(input_ids=ids).logits[0].float() / sampling.temperature).tolist()
            logp = [_reference_row(z[s - 1], int(ids[0, s]), sampling.top_p, sampling.top_k)[0]
                    for s in range(len(prompt), ids.shape[1])]
            completions.append(Completion(f"p{g}", k, prompt, response, np.array(logp, np.float32), "", float(k), 0))
        groups.append(RolloutGroup(Prompt(f"p{g}", "", ""), tuple(completions), 0))
    batch = collate_groups(groups, scale_advantages_by_std=True)
    old_BT = proximal_logprobs(model, shard_tensors(batch, torch.device("cpu")), 4, sampling).numpy()
    arrays = batch.response_arrays()
    mask = arrays.mask_BT
    np.testing.assert_allclose(old_BT[mask], arrays.behaviour_BT[mask], atol=2e-6)
    assert np.isneginf(old_BT[mask]).any() and np.isfinite(old_BT[mask]).any()
    assert (old_BT[~mask] == 0).all()
