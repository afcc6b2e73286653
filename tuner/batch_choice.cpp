#include "tuner/batch_choice.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace vlatune::tuner {

std::vector<BatchShape> candidate_batches(const CostModel& model, std::optional<int64_t> fixed, int grad_accum) {
  if (fixed) return {{*fixed, grad_accum}};
  std::set<int64_t> batches;
  for (const auto& b : model.profile.batches) batches.insert(b.batch);
  const int64_t top = model.profiled_batch;
  const int64_t step = std::max<int64_t>(1, top / 8);
  const auto limit = static_cast<int64_t>(kMaxBatchFactor * static_cast<double>(top));
  for (int64_t b = step; b <= limit; b += step) batches.insert(b);
  std::vector<BatchShape> out;
  for (int64_t b : batches) out.push_back({b, grad_accum});
  return out;
}

std::vector<BatchShape> dividing_batches(const CostModel& model, int64_t per_gpu, std::optional<int64_t> fixed) {
  const auto limit = static_cast<int64_t>(kMaxBatchFactor * static_cast<double>(model.profiled_batch));
  std::vector<BatchShape> out;
  for (int64_t b = 1; b <= std::min(per_gpu, fixed ? *fixed : limit); ++b)
    if (per_gpu % b == 0 && (!fixed || b == *fixed)) out.push_back({b, static_cast<int>(per_gpu / b)});
  return out;
}

std::vector<BatchOption> evaluate_batches(const CostModel& model, double budget_gib,
                                          const std::vector<BatchShape>& shapes, int world_size,
                                          const std::function<double(int64_t, const std::vector<int>&)>& comm_exposed) {
  std::vector<BatchOption> out;
  for (const BatchShape& shape : shapes) {
    const int64_t b = shape.micro_batch;
    BatchOption o;
    o.batch = b;
    o.grad_accum = shape.grad_accum;
    RecomputeProblem problem;
    o.at = recompute_problem(model, b, budget_gib, problem, shape.grad_accum);
    // The least memory this batch can take: every outermost candidate unit recomputed.
    std::vector<int> all_roots;
    for (size_t i = 0; i < problem.items.size(); ++i) {
      bool outermost = problem.items[i].allowed;  // a unit frozen out of the candidates holds nothing
      for (int a = problem.items[i].parent; outermost && a >= 0; a = problem.items[static_cast<size_t>(a)].parent)
        outermost = !problem.items[static_cast<size_t>(a)].allowed;
      if (outermost) all_roots.push_back(static_cast<int>(i));
    }
    o.min_peak_gib = o.at.other_gib + static_cast<double>(evaluate_recompute(problem, all_roots).peak_bytes) / kGiB;
    o.recompute = solve_recompute(problem);
    o.feasible = o.recompute.best.feasible;
    if (o.feasible) {
      Candidate c;
      c.micro_batch = b;
      c.recompute = o.recompute.best.chosen;
      c.comm_exposed_ms = comm_exposed ? comm_exposed(b, c.recompute) : 0.0;
      o.prediction = predict(model, c, shape.grad_accum, world_size);
    }
    out.push_back(std::move(o));
  }
  return out;
}

bool in_profiled_range(const CostModel& model, int64_t batch) {
  int64_t lo = 0, hi = 0;
  for (const auto& p : model.profile.batches) {
    lo = lo == 0 ? p.batch : std::min(lo, p.batch);
    hi = std::max(hi, p.batch);
  }
  return batch >= lo && batch <= hi;
}

int choose_batch(const CostModel& model, const std::vector<BatchOption>& options) {
  auto trusted = [&](int64_t b) { return in_profiled_range(model, b); };
  int best = -1, best_trusted = -1;
  for (int i = 0; i < static_cast<int>(options.size()); ++i) {
    const BatchOption& o = options[static_cast<size_t>(i)];
    if (!o.feasible) continue;
    // Within rounding of a tie, the larger micro-batch: fewer kernel launches per sample, which the linear fit does
    // not price.
    auto better = [&](int j) {
      if (j < 0) return true;
      const BatchOption& other = options[static_cast<size_t>(j)];
      const double tie = 1e-9 * other.prediction.samples_per_s;
      if (std::abs(o.prediction.samples_per_s - other.prediction.samples_per_s) <= tie) return o.batch > other.batch;
      return o.prediction.samples_per_s > other.prediction.samples_per_s;
    };
    if (better(best)) best = i;
    if (trusted(o.batch) && better(best_trusted)) best_trusted = i;
  }
  if (best < 0 || best_trusted < 0 || best == best_trusted) return best;
  const double gain = options[static_cast<size_t>(best)].prediction.samples_per_s /
                      options[static_cast<size_t>(best_trusted)].prediction.samples_per_s;
  return gain > kExtrapolationMargin ? best : best_trusted;
}

}  // namespace vlatune::tuner
