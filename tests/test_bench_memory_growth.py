"""``benchmarks/bench_memory_growth.py``'s summary: growth per 100 steps over each quarter of the run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_memory_growth import quarter_growth  # noqa: E402


def test_a_linear_leak_grows_alike_in_every_quarter():
    # 0.5 MiB a step, sampled every 20 steps over 400 steps: 50 MiB per 100 steps in each quarter
    series = [(s, 1000 + 0.5 * s) for s in range(0, 401, 20)]
    assert quarter_growth(series, 400) == [50.0, 50.0, 50.0, 50.0]


def test_growth_that_levels_shows_in_the_late_quarters():
    # +60 MiB over steps 0-100, +20 over 100-200, flat after: per 100 steps 60, 20, 0, 0
    series = [(0, 500.0), (50, 540.0), (100, 560.0), (150, 575.0), (200, 580.0), (300, 580.0), (400, 580.0)]
    assert quarter_growth(series, 400) == [60.0, 20.0, 0.0, 0.0]


def test_a_quarter_with_fewer_than_two_samples_or_none_values_is_none():
    assert quarter_growth([(0, 1.0), (350, 2.0), (400, None)], 400) == [None, None, None, None]
