"""``aisrl report``: the three files, their values, and clear errors on adversarial dumps."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from actors.cli import app
from system.report.demo_dump import make_demo_dump
from system.report.dump import DumpError, load_dump, save_dump

runner = CliRunner()
SECTION1 = ["n_sequences", "n_tokens", "nonfinite_tokens", "kl_k1", "kl_k2", "kl_k3", "chi2_token",
            "chi2_seq", "logp_pearson", "abs_diff_mean", "abs_diff_median", "abs_diff_max",
            "prob_abs_diff_mean", "frac_outside_2x", "frac_outside_5x", "ess_token", "ess_seq"]


def _report(tmp_path, arrays):
    dump = save_dump(tmp_path / "step_000001.npz", **arrays)
    out = tmp_path / "out"
    result = runner.invoke(app, ["report", str(dump), "--out", str(out)])
    return result, out


def test_report_on_a_hand_sized_dump(tmp_path):
    # Two responses; the second has one padding column and a NaN token (excluded, counted).
    mu = np.array([[-1.0, -2.0, -0.5], [-0.1, np.nan, 0.0]], np.float32)
    old = np.array([[-1.0, -1.0, -0.5], [-0.6, -3.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    result, out = _report(tmp_path, {"rollout_logp": mu, "train_logp": old, "response_mask": mask,
                                     "lag": np.array([0, 1], np.int32)})
    assert result.exit_code == 0, result.output
    s = json.loads((out / "summary.json").read_text())
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
    samples = json.loads((out / "samples.json").read_text())
    # Worst mean |diff| first: row 0 has mean 1/3, row 1 has 0.5.
    assert [r["index"] for r in samples] == [1, 0]
    tok = samples[1]["tokens"]
    assert tok["diff"] == pytest.approx([0.0, 1.0, 0.0])
    assert tok["ratio"] == pytest.approx([1.0, np.e, 1.0], rel=1e-5)
    assert tok["p_train"][1] == pytest.approx(np.exp(-1.0), rel=1e-5)
    assert samples[0]["tokens"]["ratio"][1] is None  # the NaN token has no ratio


def test_report_matches_numpy_on_a_demo_dump(tmp_path):
    arrays = make_demo_dump(48, 40, sigma=0.2, seed=5)
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    s = json.loads((out / "summary.json").read_text())
    m = arrays["response_mask"]
    d = (arrays["train_logp"] - arrays["rollout_logp"])[m].astype(np.float64)
    assert s["kl_k1"] == pytest.approx(np.mean(-d), rel=1e-5)
    assert s["abs_diff_median"] == pytest.approx(np.median(np.abs(d)), rel=1e-5)
    rho = np.exp(np.clip(d, -20, 20))
    assert s["ess_token"] == pytest.approx(rho.sum() ** 2 / (d.size * (rho**2).sum()), rel=1e-5)
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "seq-mis" in page and "By policy lag" in page


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda a: a.pop("train_logp"), "train_logp"),
        (lambda a: a.__setitem__("response_mask", a["response_mask"][:, :-1]), "response_mask"),
        (lambda a: a.__setitem__("lag", a["lag"][:-1]), "lag"),
        (lambda a: a.__setitem__("response_mask", np.zeros_like(a["response_mask"])), "empty batch"),
        (lambda a: [a.__setitem__(k, a[k][:0]) for k in list(a)], "empty batch"),
        (lambda a: a.__setitem__("rollout_logp", a["rollout_logp"][0]), "rollout_logp"),
    ],
)
def test_bad_dumps_fail_naming_the_key_without_traceback(tmp_path, mutate, needle):
    arrays = make_demo_dump(8, 6, seed=1)
    mutate(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert needle in result.output and "Traceback" not in result.output
    with pytest.raises(DumpError, match="bad.npz"):
        load_dump(path)


def test_not_a_dump(tmp_path):
    path = tmp_path / "x.npz"
    path.write_text("not a zip")
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "x.npz" in result.output
    result = runner.invoke(app, ["report", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no such file" in result.output


def test_extreme_mismatch_stays_finite(tmp_path):
    # The compressed-weight regime and worse: log-probs down to -1e4 and ±inf in places.
    rng = np.random.default_rng(0)
    mu = -rng.exponential(3.0, (16, 32)).astype(np.float32)
    old = mu + rng.normal(0, 6.0, (16, 32)).astype(np.float32)
    mu[0, 0], old[1, 1], old[2, 2] = -1e4, -np.inf, np.inf
    mask = np.ones((16, 32), bool)
    result, out = _report(tmp_path, {"rollout_logp": mu, "train_logp": old, "response_mask": mask})
    assert result.exit_code == 0, result.output
    s = json.loads((out / "summary.json").read_text())
    assert s["nonfinite_tokens"] == 2 and "by_lag" not in s
    assert all(np.isfinite(s[k]) for k in SECTION1 if s[k] is not None)


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
