#include "reports/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace vlatune::reports {

namespace {

void require_finite(const std::vector<double>& v, const char* what) {
  if (v.empty()) throw std::invalid_argument(std::string("mann_whitney_u: the ") + what + " sample is empty");
  for (double x : v) {
    if (!std::isfinite(x)) throw std::invalid_argument(std::string("mann_whitney_u: non-finite value in ") + what);
  }
}

// P(U >= u) under H0 for samples of sizes m and n without ties. The number of arrangements with U = k is the
// coefficient of q^k in the Gaussian binomial [m+n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i); built
// one factor pair at a time, so after step i the polynomial is [n+i choose i]_q (all coefficients >= 0) and
// every intermediate stays within the final magnitude (C(100, 50) ~ 1e29 fits a double's range; the p-values we
// care about are far above its rounding).
double exact_upper_tail(size_t m, size_t n, size_t u) {
  const size_t max_u = m * n;
  std::vector<double> c(max_u + m + 1, 0.0);  // room for the product's degree before each division
  c[0] = 1.0;
  size_t degree = 0;
  for (size_t i = 1; i <= m; ++i) {
    const size_t up = n + i, top = degree + up;
    for (size_t k = top; k >= up; --k) c[k] -= c[k - up];  // times (1 - q^(n+i))
    for (size_t k = i; k <= top; ++k) c[k] += c[k - i];    // divided by (1 - q^i): Q[k] = P[k] + Q[k-i]
    degree += n;
    for (size_t k = degree + 1; k <= top; ++k) c[k] = 0.0;  // the division is exact: clear rounding residue
  }
  double total = 0, tail = 0;
  for (size_t k = 0; k <= max_u; ++k) {
    total += c[k];
    if (k >= u) tail += c[k];
  }
  return tail / total;
}

}  // namespace

std::vector<double> rolling_median(const std::vector<double>& values, size_t window) {
  const size_t half = std::max<size_t>(window, 1) / 2;
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t lo = i >= half ? i - half : 0, hi = std::min(values.size(), i + half + 1);
    out[i] = median(std::vector<double>(values.begin() + static_cast<std::ptrdiff_t>(lo),
                                        values.begin() + static_cast<std::ptrdiff_t>(hi)));
  }
  return out;
}

MannWhitney mann_whitney_u(const std::vector<double>& baseline, const std::vector<double>& candidate, UMethod method) {
  require_finite(baseline, "baseline");
  require_finite(candidate, "candidate");
  const size_t n1 = baseline.size(), n2 = candidate.size(), n = n1 + n2;
  // (value, from baseline?) sorted; mid-ranks for ties.
  std::vector<std::pair<double, bool>> all;
  all.reserve(n);
  for (double x : baseline) all.emplace_back(x, true);
  for (double x : candidate) all.emplace_back(x, false);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double rank_sum_baseline = 0;
  double tie_term = 0;  // sum over tie groups of t^3 - t
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && all[j].first == all[i].first) ++j;
    const double t = static_cast<double>(j - i);
    const double mid_rank = 0.5 * static_cast<double>(i + 1 + j);  // ranks i+1..j
    for (size_t k = i; k < j; ++k) {
      if (all[k].second) rank_sum_baseline += mid_rank;
    }
    tie_term += t * t * t - t;
    i = j;
  }
  MannWhitney r;
  r.n_baseline = n1;
  r.n_candidate = n2;
  const double nn1 = static_cast<double>(n1), nn2 = static_cast<double>(n2), nn = static_cast<double>(n);
  r.u_baseline = rank_sum_baseline - nn1 * (nn1 + 1) / 2;
  r.u_candidate = nn1 * nn2 - r.u_baseline;
  const double u_max = std::max(r.u_baseline, r.u_candidate);

  if (method == UMethod::kExact && tie_term != 0)
    throw std::invalid_argument("mann_whitney_u: the exact method needs samples without ties");
  if (method == UMethod::kExact || (method == UMethod::kAuto && tie_term == 0 && n1 * n2 <= kExactLimit)) {
    r.exact = true;
    r.p_value = std::min(1.0, 2.0 * exact_upper_tail(n1, n2, static_cast<size_t>(std::lround(u_max))));
    return r;
  }
  const double mu = nn1 * nn2 / 2;
  const double var = nn1 * nn2 / 12 * ((nn + 1) - tie_term / (nn * (nn - 1)));
  if (var <= 0) {  // every value tied: no evidence of a difference
    r.p_value = 1;
    return r;
  }
  const double z = (u_max - mu - 0.5) / std::sqrt(var);
  r.p_value = std::clamp(std::erfc(z / std::sqrt(2.0)), 0.0, 1.0);  // 2 * (1 - Phi(z))
  return r;
}

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2)
    throw std::invalid_argument("pearson: needs two series of equal length >= 2, got " + std::to_string(a.size()) +
                                " and " + std::to_string(b.size()));
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n;
  const double mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double da = a[i] - ma, db = b[i] - mb;
    sab += da * db;
    saa += da * da;
    sbb += db * db;
  }
  if (saa == 0 || sbb == 0) return std::nan("");
  return std::clamp(sab / std::sqrt(saa * sbb), -1.0, 1.0);
}

double relative_error(double baseline, double candidate) {
  const double diff = std::fabs(candidate - baseline);
  if (baseline == 0) return diff == 0 ? 0.0 : HUGE_VAL;
  return diff / std::fabs(baseline);
}

SeriesError series_error(const std::vector<double>& baseline, const std::vector<double>& candidate) {
  if (baseline.size() != candidate.size() || baseline.empty())
    throw std::invalid_argument("series_error: needs two non-empty series of equal length, got " +
                                std::to_string(baseline.size()) + " and " + std::to_string(candidate.size()));
  SeriesError e;
  double sum = 0;
  for (size_t i = 0; i < baseline.size(); ++i) {
    const double r = relative_error(baseline[i], candidate[i]);
    sum += r;
    if (r > e.max_relative || i == 0) {
      e.max_relative = r;
      e.argmax = i;
    }
  }
  e.mean_relative = sum / static_cast<double>(baseline.size());
  return e;
}

}  // namespace vlatune::reports
