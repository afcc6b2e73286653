#include "trainer/recipe_apply.h"

#include <stdexcept>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"

namespace vlatune::trainer {

std::vector<std::string> module_fqns(const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) out.push_back(item.key());
  return out;
}

AppliedRecipe apply_recipe(const formats::Recipe& recipe, const std::string& file, model::Pi05Impl& model) {
  AppliedRecipe out;
  // 1. Data: exact shortcuts on the batch.
  out.num_images = recipe.data.num_images;
  out.forward.prune_slots = true;  // empty slots never reach the loss (exact); num_images only caps the slots
  out.forward.trim_text = recipe.data.trim_text;
  out.forward.trim_multiple = recipe.data.trim_multiple;

  // 2. Model options.
  out.forward.skip_dead = recipe.model_options.skip_dead;
  out.forward.attention = recipe.model_options.attention == formats::Attention::kMaterialized
                              ? model::Attention::kMaterialized
                              : model::Attention::kLean;
  out.precision = formats::to_string(recipe.model_options.precision);

  // 3. Recompute: patterns -> FQNs (errors: no match, nesting) -> the model (errors: not recomputable).
  out.recompute = formats::resolve_patterns(recipe.recompute.modules, module_fqns(model), file, "$.recompute.modules");
  try {
    model.set_recompute(out.recompute);
  } catch (const std::invalid_argument& e) {
    throw formats::FormatError(file, "$.recompute.modules", e.what());
  }

  // 4. Features that do not exist yet: refuse rather than silently ignore.
  if (!recipe.fp8.modules.empty())
    throw formats::FormatError(file, "$.fp8.modules",
                               "FP8 Linears are not available in this version of the trainer (they arrive with the "
                               "FP8 issue); leave the list empty");
  if (!recipe.groups.empty())
    throw formats::FormatError(file, "$.groups",
                               "execution/communication groups are not available in this version of the trainer; "
                               "leave the list empty (the default grouping)");
  if (recipe.distributed.world_size != 1)
    throw formats::FormatError(file, "$.distributed.world_size",
                               "multi-GPU training is not available in this version of the trainer; use 1");
  return out;
}

}  // namespace vlatune::trainer
