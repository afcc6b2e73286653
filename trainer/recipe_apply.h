// apply_recipe(): a recipe.json turned into the trainer's settings, in a stated order:
//   1. data       (num_images, trim_text, trim_multiple)          -> slots, ForwardOptions
//   2. model      (skip_dead, attention, precision, cuda_graph)    -> ForwardOptions, precision, step capture
//   3. recompute  (FQN patterns resolved against the model)        -> Pi05Impl::set_recompute
//   4. fp8        (FQN patterns of Linears resolved against the model; scaling) -> Pi05Impl::set_fp8
//   5. groups      (FQN patterns resolved; a module in two groups is refused; per-group cuda_graph refused)
//      distributed (world_size must be 1 = unspecified, or the run's; reduce_dtype)
// Every refusal is a formats::FormatError naming the recipe file and the JSON path.
#pragma once

#include <string>
#include <vector>

#include "formats/recipe.h"
#include "model/config.h"
#include "model/pi05.h"

namespace vlatune::trainer {

struct AppliedRecipe {
  model::ForwardOptions forward;       // shortcuts and attention path
  std::optional<int64_t> num_images;   // camera slots per batch (unset: the data's, empty slots pruned)
  std::string precision;               // "bf16" | "fp32-master"
  std::vector<std::string> recompute;  // resolved FQNs, in module order
  std::vector<std::string> fp8;        // the FP8 Linears (merged members included), in module order
  struct AppliedGroup {
    std::string name;
    std::vector<std::string> modules;  // resolved FQNs
  };
  std::vector<AppliedGroup> groups;   // gradient buckets; empty: one per named unit (trainer/grad_buckets.h)
  int world_size = 1;                 // processes of this run
  std::string reduce_dtype = "bf16";  // gradient all-reduce dtype: "bf16" | "fp32"
  bool fp8_delayed = false;           // FP8 Linears with delayed scaling
  bool cuda_graph_step = false;       // model_options.cuda_graph "step": the step replays a CUDA graph
};

// `file` labels errors (the recipe's path, or "<defaults>").
// `world_size`: processes of this run (a recipe's distributed.world_size other than 1 must equal it).
AppliedRecipe apply_recipe(const formats::Recipe& recipe, const std::string& file, model::Pi05Impl& model,
                           int world_size = 1);

// Every module FQN of the model (named_modules, root excluded), the names recipe patterns match against.
std::vector<std::string> module_fqns(const torch::nn::Module& model);

}  // namespace vlatune::trainer
