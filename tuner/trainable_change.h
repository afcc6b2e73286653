// Freezing and LoRA (recipe `freeze`, `lora`) priced from profile.json alone, against the profiled recipe, which
// trains every parameter (tuner/README.md lists the assumptions):
//   - memory that does not scale with the batch: a frozen parameter keeps its bytes but has no gradient and no AdamW
//     moments (sized from the outermost frozen module rows' parameter_bytes); a LoRA'd GEMM of the inventory adds
//     rank x (members x k + n) adapter elements, with their gradients and moments;
//   - time: a module whose backward no longer runs (layout::backward_free_modules) drops its rows' backward_ms, less
//     what runs inside its scope and still trains; another frozen GEMM drops its weight gradient (and, inside such a
//     scope, its input gradient) at the profiled precision, scaled with the batch; LoRA adapters add an estimate; the
//     "<optimizer>" row scales with the trainable elements;
//   - activations: the rows whose backward no longer runs hold nothing, and their recompute units leave the
//     candidates. LoRA keeps the activations (the inputs still need gradients).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "formats/profile.h"
#include "formats/recipe.h"
#include "tuner/cost_model.h"

namespace vlatune::tuner {

// The selection a recipe's freeze and lora keys make, resolved against the profile as trainer/recipe_apply resolves
// them against the model: frozen modules (presets, patterns over the module rows, the LoRA preset's freezing) and
// the LoRA'd Linears with their rank (the preset's targets, then the recipe's, matched against the GEMM inventory's
// members). `flag` labels errors (e.g. "--allow lora").
TrainableSelection resolve_trainable(const formats::Profile& profile, const formats::Recipe::Freeze& freeze,
                                     const formats::Recipe::Lora& lora, const std::string& flag);

// One LoRA'd GEMM of the inventory: its adapters' elements and estimated time per step at the profiled batch.
struct AdapterCost {
  int gemm = 0;  // index into profile.gemms
  int64_t rank = 0;
  double numel = 0;  // rank x (members x k + n)
  double ms = 0;     // estimate (tuner/README.md)
};
std::vector<AdapterCost> adapter_costs(const formats::Profile& profile, const TrainableSelection& selection,
                                       const std::string& flag);

// Prices `selection` into model.trainable for the planned optimizer state held as 1/`shards` per GPU. Throws
// PlanInputError (naming `flag`) when the profile has no parameter bytes, when a frozen module or a LoRA target has
// nothing in the profile to size it from, or when a merged GEMM is only partly LoRA'd.
void plan_trainable(CostModel& model, const TrainableSelection& selection, formats::StateDtype state_dtype, int shards,
                    const std::string& flag);

// One line on what the change frees and costs, for the rationale and --explain.
std::string describe_trainable(const CostModel& model, double batch);

}  // namespace vlatune::tuner
