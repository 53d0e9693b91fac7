"""``report.html``: one self-contained page (inline CSS, inline SVG charts, no network).

Rendered from ``templates/report.html.j2`` with Jinja2 autoescaping on: every string that
comes from the dump (uid, prompt and response text, token text, the file name) is escaped by
the template engine, never by hand.
"""

import math
from pathlib import Path

import jinja2

from system.report.dump import BEHAVIOUR_KEY, PROXIMAL_KEY

TEMPLATE = "report.html.j2"
TEMPLATE_DIR = Path(__file__).with_name("templates")
MAX_TABLES = 20
MAX_TOKENS = 256
METHOD_COLUMNS = ("keep_token_frac", "keep_seq_frac", "weight_mean", "weight_max", "ess")
LAG_COLUMNS = ("n_sequences", "n_tokens", "kl_k1", "kl_k3", "abs_diff_median", "frac_outside_5x", "ess_seq")


def fmt(value, digits: int = 4) -> str:
    """A number for the page: ``n/a`` for None or a non-finite float, 4 significant digits."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else "n/a"
    return str(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = fmt
    return env


def _kl_level(kl: float | None) -> tuple[str, str]:
    if kl is None:
        return "", "undefined: no valid tokens"
    if abs(kl) <= 1e-2:
        return "ok", "within the dense BF16-vs-BF16 range (4e-4 to 1e-2)"
    if abs(kl) <= 0.1:
        return "warn", "above dense runs (4e-4 to 1e-2): correction matters"
    return "bad", "severe: far above dense runs (4e-4 to 1e-2)"


def headline_cards(s: dict) -> list[dict]:
    level, note = _kl_level(s["kl_k1"])
    cards = [
        (level, "kl_k1", s["kl_k1"], note),
        ("", "kl_k3", s["kl_k3"], "unbiased, non-negative KL(mu || pi_old)"),
        ("", "chi2_token", s["chi2_token"], "token chi-square divergence"),
        ("", "ess_seq", s["ess_seq"], "sequence-ratio ESS fraction (1 = no loss)"),
        ("", "abs_diff_median", s["abs_diff_median"], "median |log-ratio|, nats"),
        ("", "frac_outside_5x", s["frac_outside_5x"], "tokens whose ratio is beyond 5x"),
        ("", "logp_pearson", s["logp_pearson"], "correlation of rollout and trainer log-probs"),
        ("", "AIS severity", s["ais"].get("severity"), "mean |clamped log-ratio| (~2 TV)"),
    ]
    return [{"level": c, "key": k, "value": v, "note": n} for c, k, v, n in cards]


def token_rows(tokens: dict, limit: int = MAX_TOKENS) -> list[dict]:
    """The first ``limit`` rows of a per-token table, with the page's highlighting decided."""
    labels = tokens.get("token") or [str(t) for t in tokens.get("token_id", [""] * len(tokens["position"]))]
    rows = []
    for k in range(min(len(tokens["position"]), limit)):
        diff, ratio = tokens["diff"][k], tokens["ratio"][k]
        rows.append({
            "pos": tokens["position"][k],
            "label": repr(labels[k]),
            "behaviour": tokens[BEHAVIOUR_KEY][k],
            "proximal": tokens[PROXIMAL_KEY][k],
            "diff": diff,
            "p_behaviour": tokens["p_rollout"][k],
            "p_proximal": tokens["p_train"][k],
            "ratio": ratio,
            "marked": diff is None or abs(diff) > 0.5,
            "out": ratio is None or not (0.2 <= ratio <= 5.0),
        })
    return rows


def _scalars(section: dict) -> dict:
    return {k: v for k, v in section.items() if v is None or isinstance(v, (int, float))}


def render_page(source: str, summary: dict, samples: dict, figures: dict[str, str]) -> str:
    """The page for ``summary`` (summary.json), ``samples`` (samples.json) and ``figures``
    (keys ``ratio_hist``, ``prob_diff``, ``density``, ``keep_by_len``; empty for no valid tokens)."""
    worst = [{**seq, "rows": token_rows(seq["tokens"])} for seq in samples["worst"][:MAX_TABLES]]
    return _environment().get_template(TEMPLATE).render(
        source=source,
        s=summary,
        cards=headline_cards(summary),
        ais=_scalars(summary.get("ais", {})),
        figures=figures,
        method_cols=METHOD_COLUMNS,
        lag_cols=LAG_COLUMNS,
        worst=worst,
        worst_k=len(samples["worst"]),
        n_rows=samples["n_rows"],
        max_tokens=MAX_TOKENS,
        above_zero=_above_zero(summary),
    )


def _above_zero(summary: dict) -> dict | None:
    """Masked-in log-probs above 0, as ``{"behaviour": n, "proximal": n}`` (summary.json counts them by
    dump key); None when the summary has no such count or both are 0."""
    counts = summary.get("logp_above_zero") or {}
    found = {"behaviour": counts.get(BEHAVIOUR_KEY, 0), "proximal": counts.get(PROXIMAL_KEY, 0)}
    return found if any(found.values()) else None
