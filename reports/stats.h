// The statistics of `vlatune check`: pure functions on samples, unit-tested on synthetic data
// (tests/core/test_reports_stats.cpp). No I/O.
//
// Timing is compared as distributions (anchors §5.5): a two-sided Mann-Whitney U test (Google Benchmark's
// tools/compare.py uses the same test, α = 0.05, and asks for >= 9 repetitions) AND a practical threshold on the
// median; a regression needs both. Numerics are compared step by step (relative error) and, on long runs, as
// curves (Pearson correlation and mean relative error).
#pragma once

#include <cstddef>
#include <vector>

#include "formats/numbers.h"

namespace vlatune::reports {

using formats::median;  // of the finite values (NaN when there are none)

// Centered rolling median: out[i] is the median of the finite values among values[i - w/2 .. i + w/2] (clipped at
// the ends; NaN when there are none). Robust to the single slow steps (a checkpoint, a data stall) that a moving
// average would smear. `window` >= 1.
std::vector<double> rolling_median(const std::vector<double>& values, size_t window);

struct MannWhitney {
  double u_baseline = 0;   // U of the first sample: pairs (b, c) with b > c, ties counted 1/2
  double u_candidate = 0;  // U of the second sample; u_baseline + u_candidate = n_baseline * n_candidate
  double p_value = 1;      // two-sided
  bool exact = false;      // exact null distribution (no ties, small samples) vs normal approximation
  size_t n_baseline = 0, n_candidate = 0;
};

// Two-sided Mann-Whitney U test (Wilcoxon rank-sum) of `baseline` against `candidate`. Ties get mid-ranks.
// p-value: exact (the permutation distribution of U, counted by dynamic programming) when there are no ties and
// n_baseline * n_candidate <= kExactLimit; otherwise the normal approximation with the tie-corrected variance
// and a continuity correction of 1/2 (as scipy.stats.mannwhitneyu, method "asymptotic").
// `method` forces one or the other (kExact with ties is an error). Both samples must be non-empty and finite
// (std::invalid_argument otherwise).
enum class UMethod { kAuto, kExact, kAsymptotic };
inline constexpr size_t kExactLimit = 2500;  // n1 * n2 up to 50 x 50: an O(n1^2 n2) count, microseconds
MannWhitney mann_whitney_u(const std::vector<double>& baseline, const std::vector<double>& candidate,
                           UMethod method = UMethod::kAuto);

// Pearson correlation of two equal-length series (std::invalid_argument when lengths differ or < 2).
// NaN when either series is constant (correlation undefined).
double pearson(const std::vector<double>& a, const std::vector<double>& b);

// |candidate - baseline| / |baseline|; a zero baseline gives 0 when candidate is 0, else +inf.
double relative_error(double baseline, double candidate);

struct SeriesError {
  double max_relative = 0;   // largest per-element relative error
  size_t argmax = 0;         // its index
  double mean_relative = 0;  // mean of the per-element relative errors
};
// Elementwise relative errors of equal-length, non-empty series (std::invalid_argument otherwise).
SeriesError series_error(const std::vector<double>& baseline, const std::vector<double>& candidate);

}  // namespace vlatune::reports
