// Recompute solver: the DP is exact (same least cost as brute force over every non-nested selection on random
// small forests), its answers are feasible, and the memory model gives the documented figures.
#include <catch2/catch.hpp>

#include <random>
#include <stdexcept>
#include <vector>

#include "tuner/recompute_solver.h"

using namespace vlatune::tuner;

namespace {

// Brute force: every subset, filtered by evaluate_recompute's validity and the budget.
RecomputeSolution brute_force(const RecomputeProblem& p) {
  RecomputeSolution best;
  const int n = static_cast<int>(p.items.size());
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    std::vector<int> chosen;
    for (int i = 0; i < n; ++i)
      if (mask & (1u << i)) chosen.push_back(i);
    const RecomputeEvaluation e = evaluate_recompute(p, chosen);
    if (!e.valid || e.peak_bytes > p.budget_bytes) continue;
    if (!best.feasible || e.cost_ms < best.cost_ms - 1e-9) {
      best.feasible = true;
      best.chosen = chosen;
      best.cost_ms = e.cost_ms;
      best.peak_bytes = e.peak_bytes;
    }
  }
  return best;
}

RecomputeProblem random_problem(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int> act(1, 60), cost(0, 50), coin(0, 9);
  RecomputeProblem p;
  for (int i = 0; i < n; ++i) {
    RecomputeItem item;
    // A random forest: the parent is any earlier item or none.
    item.parent = i == 0 ? -1 : std::uniform_int_distribution<int>(-1, i - 1)(rng);
    item.act_bytes = act(rng);
    item.out_bytes = std::uniform_int_distribution<int64_t>(0, item.act_bytes)(rng);
    item.cost_ms = cost(rng) / 4.0;
    item.allowed = coin(rng) != 0;
    item.forced = coin(rng) == 0 && item.allowed;
    p.items.push_back(item);
  }
  // Parents at least as large as their children (inclusive sizes), as in a profile.
  for (int i = n - 1; i >= 0; --i) {
    const int parent = p.items[static_cast<size_t>(i)].parent;
    if (parent >= 0) p.items[static_cast<size_t>(parent)].act_bytes += p.items[static_cast<size_t>(i)].act_bytes / 2;
  }
  int64_t total = 0;
  for (const auto& item : p.items) total += item.act_bytes;
  p.budget_bytes = std::uniform_int_distribution<int64_t>(0, total)(rng);
  return p;
}

}  // namespace

TEST_CASE("the recompute DP finds the brute-force optimum on random small forests", "[tuner][recompute]") {
  std::mt19937 rng(20261130);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + trial % 11;
    const RecomputeProblem p = random_problem(rng, n);
    const RecomputeSolution want = brute_force(p);
    const RecomputeFrontier got = solve_recompute(p);
    INFO("trial " << trial << ", " << n << " items, budget " << p.budget_bytes);
    REQUIRE(got.best.feasible == want.feasible);
    if (!want.feasible) {
      ++infeasible;
      continue;
    }
    ++feasible;
    CHECK(got.best.cost_ms == Approx(want.cost_ms).margin(1e-9));
    const RecomputeEvaluation e = evaluate_recompute(p, got.best.chosen);
    CHECK(e.valid);
    CHECK(e.peak_bytes <= p.budget_bytes);
    CHECK(e.cost_ms == Approx(got.best.cost_ms));
  }
  // Both outcomes occur, so neither branch passes vacuously.
  CHECK(feasible > 100);
  CHECK(infeasible > 10);
}

TEST_CASE("the recompute frontier trades peak for time and every point is feasible", "[tuner][recompute]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const RecomputeProblem p = random_problem(rng, 10);
    const RecomputeFrontier f = solve_recompute(p);
    for (size_t i = 0; i < f.frontier.size(); ++i) {
      const RecomputeEvaluation e = evaluate_recompute(p, f.frontier[i].chosen);
      REQUIRE(e.valid);
      CHECK(e.peak_bytes <= p.budget_bytes);
      if (i > 0) {
        CHECK(f.frontier[i].peak_bytes > f.frontier[i - 1].peak_bytes);
        CHECK(f.frontier[i].cost_ms < f.frontier[i - 1].cost_ms);
      }
    }
  }
}

TEST_CASE("with a coarse quantum the answer stays feasible in exact bytes and never beats the exact optimum",
          "[tuner][recompute]") {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 200; ++trial) {
    RecomputeProblem p = random_problem(rng, 8);
    const RecomputeSolution exact = brute_force(p);
    p.quantum_bytes = 7;
    const RecomputeFrontier coarse = solve_recompute(p);
    if (!coarse.best.feasible) continue;
    REQUIRE(exact.feasible);
    CHECK(evaluate_recompute(p, coarse.best.chosen).peak_bytes <= p.budget_bytes);
    CHECK(coarse.best.cost_ms >= exact.cost_ms - 1e-9);
  }
}

TEST_CASE("the memory model counts kept bytes and the recomputation bump", "[tuner][recompute]") {
  // Three layers in forward order, each holding 10 (output 2); a parent "tower" of the first two holding 25
  // (5 of its own beyond its children).
  RecomputeProblem p;
  p.items = {{-1, 25, 2, 3.0}, {0, 10, 2, 1.0}, {0, 10, 2, 1.0}, {-1, 10, 2, 1.0}};
  p.budget_bytes = 1000;
  CHECK(evaluate_recompute(p, {}).peak_bytes == 35);  // 10 + 10 + 5 own + 10
  // Recompute the last layer: kept 25 + 2 = 27; its backward brings 10 back on top of the 25 before it.
  CHECK(evaluate_recompute(p, {3}).peak_bytes == 35);
  // Recompute the first layer: kept 2 + 10 + 5 + 10 = 27; its bump (nothing before it) is 10.
  CHECK(evaluate_recompute(p, {1}).peak_bytes == 27);
  // The tower as a whole: 2 + 10 kept, bump 25.
  CHECK(evaluate_recompute(p, {0}).peak_bytes == 25);
  CHECK(evaluate_recompute(p, {0}).cost_ms == 3.0);
  // Nested selections are invalid.
  CHECK_FALSE(evaluate_recompute(p, {0, 1}).valid);
  // Within 26: the two inner layers (kept 2 + 2 + 5 + 10 = 19, bumps 10 and 12) cost 2 ms, less than the
  // tower's 3 ms (peak 25); within 18 nothing fits (the least is 19).
  p.budget_bytes = 26;
  const RecomputeFrontier f = solve_recompute(p);
  REQUIRE(f.best.feasible);
  CHECK(f.best.chosen == std::vector<int>{1, 2});
  CHECK(f.best.cost_ms == 2.0);
  CHECK(f.best.peak_bytes == 19);
  p.budget_bytes = 18;
  CHECK_FALSE(solve_recompute(p).best.feasible);
}

TEST_CASE("a malformed recompute problem is refused", "[tuner][recompute]") {
  RecomputeProblem p;
  p.items = {{1, 10, 1, 1.0}, {-1, 10, 1, 1.0}};
  CHECK_THROWS_AS(solve_recompute(p), std::invalid_argument);
  p.items = {{-1, 10, 1, 1.0}};
  p.quantum_bytes = 0;
  CHECK_THROWS_AS(solve_recompute(p), std::invalid_argument);
}
