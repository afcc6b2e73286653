#include "trainer/recipe_apply.h"

#include <algorithm>
#include <stdexcept>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"

namespace vlatune::trainer {

std::vector<std::string> module_fqns(const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) out.push_back(item.key());
  return out;
}

AppliedRecipe apply_recipe(const formats::Recipe& recipe, const std::string& file, model::Pi05Impl& model,
                           int world_size) {
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
  using Backend = formats::AttentionBackend;
  const Backend backend = recipe.model_options.attention_backend;
  out.forward.attention_backend = backend == Backend::kCudnn   ? kernels::AttentionBackend::kCudnn
                                  : backend == Backend::kFlash ? kernels::AttentionBackend::kFlash
                                  : backend == Backend::kSdpa  ? kernels::AttentionBackend::kSdpa
                                                               : kernels::AttentionBackend::kAuto;
  out.precision = formats::to_string(recipe.model_options.precision);

  // 3. Recompute: patterns -> FQNs (errors: no match, nesting) -> the model (errors: not recomputable). The names
  // are the modules plus the recomputable units that are not modules (a merged GEMM's output,
  // `...mlp.gate_proj+up_proj`: nested in its MLP, so selecting both is the usual nesting error).
  {
    std::vector<std::string> names = module_fqns(model);
    for (const std::string& unit : model.recomputable_fqns())
      if (std::find(names.begin(), names.end(), unit) == names.end()) names.push_back(unit);
    out.recompute = formats::resolve_patterns(recipe.recompute.modules, names, file, "$.recompute.modules");
  }
  try {
    model.set_recompute(out.recompute);
  } catch (const std::invalid_argument& e) {
    throw formats::FormatError(file, "$.recompute.modules", e.what());
  }

  // 4. FP8: patterns -> FQNs (errors: no match, nesting) -> the model (errors: not a Linear, shapes not % 16).
  {
    const auto fqns = formats::resolve_patterns(recipe.fp8.modules, module_fqns(model), file, "$.fp8.modules");
    model::Fp8Config config;
    config.scaling =
        recipe.fp8.scaling == formats::Fp8Scaling::kDelayed ? model::Fp8Scaling::kDelayed : model::Fp8Scaling::kCurrent;
    try {
      model.set_fp8(fqns, config);
    } catch (const std::invalid_argument& e) {
      throw formats::FormatError(file, "$.fp8.modules", e.what());
    }
    out.fp8 = model.fp8_selection();
    out.fp8_delayed = !out.fp8.empty() && config.scaling == model::Fp8Scaling::kDelayed;
  }

  // 5. Groups (gradient buckets; per-group CUDA-graph capture is not available) and distributed settings.
  const std::vector<std::string> fqns = module_fqns(model);
  for (size_t i = 0; i < recipe.groups.size(); ++i) {
    const formats::Recipe::Group& group = recipe.groups[i];
    const std::string path = "$.groups[" + std::to_string(i) + "]";
    if (group.cuda_graph)
      throw formats::FormatError(file, path + ".cuda_graph",
                                 "CUDA-graph capture of a single group is not available in this version of the "
                                 "trainer; use false, and \"model_options\": {\"cuda_graph\": \"step\"} to "
                                 "capture the whole step");
    AppliedRecipe::AppliedGroup applied{group.name,
                                        formats::resolve_patterns(group.modules, fqns, file, path + ".modules")};
    for (const std::string& fqn : applied.modules) {
      for (const AppliedRecipe::AppliedGroup& other : out.groups) {
        for (const std::string& taken : other.modules) {
          if (formats::fqn_within(fqn, taken) || formats::fqn_within(taken, fqn))
            throw formats::FormatError(file, path + ".modules",
                                       "module " + fqn + " overlaps " + taken + " of group '" + other.name +
                                           "': a module belongs to one group");
        }
      }
    }
    out.groups.push_back(std::move(applied));
  }
  if (recipe.distributed.world_size != 1 && recipe.distributed.world_size != world_size)
    throw formats::FormatError(
        file, "$.distributed.world_size",
        "the recipe is for " + std::to_string(recipe.distributed.world_size) + " processes but this run has " +
            std::to_string(world_size) + " (launch it with `vlatune launch --nproc " +
            std::to_string(recipe.distributed.world_size) + " -- train ...` or torchrun, or set world_size to " +
            std::to_string(world_size) + ")");
  out.cuda_graph_step = recipe.model_options.cuda_graph_step;
  out.world_size = world_size;
  out.reduce_dtype = formats::to_string(recipe.distributed.reduce_dtype);
  return out;
}

}  // namespace vlatune::trainer
