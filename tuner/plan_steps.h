// The steps of `vlatune plan` (planner.h lists them), each a function that returns its decision and the
// rationale entries that explain it. plan() runs them in order; nothing else calls them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "formats/recipe.h"
#include "tuner/batch_choice.h"
#include "tuner/cost_model.h"
#include "tuner/gpus.h"
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
  // The global batch the candidates keep (samples per optimizer step over all GPUs); 0: any, at the profiled
  // recipe's grad_accum (--allow global-batch).
  int64_t global_batch = 0;
  // Why the target GPU cannot run FP8 ("" when it can): --fp8 auto then selects nothing.
  std::string fp8_unavailable;
  // What set the planned optimizer state, for the rationale.
  std::string state_source = "--optimizer-state";
  // What set the planned freezing and LoRA (options.freeze, options.lora), for the rationale and errors.
  std::string trainable_source = "the profiled recipe";
};

// The plan freezes or uses LoRA (options.freeze, options.lora set): priced against the profiled recipe.
bool trainable_planned(const PlanInputs& in);

// --fp8 auto on a GPU that has FP8.
bool fp8_planned(const PlanInputs& in);

// The optimizer state the plan prices and writes: --optimizer-state, else the profiled recipe's.
formats::StateDtype planned_state_dtype(const PlanInputs& in);

// The settings every candidate shares: the profiled recipe without its groups and rationale, for this world size
// and the planned optimizer state.
formats::Recipe base_recipe(const PlanInputs& in);

// 1. The GPU planned for (--gpu, else the profiled one) and the memory budget.
struct TargetStep {
  double budget_gib = 0;
  std::optional<GpuSpec> gpu;                            // --gpu
  std::optional<formats::ComputeCapability> capability;  // of the target, when known
  std::string fp8_unavailable;                           // see PlanInputs
  std::optional<std::string> timed_on;                   // the profiled GPU, when the target is another one
  std::vector<formats::Rationale> why;
};
TargetStep target_step(const formats::Profile& profile, const PlanOptions& options);

// The global batch the plan keeps unless --allow global-batch: --global-batch, else the profiled recipe's
// (micro-batch x grad_accum x the processes that ran it). `strict` (the global batch must be kept): throws
// PlanInputError when --world-size does not divide it or --batch does not divide its share per GPU, naming both.
struct GlobalBatch {
  int64_t samples = 0;
  std::string source;  // "--global-batch" or how the profiled recipe makes it up
};
GlobalBatch stated_global_batch(const formats::Profile& profile, const PlanOptions& options, bool strict);

// 2. The cost model: fitted, calibrated, and (--fp8 auto) with the merged-GEMM units priced at their FP8 times.
struct FitStep {
  CostModel model;   // predictions: the profiled prices
  CostModel priced;  // what the recompute solver and the batch choice see
  std::vector<std::string> warnings;
  std::vector<formats::Rationale> why;
};
FitStep fit_step(const PlanInputs& in);

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

// 3. The micro-batch (with the grad_accum that keeps the global batch) and its recompute set, jointly.
struct RecomputeStep {
  std::vector<BatchOption> options;  // every candidate micro-batch
  int chosen = -1;                   // index into options; -1: nothing fits the budget
  std::vector<formats::Rationale> why;
  bool feasible() const { return chosen >= 0; }
  const BatchOption& choice() const { return options[static_cast<size_t>(chosen)]; }
  // The least predicted peak of any candidate, recomputing everything that may be (infinity without candidates).
  double min_peak_gib() const;
};
RecomputeStep recompute_step(const PlanInputs& in, const FitStep& fit, double budget_gib, const ExposedMs& exposed);
// Why an infeasible step fits nothing: the budget against the least any candidate needs.
std::string does_not_fit(const RecomputeStep& step, double budget_gib);
// "micro-batch 8 x grad_accum 4" (or "micro-batch 8" without accumulation).
std::string batch_shape(int64_t micro_batch, int grad_accum);

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
