// apply_recipe(): a recipe.json, with the command line's overrides written into it, turned into the trainer's
// settings. It owns every key and applies them in this order:
//   1. batch       (micro_batch, grad_accum; --batch, --grad-accum)                  -> micro-batches per step
//   2. data        (num_images, trim_text, trim_multiple: slot pruning, text trimming) -> slots, ForwardOptions
//   3. model       (skip_dead, attention, precision, cuda_graph; --precision, --cuda-graph)
//      optimizer   (state_dtype)
//                  -> ForwardOptions, the parameters' and the optimizer's precision, the AdamW moments' storage,
//                  whole-step capture;
//                  then the model is built (its parameters' dtype is known now)
//   4. recompute   (FQN patterns resolved against the model)                         -> Pi05Impl::set_recompute
//   5. fp8         (FQN patterns of Linears resolved against the model; scaling)     -> Pi05Impl::set_fp8
//   6. freeze      (presets -> their modules (layout/pi05.h), FQN patterns resolved)     -> model::freeze_modules
//   7. lora        (the preset's targets and freezing, then the recipe's targets: patterns of Linears resolved;
//                  a Linear in two targets, an FP8 Linear, a rank above the Linear's smaller dimension refused)
//                  -> model::add_lora (after freezing: the adapters of a frozen tower train)
//                  Both before the optimizer is built and the step graph captured (build_training_parts), so
//                  frozen parameters never get gradients, optimizer state or gradient buckets.
//   8. groups      (FQN patterns resolved; a module in two groups is refused; per-group cuda_graph refused)
//      distributed (world_size must be 1 = unspecified, or the run's; reduce_dtype; --reduce-dtype;
//                  shard_optimizer_state, which one process ignores)
//                  -> gradient buckets
// The overrides are written into AppliedRecipe::effective, the recipe the run records (RUNDIR/recipe.json, the
// recipe_hash of run.json): a run with --precision fp32-master over a bf16 recipe is recorded as fp32-master.
// Every refusal names the recipe file and the JSON path, or the flag.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "formats/recipe.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/pi05.h"
#include "trainer/optimizer.h"

namespace vlatune::trainer {

// Command-line values that replace recipe keys (unset: the recipe's).
struct RecipeOverrides {
  std::optional<int64_t> micro_batch;       // --batch: batch.micro_batch
  std::optional<int64_t> grad_accum;        // --grad-accum: batch.grad_accum
  std::optional<std::string> precision;     // --precision: model_options.precision
  std::optional<std::string> reduce_dtype;  // --reduce-dtype: distributed.reduce_dtype
  std::optional<std::string> cuda_graph;    // --cuda-graph: model_options.cuda_graph ("off" | "step")
};

// The run the recipe is applied to.
struct RecipeContext {
  RecipeOverrides overrides;
  int world_size = 1;  // processes of this run
  bool cuda = false;   // the device is a GPU (bf16 parameters for "bf16" precision)
  uint64_t seed = 42;  // draws the LoRA adapters' A
};

struct AppliedRecipe {
  formats::Recipe effective;  // the recipe with the overrides written in (their prediction dropped when it changed)
  int64_t micro_batch = 1, grad_accum = 1;
  std::optional<int64_t> num_images;  // camera slots per batch (unset: the data's, empty slots pruned)
  model::ForwardOptions forward;      // shortcuts, attention path, compute dtype
  std::string precision;              // "bf16" | "fp32-master"
  OptimizerPrecision optimizer_precision = OptimizerPrecision::kBf16;
  OptimizerStateDtype state_dtype = OptimizerStateDtype::kAuto;  // how AdamW stores its two moments
  torch::Dtype parameter_dtype = torch::kFloat32;
  bool cuda_graph_step = false;   // the step replays a CUDA graph
  std::string cuda_graph_source;  // what asked for it, for refusals: "--cuda-graph step" or "FILE: $.model_options..."
  std::vector<std::string> recompute;  // resolved FQNs, in module order
  std::vector<std::string> fp8;        // the FP8 Linears (merged members included), in module order
  bool fp8_delayed = false;            // FP8 Linears with delayed scaling
  std::vector<std::string> frozen;     // modules whose parameters are frozen (presets and patterns), module order
  std::vector<model::LoraSpec> lora;   // the adapters added, module order
  struct AppliedGroup {
    std::string name;
    std::vector<std::string> modules;  // resolved FQNs
  };
  std::vector<AppliedGroup> groups;    // gradient buckets; empty: one per named unit (trainer/grad_buckets.h)
  int world_size = 1;                  // processes of this run
  std::string reduce_dtype = "bf16";   // gradient all-reduce dtype: "bf16" | "fp32"
  bool shard_optimizer_state = false;  // ZeRO-1 over the ranks (a world of one holds the whole state)
};

// `file` labels errors (the recipe's path, or "<default recipe>"). `build_model(parameter dtype)` is called once,
// after step 3, and returns the model steps 4-8 apply to.
using ModelBuilder = std::function<model::Pi05Impl&(torch::Dtype parameter_dtype)>;
AppliedRecipe apply_recipe(const formats::Recipe& recipe, const std::string& file, const RecipeContext& context,
                           const ModelBuilder& build_model);
// The same for a model already built (its parameters' dtype is the caller's choice).
AppliedRecipe apply_recipe(const formats::Recipe& recipe, const std::string& file, model::Pi05Impl& model,
                           const RecipeContext& context = {});

// Every module FQN of the model (named_modules, root excluded), the names recipe patterns match against.
std::vector<std::string> module_fqns(const torch::nn::Module& model);

}  // namespace vlatune::trainer
