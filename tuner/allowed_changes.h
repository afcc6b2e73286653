// What a plan may change about the training, each only when the user allows it (`vlatune plan --allow a,b`). By
// default a plan trains what the profiled recipe trains: the same global batch (micro-batch x grad_accum x world
// size), optimizer state and parameters; it only chooses how (micro-batch, recompute, FP8 when asked, groups).
// A plan that uses an allowed change says so first in its rationale.
//
// Adding a choice: an enumerator, its row in allowed_change_table() (name and help), what it lets the planner try
// in plan_variants.cpp's training_variants() (a variant of the plan's options, planned like the stated one and
// taken when the stated one does not fit or predicts fewer samples/s), how changes_made() tells it was used, and
// its rationale entry in allowed_change_rationale().
#pragma once

#include <set>
#include <string>
#include <vector>

namespace vlatune::tuner {

enum class AllowedChange {
  kGlobalBatch,     // "global-batch": any micro-batch at the profiled recipe's grad_accum (most samples/s)
  kOptimizerState,  // "optimizer-state": AdamW's moments in 8 bits (optimizer.state_dtype "int8-blockwise")
  kFreeze,          // "freeze": freeze.presets freeze_vision_encoder, else train_expert_only (the least that fits)
  kLora,            // "lora": lora.preset "openpi" (adapters on both Gemma towers, their own weights frozen)
};

struct AllowedChangeInfo {
  AllowedChange change;
  std::string name;  // as --allow takes it
  std::string help;  // one line for --help and the docs
};

// Every choice, in the order --help lists them.
const std::vector<AllowedChangeInfo>& allowed_change_table();

const std::string& to_string(AllowedChange change);

// "global-batch,optimizer-state" (commas; repeats and spaces around names ignored). Throws PlanInputError naming
// --allow and the known choices for an unknown or empty name.
std::set<AllowedChange> parse_allowed_changes(const std::string& list);

// "--allow a,b" for a set (in table order).
std::string allow_flag(const std::set<AllowedChange>& changes);

}  // namespace vlatune::tuner
