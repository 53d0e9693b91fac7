"""The fused correction pass: spec section 1 diagnostics, per-response sums and sequence-level
method weights and statistics from two reads of (mu, old, mask), without [B, T] temporaries.

``fused_pass.cpp`` (built by ``fused_build``, loaded with ``ctypes``) reads the batch once (its
rows split among :func:`pass_threads` threads, each range's sums added in range order):

    per valid token (mask != 0 and d = old - mu finite; dc = clamp(d, -20, 20),
    e = expm1(dc), rho = exp(dc)), summed per response i:
        T_i, nonfinite_i, L_i = sum dc, sum d, sum (e - dc), sum |d|, #(|d| > log 5), min d
    and over the batch: sum dc**2, sum e, sum e**2, sum rho, sum rho**2, sum |exp(old) - exp(mu)|,
        #(|d| > log 2), max |d|, and Pearson's sums of x = mu - mu_0, y = old - old_0 (mu_0, old_0:
        values nearest the means of the valid tokens among the bracket's sample positions, or of the whole
        batch when it is small, ``_references``: so the one-pass centring below loses little to
        cancellation): sum x, sum y, sum x**2, sum y**2, sum x y (centred afterwards:
        sum x**2 - (sum x)**2 / n, ...; exactly 0 for a constant input)
    the median of |d|: a sample of 16384 positions (fixed seed) brackets it, [lo, hi]; the pass
        counts the valid |d| below lo and keeps those inside, where the exact order statistics are
        selected. A bracket that misses (the counts say so) is widened to all values, pass repeated.

The diagnostics then follow ``diagnostics.py``'s formulas on those sums (same keys, same ``None``
cases); chi2_seq and ess_seq, the sequence-level weights (``methods.sequence_weights_B``) and their
statistics (``method_statistics``' keys) come from the per-response sums. Agreement with the torch
path is to summation order (``tests/test_correction_fused.py``: 1e-12 relative).
When the library is not built, ``available()`` is False and callers use the torch path.

Shapes: the README's suffix legend (B responses, T response positions).
"""

import ctypes
import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from system.correction.diagnostics import DIAGNOSTIC_KEYS, checked_lags
from system.correction.fused_build import LIBRARY, build
from system.correction.methods import sequence_weights_B
from system.correction.ratios import (
    LOG_RATIO_CLAMP,
    LogRatios,
    check_inputs,
    log_threshold,
    valid_tokens,
)
from system.correction.reductions import LENGTH_BUCKETS, ess_fraction, fraction_by_bucket

_BAND_MIN_TOKENS = 1 << 16
"""Up to this many [B, T] positions the bracket is everything (no sample)."""
_ABI = 8
"""``fused_pass.cpp``'s ``aisrl_fused_abi()``: the exported functions' argument lists."""
_POSITIONS_PER_THREAD = 1 << 17
"""A thread per 128k positions at most. The pass's threads are the process's OpenMP team (torch's);
on ``std::thread`` a second thread did not pay at 1M positions (8.2 -> 8.8-10.9 ms): torch's OpenMP
threads, still spinning after an op (e.g. an ``exp`` of 1024 values), held the second core. On the
team (2-core AMD EPYC, float32 inputs, one thread -> two, ms): 64k 1.06 -> 1.04 (every |d| in the
band there), 128k 0.51 -> 0.36, 256k 0.76 -> 0.50, 1M 2.36 -> 1.41, 4M 10.0 -> 5.2."""
_SAMPLE = 16384
_SEED = 0x5EED
_ROW = ("num_valid", "nonfinite", "seq_logratio", "sum_d", "sum_k3", "sum_abs", "out5", "min_d")
"""The pass's per-response columns (its output layout; sum_d, sum_k3, sum_abs and out5 are read by
no caller since the per-lag diagnostics run a pass of their own, and cost the pass nothing per token)."""
_GLOB = ("n", "sum_d", "sum_dc2", "sum_e", "sum_e2", "sum_rho", "sum_rho2", "sum_k3", "sum_abs", "max_abs",
         "sum_gap", "out2", "out5", "sum_mu", "sum_old", "ref_mu", "ref_old", "sum_mu2", "sum_old2", "sum_mu_old",
         "below", "band")
_lib: ctypes.CDLL | None = None
_load_error: str | None = None


def _library() -> ctypes.CDLL | None:
    global _lib, _load_error
    if _lib is None and _load_error is None:
        try:
            build()  # a no-op when the library is up to date; rebuilds a stale one if a compiler exists
        except RuntimeError as exc:
            _load_error = str(exc)
            return None
        try:
            lib = ctypes.CDLL(str(LIBRARY))
        except OSError as exc:
            _load_error = str(exc)
            return None
        if not compatible(lib):
            _load_error = (f"{LIBRARY.name} does not match this module (built from an older fused_pass.cpp: rebuild "
                           "with python -m system.correction.fused_build; or its kClamp differs from "
                           "LOG_RATIO_CLAMP: change both)")
            return None
        _lib = declare(lib)
    return _lib


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument types of the library's exported functions (``fused_pass.cpp``'s signatures)."""
    ptr = ctypes.c_void_p
    lib.aisrl_fused_pass.argtypes = [ctypes.c_int, ptr, ptr, ptr, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_double, ctypes.c_double, ptr, ptr, ptr, ctypes.c_int64,
                                     ctypes.c_int, ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double]
    lib.aisrl_select.argtypes = [ptr, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ptr]
    lib.aisrl_exponentials.argtypes = [ptr, ctypes.c_int64, ptr, ptr, ptr]
    return lib


def compatible(lib) -> bool:
    """Whether a loaded library is the one this module calls: its ABI version, output widths and log-ratio
    clamp (``LOG_RATIO_CLAMP``, a compile-time constant there)."""
    if not all(hasattr(lib, f) for f in ("aisrl_fused_abi", "aisrl_fused_row_cols", "aisrl_fused_glob_cols",
                                         "aisrl_fused_clamp")):
        return False
    if (lib.aisrl_fused_abi(), lib.aisrl_fused_row_cols(), lib.aisrl_fused_glob_cols()) != (_ABI, len(_ROW), len(_GLOB)):
        return False
    lib.aisrl_fused_clamp.restype = ctypes.c_double
    return lib.aisrl_fused_clamp() == LOG_RATIO_CLAMP


def threads_backend() -> str | None:
    """What the pass's threads are: ``"openmp"`` (the process's OpenMP team, torch's own), ``"std::thread"``
    (a compiler without OpenMP), or None when the library is not available."""
    lib = _library()
    return None if lib is None else ("openmp" if lib.aisrl_fused_openmp() else "std::thread")


def available() -> bool:
    """Whether the fused pass is built and loads (else the torch path is used)."""
    return _library() is not None


def exponentials(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pass's inline ``exp(x)`` (NaN outside [-708, log(DBL_MAX)], where the pass uses libm),
    ``expm1(x)`` and the token ratio ``exp(x)`` computed beside it (both NaN where |x| > 20) for
    float64 ``x``, to test them against libm."""
    lib = _library()
    if lib is None:
        raise RuntimeError(f"the fused pass is not available: {_load_error}")
    x = np.ascontiguousarray(x, dtype=np.float64)
    exp_out, expm1_out, rho_out = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    lib.aisrl_exponentials(x.ctypes.data, x.size, exp_out.ctypes.data, expm1_out.ctypes.data, rho_out.ctypes.data)
    return exp_out, expm1_out, rho_out


@dataclass(frozen=True)
class FusedSums:
    """What the fused pass returns: per-response sums (float64 / int64 tensors [B]) and the
    batch's diagnostics (``compute_diagnostics``' keys and values)."""

    num_valid_B: torch.Tensor
    nonfinite_B: torch.Tensor
    seq_logratio_B: torch.Tensor
    min_d_B: torch.Tensor
    """The smallest d of each response's valid tokens (+inf for an empty response)."""
    diagnostics: dict
    weight_dtype: torch.dtype

    @property
    def seq_valid_B(self) -> torch.Tensor:
        return self.num_valid_B >= 1

    def row_ratios(self) -> LogRatios:
        """A per-response ``LogRatios`` ([B, 1] token fields: valid = a sequence, d = its minimum d),
        enough for the sequence-level methods and their veto (``methods.sequence_weights_B``)."""
        seq_valid_B = self.seq_valid_B
        zeros_B1 = torch.zeros(len(seq_valid_B), 1, dtype=torch.float64)
        min_d_B1 = torch.where(seq_valid_B, self.min_d_B, 0.0)[:, None]
        return LogRatios(
            valid_BT=seq_valid_B[:, None], d_BT=min_d_B1, dc_BT=zeros_B1, rho_BT=zeros_B1,
            num_valid_B=self.num_valid_B, seq_valid_B=seq_valid_B, seq_logratio_B=self.seq_logratio_B,
            rho_seq_B=self.seq_logratio_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp(),
            nonfinite_tokens=int(self.nonfinite_B.sum().item()), behaviour_BT=zeros_B1, proximal_BT=zeros_B1,
            nonfinite_B=self.nonfinite_B, weight_dtype=self.weight_dtype)


def _as_inputs(behaviour_BT, proximal_BT, mask_BT) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.dtype]:
    with warnings.catch_warnings():
        # arrays read from Ray's object store are read-only; nothing here writes to them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        behaviour = torch.as_tensor(behaviour_BT).detach().cpu()
        proximal = torch.as_tensor(proximal_BT).detach().cpu()
        mask = torch.as_tensor(mask_BT).detach().cpu()
    weight_dtype = check_inputs(behaviour, proximal, mask)  # the torch path's checks and weight dtype
    dtype = torch.float32 if weight_dtype == torch.float32 else torch.float64
    behaviour_np = np.ascontiguousarray(behaviour.to(dtype).numpy())
    proximal_np = np.ascontiguousarray(proximal.to(dtype).numpy())
    mask_np = np.ascontiguousarray((mask if mask.dtype == torch.bool else mask != 0).numpy()).view(np.uint8)
    return behaviour_np, proximal_np, mask_np, weight_dtype


@functools.lru_cache(maxsize=8)
def _sample_positions(num: int) -> np.ndarray:
    """The bracket's sample: ``_SAMPLE`` positions of ``num``, the same for every batch of that size."""
    # sorted: the gather walks the arrays in address order (the same sample; 0.4-0.6 instead of
    # ~0.8 ms at 1M positions when the pass has just evicted them from the cache, AMD EPYC)
    positions = np.sort(np.random.default_rng(_SEED).integers(num, size=_SAMPLE))
    positions.setflags(write=False)
    return positions


def _sampled_valid(behaviour: np.ndarray, proximal: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 (behaviour, proximal) of the valid tokens among the fixed sample positions (``_sample_positions``;
    every position of a batch of at most ``_BAND_MIN_TOKENS``): what ``_bracket`` and ``_references``
    look at, gathered once."""
    if behaviour.size <= _BAND_MIN_TOKENS:
        m, o, k = behaviour.reshape(-1), proximal.reshape(-1), mask.reshape(-1)
    else:
        positions = _sample_positions(behaviour.size)
        m, o, k = behaviour.reshape(-1)[positions], proximal.reshape(-1)[positions], mask.reshape(-1)[positions]
    m, o = m.astype(np.float64), o.astype(np.float64)
    valid = valid_tokens(k, m, o)
    return m[valid], o[valid]


def _bracket(num: int, m: np.ndarray, o: np.ndarray) -> tuple[float, float, int]:
    """``(lo, hi, capacity)`` for a batch of ``num`` positions: a range of |d| that holds the median with
    near certainty, from the sampled valid tokens ``m``, ``o`` (the rank margin is >= 5 binomial
    standard deviations), and room for the values inside it; everything for small batches."""
    if num <= _BAND_MIN_TOKENS:
        return 0.0, math.inf, num
    values = np.abs(o - m)
    size = values.size
    if size < 256:
        return 0.0, math.inf, num
    margin = 2.5 * math.sqrt(size) + 8.0
    rank_lo, rank_hi = math.floor(size / 2 - margin), math.ceil(size / 2 + 1 + margin)
    kth = [r - 1 for r in (rank_lo, rank_hi) if 1 <= r <= size]
    values = np.partition(values, kth)
    lo = float(values[rank_lo - 1]) if rank_lo >= 1 else 0.0
    hi = float(values[rank_hi - 1]) if rank_hi <= size else math.inf
    expected = (rank_hi - rank_lo) / size * num
    return lo, hi, min(num, int(2 * expected) + 4096)


def _references(m: np.ndarray, o: np.ndarray) -> tuple[float, float]:
    """Pearson's shift ``(mu_0, old_0)``: of the sampled valid tokens ``m``, ``o`` (``_sampled_valid``),
    the mu and the old value nearest to their means (a value of the batch, so a constant input still
    gives x = 0 exactly); NaN when none is valid (the pass then takes the first valid token's). Any
    shift gives the same correlation in exact arithmetic; one near the means keeps
    ``sum x**2 - (sum x)**2 / n`` from cancelling (a first token at mu = -25 among values near -0.3
    lost ~1e-12 relative with the first token as the shift)."""
    if not m.size:
        return math.nan, math.nan
    return float(m[np.argmin(np.abs(m - m.mean()))]), float(o[np.argmin(np.abs(o - o.mean()))])


def pass_threads(num_positions: int, threads: int | None = None) -> int:
    """Threads for a pass over ``num_positions`` [B, T] positions: ``threads`` when given, else
    torch's intra-op thread count (what the process was given: a Ray actor's ``num_cpus``,
    ``--threads`` in the benchmarks) but at most one per ``_POSITIONS_PER_THREAD`` positions.
    The pass uses at most B."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        return threads
    return max(1, min(torch.get_num_threads(), num_positions // _POSITIONS_PER_THREAD))


def fused_sums(behaviour_logp_BT, proximal_logp_BT, mask_BT, threads: int | None = None) -> FusedSums:
    """The fused pass over one batch (torch tensors or numpy arrays, any float dtype; mask bool,
    integer or float), on :func:`pass_threads` threads (the rows split among them; the result
    depends on the count only through summation order). Raises ``RuntimeError`` when the
    library is not available."""
    lib = _library()
    if lib is None:
        raise RuntimeError(f"the fused correction pass is not built ({_load_error}); "
                           "build it with: python -m system.correction.fused_build")
    behaviour, proximal, mask, weight_dtype = _as_inputs(behaviour_logp_BT, proximal_logp_BT, mask_BT)
    B, T = behaviour.shape
    width = 4 if behaviour.dtype == np.float32 else 8
    sampled = _sampled_valid(behaviour, proximal, mask)
    lo, hi, capacity = _bracket(behaviour.size, *sampled)
    ref_behaviour, ref_proximal = _references(*sampled)
    num_threads = pass_threads(B * T, threads)
    log_2_and_5 = (log_threshold(2.0, weight_dtype), log_threshold(5.0, weight_dtype))
    while True:
        row = np.zeros((B, len(_ROW)), dtype=np.float64)
        glob = np.zeros(len(_GLOB), dtype=np.float64)
        band = np.empty(max(capacity, 1), dtype=np.float64)
        rc = lib.aisrl_fused_pass(width, behaviour.ctypes.data, proximal.ctypes.data, mask.ctypes.data, B, T, lo, hi,
                                  row.ctypes.data, glob.ctypes.data, band.ctypes.data, capacity, num_threads,
                                  ref_behaviour, ref_proximal, *log_2_and_5)
        if rc != 0:
            raise RuntimeError("the fused correction pass failed" + (": out of memory (or no thread could start)" if rc == -2 else ""))
        g = dict(zip(_GLOB, glob.tolist(), strict=True))
        n, below, num_band = int(g["n"]), int(g["below"]), int(g["band"])
        k1, k2 = ((n + 1) // 2, (n + 1) // 2) if n % 2 == 1 else (n // 2, n // 2 + 1)
        if n == 0 or (below < k1 and k2 <= below + num_band and num_band <= capacity):
            break
        lo, hi, capacity = 0.0, math.inf, B * T  # the bracket missed: every valid |d| is in the band
    out = np.zeros(2, dtype=np.float64)
    if n and lib.aisrl_select(band.ctypes.data, num_band, k1 - below - 1, k2 - below - 1, out.ctypes.data) != 0:
        raise RuntimeError("the fused correction pass's selection failed")
    rows = {name: torch.from_numpy(np.ascontiguousarray(row[:, j])) for j, name in enumerate(_ROW)}
    counts = {name: rows[name].to(torch.int64) for name in ("num_valid", "nonfinite")}
    sums = FusedSums(
        num_valid_B=counts["num_valid"], nonfinite_B=counts["nonfinite"], seq_logratio_B=rows["seq_logratio"],
        min_d_B=rows["min_d"], diagnostics={}, weight_dtype=weight_dtype)
    sums.diagnostics.update(_diagnostics(sums, g, n, out))
    return sums


def _diagnostics(sums: FusedSums, g: dict, n: int, out: np.ndarray) -> dict:
    """``compute_diagnostics``' dict from the sums (its formulas; see ``diagnostics.py``)."""
    n_seq = int(sums.seq_valid_B.sum().item())
    diag: dict = dict.fromkeys(DIAGNOSTIC_KEYS)
    diag.update(n_sequences=n_seq, n_tokens=n, nonfinite_tokens=int(sums.nonfinite_B.sum().item()))
    if n == 0:
        return diag
    lower, upper = out.tolist()
    # centred sums from the shifted ones (x = mu - mu_0): exactly 0 for a constant input
    # products, not ``** 2``: Python's float power raises OverflowError where a product gives inf
    xx = max(g["sum_mu2"] - g["sum_mu"] * g["sum_mu"] / n, 0.0)
    yy = max(g["sum_old2"] - g["sum_old"] * g["sum_old"] / n, 0.0)
    xy = g["sum_mu_old"] - g["sum_mu"] * g["sum_old"] / n
    pearson = None if xx == 0.0 or yy == 0.0 else max(-1.0, min(1.0, xy / (math.sqrt(xx) * math.sqrt(yy))))
    log_rho_seq_B = sums.seq_logratio_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    seq_valid_B = sums.seq_valid_B
    chi2_B = torch.where(seq_valid_B, torch.expm1(2.0 * log_rho_seq_B), 0.0)
    rho_seq_B = torch.where(seq_valid_B, log_rho_seq_B.exp(), 0.0)
    diag.update(
        kl_k1=(0.0 - g["sum_d"]) / n, kl_k2=0.5 * g["sum_dc2"] / n, kl_k3=g["sum_k3"] / n,
        chi2_token=(g["sum_e2"] + 2.0 * g["sum_e"]) / n, chi2_seq=float(chi2_B.sum().item()) / n_seq,
        logp_pearson=pearson,
        abs_diff_mean=g["sum_abs"] / n, abs_diff_median=lower if n % 2 == 1 else (lower + upper) / 2,
        abs_diff_max=g["max_abs"], prob_abs_diff_mean=g["sum_gap"] / n,
        frac_outside_2x=g["out2"] / n, frac_outside_5x=g["out5"] / n,
        ess_token=min(g["sum_rho"] * g["sum_rho"] / (n * g["sum_rho2"]), 1.0), ess_seq=ess_fraction(rho_seq_B, n_seq),
    )
    return diag


def diagnostics_by_lag(behaviour_logp_BT, proximal_logp_BT, mask_BT, lag_B,
                       whole: FusedSums | None = None) -> dict[str, dict]:
    """Every section 1 diagnostic of the responses of each lag (keyed ``str(lag)``, sorted):
    ``diagnostics_by_lag_of``'s values, from one fused pass over each lag's rows (``whole``, the
    batch's own sums, stands for a batch of a single lag: no second pass)."""
    lag_t, lags = checked_lags(lag_B, np.shape(behaviour_logp_BT)[0])
    lag_B = lag_t.cpu().numpy()
    if len(lags) == 1 and whole is not None:
        return {str(lags[0]): dict(whole.diagnostics)}
    def rows_of(x, rows: np.ndarray):  # numpy arrays (read-only ones from the object store too) or tensors
        return x[rows] if isinstance(x, np.ndarray) else torch.as_tensor(x).index_select(0, torch.from_numpy(rows))

    out = {}
    for lag in lags:
        rows = np.flatnonzero(lag_B == lag)
        out[str(lag)] = fused_sums(*(rows_of(x, rows) for x in (behaviour_logp_BT, proximal_logp_BT, mask_BT))).diagnostics
    return out


def sequence_method_statistics(sums: FusedSums, w_B: torch.Tensor) -> dict:
    """``method_statistics`` of a sequence-level weight ``w_B`` carried by every token of its
    response: token sums are ``T_i``-weighted sums over responses."""
    n = int(sums.num_valid_B.sum().item())
    n_seq = int(sums.seq_valid_B.sum().item())
    if n == 0:
        return {"keep_token_frac": None, "keep_seq_frac": None, "weight_mean": None, "weight_max": None,
                "ess": None, "keep_seq_frac_by_len": {key: None for key, _ in LENGTH_BUCKETS}}
    seq_valid_B = sums.seq_valid_B
    t_B = sums.num_valid_B.to(torch.float64)
    w_B = torch.where(seq_valid_B, w_B.to(torch.float64), 0.0)
    kept_seq_B = seq_valid_B & (w_B > 0)
    sum_w, sum_w2 = float((t_B * w_B).sum().item()), float((t_B * w_B.square()).sum().item())
    return {
        "keep_token_frac": int(sums.num_valid_B[kept_seq_B].sum().item()) / n,
        "keep_seq_frac": int(kept_seq_B.sum().item()) / n_seq,
        "weight_mean": sum_w / n,
        "weight_max": float(torch.where(seq_valid_B, w_B, float("-inf")).max().item()),
        "ess": 0.0 if sum_w2 == 0.0 else min(sum_w**2 / (n * sum_w2), 1.0),
        "keep_seq_frac_by_len": fraction_by_bucket(kept_seq_B, sums.num_valid_B, seq_valid_B),
    }


def full_path(behaviour_logp_BT, proximal_logp_BT, mask_BT, method,
              threads: int | None = None) -> tuple[dict, torch.Tensor, dict]:
    """Diagnostics, the sequence-level method's weight of each response (in the inputs' weight
    dtype, as ``compute_weights``), and their statistics: the torch path's ``compute_diagnostics``,
    ``compute_weights`` and ``method_statistics`` for a sequence-level ``method``."""
    sums = fused_sums(behaviour_logp_BT, proximal_logp_BT, mask_BT, threads)
    w_B = sequence_weights_B(sums.row_ratios(), method).to(sums.weight_dtype)  # as compute_weights returns them
    return sums.diagnostics, w_B, sequence_method_statistics(sums, w_B)
