"""A straightforward per-metric implementation (the way verl's helper is organised), for comparison only.

Every metric masks, exponentiates and reduces on its own from the raw inputs; nothing is
shared. Same definitions as ``CORRECTION_SPEC.md`` section 1; not used by aisrl itself.
"""

import torch


def _valid(mu, old, mask):
    return mask.bool() & torch.isfinite(mu) & torch.isfinite(old)


def _d(mu, old, mask):
    v = _valid(mu, old, mask)
    return torch.where(v, old.double() - mu.double(), 0.0), v


def kl_k1(mu, old, mask):
    d, v = _d(mu, old, mask)
    return (-d)[v].mean()


def kl_k2(mu, old, mask):
    d, v = _d(mu, old, mask)
    return (0.5 * d.clamp(-20, 20) ** 2)[v].mean()


def kl_k3(mu, old, mask):
    d, v = _d(mu, old, mask)
    dc = d.clamp(-20, 20)
    return (torch.exp(dc) - 1 - dc)[v].mean()


def chi2_token(mu, old, mask):
    d, v = _d(mu, old, mask)
    return (torch.exp(d.clamp(-20, 20)) ** 2)[v].mean() - 1


def _seq(mu, old, mask):
    d, v = _d(mu, old, mask)
    return d.clamp(-20, 20).sum(1), v.sum(1) > 0


def chi2_seq(mu, old, mask):
    L, s = _seq(mu, old, mask)
    return (torch.exp(L.clamp(-20, 20)) ** 2)[s].mean() - 1


def pearson(mu, old, mask):
    v = _valid(mu, old, mask)
    return torch.corrcoef(torch.stack([mu[v].double(), old[v].double()]))[0, 1]


def abs_diff(mu, old, mask):
    d, v = _d(mu, old, mask)
    a = d.abs()[v]
    return a.mean(), a.median(), a.max()


def prob_abs_diff(mu, old, mask):
    v = _valid(mu, old, mask)
    return (torch.exp(old.double()) - torch.exp(mu.double())).abs()[v].mean()


def frac_outside(mu, old, mask, factor):
    d, v = _d(mu, old, mask)
    return (d.abs()[v] > torch.log(torch.tensor(float(factor)))).double().mean()


def ess_token(mu, old, mask):
    d, v = _d(mu, old, mask)
    r = torch.exp(d.clamp(-20, 20))[v]
    return r.sum() ** 2 / (r.numel() * (r**2).sum())


def ess_seq(mu, old, mask):
    L, s = _seq(mu, old, mask)
    r = torch.exp(L.clamp(-20, 20))[s]
    return r.sum() ** 2 / (r.numel() * (r**2).sum())


def seq_mis_weights(mu, old, mask, hi=3.0):
    d, v = _d(mu, old, mask)
    L = d.clamp(-20, 20).sum(1)
    keep = L <= torch.log(torch.tensor(hi, dtype=torch.float64))
    w = torch.exp(L.clamp(-20, 20)) * keep
    return torch.where(v, w[:, None].expand_as(d), 0.0)


def all_metrics(mu, old, mask) -> dict:
    return {
        "kl_k1": kl_k1(mu, old, mask), "kl_k2": kl_k2(mu, old, mask), "kl_k3": kl_k3(mu, old, mask),
        "chi2_token": chi2_token(mu, old, mask), "chi2_seq": chi2_seq(mu, old, mask),
        "pearson": pearson(mu, old, mask), "abs_diff": abs_diff(mu, old, mask),
        "prob_abs_diff": prob_abs_diff(mu, old, mask), "frac_2x": frac_outside(mu, old, mask, 2),
        "frac_5x": frac_outside(mu, old, mask, 5), "ess_token": ess_token(mu, old, mask),
        "ess_seq": ess_seq(mu, old, mask), "w": seq_mis_weights(mu, old, mask),
    }
