// The statistics of `vlatune check` on synthetic samples: U statistics and p-values against values computed
// independently (scipy.stats.mannwhitneyu's documented example; brute-force permutation counts), Pearson, and
// relative errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <stdexcept>

#include "reports/stats.h"

using vlatune::reports::mann_whitney_u;
using vlatune::reports::UMethod;

TEST_CASE("median handles odd, even and non-finite inputs", "[reports][stats]") {
  using vlatune::reports::median;
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 3, 2}) == 2.5);
  CHECK(median({NAN, 5, 1}) == 3);
  CHECK(std::isnan(median({})));
}

TEST_CASE("Mann-Whitney U matches scipy's documented example, exact and asymptotic", "[reports][stats]") {
  // scipy.stats.mannwhitneyu docs: males vs females -> U1 = 17, p = 0.1111 (exact), 0.11134688653314 (asymptotic).
  const std::vector<double> males = {19, 22, 16, 29, 24}, females = {20, 11, 17, 12};
  const auto exact = mann_whitney_u(males, females);
  CHECK(exact.exact);
  CHECK(exact.u_baseline == 17);
  CHECK(exact.u_candidate == 3);
  CHECK(exact.p_value == Approx(1.0 / 9).epsilon(1e-12));
  const auto asym = mann_whitney_u(males, females, UMethod::kAsymptotic);
  CHECK_FALSE(asym.exact);
  CHECK(asym.p_value == Approx(0.11134688653314048).epsilon(1e-10));
}

TEST_CASE("Exact U p-values equal permutation counts", "[reports][stats]") {
  // Completely separated samples: only 2 of C(m+n, m) arrangements are as extreme (one per side).
  CHECK(mann_whitney_u({1, 2, 3}, {4, 5, 6}).p_value == Approx(2.0 / 20));
  CHECK(mann_whitney_u({1, 2, 3, 4}, {5, 6, 7, 8}).p_value == Approx(2.0 / 70));
  std::vector<double> a, b;
  for (int i = 0; i < 9; ++i) {
    a.push_back(100 + i);
    b.push_back(200 + i);
  }
  const auto r = mann_whitney_u(a, b);
  CHECK(r.exact);
  CHECK(r.u_baseline == 0);
  CHECK(r.p_value == Approx(2.0 / 48620).epsilon(1e-9));
  // Symmetric in its arguments, and p = 1 for identical orderings in the middle of the distribution.
  CHECK(mann_whitney_u(b, a).p_value == Approx(r.p_value));
  CHECK(mann_whitney_u({1, 4}, {2, 3}).p_value == Approx(1.0));
}

TEST_CASE("Ties get mid-ranks and the tie-corrected normal approximation", "[reports][stats]") {
  // Reference: the same formula evaluated independently in Python (mid-ranks, sum t^3 - t, continuity 1/2).
  const std::vector<double> a = {10, 12, 12, 13, 15, 15, 15, 18, 20}, b = {14, 15, 16, 16, 17, 19, 19, 21, 22};
  const auto r = mann_whitney_u(a, b);
  CHECK_FALSE(r.exact);  // ties force the approximation
  CHECK(r.u_baseline == 16.5);
  CHECK(r.u_baseline + r.u_candidate == 81);
  CHECK(r.p_value == Approx(0.036693142829273905).epsilon(1e-10));
  CHECK_THROWS_AS(mann_whitney_u(a, b, UMethod::kExact), std::invalid_argument);
  // Every value tied: no evidence either way.
  CHECK(mann_whitney_u({5, 5, 5}, {5, 5, 5, 5}).p_value == 1.0);
}

TEST_CASE("The normal approximation tracks the exact p-value at check's sample sizes", "[reports][stats]") {
  std::mt19937 gen(7);
  std::normal_distribution<double> base(100.0, 1.0), slow(101.0, 1.0);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<double> a, b;
    for (int i = 0; i < 20; ++i) {
      a.push_back(base(gen));
      b.push_back(slow(gen));
    }
    const double exact = mann_whitney_u(a, b, UMethod::kExact).p_value;
    const double asym = mann_whitney_u(a, b, UMethod::kAsymptotic).p_value;
    CHECK(asym == Approx(exact).margin(0.01));
  }
}

TEST_CASE("Mann-Whitney U rejects empty and non-finite samples", "[reports][stats]") {
  CHECK_THROWS_AS(mann_whitney_u({}, {1.0}), std::invalid_argument);
  CHECK_THROWS_AS(mann_whitney_u({1.0, NAN}, {1.0}), std::invalid_argument);
}

TEST_CASE("Pearson correlation: perfect, anti, constant and mismatched series", "[reports][stats]") {
  using vlatune::reports::pearson;
  CHECK(pearson({1, 2, 3, 4}, {2, 4, 6, 8}) == Approx(1.0));
  CHECK(pearson({1, 2, 3, 4}, {8, 6, 4, 2}) == Approx(-1.0));
  CHECK(pearson({1, 2, 3}, {1, 3, 2}) == Approx(0.5));
  CHECK(std::isnan(pearson({1, 1, 1}, {1, 2, 3})));
  CHECK_THROWS_AS(pearson({1, 2}, {1, 2, 3}), std::invalid_argument);
  CHECK_THROWS_AS(pearson({1}, {1}), std::invalid_argument);
}

TEST_CASE("Relative errors of series: worst element and mean", "[reports][stats]") {
  using vlatune::reports::relative_error;
  CHECK(relative_error(2.0, 2.1) == Approx(0.05));
  CHECK(relative_error(-2.0, -1.9) == Approx(0.05));
  CHECK(relative_error(0.0, 0.0) == 0.0);
  CHECK(std::isinf(relative_error(0.0, 1e-9)));
  const auto e = vlatune::reports::series_error({1, 2, 4}, {1, 2.2, 4.1});
  CHECK(e.max_relative == Approx(0.1));
  CHECK(e.argmax == 1);
  CHECK(e.mean_relative == Approx((0 + 0.1 + 0.025) / 3));
  CHECK_THROWS_AS(vlatune::reports::series_error({}, {}), std::invalid_argument);
}
