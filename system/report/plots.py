"""The report's figures, rendered with matplotlib (Agg) to base64 PNG for embedding in HTML.

Every figure is drawn from binned counts (``np.histogram`` / ``np.bincount``) over all valid
tokens, so its cost is one pass over the data plus a fixed drawing cost, whatever the batch
size; no figure subsamples. Figures are built on ``matplotlib.figure.Figure`` (no pyplot
state) with fixed margins (one draw per figure, no ``bbox_inches="tight"`` second pass).
"""

import base64
import io

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

_DPI = 85
_BLUE = "#3b6ea8"
_RATIO_TICKS = (1e-8, 1e-6, 1e-4, 1e-3, 0.01, 0.1, 0.2, 0.5, 1, 2, 5, 10, 100, 1e3, 1e4, 1e6, 1e8)
_DENSITY_BINS = 160
_DENSITY_LOW_QUANTILE = 1e-3
"""The density plot spans log-probs from this quantile up to 0; lower values go in the edge bin."""


_PLAIN = FuncFormatter(lambda value, _pos: f"{value:g}")
"""Tick labels as plain numbers: the default log-axis labels go through mathtext, whose first
parse costs about 0.3 s per process."""


def _figure(width: float, height: float, bottom: float = 0.16, right: float = 0.96) -> tuple[Figure, object]:
    fig = Figure(figsize=(width, height), dpi=_DPI)
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.11, right=right, top=0.9, bottom=bottom)
    return fig, ax


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _log_counts(ax, counts: np.ndarray, edges: np.ndarray) -> None:
    """A filled step histogram on a log count axis (empty bins drawn at the axis floor)."""
    floor = 0.7
    ax.stairs(np.maximum(counts, floor), edges, baseline=floor, fill=True, color=_BLUE)
    ax.set_yscale("log")
    ax.set_ylim(floor, max(float(counts.max(initial=1)), 1.0) * 1.6)
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(_PLAIN)


def ratio_histogram(dc: np.ndarray) -> str:
    """Per-token ratio ``exp(dc)`` on a log axis, with the r = 1 line and the 2x / 5x bands."""
    fig, ax = _figure(6.4, 3.6)
    lo = min(float(dc.min(initial=0.0)), -np.log(10.0))
    hi = max(float(dc.max(initial=0.0)), np.log(10.0))
    log_edges = np.linspace(lo, hi, 121)
    counts, _ = np.histogram(dc, bins=log_edges)
    edges = np.exp(log_edges)
    _log_counts(ax, counts, edges)
    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ticks = [t for t in _RATIO_TICKS if edges[0] <= t <= edges[-1]]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlim(edges[0], edges[-1])
    ax.axvspan(1 / 5, 1 / 2, color="#f0b429", alpha=0.15, label="2x-5x")
    ax.axvspan(2, 5, color="#f0b429", alpha=0.15)
    ax.axvspan(edges[0], 1 / 5, color="#d64545", alpha=0.12, label="beyond 5x")
    ax.axvspan(5, edges[-1], color="#d64545", alpha=0.12)
    ax.axvline(1.0, color="black", lw=1, label="r = 1")
    ax.set_xlabel("token ratio  pi_train / pi_rollout")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=8)
    return _png(fig)


def prob_diff_histogram(abs_prob_diff: np.ndarray) -> str:
    """Histogram of ``|p_train - p_rollout|`` per token."""
    fig, ax = _figure(6.4, 3.6)
    edges = np.linspace(0.0, 1.0, 101)
    counts, _ = np.histogram(abs_prob_diff, bins=edges)
    _log_counts(ax, counts, edges)
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("|p_train - p_rollout|")
    ax.set_ylabel("tokens")
    return _png(fig)


def density_counts(mu: np.ndarray, old: np.ndarray, bins: int = _DENSITY_BINS) -> tuple[np.ndarray, float]:
    """Token counts on a ``bins x bins`` grid over ``[lo, 0]**2`` (row = old, column = mu) and ``lo``.

    ``lo`` is the lower of the two ``_DENSITY_LOW_QUANTILE`` quantiles (at most -1); values
    outside the square are counted in its edge bins.
    """
    if mu.size == 0:
        return np.zeros((bins, bins), np.int64), -1.0
    q = [float(np.quantile(x, _DENSITY_LOW_QUANTILE)) for x in (mu, old)]
    lo = min(min(q), -1.0)
    scale = bins / (0.0 - lo)

    def index(x: np.ndarray) -> np.ndarray:
        return np.clip(((x - lo) * scale).astype(np.int64), 0, bins - 1)

    flat = index(old) * bins + index(mu)
    return np.bincount(flat, minlength=bins * bins).reshape(bins, bins), lo


def logprob_density(mu: np.ndarray, old: np.ndarray, pearson: float | None) -> str:
    """Trainer vs rollout log-prob of every valid token as a 2-D density, against y = x."""
    counts, lo = density_counts(mu, old)
    fig, ax = _figure(4.8, 4.2, bottom=0.13, right=0.86)
    shown = np.where(counts > 0, counts, np.nan)
    image = ax.imshow(shown, origin="lower", extent=(lo, 0.0, lo, 0.0), aspect="auto",
                      cmap="viridis", norm=LogNorm(vmin=1, vmax=max(int(counts.max(initial=1)), 2)),
                      interpolation="nearest")
    bar = fig.colorbar(image, ax=ax, label="tokens", fraction=0.05, pad=0.02)
    bar.ax.yaxis.set_minor_locator(NullLocator())
    bar.ax.yaxis.set_major_formatter(_PLAIN)
    ax.plot([lo, 0], [lo, 0], color="black", lw=1, label="y = x")
    r = "n/a" if pearson is None else f"{pearson:.4f}"
    ax.set_title(f"Pearson r = {r}", fontsize=10)
    ax.set_xlabel("rollout log-prob (mu)")
    ax.set_ylabel("trainer log-prob (old)")
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def keep_by_length(methods: dict[str, dict]) -> str:
    """Sequences each method keeps, by response-length bucket (None buckets are empty)."""
    buckets = ["<=128", "<=512", "<=2048", ">2048"]
    fig, ax = _figure(6.4, 3.4, bottom=0.3, right=0.94)
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
