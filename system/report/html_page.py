"""``report.html``: one self-contained page (inline CSS, images as data URIs, no network)."""

from html import escape

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#1d2330}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde}
.sub{color:#667;margin-bottom:14px} .cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #dde;border-radius:8px;padding:8px 12px;min-width:150px}
.card b{display:block;font-size:20px} .card span{color:#667;font-size:12px}
.ok{border-left:5px solid #3a9a5b} .warn{border-left:5px solid #f0b429} .bad{border-left:5px solid #d64545}
table{border-collapse:collapse;margin:6px 0;font-size:13px} td,th{border:1px solid #dde;padding:3px 7px;text-align:right}
th{background:#f4f6fa} td.l,th.l{text-align:left} tr.marked td{font-weight:600;background:#fff4e0}
td.out{background:#f8c9c9} .figs{display:flex;flex-wrap:wrap;gap:12px} img{max-width:100%}
details{margin:6px 0} summary{cursor:pointer}
"""

MAX_TABLES = 20
MAX_TOKENS = 256


def _fmt(v, digits: int = 4) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}g}"


def _kl_level(kl: float | None) -> tuple[str, str]:
    if kl is None:
        return "ok", "no valid tokens"
    if abs(kl) <= 1e-2:
        return "ok", "within the dense BF16-vs-BF16 range (4e-4 to 1e-2)"
    if abs(kl) <= 0.1:
        return "warn", "above dense runs (4e-4 to 1e-2): correction matters"
    return "bad", "severe: far above dense runs (4e-4 to 1e-2)"


def headline(s: dict) -> str:
    level, note = _kl_level(s["kl_k1"])
    cards = [
        (level, "kl_k1", s["kl_k1"], note),
        ("", "kl_k3", s["kl_k3"], "unbiased, non-negative KL(mu || pi_old)"),
        ("", "chi2_token", s["chi2_token"], "token chi-square divergence"),
        ("", "ess_seq", s["ess_seq"], "sequence-ratio ESS fraction (1 = no loss)"),
        ("", "abs_diff_median", s["abs_diff_median"], "median |log-ratio|, nats"),
        ("", "frac_outside_5x", s["frac_outside_5x"], "tokens whose ratio is beyond 5x"),
        ("", "logp_pearson", s["logp_pearson"], "correlation of rollout and trainer log-probs"),
        ("", "AIS severity", s["ais"]["severity"], "mean |clamped log-ratio| (~2 TV)"),
    ]
    return '<div class="cards">' + "".join(
        f'<div class="card {c}"><span>{escape(k)}</span><b>{_fmt(v)}</b><span>{escape(n)}</span></div>'
        for c, k, v, n in cards
    ) + "</div>"


def methods_html(methods: dict[str, dict]) -> str:
    cols = ["keep_token_frac", "keep_seq_frac", "weight_mean", "weight_max", "ess"]
    head = "<tr><th class=l>method</th>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
    rows = "".join(
        f"<tr><td class=l>{escape(name)}</td>" + "".join(f"<td>{_fmt(st[c])}</td>" for c in cols) + "</tr>"
        for name, st in methods.items()
    )
    return f"<table>{head}{rows}</table>"


def by_lag_html(by_lag: dict[str, dict] | None) -> str:
    if not by_lag:
        return "<p>No <code>lag</code> array in this dump: every sample is taken as fresh (lag 0).</p>"
    cols = ["n_sequences", "n_tokens", "kl_k1", "kl_k3", "abs_diff_median", "frac_outside_5x", "ess_seq"]
    head = "<tr><th class=l>lag</th>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
    rows = "".join(
        f"<tr><td class=l>{escape(lag)}</td>" + "".join(f"<td>{_fmt(d[c])}</td>" for c in cols) + "</tr>"
        for lag, d in by_lag.items()
    )
    return f"<table>{head}{rows}</table><p class=sub>Lag 0 isolates the quantization/kernel mismatch; growth with lag is staleness.</p>"


def _token_rows(tok: dict) -> str:
    rows = []
    labels = tok.get("token") or [str(t) for t in tok.get("token_id", [""] * len(tok["position"]))]
    for k in range(min(len(tok["position"]), MAX_TOKENS)):
        diff, ratio = tok["diff"][k], tok["ratio"][k]
        marked = diff is None or abs(diff) > 0.5
        out = ratio is None or not (0.2 <= ratio <= 5.0)
        rows.append(
            f'<tr class="{"marked" if marked else ""}"><td>{tok["position"][k]}</td>'
            f"<td class=l>{escape(repr(labels[k]))}</td><td>{_fmt(tok['rollout_logp'][k])}</td>"
            f"<td>{_fmt(tok['train_logp'][k])}</td><td>{_fmt(diff)}</td><td>{_fmt(tok['p_rollout'][k])}</td>"
            f"<td>{_fmt(tok['p_train'][k])}</td><td class=\"{'out' if out else ''}\">{_fmt(ratio)}</td></tr>"
        )
    return "".join(rows)


def sequences_html(samples: list[dict]) -> str:
    head = ("<tr><th>pos</th><th class=l>token</th><th>rollout logp</th><th>trainer logp</th>"
            "<th>diff</th><th>p rollout</th><th>p trainer</th><th>ratio</th></tr>")
    parts = [f"<p class=sub>The {min(MAX_TABLES, len(samples))} worst of {len(samples)} sequences by mean |diff| "
             f"(first {MAX_TOKENS} tokens each; all of them are in samples.json). Shaded: ratio outside "
             "[1/5, 5]; bold rows: |diff| &gt; 0.5 nats.</p>"]
    for rank, s in enumerate(samples[:MAX_TABLES]):
        title = (f"#{rank + 1} uid {escape(s['uid'])}: mean |diff| {_fmt(s['mean_abs_diff'])}, "
                 f"{s['length']} tokens, lag {s['lag']}, reward {_fmt(s['reward'])}")
        parts.append(f"<details{' open' if rank < 3 else ''}><summary>{title}</summary>"
                     f"<table>{head}{_token_rows(s['tokens'])}</table></details>")
    return "".join(parts)


def render_page(source: str, summary: dict, samples: list[dict], figures: dict[str, str]) -> str:
    img = {k: f'<img alt="{k}" src="data:image/png;base64,{v}">' for k, v in figures.items()}
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>aisrl mismatch report</title>
<style>{_CSS}</style></head><body>
<h1>Train-inference mismatch report</h1>
<div class=sub>{escape(source)}: {summary['n_sequences']} sequences, {summary['n_tokens']} valid tokens,
{summary['nonfinite_tokens']} non-finite tokens excluded.</div>
{headline(summary)}
<h2>Token ratios</h2><div class=figs>{img['ratio_hist']}{img['prob_diff']}</div>
<h2>Log-probs, rollout vs trainer</h2><div class=figs>{img['scatter']}</div>
<h2>What each correction would keep</h2>{methods_html(summary['methods'])}
<h2>Kept fraction by response length</h2><div class=figs>{img['keep_by_len']}</div>
<h2>By policy lag</h2>{by_lag_html(summary.get('by_lag'))}
<h2>Worst sequences, token by token</h2>{sequences_html(samples)}
</body></html>"""
