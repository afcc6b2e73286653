#include "tuner/allowed_changes.h"

#include <sstream>
#include <stdexcept>

#include "tuner/cost_model.h"

namespace vlatune::tuner {

namespace {

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

std::string known_choices() {
  std::string out;
  for (const AllowedChangeInfo& info : allowed_change_table()) out += (out.empty() ? "" : ", ") + info.name;
  return out;
}

}  // namespace

const std::vector<AllowedChangeInfo>& allowed_change_table() {
  static const std::vector<AllowedChangeInfo> table = {
      {AllowedChange::kGlobalBatch, "global-batch",
       "change the global batch: any micro-batch at the profiled grad_accum, the most samples/s"},
      {AllowedChange::kOptimizerState, "optimizer-state",
       "store AdamW's moments in 8 bits (int8-blockwise) when nothing fits otherwise or it buys samples/s"},
      {AllowedChange::kFreeze, "freeze",
       "freeze the vision encoder (freeze_vision_encoder), or when that does not fit all of PaliGemma "
       "(train_expert_only): no gradients, moments or backward for them"},
      {AllowedChange::kLora, "lora",
       "LoRA on both Gemma towers (lora preset openpi, their own weights frozen) when nothing freezing less fits "
       "or it buys samples/s"},
  };
  return table;
}

const std::string& to_string(AllowedChange change) {
  for (const AllowedChangeInfo& info : allowed_change_table())
    if (info.change == change) return info.name;
  throw std::logic_error("allowed change without a name");
}

std::set<AllowedChange> parse_allowed_changes(const std::string& list) {
  std::set<AllowedChange> out;
  std::stringstream in(list);
  std::string item;
  bool any = false;
  while (std::getline(in, item, ',')) {
    any = true;
    const std::string name = trimmed(item);
    bool found = false;
    for (const AllowedChangeInfo& info : allowed_change_table()) {
      if (info.name != name) continue;
      out.insert(info.change);
      found = true;
    }
    if (!found)
      throw PlanInputError("--allow: unknown choice '" + name + "' (known: " + known_choices() +
                           "; several separated by commas)");
  }
  if (!any) throw PlanInputError("--allow: expected one or more of " + known_choices());
  return out;
}

std::string allow_flag(const std::set<AllowedChange>& changes) {
  std::string out;
  for (const AllowedChangeInfo& info : allowed_change_table())
    if (changes.count(info.change)) out += (out.empty() ? "--allow " : ",") + info.name;
  return out;
}

}  // namespace vlatune::tuner
