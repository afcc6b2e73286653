#include "tuner/plan_variants.h"

#include <algorithm>
#include <bitset>
#include <iterator>

#include "formats/numbers.h"

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

}  // namespace

std::vector<Variant> training_variants(const formats::Profile& profile, const PlanOptions& o,
                                       const GlobalBatch& global) {
  const std::vector<AllowedChangeInfo>& table = allowed_change_table();
  const formats::StateDtype stated_state = o.optimizer_state.value_or(profile.recipe.optimizer.state_dtype);
  std::vector<Variant> out;
  for (size_t count = 0; count <= table.size(); ++count) {
    for (unsigned mask = 0; mask < (1u << table.size()); ++mask) {
      if (std::bitset<32>(mask).count() != count) continue;
      Variant v;
      v.options = o;
      v.global_batch = global.samples;
      bool changes_nothing = false;
      for (size_t i = 0; i < table.size(); ++i) {
        if (!(mask & (1u << i))) continue;
        v.uses.insert(table[i].change);
        switch (table[i].change) {
          case AllowedChange::kGlobalBatch:
            v.global_batch = 0;
            break;
          case AllowedChange::kOptimizerState:
            changes_nothing = changes_nothing || stated_state == formats::StateDtype::kInt8Blockwise;
            v.options.optimizer_state = formats::StateDtype::kInt8Blockwise;
            v.state_source = "--allow optimizer-state";
            break;
        }
      }
      if (changes_nothing) continue;
      v.possible = v.global_batch == 0 || (v.global_batch % o.world_size == 0 &&
                                           (!o.batch || (v.global_batch / o.world_size) % *o.batch == 0));
      out.push_back(std::move(v));
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
    message += "; " + allow_flag(all) + " would make it fit: " + shape_of(p) + " at a predicted peak of " +
               fixed(p.rc.choice().prediction.peak_gib, 1) + " GiB";
  }
  if (!fitting.empty()) return message;
  if (others.empty()) return message + " (every --allow choice considered)";
  return message + "; no --allow choice makes it fit either";
}

}  // namespace vlatune::tuner
