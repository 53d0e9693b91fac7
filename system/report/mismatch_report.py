"""The mismatch report of one batch dump: ``summary.json``, ``samples.json`` and ``report.html``."""

import json
from pathlib import Path

import numpy as np

from system.report import plots
from system.report.dump import load_dump
from system.report.html_page import render_page
from system.report.samples import build_samples
from system.report.summary import build_summary, dump_ratios


def write_report(dump_path: str | Path, out_dir: str | Path) -> dict:
    """Write the three report files into ``out_dir``; return the summary. Raises DumpError on bad input."""
    dump = load_dump(dump_path)
    ratios = dump_ratios(dump)
    summary = build_summary(dump, ratios)
    samples = build_samples(dump, ratios)
    valid = ratios.valid_BT.numpy()
    mu, old = dump.rollout_logp[valid], dump.train_logp[valid]
    figures = {
        "ratio_hist": plots.ratio_histogram(ratios.dc_BT.numpy()[valid]),
        "prob_diff": plots.prob_diff_histogram(np.abs(np.exp(old.astype(np.float64)) - np.exp(mu.astype(np.float64)))),
        "scatter": plots.logprob_scatter(mu, old, summary["logp_pearson"]),
        "keep_by_len": plots.keep_by_length(summary["methods"]),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "samples.json").write_text(json.dumps(samples))
    (out / "report.html").write_text(render_page(str(dump_path), summary, samples, figures))
    return summary
