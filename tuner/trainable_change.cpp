#include "tuner/trainable_change.h"

#include <algorithm>
#include <map>
#include <set>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"
#include "formats/numbers.h"
#include "layout/pi05.h"

namespace vlatune::tuner {

namespace {

using formats::fixed;

// Adapters are thin GEMMs: at least their operands' bytes at this rate (3 TB/s, about what H100/H200-class HBM
// sustains in a GEMM that streams its inputs), whatever their FLOP share of the base GEMM says.
constexpr double kAdapterBytesPerMs = 3e9;

std::vector<std::string> row_fqns(const formats::BatchProfile& b) {
  std::vector<std::string> out;
  for (const formats::ModuleCost& row : b.modules)
    if (!is_pseudo_row(row)) out.push_back(row.fqn);
  return out;
}

// A quantity summed over `root`'s rows (its own, else the outermost inside it) at the profiled batch, in proportion
// to the micro-batch (as GEMM times scale): the two-point fits of a part of the step can carry an intercept the whole
// step's fit does not have, and removing it at a small batch would remove more than the batch runs.
template <typename Field>
LinearFit rows_fit(const formats::Profile& profile, const std::string& root, Field field) {
  const formats::BatchProfile& b0 = profile.batches[0];
  double v = 0;
  for (int r : rows_for(b0, root)) v += field(b0.modules[static_cast<size_t>(r)]);
  return {0, v / static_cast<double>(b0.batch), true};
}

LinearFit minus(LinearFit a, const LinearFit& b) {
  a.fixed -= b.fixed;
  a.per_sample -= b.per_sample;
  return a;
}
LinearFit plus(LinearFit a, const LinearFit& b) {
  a.fixed += b.fixed;
  a.per_sample += b.per_sample;
  return a;
}
LinearFit clamped(const LinearFit& f) {  // a difference that went negative: none
  return f.per_sample < 0 ? LinearFit{} : f;
}

int64_t joint_depth(const std::vector<std::string>& fqns) {
  int64_t depth = 0;
  while (std::find(fqns.begin(), fqns.end(), layout::prefix_layer(depth)) != fqns.end()) ++depth;
  return depth;
}

double element_bytes(const formats::Profile& profile) {
  return profile.recipe.model_options.precision == formats::Precision::kBf16 ? 2 : 4;
}

}  // namespace

TrainableSelection resolve_trainable(const formats::Profile& profile, const formats::Recipe::Freeze& freeze,
                                     const formats::Recipe::Lora& lora, const std::string& flag) {
  TrainableSelection out;
  auto add = [&out](const std::string& m) {
    if (std::find(out.frozen.begin(), out.frozen.end(), m) == out.frozen.end()) out.frozen.push_back(m);
  };
  for (formats::FreezePreset preset : freeze.presets)
    for (const std::string& m : layout::freeze_preset_modules(preset)) add(m);
  if (lora.preset)
    for (const std::string& m : layout::lora_preset(*lora.preset).frozen) add(m);
  if (!freeze.modules.empty()) {
    try {
      for (const std::string& m :
           formats::resolve_patterns(freeze.modules, row_fqns(profile.batches[0]), flag, "$.freeze.modules"))
        add(m);
    } catch (const formats::FormatError& e) {
      throw PlanInputError(flag + ": " + e.reason());
    }
  }
  std::vector<std::pair<std::vector<std::string>, int64_t>> targets;
  if (lora.preset)
    for (const layout::LoraPresetTarget& t : layout::lora_preset(*lora.preset).targets)
      targets.push_back({t.modules, t.rank});
  for (const formats::Recipe::LoraTarget& t : lora.targets) targets.push_back({t.modules, t.rank});
  std::set<std::string> taken;
  for (const auto& [patterns, rank] : targets) {
    for (const std::string& pattern : patterns) {
      bool matched = false;
      for (const formats::GemmEntry& g : profile.gemms)
        for (const std::string& member : g.members) {
          if (!formats::fqn_matches(pattern, member)) continue;
          matched = true;
          if (taken.insert(member).second) out.lora.push_back({member, rank});
        }
      if (!matched)
        throw PlanInputError(flag + ": LoRA pattern '" + pattern +
                             "' matches no Linear of the profile's GEMM inventory ($.gemms[*].members)");
    }
  }
  return out;
}

std::vector<AdapterCost> adapter_costs(const formats::Profile& profile, const TrainableSelection& selection,
                                       const std::string& flag) {
  std::map<std::string, int64_t> rank_of(selection.lora.begin(), selection.lora.end());
  std::vector<AdapterCost> out;
  for (size_t g = 0; g < profile.gemms.size(); ++g) {
    const formats::GemmEntry& e = profile.gemms[g];
    const auto adapted =
        std::count_if(e.members.begin(), e.members.end(), [&](const std::string& m) { return rank_of.count(m) != 0; });
    if (adapted == 0) continue;
    const int64_t rank = rank_of.count(e.members[0]) ? rank_of.at(e.members[0]) : 0;
    const bool same_rank = std::all_of(e.members.begin(), e.members.end(),
                                       [&](const std::string& m) { return rank_of.count(m) && rank_of.at(m) == rank; });
    // Members' output widths are not in the inventory, only their sum n: a partly adapted GEMM cannot be sized.
    if (static_cast<size_t>(adapted) != e.members.size() || !same_rank)
      throw PlanInputError(flag + ": the merged GEMM " + e.name +
                           " has LoRA on some of its Linears only, or at different ranks: the profile cannot size "
                           "those adapters (LoRA all of its members at one rank)");
    const double m = static_cast<double>(e.m), k = static_cast<double>(e.k), n = static_cast<double>(e.n);
    const double r = static_cast<double>(rank), members = static_cast<double>(e.members.size());
    AdapterCost a;
    a.gemm = static_cast<int>(g);
    a.rank = rank;
    a.numel = r * (members * k + n);  // A [rank, k] per member, B [n_member, rank] with the n_member summing to n
    // Forward, input and weight gradient of each: x A^T per member, then (x A^T) B^T over the whole width, each
    // costed from the base GEMM's measured bf16 pass scaled by FLOPs, at least its bytes at kAdapterBytesPerMs.
    const double base_pass = e.bf16.total() / 3;
    const double base_flops = 2 * m * k * n;
    auto gemm_ms = [&](double rows, double inner, double cols) {
      const double flops = 2 * rows * inner * cols;
      const double bytes = 2 * (rows * inner + inner * cols + rows * cols);
      return std::max(base_flops > 0 ? base_pass * flops / base_flops : 0.0, bytes / kAdapterBytesPerMs);
    };
    a.ms = 3 * (members * gemm_ms(m, k, r) + gemm_ms(m, r, n));
    out.push_back(a);
  }
  return out;
}

void plan_trainable(CostModel& model, const TrainableSelection& selection, formats::StateDtype state_dtype, int shards,
                    const std::string& flag) {
  TrainableChange t;
  t.active = true;
  t.frozen = selection.frozen;
  const formats::Profile& profile = model.profile;
  const formats::BatchProfile& b0 = profile.batches[0];
  const double elem = element_bytes(profile);
  shards = std::max(1, shards);
  if (!b0.memory.parameter_bytes || *b0.memory.parameter_bytes <= 0)
    throw PlanInputError(flag +
                         ": the profile has no parameter bytes (batches[0].memory.parameter_bytes) to size the "
                         "trainable parameters from");
  t.total_numel = static_cast<double>(*b0.memory.parameter_bytes) / elem;

  // Frozen parameters: the outermost rows inside a frozen module (parameter_bytes are inclusive).
  std::vector<int> frozen_rows;
  for (size_t i = 0; i < b0.modules.size(); ++i)
    if (!is_pseudo_row(b0.modules[i]) && formats::fqn_within_any(b0.modules[i].fqn, t.frozen))
      frozen_rows.push_back(static_cast<int>(i));
  for (int i : outermost_rows(b0, frozen_rows))
    t.frozen_parameter_bytes += static_cast<double>(b0.modules[static_cast<size_t>(i)].parameter_bytes);
  for (const std::string& m : t.frozen)
    if (rows_for(b0, m).empty())
      throw PlanInputError(flag + ": frozen module " + m +
                           " has no row in the profile (batches[0].modules) to size it");
  for (const auto& [linear, rank] : selection.lora)
    if (!formats::fqn_within_any(linear, t.frozen))
      throw PlanInputError(flag + ": LoRA on " + linear +
                           " outside the frozen modules: its base weight cannot be sized from the profile");
  t.frozen_numel = t.frozen_parameter_bytes / elem;

  // Adapters: parameters, gradients and moments at the parameters' dtype.
  const std::vector<AdapterCost> adapters = adapter_costs(profile, selection, flag);
  for (const AdapterCost& a : adapters) {
    t.adapter_numel += a.numel;
    t.adapter_ms += a.ms;
  }
  t.trainable_numel = t.total_numel - t.frozen_numel + t.adapter_numel;
  const double adapter_bytes = t.adapter_numel * elem;
  const double frozen_moments = adamw_moment_bytes(t.frozen_numel, elem, state_dtype) / shards;
  const double adapter_moments = adamw_moment_bytes(t.adapter_numel, elem, state_dtype) / shards;
  t.fixed_gib = (adapter_bytes - frozen_moments + adapter_moments) / kGiB;
  t.gradient_gib = std::max(0.0, model.gradient_gib - t.frozen_parameter_bytes / kGiB) + adapter_bytes / kGiB;
  t.state_delta_gib = t.fixed_gib + (adapter_bytes - t.frozen_parameter_bytes) / kGiB;
  t.optimizer_ms = t.total_numel > 0 ? model.optimizer_ms * t.trainable_numel / t.total_numel : model.optimizer_ms;

  // Backward that no longer runs, and the activations it held.
  auto backward = [](const formats::ModuleCost& r) { return r.backward_ms; };
  auto activation = [](const formats::ModuleCost& r) { return static_cast<double>(r.activation_bytes); };
  t.unit_no_backward.assign(model.units.size(), 0);
  t.unit_act_removed.assign(model.units.size(), LinearFit{});
  for (const layout::BackwardFree& f : layout::backward_free_modules(t.frozen, joint_depth(model.module_fqns))) {
    if (rows_for(b0, f.root).empty()) continue;  // did not run (no row): nothing to remove
    t.no_backward.push_back(f.root);
    LinearFit ms = rows_fit(profile, f.root, backward), act = rows_fit(profile, f.root, activation);
    for (const std::string& k : f.kept) {
      if (rows_for(b0, k).empty()) continue;
      t.kept.push_back(k);
      ms = minus(ms, rows_fit(profile, k, backward));
      act = minus(act, rows_fit(profile, k, activation));
    }
    ms = clamped(ms);
    act = clamped(act);
    t.backward_removed_ms = plus(t.backward_removed_ms, ms);
    t.activation_removed_bytes = plus(t.activation_removed_bytes, act);
    for (size_t u = 0; u < model.units.size(); ++u) {
      const std::string& name = model.units[u].spec.aliases[0];
      const bool holds_kept = std::any_of(f.kept.begin(), f.kept.end(), [&](const std::string& k) {
        return formats::fqn_within(k, name) || formats::fqn_within(name, k);
      });
      if (formats::fqn_within(name, f.root) && !holds_kept)
        t.unit_no_backward[u] = 1;
      else if (formats::fqn_within(f.root, name))
        t.unit_act_removed[u] = plus(t.unit_act_removed[u], act);
    }
  }

  // Frozen GEMMs outside those scopes skip their weight gradient; inside a kept scope (nothing upstream needs their
  // input gradient either) their whole backward. LoRA'd ones keep the input gradient (the adapters need it).
  std::set<std::string> adapted;
  for (const auto& [linear, rank] : selection.lora) adapted.insert(linear);
  for (const formats::GemmEntry& e : profile.gemms) {
    const bool frozen = std::all_of(e.members.begin(), e.members.end(),
                                    [&](const std::string& m) { return formats::fqn_within_any(m, t.frozen); });
    if (!frozen) continue;
    const std::string& member = e.members[0];
    const bool in_kept = formats::fqn_within_any(member, t.kept);
    if (formats::fqn_within_any(member, t.no_backward) && !in_kept) continue;  // in the rows removed above
    const bool lora =
        std::any_of(e.members.begin(), e.members.end(), [&](const std::string& m) { return adapted.count(m); });
    const formats::GemmTimes& times = profiled_in_fp8(profile, e) && e.fp8 ? *e.fp8 : e.bf16;
    t.gemm_removed_ms += times.grad_weight_ms + (in_kept && !lora ? times.grad_input_ms : 0.0);
  }
  model.trainable = std::move(t);
}

std::string describe_trainable(const CostModel& model, double batch) {
  const TrainableChange& t = model.trainable;
  if (!t.active) return "";
  const double pb = static_cast<double>(model.profiled_batch);
  std::string out = fixed(t.frozen_numel / 1e6, 1) + "M parameters frozen (" +
                    fixed(t.frozen_parameter_bytes / kGiB, 2) + " GiB: no gradients, no AdamW moments)";
  if (t.adapter_numel > 0) out += ", " + fixed(t.adapter_numel / 1e6, 2) + "M adapter parameters trained";
  out += "; training state " + fixed(t.state_delta_gib, 2) + " GiB (gradients " +
         fixed(t.gradient_gib - model.gradient_gib, 2) + ", moments and adapters " + fixed(t.fixed_gib, 2) + ")";
  if (!t.no_backward.empty())
    out += "; no backward through " + std::to_string(t.no_backward.size()) + " modules (" + t.no_backward.front() +
           (t.no_backward.size() > 1 ? " ... " + t.no_backward.back() : "") +
           "): " + fixed(t.backward_removed_ms.at(batch), 1) + " ms and " +
           fixed(std::max(0.0, t.activation_removed_bytes.at(batch)) / kGiB, 2) +
           " GiB of activations at micro-batch " + fixed(batch, 0) + " per profiled step" +
           (t.kept.empty() ? "" : " (the expert's layers and the joint attention inside their scopes still run)");
  out += "; frozen GEMMs' gradients " + fixed(-t.gemm_removed_ms * batch / pb, 1) + " ms";
  if (t.adapter_numel > 0)
    out += ", LoRA adapters +" + fixed(t.adapter_ms * batch / pb, 1) +
           " ms (an estimate: each adapter GEMM at the base GEMM's measured time scaled by FLOPs, at least its bytes "
           "at 3 TB/s)";
  out += "; optimizer " + fixed(model.optimizer_ms, 1) + " -> " + fixed(t.optimizer_ms, 1) + " ms";
  return out;
}

}  // namespace vlatune::tuner
