#include "tuner/plan_variants.h"

#include <algorithm>
#include <bitset>
#include <iterator>

#include "formats/numbers.h"
#include "layout/pi05.h"
#include "tuner/trainable_change.h"

namespace vlatune::tuner {

namespace {

using formats::fixed;
using formats::Rationale;

std::string pct(double ratio) {
  return formats::signed_pct(100 * (ratio - 1), 1);
}

const Planned* find_variant(const std::vector<std::unique_ptr<Planned>>& planned, const std::set<AllowedChange>& uses) {
  for (const auto& p : planned)
    if (p->variant.uses == uses) return p.get();
  return nullptr;
}

std::string shape_of(const Planned& p) {
  return batch_shape(p.rc.choice().batch, p.rc.choice().grad_accum);
}

// The rationale of freezing or LoRA: `why` (what allowed it; what it bought), what it moved, what it means for
// training.
Rationale trainable_rationale(const Planned& pick, AllowedChange change, const std::string& why) {
  const TrainableChange& t = pick.fit.model.trainable;
  const formats::Recipe::Freeze& freeze = pick.variant.options.freeze;
  const double batch = static_cast<double>(pick.rc.choice().batch);
  const double pb = static_cast<double>(pick.fit.model.profiled_batch);
  std::map<std::string, double> n = {{"training_state_delta_gib", t.state_delta_gib},
                                     {"frozen_parameters", t.frozen_numel},
                                     {"adapter_parameters", t.adapter_numel},
                                     {"backward_removed_ms", t.backward_removed_ms.at(batch)},
                                     {"activation_removed_gib", t.activation_removed_bytes.at(batch) / kGiB}};
  const std::string moved = "the training state (gradients, AdamW moments" +
                            std::string(t.adapter_numel > 0 ? ", adapters" : "") + ") moves by " +
                            fixed(t.state_delta_gib, 2) + " GiB";
  const size_t split = why.find("; ");
  const std::string allowed_by = why.substr(0, split + 2), bought = why.substr(split + 2);
  if (change == AllowedChange::kFreeze) {
    const std::string preset = freeze.presets.empty() ? "" : formats::to_string(freeze.presets[0]);
    return {"freeze " + preset,
            allowed_by + fixed(t.frozen_numel / 1e6, 0) + "M parameters frozen: " + moved + "; " +
                fixed(t.backward_removed_ms.at(batch), 1) + " ms of backward and " +
                fixed(t.activation_removed_bytes.at(batch) / kGiB, 2) +
                " GiB of activations removed per profiled step's worth of micro-batch " + fixed(batch, 0) + ": " +
                bought + ". This trains a different set of parameters: retune the learning rate",
            n};
  }
  n["adapter_ms_estimate"] = t.adapter_ms * batch / pb;
  return {"lora openpi (rank 16 on the language model, 32 on the action expert: attention and MLP Linears)",
          allowed_by + "both Gemma towers' own weights frozen, " + fixed(t.adapter_numel / 1e6, 1) +
              "M adapter parameters trained: " + moved + "; their weight gradients go (" +
              fixed(t.gemm_removed_ms * batch / pb, 1) + " ms) and the adapters add an estimated " +
              fixed(t.adapter_ms * batch / pb, 1) + " ms: " + bought +
              ". This trains a different set of parameters (retune the learning rate); the export merges the "
              "adapters into the base weights",
          n};
}

}  // namespace

int trainable_level(const Variant& v) {
  int level = 0;
  for (formats::FreezePreset p : v.options.freeze.presets)
    level = std::max(level, p == formats::FreezePreset::kFreezeVisionEncoder ? 1 : 2);
  return level + (v.options.lora.preset ? 3 : 0);
}

std::vector<Variant> training_variants(const formats::Profile& profile, const PlanOptions& o,
                                       const GlobalBatch& global) {
  const std::vector<AllowedChangeInfo>& table = allowed_change_table();
  const formats::StateDtype stated_state = o.optimizer_state.value_or(profile.recipe.optimizer.state_dtype);
  std::vector<Variant> out;
  for (size_t count = 0; count <= table.size(); ++count) {
    for (unsigned mask = 0; mask < (1u << table.size()); ++mask) {
      if (std::bitset<32>(mask).count() != count) continue;
      std::vector<Variant> vs(1);
      vs[0].options = o;
      vs[0].global_batch = global.samples;
      bool changes_nothing = false;
      for (size_t i = 0; i < table.size(); ++i) {
        if (!(mask & (1u << i))) continue;
        for (Variant& v : vs) v.uses.insert(table[i].change);
        switch (table[i].change) {
          case AllowedChange::kGlobalBatch:
            for (Variant& v : vs) v.global_batch = 0;
            break;
          case AllowedChange::kOptimizerState:
            changes_nothing = changes_nothing || stated_state == formats::StateDtype::kInt8Blockwise;
            for (Variant& v : vs) {
              v.options.optimizer_state = formats::StateDtype::kInt8Blockwise;
              v.state_source = "--allow optimizer-state";
            }
            break;
          case AllowedChange::kFreeze: {
            std::vector<Variant> presets;
            for (formats::FreezePreset p :
                 {formats::FreezePreset::kFreezeVisionEncoder, formats::FreezePreset::kTrainExpertOnly}) {
              for (Variant v : vs) {
                v.options.freeze.presets = {p};
                for (const std::string& m : layout::freeze_preset_modules(p)) v.options.fp8_exclude.push_back(m);
                presets.push_back(std::move(v));
              }
            }
            vs = std::move(presets);
            break;
          }
          case AllowedChange::kLora:
            for (Variant& v : vs) {
              v.options.lora.preset = formats::LoraPreset::kOpenpi;
              for (const layout::LoraPresetTarget& t : layout::lora_preset(formats::LoraPreset::kOpenpi).targets)
                v.options.fp8_exclude.insert(v.options.fp8_exclude.end(), t.modules.begin(), t.modules.end());
            }
            break;
        }
      }
      if (changes_nothing) continue;
      for (Variant& v : vs) {
        if (v.uses.count(AllowedChange::kFreeze) || v.uses.count(AllowedChange::kLora))
          v.trainable_source = allow_flag(v.uses);
        v.possible = v.global_batch == 0 || (v.global_batch % o.world_size == 0 &&
                                             (!o.batch || (v.global_batch / o.world_size) % *o.batch == 0));
        out.push_back(std::move(v));
      }
    }
  }
  return out;
}

std::set<AllowedChange> changes_made(const Planned& p, const GlobalBatch& global, const formats::Profile& profile,
                                     const PlanOptions& o) {
  std::set<AllowedChange> out;
  if (p.global_batch() != global.samples) out.insert(AllowedChange::kGlobalBatch);
  if (planned_state_dtype(p.in) != o.optimizer_state.value_or(profile.recipe.optimizer.state_dtype))
    out.insert(AllowedChange::kOptimizerState);
  if (!p.variant.options.freeze.presets.empty()) out.insert(AllowedChange::kFreeze);
  if (p.variant.options.lora.preset) out.insert(AllowedChange::kLora);
  return out;
}

std::vector<Rationale> allowed_change_rationale(const Planned& pick,
                                                const std::vector<std::unique_ptr<Planned>>& planned,
                                                const GlobalBatch& global, double budget_gib) {
  std::vector<Rationale> out;
  const std::set<AllowedChange> made = changes_made(pick, global, pick.in.profile, planned.front()->variant.options);
  for (AllowedChange change : made) {
    std::set<AllowedChange> without = pick.variant.uses;
    without.erase(change);
    const Planned* other = find_variant(planned, without);
    std::string against;
    if (other && other->rc.feasible())
      against = shape_of(pick) + " predicts " + fixed(pick.samples_per_s(), 2) + " samples/s against " +
                fixed(other->samples_per_s(), 2) + " (" + pct(pick.samples_per_s() / other->samples_per_s()) +
                ") without it, at " + shape_of(*other);
    else
      against = "without it nothing fits the " + fixed(budget_gib, 1) + " GiB budget" +
                (other && !other->rc.options.empty() ? " (least " + fixed(other->rc.min_peak_gib(), 1) + " GiB)" : "") +
                "; with it, " + shape_of(pick) + " at " + fixed(pick.samples_per_s(), 2) + " samples/s";
    const std::string by = "allowed by --allow " + to_string(change) + "; ";
    if (change == AllowedChange::kGlobalBatch) {
      out.push_back({"global batch " + std::to_string(global.samples) + " -> " + std::to_string(pick.global_batch()),
                     by + "instead of " + global.source + ": " + against +
                         ". Another batch per optimizer step trains differently: retune the learning rate",
                     {{"global_batch", static_cast<double>(pick.global_batch())},
                      {"stated_global_batch", static_cast<double>(global.samples)}}});
    } else if (change == AllowedChange::kFreeze || change == AllowedChange::kLora) {
      out.push_back(trainable_rationale(pick, change, by + against));
    } else {
      const formats::StateDtype before =
          planned.front()->variant.options.optimizer_state.value_or(pick.in.profile.recipe.optimizer.state_dtype);
      out.push_back({std::string("optimizer state ") + formats::to_string(before) + " -> " +
                         formats::to_string(planned_state_dtype(pick.in)),
                     by + "AdamW's moments in 8 bits (blockwise absmax) move the peak by " +
                         fixed(pick.fit.model.optimizer_delta_gib, 2) + " GiB: " + against +
                         ". The update rounds differently from full-precision moments",
                     {{"optimizer_delta_gib", pick.fit.model.optimizer_delta_gib}}});
    }
  }
  return out;
}

std::string nothing_fits(const std::vector<std::unique_ptr<Planned>>& planned, std::vector<Variant>& others,
                         const formats::Profile& profile, const std::string& file, const TargetStep& target,
                         const CommSetup& comm) {
  const Planned* least = nullptr;
  for (const auto& p : planned)
    if (!p->rc.options.empty() && (!least || p->rc.min_peak_gib() < least->rc.min_peak_gib())) least = p.get();
  std::string message = least ? does_not_fit(least->rc, target.budget_gib)
                              : "--batch: no micro-batch to plan (it does not divide the global batch)";
  const std::set<AllowedChange> allowed = planned.front()->variant.options.allow;
  std::vector<std::set<AllowedChange>> fitting;  // the least --allow sets that fit (no one inside another)
  for (Variant& v : others) {
    const bool covered = std::any_of(fitting.begin(), fitting.end(), [&](const std::set<AllowedChange>& f) {
      return std::includes(v.uses.begin(), v.uses.end(), f.begin(), f.end());
    });
    if (covered) continue;
    std::unique_ptr<Planned> planned_other;
    try {
      planned_other = std::make_unique<Planned>(std::move(v), profile, file, target, comm);
    } catch (const PlanInputError&) {
      continue;  // cannot be priced from this profile (e.g. no parameter bytes for another optimizer state)
    }
    const Planned& p = *planned_other;
    if (!p.rc.feasible()) continue;
    std::set<AllowedChange> all = allowed;
    all.insert(p.variant.uses.begin(), p.variant.uses.end());
    fitting.push_back(p.variant.uses);
    std::string what;
    for (formats::FreezePreset preset : p.variant.options.freeze.presets)
      what += std::string(what.empty() ? " (" : ", ") + "freeze " + formats::to_string(preset);
    if (p.variant.options.lora.preset)
      what += std::string(what.empty() ? " (" : ", ") + "lora " + formats::to_string(*p.variant.options.lora.preset);
    if (!what.empty()) what += ")";
    message += "; " + allow_flag(all) + " would make it fit" + what + ": " + shape_of(p) + " at a predicted peak of " +
               fixed(p.rc.choice().prediction.peak_gib, 1) + " GiB";
  }
  if (!fitting.empty()) return message;
  if (others.empty()) return message + " (every --allow choice considered)";
  return message + "; no --allow choice makes it fit either";
}

}  // namespace vlatune::tuner
