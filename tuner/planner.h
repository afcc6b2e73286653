// `vlatune plan`: profile -> recipe, in a stated order (plan_steps.h: one function per step, each returning its
// decision and its rationale; the units of tuner/ they use in parentheses):
//   1. target          (gpus.h)           the GPU planned for: --gpu, else the profiled one. The memory budget
//                                         (--memory-budget, else that GPU's memory minus 5%; a CPU profile: this
//                                         machine's); FP8 only at compute capability >= 8.9; what transfers from the
//                                         profiled GPU (bytes) and what does not (time)
//   2. fit             (cost_model.h)     validate the profile, fit the batch, calibrate with the A/B rows; warn of
//                                         a noisy profile; price the planned optimizer state (--optimizer-state)
//                                         and what trains (freezing, LoRA: trainable_change.h)
//   3. batch+recompute (batch_choice.h, recompute_solver.h)  the global batch kept (--global-batch, else the
//                                         profiled recipe's): the micro-batches dividing it, each with the grad_accum
//                                         that makes it up; exact least-time recompute per micro-batch; most
//                                         samples/s. Steps 2-3 run again for each change --allow permits
//                                         (allowed_changes.h), taken when the plan without it does not fit or
//                                         predicts fewer samples/s; rationale[0] then says so
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
#include <set>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "formats/recipe.h"
#include "tuner/allowed_changes.h"
#include "tuner/cost_model.h"

namespace vlatune::tuner {

inline constexpr double kDefaultBudgetFraction = 0.95;  // of the GPU's memory

struct PlanOptions {
  std::optional<double> memory_budget_gib;        // --memory-budget
  std::optional<int64_t> batch;                   // --batch B (the micro-batch); unset = auto
  std::optional<int64_t> global_batch;            // --global-batch; unset: the profiled recipe's
  std::set<AllowedChange> allow;                  // --allow: what the plan may change about the training
  std::optional<std::string> gpu;                 // --gpu NAME (gpus.h): plan for that GPU's memory and features
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
  // What trains: set by the --allow freeze and --allow lora variants (plan_variants.h), not by a flag; empty: the
  // profiled recipe's freezing and LoRA.
  formats::Recipe::Freeze freeze;
  formats::Recipe::Lora lora;
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
  int64_t global_batch = 0;                 // of the plan: micro-batch x grad_accum x world size
  std::set<AllowedChange> used;             // the allowed changes the plan makes (rationale[0..] says which)
  std::optional<std::string> timed_on;      // set when the target GPU is not the profiled one: whose times these are
  std::vector<RankedCandidate> candidates;  // [0] = the plan, then the best distinct others by samples/s
  std::vector<std::string> warnings;        // also in the rationale; e.g. a noisy profile
};

// Throws formats::FormatError (bad profile: file + JSON path; an inference profile: $.settings.workload) or
// PlanInputError (bad flag: names it; nothing fits the budget: says which --allow choice would make it fit).
PlanResult plan(const formats::Profile& profile, const std::string& file, const PlanOptions& options);

// The --explain text: every decision with its figures, then predicted vs the profiled baseline.
std::string format_explain(const PlanResult& result);

}  // namespace vlatune::tuner
