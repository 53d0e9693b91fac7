"""``aisrl report``: the three files, their values, and clear errors on adversarial dumps.

Expected values come from hand arithmetic (in comments) or from a few lines of plain numpy
written here, never from the code under test.
"""

import base64
import json
import math
import struct
import tomllib
import zlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from actors.cli import app
from system.report import plots
from system.report.demo_dump import make_demo_dump
from system.report.dump import load_dump, save_dump
from system.report.mismatch_report import write_report

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
SECTION1 = ["n_sequences", "n_tokens", "nonfinite_tokens", "kl_k1", "kl_k2", "kl_k3", "chi2_token",
            "chi2_seq", "logp_pearson", "abs_diff_mean", "abs_diff_median", "abs_diff_max",
            "prob_abs_diff_mean", "frac_outside_2x", "frac_outside_5x", "ess_token", "ess_seq"]
COUNTS = ("n_sequences", "n_tokens", "nonfinite_tokens")
SEQUENCE_COLUMNS = {"index", "uid", "reward", "lag", "length", "nonfinite_tokens", "seq_logratio",
                    "mean_abs_diff", "kept_seq_mis"}


def _refuse_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


def strict_load(path: Path):
    """json.loads that rejects NaN / Infinity / -Infinity (what a strict parser does)."""
    return json.loads(path.read_text(), parse_constant=_refuse_constant)


def _report(tmp_path, arrays, name="step_000001.npz"):
    dump = save_dump(tmp_path / name, **arrays)
    out = tmp_path / "out"
    result = runner.invoke(app, ["report", str(dump), "--out", str(out)])
    return result, out


def said(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def _outputs(out: Path) -> tuple[dict, dict, str]:
    return strict_load(out / "summary.json"), strict_load(out / "samples.json"), (out / "report.html").read_text()


def test_report_on_a_hand_sized_dump(tmp_path):
    # Two responses; the second has one padding column and a NaN token (excluded, counted).
    mu = np.array([[-1.0, -2.0, -0.5], [-0.1, np.nan, 0.0]], np.float32)
    old = np.array([[-1.0, -1.0, -0.5], [-0.6, -3.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    result, out = _report(tmp_path, {"rollout_logp": mu, "train_logp": old, "response_mask": mask,
                                     "lag": np.array([0, 1], np.int32)})
    assert result.exit_code == 0, result.output
    s, samples, _ = _outputs(out)
    assert set(SECTION1) <= set(s)
    # Valid tokens: d = [0, 1, 0] and [-0.5] -> 4 tokens, 2 sequences, 1 non-finite.
    assert (s["n_sequences"], s["n_tokens"], s["nonfinite_tokens"]) == (2, 4, 1)
    assert s["kl_k1"] == pytest.approx(-(1 - 0.5) / 4, rel=1e-5)
    assert s["abs_diff_max"] == pytest.approx(1.0, rel=1e-6)
    assert s["frac_outside_2x"] == pytest.approx(0.25)  # only |d| = 1 > log 2
    assert sorted(s["by_lag"]) == ["0", "1"] and s["by_lag"]["1"]["n_tokens"] == 1
    assert set(s["methods"]) == {"none", "token-tis", "icepop", "seq-tis", "seq-mis", "geo-rs"}
    # seq-mis (hi = 3): L = 1 (e^1 <= 3, kept) and -0.5 (kept) -> both kept.
    assert s["methods"]["seq-mis"]["keep_seq_frac"] == 1.0
    assert set(s["ais"]) == {"severity", "reliability", "variance_amplification", "bias", "noise", "alpha_raw"}
    assert s["ais"]["alpha_raw"] is None  # no advantages in this dump
    # samples.json: every row in the columnar table, in row order.
    seqs = samples["sequences"]
    assert set(seqs) == SEQUENCE_COLUMNS and samples["n_rows"] == 2
    assert seqs["length"] == [3, 1] and seqs["nonfinite_tokens"] == [0, 1]
    assert seqs["seq_logratio"] == pytest.approx([1.0, -0.5])  # L_i = sum of d
    assert seqs["mean_abs_diff"] == pytest.approx([1 / 3, 0.5])
    assert seqs["kept_seq_mis"] == [True, True] and seqs["uid"] == ["0", "1"]
    # Worst mean |diff| first: row 0 has mean 1/3, row 1 has 0.5.
    assert samples["worst_by"] == "mean_abs_diff"
    assert [r["index"] for r in samples["worst"]] == [1, 0]
    tok = samples["worst"][1]["tokens"]
    assert tok["diff"] == pytest.approx([0.0, 1.0, 0.0])
    assert tok["ratio"] == pytest.approx([1.0, np.e, 1.0], rel=1e-5)
    assert tok["p_train"][1] == pytest.approx(np.exp(-1.0), rel=1e-5)
    bad = samples["worst"][0]["tokens"]
    assert bad["valid"] == [True, False] and bad["ratio"][1] is None and bad["diff"][1] is None
    assert bad["rollout_logp"][1] is None  # the NaN itself is null, never NaN


def test_report_matches_numpy_on_a_demo_dump(tmp_path):
    arrays = make_demo_dump(48, 40, sigma=0.2, seed=5)
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    s, _, page = _outputs(out)
    m = arrays["response_mask"]
    d = (arrays["train_logp"] - arrays["rollout_logp"])[m].astype(np.float64)
    assert s["kl_k1"] == pytest.approx(np.mean(-d), rel=1e-5)
    assert s["abs_diff_median"] == pytest.approx(np.median(np.abs(d)), rel=1e-5)
    rho = np.exp(np.clip(d, -20, 20))
    assert s["ess_token"] == pytest.approx(rho.sum() ** 2 / (d.size * (rho**2).sum()), rel=1e-5)
    assert page.count('<svg class="chart"') == 4 and "</svg>" in page  # inline charts, no image files
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "<link" not in page and "src=\"http" not in page
    assert "seq-mis" in page and "By policy lag" in page


def test_samples_hold_every_sequence_and_token_tables_only_for_the_worst_k(tmp_path):
    arrays = make_demo_dump(100, 30, sigma=0.3, seed=11)
    arrays["response_mask"][7] = False  # a row with no valid token: null columns, never "worst"
    dump = save_dump(tmp_path / "d.npz", **arrays)
    write_report(dump, tmp_path / "out", worst_k=5)
    samples = strict_load(tmp_path / "out" / "samples.json")
    # Plain numpy reimplementation of the per-sequence columns (no non-finite values here).
    m = arrays["response_mask"]
    d = np.where(m, arrays["train_logp"].astype(np.float64) - arrays["rollout_logp"], 0.0)
    length = m.sum(1)
    with np.errstate(invalid="ignore"):
        mean_abs = np.abs(d).sum(1) / length
    seq_l = np.clip(d, -20, 20).sum(1)
    seqs = samples["sequences"]
    assert samples["n_rows"] == 100 and all(len(v) == 100 for v in seqs.values())
    assert seqs["length"] == length.tolist()
    assert seqs["mean_abs_diff"][7] is None and seqs["seq_logratio"][7] is None and seqs["kept_seq_mis"][7] is None
    keep = length > 0
    assert np.array(seqs["mean_abs_diff"], dtype=float)[keep] == pytest.approx(mean_abs[keep], abs=2e-6)
    assert np.array(seqs["seq_logratio"], dtype=float)[keep] == pytest.approx(seq_l[keep], abs=2e-5)
    assert [v for v, k in zip(seqs["kept_seq_mis"], keep, strict=True) if k] == (seq_l[keep] <= math.log(3)).tolist()
    assert seqs["lag"] == arrays["lag"].tolist() and seqs["uid"] == arrays["uid"].tolist()
    assert seqs["reward"] == pytest.approx(arrays["reward"].tolist(), abs=1e-6)
    # The worst 5 by mean |d|, worst first; only they carry token tables, each in full.
    want = sorted(np.flatnonzero(keep), key=lambda i: (-mean_abs[i], i))[:5]
    assert [r["index"] for r in samples["worst"]] == want
    for rec in samples["worst"]:
        i = rec["index"]
        assert rec["tokens"]["position"] == np.flatnonzero(m[i]).tolist()
        assert rec["tokens"]["token"] == arrays["token_text"][i][m[i]].tolist()
        assert rec["response_text"] == arrays["response_text"][i]
    assert sum("tokens" in r for r in samples["worst"]) == 5 and "tokens" not in seqs


@pytest.mark.parametrize("case", ["all_nan", "all_masked"])
def test_a_batch_without_valid_tokens_reports_nulls(tmp_path, case):
    arrays = make_demo_dump(6, 5, seed=2)
    if case == "all_nan":
        arrays["rollout_logp"][:] = np.nan
    else:
        arrays["response_mask"][:] = False
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    assert "no valid tokens" in said(result) and "Traceback" not in result.output
    s, samples, page = _outputs(out)
    nonfinite = int(arrays["response_mask"].sum()) if case == "all_nan" else 0
    assert (s["n_sequences"], s["n_tokens"], s["nonfinite_tokens"]) == (0, 0, nonfinite)
    assert all(s[k] is None for k in SECTION1 if k not in COUNTS)
    assert all(v is None for k, v in s["ais"].items() if k in ("severity", "reliability", "variance_amplification"))
    assert all(st["keep_seq_frac"] is None for st in s["methods"].values())
    assert all(d["kl_k1"] is None for d in s["by_lag"].values())
    assert samples["worst"] == [] and samples["n_rows"] == 6
    assert samples["sequences"]["mean_abs_diff"] == [None] * 6
    assert "No valid tokens" in page and "<svg" not in page


def test_summary_is_strict_json_with_nan_rewards(tmp_path):
    arrays = make_demo_dump(8, 6, seed=3)
    arrays["reward"][:] = np.nan  # reward_mean undefined -> null, not NaN
    arrays["reward"][2] = np.inf
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    text = (out / "summary.json").read_text() + (out / "samples.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    s, samples, _ = _outputs(out)
    assert s["reward_mean"] is None and samples["sequences"]["reward"] == [None] * 8


def test_page_escapes_dump_text(tmp_path):
    arrays = make_demo_dump(4, 5, sigma=0.5, seed=4)
    arrays["response_text"] = np.array(["<script>alert(1)</script>"] * 4)
    arrays["prompt_text"] = np.array(['"><img src=x onerror=alert(2)>'] * 4)
    arrays["uid"] = np.array(["<b>u</b>"] * 4)
    arrays["token_text"] = np.where(arrays["response_mask"], "</td><script>", "")
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    assert "<script" not in page and "<img src=x" not in page and "<b>u</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;u&lt;/b&gt;" in page and "&lt;/td&gt;&lt;script&gt;" in page


def test_density_counts_match_numpy_histogram2d():
    rng = np.random.default_rng(7)
    mu = -rng.exponential(1.0, 5000)
    old = np.minimum(mu + rng.normal(0.0, 0.3, 5000), 0.0)
    counts, lo = plots.density_counts(mu, old, bins=32)
    # numpy reference: range [lo, 0] from the 0.1% quantiles (at most -1), outliers in the edge bins
    want_lo = min(np.quantile(mu, 1e-3), np.quantile(old, 1e-3), -1.0)
    edges = np.linspace(want_lo, 0.0, 33)
    want, _, _ = np.histogram2d(np.clip(old, want_lo, 0.0), np.clip(mu, want_lo, 0.0), bins=[edges, edges])
    assert lo == pytest.approx(want_lo) and counts.sum() == 5000
    np.testing.assert_array_equal(counts, want)


def test_ratio_histogram_counts_every_token():
    dc = np.random.default_rng(3).normal(0.0, 1.0, 2000)
    chart = plots.ratio_histogram(dc)
    assert chart["counts"].sum() == 2000 and len(chart["counts"]) == 120
    # each token's bin by hand: 120 equal bins over [min(dc, -ln 10), max(dc, ln 10)], the last closed
    lo, hi = min(dc.min(), -math.log(10)), max(dc.max(), math.log(10))
    want = [0] * 120
    for x in dc:
        want[min(int((x - lo) / (hi - lo) * 120), 119)] += 1
    assert chart["counts"].tolist() == want
    assert {t["label"] for t in chart["xticks"]} >= {"0.2", "0.5", "1", "2", "5"}


def test_png_encoder_round_trips():
    pixels = np.random.default_rng(1).integers(0, 256, (5, 7, 4), dtype=np.uint8)
    png = base64.b64decode(plots.png_rgba(pixels))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(png):  # a minimal PNG reader: length, tag, data, CRC of tag + data
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        tag, data = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", png[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(tag + data)
        chunks[tag] = data
        pos += 12 + length
    assert struct.unpack(">IIBBBBB", chunks[b"IHDR"]) == (7, 5, 8, 6, 0, 0, 0)
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(5, 1 + 7 * 4)
    assert (rows[:, 0] == 0).all()  # filter type 0 (none) on every row
    np.testing.assert_array_equal(rows[:, 1:].reshape(5, 7, 4), pixels)


def test_template_is_package_data():
    assert (ROOT / "system/report/templates/report.html.j2").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(dep.lower().startswith("jinja2") for dep in project["project"]["dependencies"])
    assert "templates/*.j2" in project["tool"]["setuptools"]["package-data"]["system.report"]


def test_extreme_mismatch_stays_finite(tmp_path):
    # The compressed-weight regime and worse: log-probs down to -1e4 and ±inf in places.
    rng = np.random.default_rng(0)
    mu = -rng.exponential(3.0, (16, 32)).astype(np.float32)
    old = np.minimum(mu + rng.normal(0, 6.0, (16, 32)).astype(np.float32), 0.0)
    mu[0, 0], old[1, 1], old[2, 2] = -1e4, -np.inf, np.inf
    mask = np.ones((16, 32), bool)
    result, out = _report(tmp_path, {"rollout_logp": mu, "train_logp": old, "response_mask": mask})
    assert result.exit_code == 0, result.output
    s, _, _ = _outputs(out)
    assert s["nonfinite_tokens"] == 2
    assert list(s["by_lag"]) == ["0"] and s["by_lag"]["0"] == {k: s[k] for k in SECTION1}  # no lag: all 0
    assert s["n_tokens"] == 16 * 32 - 2 and s["n_sequences"] == 16
    assert all(s[k] is not None and np.isfinite(s[k]) for k in SECTION1)  # every diagnostic defined, finite
    assert s["abs_diff_max"] >= 1e4 - 10  # the -1e4 token is kept (only the two infinities are excluded)


def test_report_ais_bias_noise_alpha_raw_of_seq_mis_from_the_advantages(tmp_path):
    # AIS v2 (CORRECTION_SPEC.md section 3) for seq-mis, hi = 3, worked out by hand:
    # rho_seq = [2, 4, 0.5, 1] (row 1 rejected: 4 > 3), T = [1, 1, 2, 2], A = [1, -1, -1, 1]
    # d_i = A_i / T_i * sum_t k (w - 1) = [1, 0, 0.5, 0]: b = 3/8, s2 = 11/64;
    # R = ESS of min(rho_seq, 2) = [2, 2, .5, 1] = 30.25 / 37, n_eff = 4 R = 121/37;
    # noise2 = s2 / n_eff = 37/704; b^2 = 99/704 -> alpha_raw = (99 - 37) / 99 = 62/99.
    d = np.array([[np.log(2.0), 0.0], [np.log(4.0), 0.0], [np.log(0.5), 0.0], [0.0, 0.0]])
    mu = np.full((4, 2), -3.0)
    arrays = {"rollout_logp": mu.astype(np.float32), "train_logp": (mu + d).astype(np.float32),
              "response_mask": np.array([[1, 0], [1, 0], [1, 1], [1, 1]], bool)}
    result, out = _report(tmp_path, {**arrays, "advantage": np.array([1, -1, -1, 1], np.float32)})
    assert result.exit_code == 0, result.output
    ais = json.loads((out / "summary.json").read_text())["ais"]
    assert ais["bias"] == pytest.approx(3 / 8, rel=1e-5)
    assert ais["noise"] == pytest.approx(np.sqrt(37 / 704), rel=1e-5)
    assert ais["alpha_raw"] == pytest.approx(62 / 99, rel=1e-5)
    assert load_dump(tmp_path / "step_000001.npz").advantage.dtype == np.float32
    # without the optional key the three are null
    result, out = _report(tmp_path / "without", arrays)
    assert result.exit_code == 0, result.output
    ais = json.loads((out / "summary.json").read_text())["ais"]
    assert (ais["bias"], ais["noise"], ais["alpha_raw"]) == (None, None, None)
    assert ais["severity"] is not None


def test_nonfinite_rewards_and_advantages_are_left_out_and_counted(tmp_path):
    """Found by a hostile probe: one NaN made reward_mean and the ais estimate null without a word."""
    arrays = make_demo_dump(6, 4, seed=5)
    arrays["reward"] = np.array([1.0, np.nan, 0.0, 0.5, np.inf, 0.25], np.float32)
    arrays["advantage"] = np.array([0.5, -0.5, np.nan, 1.0, -1.0, 0.0], np.float32)
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    s, _, page = _outputs(out)
    # the finite rewards 1, 0, 0.5, 0.25: mean 1.75 / 4
    assert s["reward_mean"] == pytest.approx(1.75 / 4) and s["reward_nonfinite"] == 2
    assert s["advantage_nonfinite"] == 1 and s["ais"]["alpha_raw"] is None
    assert "2 non-finite reward(s)" in said(result) and "1 non-finite advantage(s)" in said(result)
    assert "Non-finite rewards or advantages" in page
    arrays["reward"][:] = 1.0  # all finite: counted as 0, no notice
    arrays["advantage"][:] = 1.0
    result, out = _report(tmp_path / "finite", arrays)
    s, _, page = _outputs(out)
    assert (s["reward_nonfinite"], s["advantage_nonfinite"]) == (0, 0) and s["reward_mean"] == 1.0
    assert "Non-finite rewards" not in page and "non-finite" not in said(result).split("sequences", 1)[1]
