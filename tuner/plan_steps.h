// The steps of `vlatune plan` (planner.h lists them), each a function that returns its decision and the
// rationale entries that explain it. plan() runs them in order; nothing else calls them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "formats/recipe.h"
#include "tuner/batch_choice.h"
#include "tuner/cost_model.h"
#include "tuner/grouping.h"
#include "tuner/planner.h"

namespace vlatune::tuner {

// A step noise (MAD / median of the timed steps) above this is warned about: the FP8 margin is then raised past
// its default 1.05 (to twice the noise), and candidates closer than the noise cannot be told apart.
inline constexpr double kHighNoiseRel = 0.025;

struct PlanInputs {
  const formats::Profile& profile;
  const std::string& file;
  const PlanOptions& options;
};

// The optimizer state the plan prices and writes: --optimizer-state, else the profiled recipe's.
formats::StateDtype planned_state_dtype(const PlanInputs& in);

// The settings every candidate shares: the profiled recipe without its groups and rationale, for this world size
// and the planned optimizer state.
formats::Recipe base_recipe(const PlanInputs& in);

// 1. The cost model: fitted, calibrated, and (--fp8 auto) with the merged-GEMM units priced at their FP8 times.
struct FitStep {
  CostModel model;   // predictions: the profiled prices
  CostModel priced;  // what the recompute solver and the batch choice see
  std::vector<std::string> warnings;
  std::vector<formats::Rationale> why;
};
FitStep fit_step(const PlanInputs& in);

// 2. The memory budget.
struct BudgetStep {
  double budget_gib = 0;
  std::vector<formats::Rationale> why;
};
BudgetStep budget_step(const PlanInputs& in);

// Communication (several GPUs): what the batch choice and the groups price the all-reduce with.
struct CommSetup {
  bool on = false;
  CommOptions options;
  std::string source;                                 // where the bandwidth came from
  std::map<std::string, double> measured_unit_bytes;  // per named unit, when measured at this world size
};
CommSetup comm_setup(const PlanInputs& in);
// Exposed communication (ms) of a micro-batch and recompute selection: 0 on one GPU.
using ExposedMs = std::function<double(int64_t batch, const std::vector<int>& recompute)>;
ExposedMs exposed_ms(const CommSetup& comm, const CostModel& priced, const formats::Recipe& base);

// 3. The micro-batch and its recompute set, jointly.
struct RecomputeStep {
  std::vector<BatchOption> options;  // every candidate batch
  size_t chosen = 0;                 // index into options
  std::vector<formats::Rationale> why;
  const BatchOption& choice() const { return options[chosen]; }
};
RecomputeStep recompute_step(const PlanInputs& in, const FitStep& fit, double budget_gib, const ExposedMs& exposed,
                             int grad_accum);

// 4. The FP8 GEMM set at the chosen batch and recompute set (empty without --fp8 auto).
struct Fp8Step {
  std::vector<int> gemms;  // indices into profile.gemms
  std::vector<formats::Rationale> why;
};
Fp8Step fp8_step(const PlanInputs& in, const CostModel& model, int64_t batch, const std::vector<int>& recompute);
// The GEMMs --fp8 auto selects at a micro-batch and recompute set (the rule of step 4, no rationale).
std::vector<int> fp8_selection(const PlanInputs& in, const CostModel& model, int64_t batch,
                               const std::vector<int>& recompute);

// 5. The gradient groups (named units on one GPU).
struct GroupsStep {
  std::vector<formats::Recipe::Group> groups;  // empty: the named units
  double exposed_ms = 0;
  std::vector<formats::Rationale> why;
};
GroupsStep groups_step(const PlanInputs& in, const CostModel& priced, const CommSetup& comm,
                       const formats::Recipe& base, int64_t batch, const std::vector<int>& recompute);

}  // namespace vlatune::tuner
