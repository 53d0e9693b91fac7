"""The fused correction pass (``system.correction.fused``) against the torch path, value by value.

Every diagnostic, the per-lag sums, the sequence-level weights (veto and self-normalisation
included) and their statistics agree with ``compute_diagnostics`` / ``diagnostics_by_lag_of`` /
``compute_weights`` / ``method_statistics`` to 1e-12 relative (they differ in summation order
only), on batches with non-finite log-probs, empty responses, ties, a constant input, odd and
even token counts, float32 and float64, and more tokens than the histogram's one bin holds.
The library is built here if a C++ compiler exists; without one these tests skip (the torch
path is then the one in use, and it is tested everywhere else).
"""

import ctypes
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from system.config.correction import GeoRS, SeqMIS, SeqTIS
from system.correction import (
    compute_diagnostics,
    compute_log_ratios,
    compute_weights,
    method_statistics,
)
from system.correction.diagnostics import diagnostics_by_lag_of
from system.correction.fused_build import build
from system.correction.ratios import LOG_RATIO_CLAMP

if build() is None:
    pytest.skip("no C++ compiler: the fused pass is not built (the torch path is used)", allow_module_level=True)

from system.correction import fused  # noqa: E402

REL = 1e-12


def close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a == b or abs(a - b) <= REL * max(abs(a), abs(b))


def assert_dicts_close(ours: dict, reference: dict) -> None:
    assert ours.keys() == reference.keys()
    for key, value in reference.items():
        if isinstance(value, dict):
            assert_dicts_close(ours[key], value)
        else:
            assert close(ours[key], value), (key, ours[key], value)


def batch(B: int, T: int, seed: int, dtype=torch.float32, spread: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    mu = -torch.empty(B, T, dtype=torch.float64).exponential_(1.0, generator=g)
    old = mu + spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return mu.to(dtype), old.to(dtype), mask


def cases():
    mu, old, mask = batch(9, 7, 0)
    mu[0, 1], old[1, 2], mu[2, 0], old[2, 0] = float("nan"), float("inf"), float("-inf"), float("-inf")
    yield "nonfinite", mu, old, mask
    yield "float64", *batch(33, 65, 1, torch.float64)
    yield "wide", *batch(80, 1024, 2, spread=0.3)  # > 2**16 positions: the median from a sampled bracket
    mu, old, mask = batch(64, 1100, 3)
    yield "ties", mu, (mu + torch.round((old - mu) * 20) / 20), mask  # |d| on a 0.05 grid: huge bins
    mu, old, mask = batch(5, 8, 4)
    yield "constant", torch.full_like(mu, -1.5), old, mask  # Pearson undefined: None
    mask = torch.zeros(3, 4, dtype=torch.bool)
    yield "empty", torch.zeros(3, 4), torch.zeros(3, 4), mask
    mu, old, mask = batch(6, 9, 5)
    mask[:, :] = False
    mask[0, :3] = True  # 3 tokens: odd count, one response
    yield "odd", mu, old, mask
    # the pass reads each row from its first to its last response position only: left padding,
    # holes, a response at the very end, and NaN / inf in the padding outside that span (ignored)
    mu, old, mask = batch(70, 1000, 7)
    mask = torch.rand(70, 1000, generator=torch.Generator().manual_seed(8)) < 0.7
    mask[0, :] = False
    mask[1, :-1] = False
    mask[2, :500] = False
    mask[3, 1:] = False
    mu[4, :10], old[4, -10:] = float("nan"), float("inf")
    mask[4, :10], mask[4, -10:] = False, False
    yield "holes", mu, old, mask
    # the inline exp / expm1 over their whole range: behaviour log-probs near exp's smallest normal
    # results (a gap sum of ~1e-290, compared relatively), |d| across every 2^k step of the clamp
    # and past it, tiny |d| (expm1's k = 0 branch), positive log-probs (bad input, still finite)
    g = torch.Generator().manual_seed(9)
    # (not symmetric around 0: a mean d that cancels to ~0 would compare summation orders, not exp)
    d = torch.cat([torch.linspace(-24.3, 25, 2001, dtype=torch.float64), torch.logspace(-12, -1, 700, dtype=torch.float64),
                   -torch.logspace(-12, -1, 299, dtype=torch.float64)]).reshape(3, 1000)
    mu = -torch.rand(3, 1000, generator=g, dtype=torch.float64) * 5
    yield "exp_range", mu, mu + d, torch.ones(3, 1000, dtype=torch.bool)
    yield "exp_tiny", mu - 660, mu - 660 + d, torch.ones(3, 1000, dtype=torch.bool)
    yield "exp_positive", mu + 7, mu + 7 + d, torch.ones(3, 1000, dtype=torch.bool)
    # behaviour log-probs just below log(DBL_MAX): exp(mu) finite, 2^k at its largest (k = 1024)
    top = torch.tensor([[709.45, 709.5, 709.6, 709.7, 709.78]], dtype=torch.float64)
    yield "exp_top", top, top - torch.tensor([[0.01, 0.02, 0.03, 0.05, 0.3]], dtype=torch.float64), \
        torch.ones(1, 5, dtype=torch.bool)
    # exp(mu) subnormal (mu < -708): those tokens' probability gap comes from libm, beside normal ones
    low = torch.tensor([[-745.0, -740.0, -720.0, -708.5, -707.5, -1.0]], dtype=torch.float64)
    yield "exp_subnormal", low, low + torch.tensor([[0.5, -0.3, 2.0, 0.1, 0.1, 0.01]], dtype=torch.float64), \
        torch.ones(1, 6, dtype=torch.bool)
    yield "exp_subnormal_only", low[:, :4], low[:, :4] + 0.25, torch.ones(1, 4, dtype=torch.bool)
    # every rho tiny (d <= -15): sum rho^2 must come from rho itself (1 + 2e + e^2 cancels to 0 there)
    far = -15.0 - 10.0 * torch.rand(4, 50, generator=g, dtype=torch.float64)
    yield "all_far_below", mu[:, :50].repeat(2, 1)[:4], mu[:, :50].repeat(2, 1)[:4] + far, torch.ones(4, 50, dtype=torch.bool)
    yield "one_at_the_clamp", torch.zeros(1, 1, dtype=torch.float64), torch.full((1, 1), -20.0, dtype=torch.float64), \
        torch.ones(1, 1, dtype=torch.bool)
    # log-probs near float64's range (found by a probe: the pass's ``sum ** 2`` raised OverflowError)
    huge = -torch.rand(4, 8, generator=g, dtype=torch.float64) * 1e300
    yield "huge_logps", huge, huge.clone(), torch.ones(4, 8, dtype=torch.bool)


@pytest.mark.parametrize("threads", [1, 3], ids=["1-thread", "3-threads"])
@pytest.mark.parametrize("name, mu, old, mask", list(cases()), ids=[c[0] for c in cases()])
def test_diagnostics_and_lags_match_the_torch_path(name, mu, old, mask, threads):
    """(3 threads: the rows in three ranges whose sums, band and maximum are combined; "empty" has
    3 rows, one each, "odd" one valid row, in the first range.)"""
    ratios = compute_log_ratios(mu, old, mask)
    sums = fused.fused_sums(mu, old, mask, threads=threads)
    assert_dicts_close(sums.diagnostics, compute_diagnostics(ratios))
    lag_B = torch.arange(mu.shape[0]) % 3
    reference = diagnostics_by_lag_of(ratios, lag_B)
    ours = fused.diagnostics_by_lag(mu, old, mask, lag_B, sums)
    assert ours.keys() == reference.keys()
    for lag, values in ours.items():
        assert_dicts_close(values, reference[lag])  # every key
    single = torch.full_like(lag_B, 2)  # one lag: the batch's own sums, no second pass
    assert_dicts_close(fused.diagnostics_by_lag(mu, old, mask, single, sums)["2"], compute_diagnostics(ratios))


@pytest.mark.parametrize("method", [SeqMIS(), SeqMIS(hi=1.2, lo=0.9), SeqMIS(veto=0.95), SeqTIS(self_normalize=True),
                                    GeoRS(lo=0.99, hi=1.01)], ids=lambda m: f"{m.type}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_sequence_weights_and_statistics_match_the_torch_path(method, dtype):
    mu, old, mask = batch(50, 40, 6, dtype, spread=0.04)
    mu[3, 5] = float("nan")
    ratios = compute_log_ratios(mu, old, mask)
    w_BT = compute_weights(ratios, method)
    diag, w_B, stats = fused.full_path(mu, old, mask, method)
    assert w_B.dtype == w_BT.dtype
    # the same weights, to the summation order of L_i (float32 results: at most one float32 ulp apart)
    ulp = REL if dtype == torch.float64 else 2.0**-23
    assert torch.allclose(torch.where(ratios.valid_BT, w_B[:, None], 0.0), w_BT, rtol=ulp, atol=0.0)
    assert_dicts_close(stats, method_statistics(ratios, w_BT))
    assert 0 < stats["keep_seq_frac"] <= 1  # the batch exercises the method


@pytest.mark.parametrize("rows, threads", [(1, 1), (2, 2)])
def test_the_median_is_exact_when_the_sampled_bracket_misses(rows, threads):
    """An adversarial batch: |d| = 0 at exactly the positions the bracket's sample reads and 1 + i 1e-12
    elsewhere, so the sample brackets [0, 0] and misses the median; the pass is repeated with every
    value in the band and the median is still exact (and equal to the torch path's). Also as two
    rows on two threads: the band is the two ranges' bands joined."""
    n = 70_002
    flat = (1.0 + torch.arange(n, dtype=torch.float64) * 1e-12)
    sampled = np.unique(np.random.default_rng(fused._SEED).integers(n, size=fused._SAMPLE))
    flat[sampled] = 0.0
    mu, old, mask = torch.zeros(rows, n // rows, dtype=torch.float64), flat.reshape(rows, -1), torch.ones(
        rows, n // rows, dtype=torch.bool)
    lo, hi, _ = fused._bracket(n, *fused._sampled_valid(mu.numpy(), old.numpy(), mask.numpy().view(np.uint8)))
    assert lo == hi == 0.0  # the sample saw only zeros
    sums = fused.fused_sums(mu, old, mask, threads=threads)
    rest = np.sort(np.setdiff1d(np.arange(n), sampled))
    # n even: the mean of the values of 0-indexed ranks n/2 - 1 and n/2 overall, i.e. ranks k, k + 1
    # among the values 1 + i 1e-12 (the zeros come first)
    k = n // 2 - 1 - len(sampled)
    assert sums.diagnostics["abs_diff_median"] == ((1.0 + rest[k] * 1e-12) + (1.0 + rest[k + 1] * 1e-12)) / 2
    reference = compute_diagnostics(compute_log_ratios(mu, old, mask))
    assert sums.diagnostics["abs_diff_median"] == reference["abs_diff_median"]


def _libm(f, v: float) -> float:
    try:
        return f(v)
    except OverflowError:
        return math.inf


def _ulps(ours: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|ours - reference| in units of the reference's last place (subnormals: 2^-1074)."""
    spacing = np.spacing(np.abs(reference).clip(min=5e-324))
    with np.errstate(invalid="ignore"):
        return np.where(ours == reference, 0.0, np.abs(ours - reference) / spacing)


def test_inline_exponentials_are_within_four_ulp_of_libm():
    """The pass's own exp (where it uses it: results that are normal doubles, x in [-708, log(DBL_MAX)];
    the pass sends other tokens to libm) and expm1 (|x| <= 20, the clamp; its k = 0 branch for tiny x)
    against Python's ``math`` (glibc), value by value; NaN outside those ranges. Measured on AMD EPYC:
    exp <= 1 ulp, expm1 <= 2 ulp; the bound is 4 ulp because the library is built for the CPU it runs
    on (``-march=native``, reassociation allowed), so another instruction set may order the
    polynomial's operations differently; the polynomial one degree short (degree 8, fitted the same
    way) is 8 ulp off in exp and 29 in expm1, so the bound still tells it apart."""
    bound = 4
    rng = np.random.default_rng(0)
    top = 709.782712893384  # log(DBL_MAX) to the nearest double (below it: exp is finite)
    edges = [0.0, -708.0, top, 709.7827128933841, 710.0, -708.0000001, -745.0, 20.0, -20.0,
             0.34657359, -0.34657359, 1e-300, -1e-300]
    x = np.concatenate([rng.uniform(-720, 720, 100_000), rng.uniform(-20, 20, 100_000),
                        np.array([k * math.log(2) for k in range(-1021, 1024)]),
                        np.logspace(-300, 0, 2000), -np.logspace(-300, 0, 2000), edges])
    exp, expm1, rho = fused.exponentials(x)
    inside = (x >= -708.0) & (x <= top)
    assert _ulps(exp[inside], np.array([math.exp(v) for v in x[inside]])).max() <= bound
    assert np.isnan(exp[~inside]).all() and (~inside).sum() > 1000
    assert exp[x == top][0] == math.exp(top) and exp[x == 0.0][0] == 1.0
    inside = np.abs(x) <= 20
    assert _ulps(expm1[inside], np.array([math.expm1(v) for v in x[inside]])).max() <= bound
    assert np.isnan(expm1[~inside]).all()
    # the token ratio from expm1's reduction, 2^k (1 + q): relative to itself also where it is tiny
    assert _ulps(rho[inside], np.array([math.exp(v) for v in x[inside]])).max() <= bound
    assert np.isnan(rho[~inside]).all() and rho[x == -20.0][0] == pytest.approx(math.exp(-20.0), rel=1e-15)


@pytest.mark.parametrize("kind", ["spread", "narrow", "ties", "constant", "zeros_and_one", "small"])
def test_selection_of_two_adjacent_ranks_matches_a_sort(kind):
    """``aisrl_select`` (the median's last step: a radix histogram, then ``nth_element`` on the bins
    holding the ranks) against ``np.sort``, for r2 = r1 and r2 = r1 + 1 at the ends and in the middle."""
    rng = np.random.default_rng(3)
    n = 50_000
    values = {
        "spread": np.abs(rng.standard_cauchy(n)),  # many exponents
        "narrow": 0.032 + rng.random(n) * 0.0035,  # one exponent, as a median's band
        "ties": np.round(rng.random(n) * 20) / 20,  # 21 distinct values
        "constant": np.full(n, 0.25),
        "zeros_and_one": np.where(np.arange(n) == n // 2, 1.0, 0.0),
        "small": rng.random(1000),  # below the histogram's size: nth_element alone
    }[kind]
    reference = np.sort(values)
    lib = fused._library()
    for r1 in (0, 1, len(values) // 2 - 1, len(values) // 2, len(values) - 2):
        for r2 in (r1, r1 + 1):
            band, out = values.copy(), np.zeros(2)
            assert lib.aisrl_select(band.ctypes.data, band.size, r1, r2, out.ctypes.data) == 0
            assert (out[0], out[1]) == (reference[r1], reference[r2]), (kind, r1, r2)
            assert np.array_equal(np.sort(band), reference)  # reordered, nothing lost


def test_the_build_without_avx512_matches_the_torch_path(tmp_path, monkeypatch):
    """The library built for a CPU without AVX-512 (``-march=x86-64-v2``: the band's compaction one
    value at a time instead of AVX-512's compress, 128-bit vectors elsewhere) against the torch path,
    on the batches whose band is collected from a sampled bracket, from holes, and from ties."""
    import ctypes
    import platform
    import subprocess

    from system.correction import fused_build

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86-64-v2 is an x86 target")

    flags = [f if not f.startswith("-march=") else "-march=x86-64-v2" for f in fused_build.FLAGS]
    path = tmp_path / "fused_v2.so"
    subprocess.run([fused_build.compiler(), *flags, str(fused_build.SOURCE), "-o", str(path), *fused_build.LIBS],
                   check=True, capture_output=True)
    monkeypatch.setattr(fused, "_lib", fused.declare(ctypes.CDLL(str(path))))
    for name, mu, old, mask in cases():
        if name in ("wide", "ties", "holes", "exp_range", "nonfinite"):
            assert_dicts_close(fused.fused_sums(mu, old, mask, threads=1).diagnostics,
                               compute_diagnostics(compute_log_ratios(mu, old, mask)))


def test_a_library_of_another_abi_or_layout_is_not_used():
    """A library built from an older source (another argument list or output layout, or a log-ratio
    clamp other than ``LOG_RATIO_CLAMP``) is refused, so the torch path runs instead of a call with the
    wrong arguments or a pass that clamps elsewhere."""
    from types import SimpleNamespace

    rows, glob = len(fused._ROW), len(fused._GLOB)

    def lib(abi, rows, glob, clamp=LOG_RATIO_CLAMP):
        return SimpleNamespace(aisrl_fused_abi=lambda: abi, aisrl_fused_row_cols=lambda: rows,
                               aisrl_fused_glob_cols=lambda: glob, aisrl_fused_clamp=lambda: clamp)
    assert fused.compatible(lib(fused._ABI, rows, glob))
    assert not fused.compatible(lib(fused._ABI - 1, rows, glob))
    assert not fused.compatible(lib(fused._ABI, rows, glob - 1))
    assert not fused.compatible(lib(fused._ABI, rows, glob, clamp=LOG_RATIO_CLAMP / 2))
    if fused.available():  # the library built here links to the same constant
        assert fused.compatible(fused._library())
    assert not fused.compatible(SimpleNamespace(aisrl_fused_row_cols=lambda: 8))  # before the ABI symbol


def test_thread_count_follows_torch_and_the_batch_size(monkeypatch):
    per = fused._POSITIONS_PER_THREAD
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert [fused.pass_threads(n) for n in (10, per - 1, per, 3 * per, 100 * per)] == [1, 1, 1, 3, 4]
    assert fused.pass_threads(10, threads=3) == 3  # asked for: used (the pass caps it at B rows)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        fused.pass_threads(10, threads=0)


def test_an_openmp_build_shares_torchs_runtime():
    """Built with OpenMP (``fused_build.OPENMP``), the pass runs on the OpenMP runtime torch loaded, so its
    threads are torch's (a second runtime beside it, e.g. the system's ``libgomp.so.1``, would bring a
    second set of threads to compete with torch's for the cores): the library's ``GOMP_parallel`` (the
    entry point of every ``omp parallel`` region) is the one torch's CPU library calls."""
    if fused.threads_backend() != "openmp":
        pytest.skip("the compiler built the std::thread variant (no OpenMP)")
    mu = -torch.rand(64, 32)
    fused.fused_sums(mu, mu + 0.01, torch.ones(64, 32, dtype=torch.bool), threads=2)
    torch_cpu = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))  # already loaded

    def entry(lib) -> int:  # dlsym through the library and the libraries it was linked against
        return ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value

    assert entry(fused._library()) == entry(torch_cpu)


def test_bad_shapes_and_dtypes_are_refused():
    with pytest.raises(ValueError, match="proximal_logp has shape"):
        fused.fused_sums(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="must be a floating tensor"):
        fused.fused_sums(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3), torch.ones(2, 3))


def test_the_library_is_named_for_the_cpus_instruction_sets():
    """A checkout shared by machines of different CPUs (a login node and compute nodes) must not hand
    one a library built with instructions it lacks (SIGILL): the file name carries the ISA flags."""
    from system.correction import fused_build

    base = "processor : 0\nflags : fpu sse4_2 avx2 fma hypervisor\n"
    same = fused_build.isa_key(base.replace(" hypervisor", ""))  # not an instruction set: same key
    assert fused_build.isa_key(base) == same
    assert fused_build.isa_key(base.replace("avx2", "avx2 avx512f")) != same
    assert fused_build.isa_key(base.replace("fma", "fma amx_bf16")) != same
    assert fused_build.isa_key("flags : avx2 fma sse4_2") == fused_build.isa_key("flags : sse4_2 fma avx2")
    assert fused_build.LIBRARY.name == f"_fused_pass.{fused_build.isa_key()}.so"


@pytest.mark.parametrize("rows", [40, 1000])  # 40 x 1000: every position; 1000 x 1000: the sample
def test_pearson_keeps_its_digits_when_the_first_token_is_far_from_the_rest(rows):
    """A first valid token at mu = -25 among log-probs near -0.3: with that token as the shift, the
    one-pass centred sums cancelled to ~1e-12 relative (found by a review, 2e-12 at 1000 x 1000). The
    reference is numpy's two-pass Pearson in float64 on the same float32 values."""
    rng = np.random.default_rng(11)
    mu = (-0.3 * np.abs(rng.standard_t(3, (rows, 1000)))).astype(np.float32)
    mu[0, 0] = -25.0
    old = (mu + rng.normal(0.0, 1e-2, mu.shape)).astype(np.float32)
    mask = np.ones(mu.shape, dtype=bool)
    x, y = mu.astype(np.float64).ravel(), old.astype(np.float64).ravel()
    x, y = x - x.mean(), y - y.mean()
    reference = float((x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum()))
    got = fused.fused_sums(mu, old, mask).diagnostics["logp_pearson"]
    assert got == pytest.approx(reference, rel=1e-14, abs=0)
