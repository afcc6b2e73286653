#include "trainer/recipe_apply.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"
#include "layout/pi05.h"
#include "trainer/train_loop.h"

namespace vlatune::trainer {

std::vector<std::string> module_fqns(const torch::nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) out.push_back(item.key());
  return out;
}

namespace {
int64_t override_size(const char* flag, int64_t value) {
  if (value < 1 || value > (int64_t{1} << 20))
    throw TrainInputError(std::string(flag) + ": expected an integer in 1..1048576, got " + std::to_string(value));
  return value;
}

std::string override_choice(const char* flag, const std::string& value, const char* a, const char* b) {
  if (value != a && value != b)
    throw TrainInputError(std::string(flag) + ": expected " + a + " or " + b + ", got '" + value + "'");
  return value;
}

// Presets and patterns -> module FQNs, in module order; nesting is allowed across presets and patterns (freezing
// a module twice is freezing it).
std::vector<std::string> resolve_freeze(const formats::Recipe& recipe, const std::string& file,
                                        const std::vector<std::string>& fqns) {
  std::vector<std::string> roots;
  for (size_t i = 0; i < recipe.freeze.presets.size(); ++i)
    for (const std::string& m : layout::freeze_preset_modules(recipe.freeze.presets[i])) {
      if (std::find(fqns.begin(), fqns.end(), m) == fqns.end())
        throw formats::FormatError(file, "$.freeze.presets[" + std::to_string(i) + "]",
                                   "preset \"" + std::string(formats::to_string(recipe.freeze.presets[i])) +
                                       "\" names module " + m + ", which this model does not have");
      roots.push_back(m);
    }
  if (recipe.lora.preset)
    for (const std::string& m : layout::lora_preset(*recipe.lora.preset).frozen) roots.push_back(m);
  for (const std::string& m : formats::resolve_patterns(recipe.freeze.modules, fqns, file, "$.freeze.modules"))
    roots.push_back(m);
  std::vector<std::string> out;
  for (const std::string& fqn : fqns)
    if (std::find(roots.begin(), roots.end(), fqn) != roots.end()) out.push_back(fqn);
  return out;
}

void apply_freeze_and_lora(const formats::Recipe& recipe, const std::string& file, model::Pi05Impl& model,
                           const std::vector<std::string>& fqns, uint64_t seed, AppliedRecipe& out) {
  out.frozen = resolve_freeze(recipe, file, fqns);
  model::freeze_modules(model, out.frozen);

  // The preset's targets first, then the recipe's: (patterns, rank, alpha, JSON path).
  struct Target {
    std::vector<std::string> modules;
    int rank;
    double alpha;
    std::string path;
  };
  std::vector<Target> targets;
  if (recipe.lora.preset)
    for (const auto& t : layout::lora_preset(*recipe.lora.preset).targets)
      targets.push_back({t.modules, t.rank, t.alpha, "$.lora.preset"});
  for (size_t i = 0; i < recipe.lora.targets.size(); ++i) {
    const auto& t = recipe.lora.targets[i];
    targets.push_back({t.modules, t.rank, t.alpha, "$.lora.targets[" + std::to_string(i) + "]"});
  }
  std::map<std::string, const model::LinearImpl*> linears;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false))
    if (const auto* l = dynamic_cast<const model::LinearImpl*>(item.value().get())) linears.emplace(item.key(), l);
  std::map<std::string, std::string> taken;  // Linear -> the path of the target that took it
  std::vector<model::LoraSpec> specs;
  for (const Target& t : targets) {
    const std::string modules_path = t.path == "$.lora.preset" ? t.path : t.path + ".modules";
    for (const std::string& fqn : formats::resolve_patterns(t.modules, fqns, file, modules_path)) {
      auto it = linears.find(fqn);
      if (it == linears.end())
        throw formats::FormatError(file, modules_path, "module " + fqn + " is not a Linear (LoRA adapts Linears)");
      const model::LinearImpl& l = *it->second;
      const int64_t out_features = l.weight.size(0), in_features = l.weight.size(1);
      if (t.rank > std::min(in_features, out_features))
        throw formats::FormatError(file, t.path == "$.lora.preset" ? t.path : t.path + ".rank",
                                   "rank " + std::to_string(t.rank) + " exceeds the smaller dimension of " + fqn +
                                       " [" + std::to_string(out_features) + ", " + std::to_string(in_features) +
                                       "]: at most " + std::to_string(std::min(in_features, out_features)));
      if (l.fp8)
        throw formats::FormatError(file, modules_path,
                                   fqn +
                                       " runs in FP8 ($.fp8.modules): LoRA adapters on FP8 Linears are not "
                                       "supported; remove it from $.fp8.modules or from the LoRA targets");
      const auto [prev, fresh] = taken.emplace(fqn, t.path);
      if (!fresh)
        throw formats::FormatError(file, modules_path,
                                   fqn + " already has an adapter from " + prev->second + ": one adapter per Linear");
      specs.push_back({fqn, t.rank, t.alpha});
    }
  }
  std::sort(specs.begin(), specs.end(), [&fqns](const model::LoraSpec& a, const model::LoraSpec& b) {
    return std::find(fqns.begin(), fqns.end(), a.module) < std::find(fqns.begin(), fqns.end(), b.module);
  });
  model::add_lora(model, specs, seed);
  out.lora = std::move(specs);
}

}  // namespace

AppliedRecipe apply_recipe(const formats::Recipe& recipe, const std::string& file, const RecipeContext& context,
                           const ModelBuilder& build_model) {
  AppliedRecipe out;
  formats::Recipe& effective = out.effective;
  effective = recipe;
  const RecipeOverrides& flags = context.overrides;

  // 1. Batch.
  if (flags.micro_batch) effective.batch.micro_batch = static_cast<int>(override_size("--batch", *flags.micro_batch));
  if (flags.grad_accum) effective.batch.grad_accum = static_cast<int>(override_size("--grad-accum", *flags.grad_accum));
  out.micro_batch = effective.batch.micro_batch;
  out.grad_accum = effective.batch.grad_accum;

  // 2. Data: exact shortcuts on the batch.
  out.num_images = effective.data.num_images;
  out.forward.prune_slots = true;  // empty slots never reach the loss (exact); num_images only caps the slots
  out.forward.trim_text = effective.data.trim_text;
  out.forward.trim_multiple = effective.data.trim_multiple;

  // 3. Model options. Parameters in bf16 on the GPU ("bf16": parameters and AdamW state in bf16) or fp32
  // ("fp32-master" on the GPU: fp32 master weights in the optimizer, bf16 compute; the CPU computes in fp32).
  out.forward.skip_dead = effective.model_options.skip_dead;
  out.forward.skip_padded_rows = effective.model_options.skip_dead;
  out.forward.attention = effective.model_options.attention == formats::Attention::kMaterialized
                              ? model::Attention::kMaterialized
                              : model::Attention::kLean;
  using Backend = formats::AttentionBackend;
  const Backend backend = effective.model_options.attention_backend;
  out.forward.attention_backend = backend == Backend::kCudnn   ? kernels::AttentionBackend::kCudnn
                                  : backend == Backend::kFlash ? kernels::AttentionBackend::kFlash
                                  : backend == Backend::kSdpa  ? kernels::AttentionBackend::kSdpa
                                                               : kernels::AttentionBackend::kAuto;
  if (flags.precision)
    effective.model_options.precision =
        override_choice("--precision", *flags.precision, "bf16", "fp32-master") == "bf16"
            ? formats::Precision::kBf16
            : formats::Precision::kFp32Master;
  out.precision = formats::to_string(effective.model_options.precision);
  out.optimizer_precision = parse_optimizer_precision(out.precision);
  const bool bf16 = out.optimizer_precision == OptimizerPrecision::kBf16;
  out.parameter_dtype = context.cuda && bf16 ? torch::kBFloat16 : torch::kFloat32;
  if (context.cuda && !bf16) out.forward.compute_dtype = torch::kBFloat16;
  out.state_dtype = effective.optimizer.state_dtype == formats::StateDtype::kInt8Blockwise
                        ? OptimizerStateDtype::kInt8Blockwise
                        : OptimizerStateDtype::kAuto;
  if (flags.cuda_graph)
    effective.model_options.cuda_graph_step =
        override_choice("--cuda-graph", *flags.cuda_graph, "off", "step") == "step";
  out.cuda_graph_step = effective.model_options.cuda_graph_step;
  out.cuda_graph_source =
      flags.cuda_graph ? std::string("--cuda-graph step") : file + ": $.model_options.cuda_graph \"step\"";
  model::Pi05Impl& model = build_model(out.parameter_dtype);

  // 4. Recompute: patterns -> FQNs (errors: no match, nesting) -> the model (errors: not recomputable). The names
  // are the modules plus the recomputable units that are not modules (a merged GEMM's output,
  // `...mlp.gate_proj+up_proj`: nested in its MLP, so selecting both is the usual nesting error).
  {
    std::vector<std::string> names = module_fqns(model);
    for (const std::string& unit : model.recomputable_fqns())
      if (std::find(names.begin(), names.end(), unit) == names.end()) names.push_back(unit);
    out.recompute = formats::resolve_patterns(effective.recompute.modules, names, file, "$.recompute.modules");
  }
  try {
    model.set_recompute(out.recompute);
  } catch (const std::invalid_argument& e) {
    throw formats::FormatError(file, "$.recompute.modules", e.what());
  }

  // 5. FP8: patterns -> FQNs (errors: no match, nesting) -> the model (errors: not a Linear, shapes not % 16).
  {
    const auto fqns = formats::resolve_patterns(effective.fp8.modules, module_fqns(model), file, "$.fp8.modules");
    model::Fp8Config config;
    config.scaling = effective.fp8.scaling == formats::Fp8Scaling::kDelayed ? model::Fp8Scaling::kDelayed
                                                                            : model::Fp8Scaling::kCurrent;
    config.saved_geglu_blocks = effective.fp8.saved_geglu_inputs == formats::SavedGegluInputs::kE4m3Blocks;
    config.gemm_algorithm = effective.fp8.gemm_algorithm == formats::Fp8GemmAlgorithm::kTimed
                                ? kernels::Fp8GemmAlgorithm::kTimed
                                : kernels::Fp8GemmAlgorithm::kHeuristic;
    try {
      model.set_fp8(fqns, config);
    } catch (const std::invalid_argument& e) {
      throw formats::FormatError(file, "$.fp8.modules", e.what());
    }
    if (config.saved_geglu_blocks &&
        std::none_of(fqns.begin(), fqns.end(), [](const std::string& f) { return layout::geglu_down_projection(f); }))
      throw formats::FormatError(file, "$.fp8.saved_geglu_inputs",
                                 "\"e4m3-blocks\" keeps the input of an FP8 GeGLU down projection (a decoder "
                                 "layer's mlp.down_proj), and $.fp8.modules selects none");
    out.fp8 = model.fp8_selection();
    out.fp8_delayed = !out.fp8.empty() && config.scaling == model::Fp8Scaling::kDelayed;
  }

  // 6. Freezing, 7. LoRA (trainer's part: resolution and checks with JSON paths; model/lora.h does the rest).
  const std::vector<std::string> fqns = module_fqns(model);
  apply_freeze_and_lora(effective, file, model, fqns, context.seed, out);

  // 8. Groups (gradient buckets; per-group CUDA-graph capture is not available) and distributed settings.
  for (size_t i = 0; i < effective.groups.size(); ++i) {
    const formats::Recipe::Group& group = effective.groups[i];
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
  const int planned_world = effective.distributed.world_size;
  if (planned_world != 1 && planned_world != context.world_size)
    throw formats::FormatError(file, "$.distributed.world_size",
                               "the recipe is for " + std::to_string(planned_world) + " processes but this run has " +
                                   std::to_string(context.world_size) + " (launch it with `vlatune launch --nproc " +
                                   std::to_string(planned_world) + " -- train ...` or torchrun, or set world_size to " +
                                   std::to_string(context.world_size) + ")");
  if (flags.reduce_dtype)
    effective.distributed.reduce_dtype =
        override_choice("--reduce-dtype", *flags.reduce_dtype, "bf16", "fp32") == "fp32" ? formats::ReduceDtype::kFp32
                                                                                         : formats::ReduceDtype::kBf16;
  out.world_size = context.world_size;
  out.reduce_dtype = formats::to_string(effective.distributed.reduce_dtype);
  // One process holds the whole state whatever the key says: the recipe is kept as written (a plan for N GPUs
  // rehearsed on one), and the key takes effect under a launch of several processes.
  out.shard_optimizer_state = effective.distributed.shard_optimizer_state && context.world_size > 1;
  // A plan's prediction holds for the recipe it planned: an override makes another recipe.
  if (formats::recipe_hash(effective) != formats::recipe_hash(recipe)) effective.predicted = {};
  return out;
}

AppliedRecipe apply_recipe(const formats::Recipe& recipe, const std::string& file, model::Pi05Impl& model,
                           const RecipeContext& context) {
  return apply_recipe(recipe, file, context, [&model](torch::Dtype) -> model::Pi05Impl& { return model; });
}

}  // namespace vlatune::trainer
