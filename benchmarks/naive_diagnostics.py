"""A straightforward per-metric implementation (the way verl's helper is organised), for comparison only.

Every metric masks, exponentiates and reduces on its own from the raw inputs; nothing is
shared. Same definitions as ``CORRECTION_SPEC.md`` section 1; not used by aisrl itself.
"""

import torch


def _valid(behaviour, proximal, mask):
    return mask.bool() & torch.isfinite(behaviour) & torch.isfinite(proximal)


def _d(behaviour, proximal, mask):
    v = _valid(behaviour, proximal, mask)
    return torch.where(v, proximal.double() - behaviour.double(), 0.0), v


def kl_k1(behaviour, proximal, mask):
    d, v = _d(behaviour, proximal, mask)
    return (-d)[v].mean()


def kl_k2(behaviour, proximal, mask):
    d, v = _d(behaviour, proximal, mask)
    return (0.5 * d.clamp(-20, 20) ** 2)[v].mean()


def kl_k3(behaviour, proximal, mask):
    d, v = _d(behaviour, proximal, mask)
    dc = d.clamp(-20, 20)
    return (torch.exp(dc) - 1 - dc)[v].mean()


def chi2_token(behaviour, proximal, mask):
    d, v = _d(behaviour, proximal, mask)
    return (torch.exp(d.clamp(-20, 20)) ** 2)[v].mean() - 1


def _seq(behaviour, proximal, mask):
    d, v = _d(behaviour, proximal, mask)
    return d.clamp(-20, 20).sum(1), v.sum(1) > 0


def chi2_seq(behaviour, proximal, mask):
    L, s = _seq(behaviour, proximal, mask)
    return (torch.exp(L.clamp(-20, 20)) ** 2)[s].mean() - 1


def pearson(behaviour, proximal, mask):
    v = _valid(behaviour, proximal, mask)
    return torch.corrcoef(torch.stack([behaviour[v].double(), proximal[v].double()]))[0, 1]


def abs_diff(behaviour, proximal, mask):
    d, v = _d(behaviour, proximal, mask)
    a = d.abs()[v]
    return a.mean(), a.median(), a.max()


def prob_abs_diff(behaviour, proximal, mask):
    v = _valid(behaviour, proximal, mask)
    return (torch.exp(proximal.double()) - torch.exp(behaviour.double())).abs()[v].mean()


def frac_outside(behaviour, proximal, mask, factor):
    d, v = _d(behaviour, proximal, mask)
    return (d.abs()[v] > torch.log(torch.tensor(float(factor)))).double().mean()


def ess_token(behaviour, proximal, mask):
    d, v = _d(behaviour, proximal, mask)
    r = torch.exp(d.clamp(-20, 20))[v]
    return r.sum() ** 2 / (r.numel() * (r**2).sum())


def ess_seq(behaviour, proximal, mask):
    L, s = _seq(behaviour, proximal, mask)
    r = torch.exp(L.clamp(-20, 20))[s]
    return r.sum() ** 2 / (r.numel() * (r**2).sum())


def seq_mis_weights(behaviour, proximal, mask, hi=3.0):
    d, v = _d(behaviour, proximal, mask)
    L = d.clamp(-20, 20).sum(1)
    keep = L <= torch.log(torch.tensor(hi, dtype=torch.float64))
    w = torch.exp(L.clamp(-20, 20)) * keep
    return torch.where(v, w[:, None].expand_as(d), 0.0)


def all_metrics(behaviour, proximal, mask) -> dict:
    return {
        "kl_k1": kl_k1(behaviour, proximal, mask), "kl_k2": kl_k2(behaviour, proximal, mask), "kl_k3": kl_k3(behaviour, proximal, mask),
        "chi2_token": chi2_token(behaviour, proximal, mask), "chi2_seq": chi2_seq(behaviour, proximal, mask),
        "pearson": pearson(behaviour, proximal, mask), "abs_diff": abs_diff(behaviour, proximal, mask),
        "prob_abs_diff": prob_abs_diff(behaviour, proximal, mask), "frac_2x": frac_outside(behaviour, proximal, mask, 2),
        "frac_5x": frac_outside(behaviour, proximal, mask, 5), "ess_token": ess_token(behaviour, proximal, mask),
        "ess_seq": ess_seq(behaviour, proximal, mask), "w": seq_mis_weights(behaviour, proximal, mask),
    }
