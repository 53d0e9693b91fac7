"""Per-token log-probs (and optionally entropies) of the sampled tokens under the learner's model.

The distribution is the one vLLM sampled from (spec section 0): logits divided by the
temperature, then vLLM's top-k and top-p truncation, renormalised over the kept tokens K:

    z = logits / temperature
    logp[b, s] = z[b, s-1, ids[b, s]] - logsumexp_{v in K} z[b, s-1, v]   if ids[b, s] in K
               = -inf                                                     otherwise
    logp[b, 0] = 0                                                          (no context)

    H[b, s] = logsumexp_K z - sum_{v in K} softmax_K(z)_v z_v               (entropy of that distribution)

Without truncation (``top_p == 1`` and top-k off) K is the whole vocabulary and nothing is
sorted (the fast path). ``temperature``, ``top_p`` and ``top_k`` must be the rollout's: vLLM
returns processed log-probs (``processed_logprobs``), and ``old/mu`` is only meaningful if
both sides use the same distribution; otherwise every token carries ``log(nucleus mass)``.

The kept set K, as vLLM's sampler builds it (``apply_top_k_top_p_pytorch``, the CPU path of
vllm 0.32), per row of z:

1. top-k (``0 < top_k < V``; 0 and -1 mean off, as in vLLM's ``SamplingParams``): keep the
   tokens with ``z >= `` the k-th largest value (every token tied with it is kept);
2. top-p (``top_p < 1``), applied after top-k: softmax over the top-k survivors, tokens in
   ascending order, cumulative sum in float32; drop the tokens whose cumulative sum is
   ``<= 1 - top_p`` (the largest token is always kept). K is thus the smallest set of the
   most probable tokens whose mass reaches ``top_p``: the token that crosses it is kept.

Ties inside top-p (equal z at the boundary): vLLM's CPU sampler sorts with an unstable sort,
so which of the tied tokens it keeps is arbitrary; here the LOWER token ids are kept first
(order by z descending, then id ascending), which is also what vLLM's GPU (Triton) kernel does
with boundary duplicates. Known differences from vLLM on GPU, exact ties only: its top-k keeps
exactly k tokens (lower ids first) where the CPU path and this module keep every tie. Both only
move the boundary by tokens of the same probability.

A sampled token outside the learner's K (possible when FP8 and BF16 logits disagree near the
boundary) gets ``logp = -inf``: a non-finite ``old`` makes the token not valid (spec section 0:
excluded from every statistic and from the loss, counted in ``nonfinite_tokens``), and a
non-finite ``cur`` is excluded from the loss the same way (``token_loss_inputs``); its
gradient is exactly 0 (the ``-inf`` comes from a ``where`` on a constant mask, never from
arithmetic on the logits). The entropy is always finite.

Gradients: ``logp`` carries gradient through z (the gathered logit and the kept-set
logsumexp); K is a constant (it comes from comparisons, like vLLM's mask).

Memory: the model's logits come in ``param_dtype``; they are upcast once to an fp32
``[B, S, V]`` tensor ``z``. The log-prob is a gather minus a logsumexp, so no second fp32
``[B, S, V]`` log-softmax is kept; the entropy (no gradient) is computed in row chunks. With
truncation, the sort runs in row chunks of about ``_SORT_CHUNK_ELEMENTS`` elements (no grad)
and K is kept per row as two numbers (the boundary token's value and id), so nothing of size
``[B, S, V]`` is added to what autograd keeps; the kept-set logsumexp's backward recomputes
the mask and the softmax chunk by chunk.
"""

from dataclasses import dataclass

import torch
from torch import nn

_ENTROPY_CHUNK_ROWS = 1024
_SORT_CHUNK_ELEMENTS = 1 << 24
"""Row chunk of the truncation pass, in elements (a chunk's sort and cumsum take ~40 bytes each)."""


def _scaled_logits_BSV(
    model: nn.Module, input_ids_BS: torch.Tensor, attention_mask_BS: torch.Tensor, temperature: float
) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if input_ids_BS.shape != attention_mask_BS.shape or input_ids_BS.dim() != 2:
        raise ValueError(
            f"input_ids_BS {tuple(input_ids_BS.shape)} and attention_mask_BS "
            f"{tuple(attention_mask_BS.shape)} must be equal [B, S] shapes"
        )
    logits_BSV = model(input_ids=input_ids_BS, attention_mask=attention_mask_BS.long()).logits
    return logits_BSV.float() / temperature


def _gather_logp_BS(z_BSV: torch.Tensor, input_ids_BS: torch.Tensor) -> torch.Tensor:
    """``logp_BS`` from the scaled logits; position 0 gets 0."""
    z_prev_BSV = z_BSV[:, :-1]
    target_BS = input_ids_BS[:, 1:].unsqueeze(-1)
    picked_BS = z_prev_BSV.gather(-1, target_BS).squeeze(-1)
    logp_BS = picked_BS - torch.logsumexp(z_prev_BSV, dim=-1)
    return torch.nn.functional.pad(logp_BS, (1, 0), value=0.0)


@torch.no_grad()
def _entropy_BS(z_BSV: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution predicting token s, at s (0 at s = 0). Every position's
    row is read through a view of z (its last position's entropy computed and dropped): slicing off
    the last position first made ``reshape`` copy the whole fp32 [B, S, V] logits (a review found it)."""
    B, S, V = z_BSV.shape
    z_NV = z_BSV.detach().reshape(-1, V)  # a view of contiguous logits: no copy
    out_N = torch.empty(z_NV.shape[0], dtype=torch.float32, device=z_BSV.device)
    for start in range(0, z_NV.shape[0], _ENTROPY_CHUNK_ROWS):
        chunk_NV = z_NV[start : start + _ENTROPY_CHUNK_ROWS]
        lse_N = torch.logsumexp(chunk_NV, dim=-1)
        p_NV = torch.exp(chunk_NV - lse_N[:, None])
        out_N[start : start + _ENTROPY_CHUNK_ROWS] = lse_N - (p_NV * chunk_NV).sum(-1)
    return torch.nn.functional.pad(out_N.reshape(B, S)[:, :-1], (1, 0), value=0.0)


# ---------------------------------------------------------------- top-k / top-p truncation


def _check_truncation(top_p: float, top_k: int) -> None:
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if isinstance(top_k, bool) or int(top_k) != top_k or top_k < -1:
        raise ValueError(f"top_k must be an integer >= -1 (0 or -1: off), got {top_k}")


def _top_k_active(top_k: int, vocab: int) -> bool:
    return 0 < top_k < vocab


def _truncates(top_p: float, top_k: int, vocab: int) -> bool:
    return top_p < 1.0 or _top_k_active(top_k, vocab)


def _row_step(vocab: int) -> int:
    return max(1, _SORT_CHUNK_ELEMENTS // max(1, vocab))


def _kept(z: torch.Tensor, ids: torch.Tensor, cut_value_N: torch.Tensor, cut_index_N: torch.Tensor) -> torch.Tensor:
    """Membership of K: ``z > cut value``, or ``z == cut value`` and ``id <= cut id``.

    ``z`` and ``ids`` are ``[N, *]`` (or broadcast to it): the row's logits and their token ids.
    """
    cut_value, cut_index = cut_value_N[:, None], cut_index_N[:, None]
    return (z > cut_value) | ((z == cut_value) & (ids <= cut_index))


@torch.no_grad()
def _nucleus_N(
    z_NV: torch.Tensor, top_p: float, top_k: int, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(cut_value_N, cut_index_N, lse_N, entropy_N or None)`` of every row's kept set K.

    K = the tokens ``(z, -id) >= (cut_value, -cut_index)`` (see ``_kept``); ``lse_N`` is the
    logsumexp of z over K and ``entropy_N`` the entropy of ``softmax_K(z)``.
    """
    N, V = z_NV.shape
    cut_value_N = torch.empty(N, dtype=z_NV.dtype, device=z_NV.device)
    cut_index_N = torch.empty(N, dtype=torch.long, device=z_NV.device)
    lse_N = torch.empty(N, dtype=torch.float32, device=z_NV.device)
    entropy_N = torch.empty(N, dtype=torch.float32, device=z_NV.device) if with_entropy else None
    # vLLM compares the cumulative sum with 1 - p computed in float32 from a float32 p.
    drop_at_or_below = 1.0 - torch.tensor(top_p, dtype=torch.float32, device=z_NV.device)
    positions_V = torch.arange(V, device=z_NV.device)
    step = _row_step(V)
    for start in range(0, N, step):
        rows = slice(start, start + step)
        z_nV = z_NV[rows].detach()
        if top_p < 1.0:
            # Ascending by z, ties by DESCENDING id: a stable ascending sort of the reversed row.
            asc_nV, flipped_id_nV = z_nV.flip(-1).sort(dim=-1, stable=True)
            if _top_k_active(top_k, V):
                asc_nV.masked_fill_(asc_nV < asc_nV[:, V - top_k, None], float("-inf"))
            cum_nV = torch.softmax(asc_nV, dim=-1)
            torch.cumsum(cum_nV, dim=-1, out=cum_nV)
            drop_nV = cum_nV <= drop_at_or_below
            del cum_nV
            drop_nV[:, -1] = False
            first_kept_n = drop_nV.sum(-1)  # a prefix: the cumulative sum never decreases
            del drop_nV
            cut_value_N[rows] = asc_nV.gather(1, first_kept_n[:, None]).squeeze(1)
            cut_index_N[rows] = V - 1 - flipped_id_nV.gather(1, first_kept_n[:, None]).squeeze(1)
            del flipped_id_nV
            kept_nV = positions_V[None, :] >= first_kept_n[:, None]
            vals_nV = asc_nV
        else:  # top-k only: no sort (vLLM's apply_top_k_only); every tie with the k-th value is kept
            kth_n = z_nV.topk(top_k, dim=-1).values[:, -1]
            cut_value_N[rows] = kth_n
            cut_index_N[rows] = V
            kept_nV = z_nV >= kth_n[:, None]
            vals_nV = z_nV
        lse_n = torch.logsumexp(vals_nV.masked_fill(~kept_nV, float("-inf")), dim=-1)
        lse_N[rows] = lse_n
        if entropy_N is not None:
            p_nV = torch.exp(vals_nV - lse_n[:, None]).masked_fill_(~kept_nV, 0.0)
            entropy_N[rows] = lse_n - torch.where(p_nV > 0, p_nV * vals_nV, 0.0).sum(-1)
    return cut_value_N, cut_index_N, lse_N, entropy_N


class _KeptLogSumExp(torch.autograd.Function):
    """``logsumexp`` of z over each row's kept set (a constant), given its value from ``_nucleus_N``.

    Backward: ``d lse / d z = softmax_K(z)`` (0 outside K), built chunk by chunk, so autograd
    keeps only z (already alive) and per-row numbers.
    """

    @staticmethod
    def forward(ctx, z_NV, lse_N, cut_value_N, cut_index_N):
        ctx.save_for_backward(z_NV, lse_N, cut_value_N, cut_index_N)
        return lse_N.clone()

    @staticmethod
    def backward(ctx, grad_N):
        z_NV, lse_N, cut_value_N, cut_index_N = ctx.saved_tensors
        grad_NV = torch.empty_like(z_NV)
        N, V = z_NV.shape
        ids_V = torch.arange(V, device=z_NV.device)
        step = _row_step(V)
        for start in range(0, N, step):
            rows = slice(start, start + step)
            z_nV = z_NV[rows]
            kept_nV = _kept(z_nV, ids_V[None, :], cut_value_N[rows], cut_index_N[rows])
            p_nV = torch.exp(z_nV - lse_N[rows, None]).masked_fill_(~kept_nV, 0.0)
            grad_NV[rows] = p_nV.mul_(grad_N[rows, None])
        return grad_NV, None, None, None


def _truncated_logp_BS(
    z_BSV: torch.Tensor, input_ids_BS: torch.Tensor, top_p: float, top_k: int, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp_BS, entropy_BS or None)`` under the truncated, renormalised distribution.

    Rows are all ``B * S`` positions of z (a view, no copy); the last position of each row
    predicts nothing and is dropped at the end.
    """
    B, S, V = z_BSV.shape
    z_NV = z_BSV.reshape(B * S, V)
    target_N = torch.nn.functional.pad(input_ids_BS[:, 1:], (0, 1), value=0).reshape(-1, 1)
    cut_value_N, cut_index_N, lse_N, entropy_N = _nucleus_N(z_NV, top_p, top_k, with_entropy)
    picked_N = z_NV.gather(-1, target_N).squeeze(-1)
    kept_N = _kept(picked_N.detach()[:, None], target_N, cut_value_N, cut_index_N).squeeze(-1)
    if torch.is_grad_enabled() and z_NV.requires_grad:
        lse_N = _KeptLogSumExp.apply(z_NV, lse_N, cut_value_N, cut_index_N)
    logp_N = torch.where(kept_N, picked_N - lse_N, float("-inf"))

    def shifted(x_N: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x_N.reshape(B, S)[:, :-1], (1, 0), value=0.0)

    return shifted(logp_N), None if entropy_N is None else shifted(entropy_N)


# ---------------------------------------------------------------- public


@dataclass(frozen=True)
class Sampling:
    """The rollout's sampling settings, which the learner's log-probs reproduce (spec section 0)."""

    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus mass; 1 = off."""
    top_k: int = 0
    """Most probable tokens kept; 0 or -1 = off (vLLM's convention), as is any value >= V."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        _check_truncation(self.top_p, self.top_k)

    @property
    def truncates(self) -> bool:
        """Whether top-p or top-k may leave a token outside the kept set (log-prob ``-inf``)."""
        return self.top_p < 1.0 or self.top_k > 0

    @classmethod
    def of(cls, sampling: "float | Sampling") -> "Sampling":
        """A ``Sampling`` as is; a bare number is a temperature without truncation."""
        return sampling if isinstance(sampling, Sampling) else cls(temperature=float(sampling))


def token_logprobs(
    model: nn.Module,
    input_ids_BS: torch.Tensor,
    attention_mask_BS: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
) -> torch.Tensor:
    """fp32 ``logp_BS`` (carries gradient unless called under ``torch.no_grad``); ``-inf`` where the
    token is outside the top-k / top-p set."""
    _check_truncation(top_p, top_k)
    z_BSV = _scaled_logits_BSV(model, input_ids_BS, attention_mask_BS, temperature)
    if not _truncates(top_p, top_k, z_BSV.shape[-1]):
        return _gather_logp_BS(z_BSV, input_ids_BS)
    return _truncated_logp_BS(z_BSV, input_ids_BS, top_p, top_k, with_entropy=False)[0]


def token_logprobs_and_entropy(
    model: nn.Module,
    input_ids_BS: torch.Tensor,
    attention_mask_BS: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_BS, entropy_BS)`` from one forward; the entropy (of the truncated distribution) is detached."""
    _check_truncation(top_p, top_k)
    z_BSV = _scaled_logits_BSV(model, input_ids_BS, attention_mask_BS, temperature)
    if not _truncates(top_p, top_k, z_BSV.shape[-1]):
        return _gather_logp_BS(z_BSV, input_ids_BS), _entropy_BS(z_BSV)
    logp_BS, entropy_BS = _truncated_logp_BS(z_BSV, input_ids_BS, top_p, top_k, with_entropy=True)
    return logp_BS, entropy_BS
