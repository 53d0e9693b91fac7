"""What the report keeps of small values (``samples.json``'s rounding) and what it refuses for memory."""

import numpy as np
from test_report import _outputs, _report, runner, said

from actors.cli import app
from system.report.demo_dump import make_demo_dump
from system.report.dump import save_dump


def test_samples_keep_six_significant_digits_so_small_ratios_are_not_zero(tmp_path):
    """Found by a review: samples.json rounded to 6 decimal places, so a token ratio of 3.06e-7 (or a
    probability of 1.5e-8) was written as 0.0 in the worst sequences' tables. Now 6 decimal places or 6
    significant digits, whichever keeps more. By hand: d = -15 gives ratio e^-15 = 3.059e-7."""
    from system.report.samples import round_significant

    got = round_significant(np.array([np.exp(-15.0), 0.123456789, 10.34017464, 123456.7891234, 1.5e-8, 0.0, -2.5e-12]))
    assert got.tolist() == [3.05902e-07, 0.123457, 10.340175, 123456.789123, 1.5e-08, 0.0, -2.5e-12]
    arrays = make_demo_dump(4, 6, seed=3)
    m = arrays["response_mask"]
    r, c = np.argwhere(m)[0]
    arrays["train_logp"][r, c] = arrays["rollout_logp"][r, c] - 15.0  # one token at ratio e^-15
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    _, samples, _ = _outputs(out)
    ratios = [v for seq in samples["worst"] for v in seq["tokens"]["ratio"] if v is not None]
    assert any(v != 0 and abs(v / np.exp(-15.0) - 1) < 1e-5 for v in ratios), sorted(ratios)[:3]


def test_a_dump_whose_report_would_not_fit_in_memory_is_refused_by_name(tmp_path, monkeypatch):
    """Found by a review: the load's check counts the arrays alone, while the report adds ~85 bytes per
    token position at its peak, so a dump could pass and then run the machine out of memory (killed,
    no message). A 64 x 64 dump (4096 positions, ~0.4 MB of report) against 0.2 MB available: refused,
    naming the file; with 1 GB available it reports."""
    import system.report.dump as dump

    path = save_dump(tmp_path / "d.npz", **make_demo_dump(64, 64, seed=0))
    with np.load(path) as z:  # the arrays themselves fit: the load's own check passes
        arrays_bytes = sum(z[k].nbytes for k in z.files)
    assert arrays_bytes < 200_000 < 100 * 64 * 64
    monkeypatch.setattr(dump, "available_memory_bytes", lambda: 200_000)
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "d.npz: its report needs about" in said(result), result.output
    assert "4096 token positions" in said(result) and not (tmp_path / "out").exists()
    monkeypatch.setattr(dump, "available_memory_bytes", lambda: 2**30)
    assert runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "out")]).exit_code == 0
