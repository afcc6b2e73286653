// `vlatune plan`: profile -> recipe, in a stated order (plan_steps.h: one function per step, each returning its
// decision and its rationale; the units of tuner/ they use in parentheses):
//   1. fit             (cost_model.h)     validate the profile, fit the batch, calibrate with the A/B rows; warn of
//                                         a noisy profile; price the planned optimizer state (--optimizer-state)
//   2. budget          --memory-budget, else the profiled GPU's memory minus 5% (a CPU profile: this machine's)
//   3. batch+recompute (batch_choice.h, recompute_solver.h)  exact least-time selection per batch, best samples/s
//   4. FP8             (fp8_selector.h)   measured ratio over the margin, outside the exclusions
//   5. groups          (grouping.h)       named units; with several GPUs, merged/split to hide the all-reduce
//   6. ranking         the prediction, the candidates (the plan's marked "chosen"; a faster one says which rule
//                      passed it over), the recipe: compact patterns, tuned_on, predicted
// Every decision appends a formats::Rationale with its numbers (keys carry units). The trade-off frontier is
// emitted as rationale entries whose numbers hold "predicted_step_ms", "predicted_peak_gib" and "micro_batch"
// (the report plots them; keep the names); the plan's own entries also hold "chosen": 1 (the report highlights it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "formats/recipe.h"
#include "tuner/cost_model.h"

namespace vlatune::tuner {

inline constexpr double kDefaultBudgetFraction = 0.95;  // of the profiled GPU's memory

struct PlanOptions {
  std::optional<double> memory_budget_gib;        // --memory-budget
  std::optional<int64_t> batch;                   // --batch B; unset = auto
  bool fp8_auto = false;                          // --fp8 auto (off by default: FP8 changes the numerics)
  std::vector<std::string> fp8_include;           // --fp8-include
  std::vector<std::string> fp8_exclude;           // --fp8-exclude
  double fp8_margin = 1.05;                       // --fp8-margin
  int world_size = 1;                             // --world-size
  std::optional<double> allreduce_gbps;           // --allreduce-gbps (else the profile's communication)
  std::vector<std::string> recompute_candidates;  // --recompute-candidate
  std::string profile_label;                      // tuned_on.profile
  int candidates = 1;                             // how many ranked candidates to return (--grid N)
  // This machine's main memory (GiB): the budget's base for a CPU profile, which records no device memory.
  std::optional<double> host_memory_gib;
  std::optional<formats::StateDtype> optimizer_state;  // --optimizer-state; unset: the profiled recipe's
};

struct RankedCandidate {
  formats::Recipe recipe;  // complete, with predicted and a short rationale
  Prediction prediction;
  std::string summary;  // one line: batch, recompute, FP8
};

struct PlanResult {
  formats::Recipe recipe;  // the plan
  Prediction predicted;
  Prediction baseline;  // the profiled recipe at the profiled batch, as the model sees it (= the measurement)
  int64_t baseline_batch = 0;
  double budget_gib = 0;
  std::vector<RankedCandidate> candidates;  // [0] = the plan, then the best distinct others by samples/s
  std::vector<std::string> warnings;        // also in the rationale; e.g. a noisy profile
};

// Throws formats::FormatError (bad profile: file + JSON path) or PlanInputError (bad flag: names it).
PlanResult plan(const formats::Profile& profile, const std::string& file, const PlanOptions& options);

// The --explain text: every decision with its figures, then predicted vs the profiled baseline.
std::string format_explain(const PlanResult& result);

}  // namespace vlatune::tuner
