"""The report's figures, rendered with matplotlib (Agg) to base64 PNG for embedding in HTML."""

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_SCATTER_POINTS = 40_000


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=85, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def ratio_histogram(dc: np.ndarray) -> str:
    """Per-token ratio ``exp(dc)`` on a log axis, with the r = 1 line and the 2x / 5x bands."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    lo, hi = min(dc.min(initial=0.0), -np.log(10.0)), max(dc.max(initial=0.0), np.log(10.0))
    bins = np.exp(np.linspace(lo, hi, 121))
    ax.hist(np.exp(dc), bins=bins, color="#3b6ea8")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axvspan(1 / 5, 1 / 2, color="#f0b429", alpha=0.15, label="2x-5x")
    ax.axvspan(2, 5, color="#f0b429", alpha=0.15)
    ax.axvspan(bins[0], 1 / 5, color="#d64545", alpha=0.12, label="beyond 5x")
    ax.axvspan(5, bins[-1], color="#d64545", alpha=0.12)
    ax.axvline(1.0, color="black", lw=1, label="r = 1")
    ax.set_xlabel("token ratio  pi_train / pi_rollout")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=8)
    return _png(fig)


def prob_diff_histogram(abs_prob_diff: np.ndarray) -> str:
    """Histogram of ``|p_train - p_rollout|`` per token."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.hist(abs_prob_diff, bins=100, range=(0.0, 1.0), color="#3b6ea8")
    ax.set_yscale("log")
    ax.set_xlabel("|p_train - p_rollout|")
    ax.set_ylabel("tokens")
    return _png(fig)


def logprob_scatter(mu: np.ndarray, old: np.ndarray, pearson: float | None, seed: int = 0) -> str:
    """Trainer vs rollout log-prob per token against y = x (subsampled beyond 40k points)."""
    if mu.size > _SCATTER_POINTS:
        keep = np.random.default_rng(seed).choice(mu.size, _SCATTER_POINTS, replace=False)
        mu, old = mu[keep], old[keep]
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    ax.scatter(mu, old, s=2, alpha=0.35, color="#3b6ea8", rasterized=True)
    lo = float(min(mu.min(initial=0.0), old.min(initial=0.0)))
    ax.plot([lo, 0], [lo, 0], color="black", lw=1, label="y = x")
    r = "n/a" if pearson is None else f"{pearson:.4f}"
    ax.set_title(f"Pearson r = {r}", fontsize=10)
    ax.set_xlabel("rollout log-prob (mu)")
    ax.set_ylabel("trainer log-prob (old)")
    ax.legend(fontsize=8)
    return _png(fig)


def keep_by_length(methods: dict[str, dict]) -> str:
    """Sequences each method keeps, by response-length bucket (None buckets are empty)."""
    buckets = ["<=128", "<=512", "<=2048", ">2048"]
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    width = 0.8 / max(len(methods), 1)
    for k, (name, stats) in enumerate(methods.items()):
        by_len = stats["keep_seq_frac_by_len"]
        vals = [np.nan if by_len.get(b) is None else by_len[b] for b in buckets]
        ax.bar(np.arange(len(buckets)) + k * width, vals, width, label=name)
    ax.set_xticks(np.arange(len(buckets)) + 0.4 - width / 2, buckets)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("kept sequence fraction")
    ax.set_xlabel("response length (tokens)")
    ax.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    return _png(fig)
