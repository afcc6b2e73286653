// The trainings a plan considers (allowed_changes.h): the stated one, and the stated one with each combination of
// changes --allow may permit, each planned through steps 2-3 (plan_steps.h). plan() takes the stated training unless
// an allowed variant fits where it does not or predicts more samples/s, and says so first in the rationale; when
// nothing allowed fits, the variants it did not allow tell the user which --allow would.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "formats/recipe.h"
#include "tuner/allowed_changes.h"
#include "tuner/plan_steps.h"
#include "tuner/planner.h"

namespace vlatune::tuner {

// One way to train: the stated one, or with changes applied. `uses` names them whether or not they are allowed.
struct Variant {
  std::set<AllowedChange> uses;
  PlanOptions options;
  int64_t global_batch = 0;  // kept; 0: any
  std::string state_source = "--optimizer-state";
  std::string trainable_source = "the profiled recipe";
  bool possible = true;  // false: --batch does not divide the kept global batch
};

// How much a variant changes what trains: 0 nothing, 1 freeze_vision_encoder, 2 train_expert_only, 3 LoRA, 4 and 5
// LoRA with those. plan() takes a variant that changes more only when none changing less (but something) fits.
int trainable_level(const Variant& v);

// The stated training first, then every combination of changes, fewer changes first. A change that changes nothing
// (8-bit state when the planned state is already 8-bit) is left out. `freeze` gives one variant per preset, the
// vision encoder first; a LoRA variant keeps FP8 off its adapted Linears (the trainer refuses LoRA on FP8), and a
// freezing one off the frozen modules (their GEMMs run without the gradients FP8 would speed up).
std::vector<Variant> training_variants(const formats::Profile& profile, const PlanOptions& options,
                                       const GlobalBatch& global);

// A variant planned through step 3. PlanInputs and the exposed-communication function refer to its members: it is
// built in place and never moved.
struct Planned {
  Planned(Variant v, const formats::Profile& profile, const std::string& file, const TargetStep& target,
          const CommSetup& comm)
      : variant(std::move(v)),
        in{profile,
           file,
           variant.options,
           variant.global_batch,
           target.fp8_unavailable,
           variant.state_source,
           variant.trainable_source},
        fit(fit_step(in)),
        base(base_recipe(in)),
        exposed(exposed_ms(comm, fit.priced, base)) {
    if (variant.possible) rc = recompute_step(in, fit, target.budget_gib, exposed);
  }
  Planned(const Planned&) = delete;
  Planned& operator=(const Planned&) = delete;

  double samples_per_s() const { return rc.feasible() ? rc.choice().prediction.samples_per_s : 0; }
  int64_t global_batch() const { return rc.choice().batch * rc.choice().grad_accum * variant.options.world_size; }

  Variant variant;
  PlanInputs in;
  FitStep fit;
  formats::Recipe base;
  ExposedMs exposed;
  RecomputeStep rc;
};

// The changes a planned variant really makes (any global batch may come out the stated one).
std::set<AllowedChange> changes_made(const Planned& planned, const GlobalBatch& global, const formats::Profile& profile,
                                     const PlanOptions& options);

// rationale[0..]: each allowed change `pick` makes and what it bought against the plan without it (`planned`: the
// allowed variants, the stated one first).
std::vector<formats::Rationale> allowed_change_rationale(const Planned& pick,
                                                         const std::vector<std::unique_ptr<Planned>>& planned,
                                                         const GlobalBatch& global, double budget_gib);

// The error when no allowed variant fits: the least any of them needs, and each least --allow set among `others`
// (the variants not allowed, planned here) that would fit, with its predicted peak.
std::string nothing_fits(const std::vector<std::unique_ptr<Planned>>& planned, std::vector<Variant>& others,
                         const formats::Profile& profile, const std::string& file, const TargetStep& target,
                         const CommSetup& comm);

}  // namespace vlatune::tuner
