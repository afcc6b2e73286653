// apply_recipe(): a recipe.json turned into the trainer's settings, in a stated order:
//   1. data       (num_images, trim_text, trim_multiple)          -> slots, ForwardOptions
//   2. model      (skip_dead, attention, precision)                -> ForwardOptions, precision
//   3. recompute  (FQN patterns resolved against the model)        -> Pi05Impl::set_recompute
//   4. fp8, groups, distributed: accepted only at their defaults until their features land; otherwise refused
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
};

// `file` labels errors (the recipe's path, or "<defaults>").
AppliedRecipe apply_recipe(const formats::Recipe& recipe, const std::string& file, model::Pi05Impl& model);

// Every module FQN of the model (named_modules, root excluded), the names recipe patterns match against.
std::vector<std::string> module_fqns(const torch::nn::Module& model);

}  // namespace vlatune::trainer
