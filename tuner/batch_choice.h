// The micro-batch, chosen jointly with the recompute set (anchors §3.8.3: freed memory buys a larger batch):
// for every candidate batch, the least-time recompute set under the budget (recompute_solver.h), then the batch
// with the most predicted samples/s. A global batch to keep (the default) makes the candidates the micro-batches
// that divide its share per GPU, each with the grad_accum that makes it up. A batch outside the profiled range is
// extrapolated, so it must beat the best batch inside that range (profiled or interpolated) by a margin before it is
// chosen.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tuner/cost_model.h"
#include "tuner/recompute_solver.h"

namespace vlatune::tuner {

// Extrapolated batches must win by this factor over the best batch in the profiled range (a linear fit two points
// wide).
inline constexpr double kExtrapolationMargin = 1.02;
// Extrapolate up to this multiple of the largest profiled batch.
inline constexpr double kMaxBatchFactor = 2.0;

// A micro-batch and the gradient accumulation it runs with.
struct BatchShape {
  int64_t micro_batch = 0;
  int grad_accum = 1;
};

struct BatchOption {
  int64_t batch = 0;  // the micro-batch
  int grad_accum = 1;
  bool feasible = false;
  RecomputeAtBatch at;
  RecomputeFrontier recompute;  // recompute.best: the least-time selection under the budget
  Prediction prediction;        // of recompute.best (no FP8 change, default groups' exposed communication)
  double min_peak_gib = 0;      // recomputing everything that may be: the least this batch can take
};

// Any global batch: `fixed` (--batch), otherwise the profiled batches and multiples of max(1, batch/8) up to
// kMaxBatchFactor x, each with `grad_accum`.
std::vector<BatchShape> candidate_batches(const CostModel& model, std::optional<int64_t> fixed, int grad_accum);

// A global batch of `per_gpu` samples per GPU and optimizer step: the micro-batches that divide it, up to
// kMaxBatchFactor x the largest profiled batch (`fixed`: --batch alone, which must divide it), each with
// grad_accum = per_gpu / micro-batch.
std::vector<BatchShape> dividing_batches(const CostModel& model, int64_t per_gpu, std::optional<int64_t> fixed);

// comm_exposed(batch, recompute selection): exposed communication ms (0 on one GPU).
std::vector<BatchOption> evaluate_batches(const CostModel& model, double budget_gib,
                                          const std::vector<BatchShape>& shapes, int world_size,
                                          const std::function<double(int64_t, const std::vector<int>&)>& comm_exposed);

// Profiled batches and those between them (the linear fit interpolates there: measured within 2.5% on the H200,
// bench/RESULTS.md) are trusted; batches outside the profiled range are extrapolated.
bool in_profiled_range(const CostModel& model, int64_t batch);

// The index of the chosen option, or -1 when none is feasible: the most predicted samples/s (the larger batch of a
// tie), except that an extrapolated batch must beat the best trusted one by kExtrapolationMargin.
int choose_batch(const CostModel& model, const std::vector<BatchOption>& options);

}  // namespace vlatune::tuner
