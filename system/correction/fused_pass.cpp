// The correction core's fused pass (system/correction/fused.py has the formulas and the caller).
//
// One read of (mu, old, mask), [B, T] row-major, gives every per-response and batch sum of spec
// sections 0-1 (Pearson's as sums of x = mu - mu_0, y = old - old_0, their squares and product; the
// caller passes mu_0, old_0 near the means, so the centred sums lose little to cancellation),
// the count of valid |d| below a bracket [lo, hi] the caller chose around the median, and the |d|
// inside it, where the median's exact order statistics are then selected. A bracket that misses
// (told by the counts) is widened to everything and the pass repeated. All arithmetic in double;
// a token is valid when mask != 0 and old - mu is finite (as system/correction/ratios.py).
// Each row is read from its first to its last mask != 0 position only (the padding around adds
// zeros; found eight mask bytes at a time), and the band is collected without a branch per token
// (a compaction of the row: AVX-512's compress eight values at a time where the CPU has it).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// system.correction.ratios.LOG_RATIO_CLAMP: fused.compatible refuses a library whose aisrl_fused_clamp() differs
// (the constant stays a compile-time one here: the row loop vectorises around it).
constexpr double kClamp = 20.0;

// Per-response outputs, ROW_* columns of the [B, kRowCols] array.
enum RowCol { ROW_T, ROW_NONFINITE, ROW_L, ROW_SUM_D, ROW_SUM_K3, ROW_SUM_ABS, ROW_OUT5, ROW_MIN_D, kRowCols };
// Batch outputs of pass 1.
enum GlobCol {
  G_N, G_SUM_D, G_SUM_DC2, G_SUM_E, G_SUM_E2, G_SUM_RHO, G_SUM_RHO2, G_SUM_K3, G_SUM_ABS, G_MAX_ABS,
  G_SUM_GAP, G_OUT2, G_OUT5, G_SUM_MU, G_SUM_OLD, G_REF_MU, G_REF_OLD, G_SUM_MU2, G_SUM_OLD2, G_SUM_MU_OLD,
  G_BELOW, G_BAND, kGlobCols
};

inline uint64_t nonzero(uint64_t x) {  // 1 if x != 0 else 0, in integer arithmetic (vectorises)
  return (x | (0 - x)) >> 63;
}

inline uint64_t finite_bits(double x) {  // 1 unless NaN or +-inf, read from the bits (no libm call)
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return nonzero(((bits >> 52) & 0x7ff) ^ 0x7ff);
}

inline double select(uint64_t keep, double yes, double no) {  // keep ? yes : no, without a branch
  uint64_t y, n;
  std::memcpy(&y, &yes, sizeof y);
  std::memcpy(&n, &no, sizeof n);
  const uint64_t r = (y & keep) | (n & ~keep);
  double out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

// A double's bits as an int64 that orders like the double (NaN excluded): negative values have
// their magnitude bits flipped. Its own inverse.
inline int64_t ordered_bits(double x) {
  int64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits ^ ((bits >> 63) & INT64_MAX);
}

inline double from_ordered_bits(int64_t key) {
  const int64_t bits = key ^ ((key >> 63) & INT64_MAX);
  double x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// exp and expm1 as inline polynomials the compiler vectorises with the rest of the loop (no libm
// call: the vector math library's exp cost about as much as the whole remaining loop). x = k ln2 + r
// with k = round(x / ln2), |r| <= ln2 / 2 (Cody-Waite: ln2 in two parts, the product k * ln2_hi
// exact); expm1(r) = r + r^2 p(r), p of degree 9 (below); then
// exp(x) = 2^k (1 + expm1(r)) and expm1(x) = 2^k expm1(r) + (2^k - 1), 2^k applied to the exponent
// field (``times_pow2``, no double-to-int conversion). Within 2 ulp of glibc's exp / expm1 (tested
// value by value and through the pass in tests/test_correction_fused.py).
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2Hi = 0.693147180369123816490;   // ln 2 to 32 bits: k * kLn2Hi exact for |k| < 2^20
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kShifter = 6755399441055744.0;        // 1.5 * 2^52

// y * 2^k for integer-valued k, by adding k to y's exponent field: exact, and right as long as the
// result is a normal double (the callers make sure). k is read from the low mantissa bits of the
// exact sum k + 1.5 * 2^52.
inline double times_pow2(double y, double k) {
  const double t = k + kShifter;
  uint64_t y_bits, k_bits;
  std::memcpy(&y_bits, &y, sizeof y_bits);
  std::memcpy(&k_bits, &t, sizeof k_bits);
  y_bits += k_bits << 52;
  double out;
  std::memcpy(&out, &y_bits, sizeof out);
  return out;
}

// expm1 of the reduced argument, |r| <= ln2 / 2: r + r^2 p(r), p the degree-9 polynomial interpolating
// g(r) = (expm1(r) - r) / r^2 at the 10 Chebyshev nodes of [-ln2/2, ln2/2] (coefficients solved in
// 60-digit arithmetic, rounded to double; Horner). Its error in expm1 is ~4e-17 relative (0.4 ulp),
// below the evaluation's own rounding (measured: expm1 and exp of the reduced argument within 0.7 ulp); the
// Taylor polynomial needs degree 11 for the same (two more multiply-adds per exponential).
inline double expm1_reduced(double r) {
  double p = 2.5100375832561234e-08;
  p = std::fma(p, r, 2.7620075879983367e-07);
  p = std::fma(p, r, 2.7557268480310024e-06);
  p = std::fma(p, r, 2.4801521322368692e-05);
  p = std::fma(p, r, 0.00019841269863040545);
  p = std::fma(p, r, 0.0013888888917196719);
  p = std::fma(p, r, 0.008333333333330065);
  p = std::fma(p, r, 0.041666666666624164);
  p = std::fma(p, r, 0.16666666666666669);
  p = std::fma(p, r, 0.5000000000000001);
  return std::fma(p * r, r, r);
}

// expm1(x) and exp(x) for |x| <= 40 (the clamped log-ratio): with s = 2^k and q = expm1(r),
// expm1(x) = s q + (s - 1) and exp(x) = s q + s, each accurate relative to itself (exp(x) as 1 + expm1(x)
// would not be where exp(x) is tiny: d = -20 gives 2e-9 with an absolute error of 1e-16).
inline void expm1_and_exp(double x, double* em1, double* ex) {
  const double k = std::nearbyint(x * kLog2e);
  const double r = std::fma(-k, kLn2Lo, std::fma(-k, kLn2Hi, x));
  const double s = times_pow2(1.0, k);  // 2^k, |k| <= 58 (normal)
  const double q = expm1_reduced(r);
  *em1 = std::fma(s, q, s - 1.0);
  *ex = std::fma(s, q, s);
}

// exp(x) for x in [kMinNormalLog, kMaxLog], where the result is a normal double: 2^k is added to the
// exponent field of 1 + expm1(r) (in [0.7, 1.42], so the result stays normal), no multiply. The
// pass sends the rare tokens outside that range (a subnormal or infinite exp(mu)) to libm instead;
// for x outside it (or NaN) the result is meaningless, never trapping, and the pass discards it.
constexpr double kMinNormalLog = -708.0;               // exp(-708) = 3.3e-308 > DBL_MIN
constexpr double kMaxLog = 709.782712893383973096;   // log(DBL_MAX)

inline double exp_normal(double x) {
  const double k = std::nearbyint(x * kLog2e);
  const double r = std::fma(-k, kLn2Lo, std::fma(-k, kLn2Hi, x));
  return times_pow2(1.0 + expm1_reduced(r), k);
}

template <typename F>
bool first_valid(const F* mu, const F* old, const uint8_t* mask, int64_t n, double* ref_mu, double* ref_old) {
  for (int64_t k = 0; k < n; ++k) {
    if (!mask[k]) continue;
    double m = static_cast<double>(mu[k]), o = static_cast<double>(old[k]);
    if (std::isfinite(o - m)) {
      *ref_mu = m;
      *ref_old = o;
      return true;
    }
  }
  return false;
}

// Rows [i0, i1) of the batch: their row outputs, and this range's batch sums into `glob` (zeroed
// by the caller) and its |d| inside [lo, hi] into `band` (at most `capacity` stored, all counted).
template <typename F>
void pass_rows(const F* mu, const F* old, const uint8_t* mask, int64_t i0, int64_t i1, int64_t T, double log2,
               double log5, double lo, double hi, double ref_mu, double ref_old, double* row, double* glob,
               std::vector<double>& band, int64_t capacity) {
  double max_abs = 0.0;
  std::vector<double> abs_row(static_cast<size_t>(std::max<int64_t>(T, 1)));
  double* abs_j = abs_row.data();  // per row: |d| of each token inside [lo, hi] (-1 elsewhere)
  double below = 0.0;
  int64_t nb = 0;

  for (int64_t i = i0; i < i1; ++i) {
    // Only the row's span from its first to its last response position: positions outside it add
    // exact zeros to every sum (right padding is most of a batch's masked positions).
    const uint8_t* k_full = mask + i * T;
    if (i + 1 < i1) {
      // the next row's first cache lines: its mask tail (read backwards first, by the padding scan
      // below) and the first 1 KB of mu and old (a 1024-token float32 row is a 4 KB page, where the
      // hardware's stream prefetch stops; -6 % at 1M tokens on AMD EPYC, 512 B alike, 2-4 KB less)
      for (int64_t off = T - 64; off >= std::max<int64_t>(0, T - 512); off -= 64) __builtin_prefetch(k_full + T + off);
      const char* m_next = reinterpret_cast<const char*>(mu + (i + 1) * T);
      const char* o_next = reinterpret_cast<const char*>(old + (i + 1) * T);
      const int64_t bytes = std::min<int64_t>(1024, T * static_cast<int64_t>(sizeof(F)));
      for (int64_t off = 0; off < bytes; off += 64) {
        __builtin_prefetch(m_next + off);
        __builtin_prefetch(o_next + off);
      }
    }
    int64_t j_end = T;
    for (uint64_t word = 0; j_end >= 8; j_end -= 8) {  // the padding, eight mask bytes at a time
      std::memcpy(&word, k_full + j_end - 8, sizeof word);
      if (word != 0) break;
    }
    while (j_end > 0 && !k_full[j_end - 1]) --j_end;
    int64_t j_begin = 0;
    while (j_begin < j_end && !k_full[j_begin]) ++j_begin;
    const int64_t span = j_end - j_begin;
    const F* m_row = mu + i * T + j_begin;
    const F* o_row = old + i * T + j_begin;
    const uint8_t* k_row = k_full + j_begin;
    double L = 0, sd = 0, sk3 = 0, sabs = 0, out5 = 0, min_d = INFINITY;
    double sdc2 = 0, se = 0, se2 = 0, srho = 0, srho2 = 0, sgap = 0, out2 = 0, smu = 0, sold = 0;
    double smu2 = 0, sold2 = 0, smo = 0, below_any = 0;
    double t = 0, nonfinite = 0, big = 0;
    int64_t min_key = ordered_bits(INFINITY), max_bits = 0;
    // Branch-free, so the compiler vectorises it (exp / expm1 inline, above): an
    // excluded token contributes exact zeros (d, m - ref, o - ref replaced by 0 before any use).
    for (int64_t j = 0; j < span; ++j) {
      const double m = static_cast<double>(m_row[j]), o = static_cast<double>(o_row[j]);
      const double d = o - m;
      const uint64_t in = nonzero(k_row[j]);
      const uint64_t fin = finite_bits(d);
      const uint64_t valid = in & fin;
      const uint64_t keep = 0 - valid;  // all ones for a valid token, else 0
      const double ds = select(keep, d, 0.0);
      const double dc = std::min(std::max(ds, -kClamp), kClamp);
      double e, rho;  // expm1(dc), exp(dc)
      expm1_and_exp(dc, &e, &rho);
      const double a = std::fabs(ds);
      const double rho_s = select(keep, rho, 0.0);
      srho += rho_s;
      srho2 += rho_s * rho_s;
      nonfinite += select(0 - (in & (fin ^ 1)), 1.0, 0.0);
      t += select(keep, 1.0, 0.0);
      L += dc;
      sd += ds;
      sdc2 += dc * dc;
      se += e;
      se2 += e * e;
      sk3 += e - dc;
      sabs += a;
      // |exp(old) - exp(mu)| = exp(mu) |expm1(d)|, and expm1(d) = e while |d| <= 20; the rare tokens
      // with |d| > 20 or exp(mu) not a normal double are added in the scalar loop below, from libm
      // (exp_normal of any other lane is meaningless, and discarded)
      const uint64_t usual = (a > kClamp || m < kMinNormalLog || m > kMaxLog) ? 0 : 1;
      sgap += select(keep & (0 - usual), exp_normal(m) * std::fabs(e), 0.0);
      big += select(keep & (0 - (usual ^ 1)), 1.0, 0.0);
      out2 += a > log2 ? 1.0 : 0.0;
      out5 += a > log5 ? 1.0 : 0.0;
      // min d and max |d| as integer reductions on order-preserving bit patterns (they vectorise;
      // |d| >= 0 orders like its bits)
      const int64_t d_key = ordered_bits(select(keep, d, INFINITY));
      min_key = d_key < min_key ? d_key : min_key;
      int64_t a_bits;
      std::memcpy(&a_bits, &a, sizeof a_bits);
      max_bits = a_bits > max_bits ? a_bits : max_bits;
      const double x = select(keep, m - ref_mu, 0.0), y = select(keep, o - ref_old, 0.0);
      smu += x;
      sold += y;
      smu2 += x * x;
      sold2 += y * y;
      smo += x * y;
      // |d| of a valid token, -1 for the others: counted below lo (the others subtracted after the
      // loop) and kept where inside [lo, hi] (lo >= 0, so never the others)
      const double av = select(keep, a, -1.0);
      below_any += av < lo ? 1.0 : 0.0;
      abs_j[j] = av >= lo && av <= hi ? av : -1.0;
    }
    below += below_any - (static_cast<double>(span) - t);
    if (big > 0.0) {  // rare: the probability gap of the tokens left out above, from both exponentials
      for (int64_t j = 0; j < span; ++j) {
        const double m = static_cast<double>(m_row[j]), o = static_cast<double>(o_row[j]);
        if (k_row[j] && std::isfinite(o - m) && (std::fabs(o - m) > kClamp || m < kMinNormalLog || m > kMaxLog)) {
          sgap += std::fabs(std::exp(o) - std::exp(m));
        }
      }
    }
    int64_t in_row = 0;  // the row's band values, compacted to the front of abs_row (branch-free)
    int64_t j = 0;
#if defined(__AVX512F__)
    // eight at a time: compress the lanes >= 0 to the front of a register and store all eight
    // (in_row <= j, so the store never reaches a value not yet read)
    for (; j + 8 <= span; j += 8) {
      const __m512d x = _mm512_loadu_pd(abs_j + j);
      const __mmask8 keep8 = _mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_GE_OQ);
      _mm512_storeu_pd(abs_j + in_row, _mm512_maskz_compress_pd(keep8, x));
      in_row += __builtin_popcount(keep8);
    }
#endif
    for (; j < span; ++j) {
      const double x = abs_j[j];
      abs_j[in_row] = x;
      in_row += x >= 0.0 ? 1 : 0;
    }
    const int64_t room = std::max<int64_t>(0, capacity - nb);
    band.insert(band.end(), abs_j, abs_j + std::min(in_row, room));
    nb += in_row;  // counted past the capacity too: the caller sees the band did not fit
    min_d = from_ordered_bits(min_key);
    double row_max;
    std::memcpy(&row_max, &max_bits, sizeof row_max);
    max_abs = std::max(max_abs, row_max);
    double* r = row + i * kRowCols;
    r[ROW_T] = t;
    r[ROW_NONFINITE] = nonfinite;
    r[ROW_L] = L;
    r[ROW_SUM_D] = sd;
    r[ROW_SUM_K3] = sk3;
    r[ROW_SUM_ABS] = sabs;
    r[ROW_OUT5] = out5;
    r[ROW_MIN_D] = min_d;
    glob[G_N] += t;
    glob[G_SUM_D] += sd;
    glob[G_SUM_DC2] += sdc2;
    glob[G_SUM_E] += se;
    glob[G_SUM_E2] += se2;
    glob[G_SUM_RHO] += srho;
    glob[G_SUM_RHO2] += srho2;
    glob[G_SUM_K3] += sk3;
    glob[G_SUM_ABS] += sabs;
    glob[G_SUM_GAP] += sgap;
    glob[G_OUT2] += out2;
    glob[G_OUT5] += out5;
    glob[G_SUM_MU] += smu;
    glob[G_SUM_OLD] += sold;
    glob[G_SUM_MU2] += smu2;
    glob[G_SUM_OLD2] += sold2;
    glob[G_SUM_MU_OLD] += smo;
  }
  glob[G_BELOW] = below;
  glob[G_BAND] = static_cast<double>(nb);
  glob[G_MAX_ABS] = max_abs;
}

// The whole batch on `threads` threads, each a contiguous range of rows; the ranges' sums are
// added in range order (so a result depends on the thread count only through summation order).
template <typename F>
bool pass1(const F* mu, const F* old, const uint8_t* mask, int64_t B, int64_t T, double log2, double log5,
           double lo, double hi, double* row, double* glob, double* band, int64_t capacity, int threads,
           double ref_mu, double ref_old) {
  if (!std::isfinite(ref_mu) || !std::isfinite(ref_old)) {  // none given: the first valid token's
    ref_mu = ref_old = 0.0;
    first_valid(mu, old, mask, B * T, &ref_mu, &ref_old);
  }
  const int n = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, B)));
  std::vector<std::vector<double>> globs(n, std::vector<double>(kGlobCols, 0.0));
  std::vector<std::vector<double>> bands(n);
  std::atomic<bool> failed{false};
  auto run = [&](int k) {
    try {  // nothing may escape a thread (or an OpenMP region): that would end the process
      pass_rows(mu, old, mask, B * k / n, B * (k + 1) / n, T, log2, log5, lo, hi, ref_mu, ref_old, row,
                globs[k].data(), bands[k], capacity);
    } catch (...) {  // std::bad_alloc from a row's buffer or the band
      failed = true;
    }
  };
#if defined(_OPENMP)
  // On the OpenMP team of the calling thread: in a process with torch that is torch's own runtime
  // (the same libgomp.so.1), so the ranges run on the threads torch's ops just used, instead of
  // on new threads that share the cores with torch's threads while those still spin after an op.
  if (n > 1) {
#pragma omp parallel for num_threads(n) schedule(static, 1)
    for (int k = 0; k < n; ++k) run(k);
  } else {
    run(0);
  }
#else
  std::vector<std::thread> workers;
  for (int k = 1; k < n; ++k) workers.emplace_back(run, k);
  run(0);
  for (auto& w : workers) w.join();
#endif
  if (failed) return false;
  int64_t stored = 0;
  for (int k = 0; k < n; ++k) {
    const double* g = globs[k].data();
    for (int c = 0; c < kGlobCols; ++c) {
      if (c == G_MAX_ABS) {
        glob[c] = std::max(glob[c], g[c]);
      } else if (c != G_REF_MU && c != G_REF_OLD) {
        glob[c] += g[c];
      }
    }
    for (double v : bands[k]) {
      if (stored < capacity) band[stored++] = v;
    }
  }
  glob[G_REF_MU] = ref_mu;
  glob[G_REF_OLD] = ref_old;
  return true;
}

}  // namespace

extern "C" {

// Bumped whenever an exported function's arguments change (fused.py refuses another version).
int aisrl_fused_abi() { return 8; }
// 1 when the ranges run on an OpenMP team, 0 on std::thread (a compiler without OpenMP).
int aisrl_fused_openmp() {
#if defined(_OPENMP)
  return 1;
#else
  return 0;
#endif
}
int aisrl_fused_row_cols() { return kRowCols; }
double aisrl_fused_clamp() { return kClamp; }
int aisrl_fused_glob_cols() { return kGlobCols; }

// dtype: 4 (float32 mu/old) or 8 (float64). row: [B, kRowCols] and glob: [kGlobCols], zeroed by the
// caller; band: room for `capacity` values (glob[G_BAND] says how many fell inside [lo, hi]);
// threads: how many threads share the rows (1: the calling thread only). ref_mu, ref_old: Pearson's
// shift (any values; near the means keeps the centred sums exact), NaN for the first valid token's.
// log2, log5: the thresholds of the 2x / 5x counts (log 2 and log 5 at the inputs' precision).
int aisrl_fused_pass(int dtype, const void* mu, const void* old, const uint8_t* mask, int64_t B, int64_t T,
                     double lo, double hi, double* row, double* glob, double* band, int64_t capacity, int threads,
                     double ref_mu, double ref_old, double log2, double log5) {
  if (threads < 1 || !(lo >= 0.0)) return -1;  // the band's -1 marks excluded tokens: lo must be >= 0
  bool done = false;
  try {  // -2: out of memory (or no thread could be started), reported instead of ending the process
    if (dtype == 4) {
      done = pass1(static_cast<const float*>(mu), static_cast<const float*>(old), mask, B, T, log2, log5, lo, hi, row,
                   glob, band, capacity, threads, ref_mu, ref_old);
    } else if (dtype == 8) {
      done = pass1(static_cast<const double*>(mu), static_cast<const double*>(old), mask, B, T, log2, log5, lo, hi,
                   row, glob, band, capacity, threads, ref_mu, ref_old);
    } else {
      return -1;
    }
  } catch (...) {
    return -2;
  }
  return done ? 0 : -2;
}

// The pass's inline exponentials on their own, for tests against libm: exp(x[i]) where the pass uses
// it, x in [-708, log(DBL_MAX)]; expm1(x[i]) and the token ratio's exp(x[i]) from the same reduction
// where |x[i]| <= 20 (the pass's clamp); NaN elsewhere.
void aisrl_exponentials(const double* x, int64_t n, double* exp_out, double* expm1_out, double* rho_out) {
  for (int64_t i = 0; i < n; ++i) {
    exp_out[i] = x[i] >= kMinNormalLog && x[i] <= kMaxLog ? exp_normal(x[i]) : NAN;
    double e = NAN, ex = NAN;
    if (std::fabs(x[i]) <= kClamp) expm1_and_exp(x[i], &e, &ex);
    expm1_out[i] = e;
    rho_out[i] = ex;
  }
}

// The values of ranks r1 <= r2 (0-indexed, r2 <= r1 + 1) of band[0:n] (finite values >= 0, reordered
// in place): out = [value_r1, value_r2]. A radix step first: non-negative doubles order like their
// bits, so a 4096-bin histogram of (bits - smallest bits) >> shift finds the bins holding the two
// ranks, and nth_element runs on those bins' values only (0.29 -> ~0.05 ms on the ~34k band values
// of a 1M-token batch, AMD EPYC).
int aisrl_select(double* band, int64_t n, int64_t r1, int64_t r2, double* out) {
  if (r1 < 0 || r2 < r1 || r2 > r1 + 1 || r2 >= n) return -1;
  constexpr int kBins = 4096;
  int64_t m = n, base = 0;  // band[0:m] holds ranks base .. base + m - 1 of the whole band
  if (n > kBins) {
    auto key = [](double v) {
      uint64_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      return bits;
    };
    uint64_t kmin = UINT64_MAX, kmax = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t k = key(band[i]);
      kmin = k < kmin ? k : kmin;
      kmax = k > kmax ? k : kmax;
    }
    int shift = 0;
    while (((kmax - kmin) >> shift) >= static_cast<uint64_t>(kBins)) ++shift;
    std::vector<int64_t> hist;
    try {
      hist.assign(kBins, 0);
    } catch (...) {  // nothing may escape a C function
      return -2;
    }
    for (int64_t i = 0; i < n; ++i) ++hist[(key(band[i]) - kmin) >> shift];
    int64_t cum = 0;
    int b1 = -1, b2 = -1;
    for (int b = 0; b < kBins; ++b) {
      if (b1 < 0 && r1 < cum + hist[b]) {
        b1 = b;
        base = cum;
      }
      if (r2 < cum + hist[b]) {
        b2 = b;
        break;
      }
      cum += hist[b];
    }
    // the values of bins b1..b2 (b2 is b1 or the next non-empty bin) to the front of band
    m = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t bin = static_cast<int64_t>((key(band[i]) - kmin) >> shift);
      if (bin == b1 || bin == b2) std::swap(band[m++], band[i]);
    }
  }
  const int64_t q = r1 - base;
  std::nth_element(band, band + q, band + m);
  out[0] = band[q];
  out[1] = r2 != r1 ? *std::min_element(band + q + 1, band + m) : out[0];
  return 0;
}

}  // extern "C"
