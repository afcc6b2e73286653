#include "tuner/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"
#include "tuner/batch_choice.h"
#include "tuner/fp8_selector.h"
#include "tuner/grouping.h"
#include "tuner/pi05_layout.h"

namespace vlatune::tuner {

namespace {

using formats::Rationale;
using formats::Recipe;

std::string fmt(double v, int precision = 1) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(precision);
  os << v;
  return os.str();
}

std::string pct(double ratio) {
  return (ratio >= 1 ? "+" : "") + fmt(100 * (ratio - 1), 1) + "%";
}

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// ---- Patterns ----

std::vector<std::string> unit_names(const CostModel& m, const std::vector<int>& units) {
  std::vector<std::string> out;
  for (int i : units) out.push_back(m.units[static_cast<size_t>(i)].spec.aliases[0]);
  return out;
}

std::vector<std::string> recompute_patterns(const CostModel& m, const std::vector<int>& units) {
  const std::vector<std::string> names = unit_names(m, units);
  std::vector<std::string> patterns = compact_patterns(names, m.recompute_names);
  // The compact form must select exactly the chosen units (and never nest): check it as the trainer would.
  std::vector<std::string> back =
      formats::resolve_patterns(patterns, m.recompute_names, "<plan>", "$.recompute.modules");
  std::vector<std::string> want = names;
  std::sort(back.begin(), back.end());
  std::sort(want.begin(), want.end());
  if (back != want) throw std::logic_error("plan: recompute patterns do not reproduce the selection");
  return patterns;
}

std::vector<std::string> gemm_universe(const formats::Profile& p) {
  std::vector<std::string> out;
  for (const auto& g : p.gemms) out.insert(out.end(), g.members.begin(), g.members.end());
  return out;
}

std::vector<std::string> fp8_patterns(const formats::Profile& p, const std::vector<int>& gemms) {
  std::vector<std::string> members;
  for (int g : gemms) {
    const auto& m = p.gemms[static_cast<size_t>(g)].members;
    members.insert(members.end(), m.begin(), m.end());
  }
  return compact_patterns(members, gemm_universe(p));
}

std::vector<int> profiled_fp8(const formats::Profile& p) {
  std::vector<int> out;
  for (size_t g = 0; g < p.gemms.size(); ++g) {
    bool on = false;
    for (const auto& member : p.gemms[g].members)
      for (const auto& pattern : p.recipe.fp8.modules) on = on || formats::fqn_matches(pattern, member);
    if (on) out.push_back(static_cast<int>(g));
  }
  return out;
}

// ---- Communication ----

struct Comm {
  bool on = false;
  CommOptions options;
  std::string source;
};

// measured_unit_bytes: bytes per named unit as the profile's communication section measured them (same world size):
// a unit whose measured bytes are below its parameters' (the token embedding's gradient is all-reduced over the rows
// looked up, trainer/grad_buckets.h) has its pieces scaled down to them.
std::vector<CommPiece> comm_pieces(const CostModel& m, int64_t batch, const std::vector<int>& recompute,
                                   const Recipe& recipe, const std::map<std::string, double>& measured_unit_bytes) {
  const double param_elem = recipe.model_options.precision == formats::Precision::kBf16 ? 2.0 : 4.0;
  const double reduce_elem = recipe.distributed.reduce_dtype == formats::ReduceDtype::kBf16 ? 2.0 : 4.0;
  RecomputeProblem problem;
  recompute_problem(m, batch, 0.0, problem);
  std::vector<CommPiece> out;
  for (const GroupPiece& gp : group_pieces(m.module_fqns)) {
    CommPiece p{gp.name, gp.unit, gp.roots, 0, 0};
    for (const std::string& root : gp.roots) {
      p.backward_ms += root_backward_ms(m, root, static_cast<double>(batch));
      p.grad_bytes += root_parameter_bytes(m, root) / param_elem * reduce_elem;
    }
    for (int u : recompute) {
      const std::string& name = m.units[static_cast<size_t>(u)].spec.aliases[0];
      if (std::any_of(gp.roots.begin(), gp.roots.end(), [&](const std::string& r) { return fqn_within(name, r); }))
        p.backward_ms += problem.items[static_cast<size_t>(u)].cost_ms;
    }
    out.push_back(std::move(p));
  }
  for (const auto& [unit, measured] : measured_unit_bytes) {
    double dense = 0;
    for (const CommPiece& p : out)
      if (p.unit == unit) dense += p.grad_bytes;
    if (dense <= 0 || measured >= dense) continue;
    for (CommPiece& p : out)
      if (p.unit == unit) p.grad_bytes *= measured / dense;
  }
  return out;
}

std::vector<Recipe::Group> recipe_groups(const std::vector<CommPiece>& pieces, const GroupPlan& plan) {
  std::vector<std::string> universe;
  for (const CommPiece& p : pieces) universe.insert(universe.end(), p.roots.begin(), p.roots.end());
  std::vector<Recipe::Group> out;
  for (const GroupRange& r : plan.groups) {
    Recipe::Group g;
    g.name = group_name(pieces, r);
    std::vector<std::string> roots;
    for (int i = r.begin; i < r.end; ++i)
      roots.insert(roots.end(), pieces[static_cast<size_t>(i)].roots.begin(),
                   pieces[static_cast<size_t>(i)].roots.end());
    g.modules = compact_patterns(roots, universe);
    out.push_back(std::move(g));
  }
  return out;
}

// ---- Candidates ----

struct Choice {
  int64_t batch = 0;
  std::vector<int> recompute;
  std::vector<int> fp8;
  Prediction prediction;
  std::string origin;  // "plan", "batch", "frontier", "profiled"
};

std::string describe(const CostModel& m, const Choice& c) {
  std::map<std::string, int> kinds;
  for (int u : c.recompute) kinds[m.units[static_cast<size_t>(u)].spec.kind]++;
  std::vector<std::string> parts;
  for (const auto& [kind, n] : kinds) parts.push_back(std::to_string(n) + " " + kind);
  return "micro-batch " + std::to_string(c.batch) + ", recompute " + (parts.empty() ? "nothing" : join(parts)) + ", " +
         std::to_string(c.fp8.size()) + " FP8 GEMMs";
}

Recipe make_recipe(const Recipe& base, const CostModel& m, const Choice& c) {
  Recipe r = base;
  r.batch.micro_batch = static_cast<int>(c.batch);
  r.recompute.modules = recompute_patterns(m, c.recompute);
  r.fp8.modules = fp8_patterns(m.profile, c.fp8);
  // Delayed scaling when FP8 is chosen: on the H200 it trained 67.7-68.3 samples/s against 63.8-64.7 for current
  // scaling at batch 32, and both passed the 200-step numerics gate (bench/RESULTS.md).
  if (!r.fp8.modules.empty()) r.fp8.scaling = formats::Fp8Scaling::kDelayed;
  r.predicted.step_ms = c.prediction.step_ms;
  r.predicted.peak_gib = c.prediction.peak_gib;
  r.predicted.samples_per_s = c.prediction.samples_per_s;
  return r;
}

// With --fp8 auto, the recompute solver prices each merged-GEMM output unit (the backbone gate+up) at the
// precision the FP8 rule gives its GEMM (a per-GEMM rule on measured times, decided here before the recompute set,
// the GEMM counted as recomputed): recomputing an FP8 GEMM costs its FP8 forward and its share of the casts.
// Predictions keep the profiled prices and add the FP8 change (predict()), which comes to the same number.
CostModel price_gemm_units(const CostModel& m, const formats::Profile& profile, const PlanOptions& o) {
  CostModel out = m;
  if (!o.fp8_auto) return out;
  Fp8Options fo;
  fo.margin = o.fp8_margin;
  fo.noise_rel = m.noise_rel;
  fo.include = o.fp8_include;
  fo.exclude = o.fp8_exclude;
  fo.recomputed = [](const std::string&) { return true; };
  std::set<int> fp8;
  for (const Fp8Verdict& v : solve_fp8_set(profile.gemms, fo).verdicts)
    if (v.selected) fp8.insert(v.gemm);
  const std::vector<int> profiled = profiled_fp8(profile);
  for (UnitModel& u : out.units) {
    if (u.gemm < 0 || !fp8.count(u.gemm) || std::count(profiled.begin(), profiled.end(), u.gemm)) continue;
    const formats::GemmEntry& e = profile.gemms[static_cast<size_t>(u.gemm)];
    if (!e.fp8 || !(e.bf16.forward_ms > 0) || !(e.fp8->total() > 0)) continue;
    const double fp8_ms = e.fp8->forward_ms + e.quant_ms.value_or(0.0) * e.fp8->forward_ms / e.fp8->total();
    const double factor = fp8_ms / e.bf16.forward_ms;
    u.recompute_ms.fixed *= factor;
    u.recompute_ms.per_sample *= factor;
    u.estimate +=
        "; --fp8 auto runs its GEMM in FP8: priced at the FP8 forward + its quant_ms share, " + fmt(fp8_ms, 2) + " ms";
  }
  return out;
}

std::map<std::string, double> candidate_numbers(const Choice& c) {
  return {{"predicted_step_ms", c.prediction.step_ms},
          {"predicted_peak_gib", c.prediction.peak_gib},
          {"micro_batch", static_cast<double>(c.batch)},
          {"predicted_samples_per_s", c.prediction.samples_per_s},
          {"recomputed_modules", static_cast<double>(c.recompute.size())}};
}

}  // namespace

PlanResult plan(const formats::Profile& profile, const std::string& file, const PlanOptions& o) {
  // ---- Flags that need no profile. ----
  if (o.world_size < 1) throw PlanInputError("--world-size: must be >= 1");
  if (o.batch && *o.batch < 1) throw PlanInputError("--batch: must be >= 1 or 'auto'");
  if (!(o.fp8_margin >= 1.0)) throw PlanInputError("--fp8-margin: must be >= 1 (a bf16/FP8 time ratio)");
  if (o.memory_budget_gib && !(*o.memory_budget_gib > 0)) throw PlanInputError("--memory-budget: must be > 0 GiB");
  if (o.allreduce_gbps && !(*o.allreduce_gbps > 0)) throw PlanInputError("--allreduce-gbps: must be > 0 GB/s");
  for (const auto& [flag, list] : {std::pair{"--fp8-include", &o.fp8_include}, {"--fp8-exclude", &o.fp8_exclude}}) {
    for (const std::string& p : *list) {
      try {
        formats::validate_pattern(p, flag, "");
      } catch (const formats::FormatError& e) {
        throw PlanInputError(std::string(flag) + ": " + e.reason());
      }
    }
  }

  // ---- 1. Cost model. ----
  CostModel m = build_cost_model(profile, file, o.recompute_candidates);
  const formats::StateDtype state_dtype = o.optimizer_state.value_or(profile.recipe.optimizer.state_dtype);
  const double state_delta_gib = plan_optimizer_state(m, state_dtype);
  const CostModel priced = price_gemm_units(m, profile, o);  // what the recompute solver and the batch choice see
  const formats::BatchProfile& b0 = profile.batches[0];
  std::vector<Rationale> why;
  {
    std::map<std::string, double> n = {{"profiled_batch", static_cast<double>(b0.batch)},
                                       {"profiled_step_ms", b0.step_ms},
                                       {"profiled_peak_gib", *b0.peak_gib},
                                       {"step_ms_per_sample", m.step_ms.per_sample},
                                       {"step_ms_fixed", m.step_ms.fixed},
                                       {"peak_gib_per_sample", m.peak_gib.per_sample},
                                       {"peak_gib_fixed", m.peak_gib.fixed},
                                       {"step_noise_pct", 100 * m.noise_rel}};
    std::string reason = "profiled " + std::to_string(b0.batch) + " samples: " + fmt(b0.step_ms) + " ms, peak " +
                         fmt(*b0.peak_gib, 2) + " GiB";
    if (m.second_batch) {
      reason += "; with batch " + std::to_string(*m.second_batch) + ": step = " + fmt(m.step_ms.fixed) + " + " +
                fmt(m.step_ms.per_sample, 2) + " ms x batch, peak = " + fmt(m.peak_gib.fixed, 2) + " + " +
                fmt(m.peak_gib.per_sample, 3) + " GiB x batch";
    } else {
      reason += "; one batch size only: time and memory scale in proportion to the batch";
    }
    reason += "; step noise " + fmt(100 * m.noise_rel, 2) + "% (MAD/median)";
    why.push_back({"cost model: linear in the micro-batch", reason, n});
  }

  // ---- 2. Budget. ----
  double budget = 0;
  if (o.memory_budget_gib) {
    budget = *o.memory_budget_gib;
    why.push_back({"memory budget " + fmt(budget, 1) + " GiB", "--memory-budget", {{"budget_gib", budget}}});
  } else {
    if (!profile.settings.gpu_memory_gib)
      throw PlanInputError(
          "--memory-budget: the profile does not record the GPU's memory (settings.gpu_memory_gib is null); "
          "pass the budget in GiB");
    budget = *profile.settings.gpu_memory_gib * kDefaultBudgetFraction;
    why.push_back({"memory budget " + fmt(budget, 1) + " GiB",
                   "the profiled GPU's " + fmt(*profile.settings.gpu_memory_gib, 1) +
                       " GiB minus 5% (allocator fragmentation, CUDA context); --memory-budget overrides",
                   {{"budget_gib", budget}, {"gpu_memory_gib", *profile.settings.gpu_memory_gib}}});
  }
  for (const Calibration& c : m.calibrations) {
    why.push_back({"calibrate recompute class '" + c.name + "' (" + std::to_string(c.units) + " units)",
                   std::string("A/B ") + (c.added ? "adding" : "removing") + " it measured " +
                       fmt(c.measured_step_ms_delta) + " ms and " + fmt(c.measured_saved_gib, 2) +
                       " GiB saved vs the per-module estimate " + fmt(c.predicted_step_ms_delta) + " ms and " +
                       fmt(c.predicted_saved_gib, 2) + " GiB: time x" + fmt(c.time_factor, 2) + ", saved bytes x" +
                       fmt(c.memory_factor, 2) +
                       (c.note.empty() ? "" : " (" + c.note.substr(0, c.note.find_last_not_of("; ") + 1) + ")"),
                   {{"measured_step_ms_delta", c.measured_step_ms_delta},
                    {"predicted_step_ms_delta", c.predicted_step_ms_delta},
                    {"time_factor", c.time_factor},
                    {"measured_saved_gib", c.measured_saved_gib},
                    {"predicted_saved_gib", c.predicted_saved_gib},
                    {"memory_factor", c.memory_factor}}});
  }
  for (const std::string& note : m.notes) why.push_back({"cost model note", note, {}});
  if (state_dtype != profile.recipe.optimizer.state_dtype) {
    why.push_back({std::string("optimizer state ") + formats::to_string(state_dtype),
                   std::string("--optimizer-state: AdamW's moments ") + fmt(state_delta_gib, 2) +
                       " GiB against the profiled " + formats::to_string(profile.recipe.optimizer.state_dtype) +
                       " state, at every micro-batch",
                   {{"optimizer_delta_gib", state_delta_gib}}});
  }

  // ---- Communication (several GPUs). ----
  Comm comm;
  if (o.world_size > 1) {
    comm.on = true;
    comm.options.world_size = o.world_size;
    if (o.allreduce_gbps) {
      comm.options.bus_gbps = *o.allreduce_gbps;
      comm.source = "--allreduce-gbps";
    } else if (profile.communication && profile.communication->allreduce_gbps > 0) {
      comm.options.bus_gbps = profile.communication->allreduce_gbps;
      comm.source = "the profile's communication section (measured on " +
                    std::to_string(profile.communication->world_size) + " GPUs)";
    } else {
      throw PlanInputError("--allreduce-gbps: --world-size " + std::to_string(o.world_size) +
                           " needs the all-reduce bandwidth and the profile has no communication section");
    }
  }
  // Bytes per named unit as measured (the profiled groups are named units when the profile ran the default groups).
  std::map<std::string, double> measured_unit_bytes;
  if (comm.on && profile.communication && profile.communication->world_size == o.world_size)
    for (const auto& g : profile.communication->groups) measured_unit_bytes[g.name] = static_cast<double>(g.bytes);
  Recipe base = profile.recipe;
  base.rationale.clear();
  base.groups.clear();
  base.distributed.world_size = o.world_size;
  base.optimizer.state_dtype = state_dtype;
  base.tuned_on = {profile.environment.gpu, profile.environment.torch,
                   o.profile_label.empty() ? std::optional<std::string>() : o.profile_label};
  const int grad_accum = base.batch.grad_accum;
  auto comm_exposed = [&](int64_t batch, const std::vector<int>& recompute) {
    if (!comm.on) return 0.0;
    const std::vector<CommPiece> pieces = comm_pieces(priced, batch, recompute, base, measured_unit_bytes);
    return solve_groups(pieces, comm.options).exposed_ms;
  };

  // ---- 3. Micro-batch and recompute, jointly. ----
  const std::vector<int64_t> batches = candidate_batches(m, o.batch);
  const std::vector<BatchOption> options =
      evaluate_batches(priced, budget, batches, grad_accum, o.world_size, comm_exposed);
  const int pick = choose_batch(priced, options);
  if (pick < 0) {
    const BatchOption& smallest = options.front();
    throw PlanInputError("--memory-budget: " + fmt(budget, 1) + " GiB is below what batch " +
                         std::to_string(smallest.batch) + " needs even recomputing every candidate: " +
                         fmt(smallest.min_peak_gib, 1) + " GiB (of which " + fmt(smallest.at.other_gib, 1) +
                         " GiB do not depend on recompute: parameters, gradients, optimizer state, "
                         "non-candidate activations)");
  }
  const BatchOption& chosen = options[static_cast<size_t>(pick)];
  const int64_t batch = chosen.batch;
  const std::vector<int>& selection = chosen.recompute.best.chosen;
  {
    RecomputeProblem problem;
    recompute_problem(priced, batch, budget, problem);
    const double bb = static_cast<double>(batch);
    const std::set<int> now(selection.begin(), selection.end());
    const std::set<int> before(m.baseline_units.begin(), m.baseline_units.end());
    // One decision per kind of unit added or removed.
    std::map<std::string, std::vector<int>> added, removed;
    for (int u : now)
      if (!before.count(u)) added[m.units[static_cast<size_t>(u)].spec.kind].push_back(u);
    for (int u : before)
      if (!now.count(u)) removed[m.units[static_cast<size_t>(u)].spec.kind].push_back(u);
    const double act_peak_gib = static_cast<double>(chosen.recompute.best.peak_bytes) / kGiB;
    const double act_budget_gib = static_cast<double>(problem.budget_bytes) / kGiB;
    for (const auto& [kind, units] : added) {
      double ms = 0, saved = 0;
      for (int u : units) {
        ms += problem.items[static_cast<size_t>(u)].cost_ms;
        saved += static_cast<double>(problem.items[static_cast<size_t>(u)].act_bytes -
                                     problem.items[static_cast<size_t>(u)].out_bytes) /
                 kGiB;
      }
      const std::string cal = m.units[static_cast<size_t>(units[0])].calibration;
      const std::string& estimate = priced.units[static_cast<size_t>(units[0])].estimate;
      why.push_back(
          {"recompute " + join(compact_patterns(unit_names(m, units), m.recompute_names)),
           std::to_string(units.size()) + " " + kind + " units: " + fmt(ms) + " ms for " + fmt(saved, 2) + " GiB (" +
               fmt(saved > 0 ? ms / saved : 0, 2) +
               " ms per GiB saved); part of the least-time selection that keeps the activation peak " +
               fmt(act_peak_gib, 1) + " GiB within the " + fmt(act_budget_gib, 1) +
               " GiB the budget leaves at micro-batch " + std::to_string(batch) +
               (cal.empty() ? " (uncalibrated estimate" + (estimate.empty() ? "" : "; per unit: " + estimate) + ")"
                            : " (calibrated by A/B '" + cal + "')"),
           {{"added_ms", ms},
            {"saved_gib", saved},
            {"ms_per_gib_saved", saved > 0 ? ms / saved : 0},
            {"units", static_cast<double>(units.size())}}});
    }
    for (const auto& [kind, units] : removed) {
      double ms = 0, extra = 0;
      for (int u : units) {
        ms += problem.items[static_cast<size_t>(u)].cost_ms;
        extra += static_cast<double>(problem.items[static_cast<size_t>(u)].act_bytes -
                                     problem.items[static_cast<size_t>(u)].out_bytes) /
                 kGiB;
      }
      why.push_back({"stop recomputing " + join(compact_patterns(unit_names(m, units), m.recompute_names)),
                     std::to_string(units.size()) + " " + kind + " units recomputed in the profiled recipe: keeping " +
                         "their activations costs " + fmt(extra, 2) + " GiB and saves " + fmt(ms) +
                         " ms; the activation peak stays " + fmt(act_peak_gib, 1) + " GiB within " +
                         fmt(act_budget_gib, 1) + " GiB",
                     {{"saved_ms", ms}, {"added_gib", extra}, {"units", static_cast<double>(units.size())}}});
    }
    if (added.empty() && removed.empty()) {
      why.push_back({"keep the profiled recompute selection",
                     "it is already the least-time selection within the budget at micro-batch " +
                         std::to_string(batch) + " (activation peak " + fmt(act_peak_gib, 1) + " of " +
                         fmt(act_budget_gib, 1) + " GiB)",
                     {{"activation_peak_gib", act_peak_gib}, {"activation_budget_gib", act_budget_gib}}});
    }
    (void)bb;
  }
  {
    std::vector<std::string> seen;
    const BatchOption* runner_up = nullptr;
    for (const BatchOption& bo : options) {
      seen.push_back(std::to_string(bo.batch) + (bo.feasible ? "" : " (does not fit)"));
      if (bo.feasible && bo.batch != batch &&
          (!runner_up || bo.prediction.samples_per_s > runner_up->prediction.samples_per_s))
        runner_up = &bo;
    }
    std::string reason = o.batch ? "--batch " + std::to_string(*o.batch)
                                 : "most predicted samples/s among batches " + join(seen) +
                                       " (each with its own least-time recompute set; a batch outside the "
                                       "profiled range must win by " +
                                       pct(kExtrapolationMargin) + ")";
    std::map<std::string, double> n = {{"micro_batch", static_cast<double>(batch)},
                                       {"predicted_samples_per_s", chosen.prediction.samples_per_s}};
    if (runner_up) {
      reason += "; next: batch " + std::to_string(runner_up->batch) + " at " +
                fmt(runner_up->prediction.samples_per_s, 2) + " samples/s";
      n["runner_up_micro_batch"] = static_cast<double>(runner_up->batch);
      n["runner_up_samples_per_s"] = runner_up->prediction.samples_per_s;
    }
    why.push_back({"micro-batch " + std::to_string(batch), reason, n});
  }

  // ---- 4. FP8. ----
  const double batch_scale = static_cast<double>(batch) / static_cast<double>(m.profiled_batch);
  auto fp8_for = [&](int64_t b, const std::vector<int>& recompute) {
    Fp8Options fo;
    fo.margin = o.fp8_margin;
    fo.noise_rel = m.noise_rel;
    fo.include = o.fp8_include;
    fo.exclude = o.fp8_exclude;
    fo.batch_scale = static_cast<double>(b) / static_cast<double>(m.profiled_batch);
    fo.recomputed = [&m, recompute](const std::string& fqn) { return inside_selection(m, recompute, fqn); };
    return solve_fp8_set(profile.gemms, fo);
  };
  const Fp8Selection fp8 = fp8_for(batch, selection);
  std::vector<int> fp8_chosen;
  for (const Fp8Verdict& v : fp8.verdicts)
    if (v.selected) fp8_chosen.push_back(v.gemm);
  if (o.fp8_auto) {
    for (const Fp8Verdict& v : fp8.verdicts) {
      std::map<std::string, double> n = {{"bf16_ms", v.bf16_ms}};
      if (v.fp8_ms > 0) {
        n["fp8_ms"] = v.fp8_ms;
        n["ratio"] = v.ratio;
        n["margin"] = fp8.effective_margin;
      }
      if (v.selected) n["saved_ms"] = v.saved_ms;
      why.push_back({std::string(v.selected ? "fp8 " : "bf16 ") + v.name, v.reason, n});
    }
    why.push_back(
        {"FP8: " + std::to_string(fp8_chosen.size()) + " of " + std::to_string(fp8.verdicts.size()) + " GEMMs",
         "--fp8 auto at micro-batch " + std::to_string(batch) + ", margin " + fmt(fp8.effective_margin, 3) + ": " +
             fmt(fp8.saved_ms, 2) + " ms saved per step",
         {{"saved_ms", fp8.saved_ms},
          {"selected_gemms", static_cast<double>(fp8_chosen.size())},
          {"margin", fp8.effective_margin}}});
  } else {
    why.push_back({"FP8 off",
                   "--fp8 off (the default); --fp8 auto would select " + std::to_string(fp8_chosen.size()) + " of " +
                       std::to_string(fp8.verdicts.size()) + " GEMMs for " + fmt(fp8.saved_ms, 2) +
                       " ms per step at margin " + fmt(fp8.effective_margin, 3),
                   {{"would_save_ms", fp8.saved_ms}, {"would_select_gemms", static_cast<double>(fp8_chosen.size())}}});
    fp8_chosen.clear();
  }
  (void)batch_scale;

  // ---- 5. Groups. ----
  double exposed = 0;
  Recipe recipe = base;
  if (comm.on) {
    const std::vector<CommPiece> pieces = comm_pieces(priced, batch, selection, base, measured_unit_bytes);
    const GroupPlan def = simulate_groups(pieces, default_groups(pieces), comm.options);
    GroupPlan best = solve_groups(pieces, comm.options);
    // The named units unless the change hides a measurable amount (0.05 ms or 1% of the exposed time).
    const bool keep_default = def.exposed_ms - best.exposed_ms < std::max(0.05, 0.01 * def.exposed_ms);
    if (keep_default) best = def;
    exposed = best.exposed_ms;
    recipe.groups = recipe_groups(pieces, best);
    std::vector<std::string> names;
    for (const auto& g : recipe.groups) names.push_back(g.name);
    why.push_back({"groups: " + std::to_string(recipe.groups.size()) + " (" + join(names) + ")",
                   std::string(keep_default ? "the named units: merging or splitting hides nothing measurable"
                                            : "merged/split so each all-reduce hides under the backward still to run") +
                       "; all-reduce " + fmt(best.comm_ms, 2) + " ms per step at " + fmt(comm.options.bus_gbps, 1) +
                       " GB/s bus bandwidth (" + comm.source + "), " + std::to_string(o.world_size) +
                       " GPUs; exposed " + fmt(best.exposed_ms, 2) + " ms (named units: " + fmt(def.exposed_ms, 2) +
                       " ms)",
                   {{"exposed_ms", best.exposed_ms},
                    {"default_exposed_ms", def.exposed_ms},
                    {"allreduce_ms", best.comm_ms},
                    {"allreduce_gbps", comm.options.bus_gbps},
                    {"groups", static_cast<double>(recipe.groups.size())}}});
  } else {
    why.push_back({"groups: the named units (default)",
                   "one GPU: no gradient all-reduce to hide; groups: [] keeps one group per named unit",
                   {}});
  }

  // ---- 6. Prediction, frontier, recipe. ----
  Choice plan_choice{batch, selection, fp8_chosen, {}, "plan"};
  plan_choice.prediction = predict(m, {batch, selection, fp8_chosen, exposed}, grad_accum, o.world_size);
  const std::vector<int> base_fp8 = profiled_fp8(profile);
  Choice profiled{m.profiled_batch, m.baseline_units, base_fp8, {}, "profiled"};
  profiled.prediction = predict(m, {m.profiled_batch, m.baseline_units, base_fp8, 0.0}, grad_accum, 1);

  std::vector<Choice> pool;
  auto fp8_list = [&](int64_t b, const std::vector<int>& rc) {
    std::vector<int> out;
    if (!o.fp8_auto) return out;
    for (const Fp8Verdict& v : fp8_for(b, rc).verdicts)
      if (v.selected) out.push_back(v.gemm);
    return out;
  };
  auto make_choice = [&](int64_t b, const std::vector<int>& rc, const std::string& origin) {
    Choice c{b, rc, fp8_list(b, rc), {}, origin};
    c.prediction = predict(m, {b, rc, c.fp8, comm_exposed(b, rc)}, grad_accum, o.world_size);
    return c;
  };
  for (const BatchOption& bo : options)
    if (bo.feasible) pool.push_back(make_choice(bo.batch, bo.recompute.best.chosen, "batch"));
  {
    const auto& front = chosen.recompute.frontier;
    const size_t keep = std::min<size_t>(8, front.size());
    for (size_t k = 0; k < keep; ++k) {
      const size_t idx = keep == 1 ? front.size() - 1 : k * (front.size() - 1) / (keep - 1);
      pool.push_back(make_choice(batch, front[idx].chosen, "frontier"));
    }
  }
  for (const Choice& c : pool) {
    why.push_back({"candidate: " + describe(m, c),
                   c.origin == "batch" ? "the least-time recompute set within the budget at this micro-batch"
                                       : "on the time/memory frontier at micro-batch " + std::to_string(batch),
                   candidate_numbers(c)});
  }
  {
    const Prediction& p = plan_choice.prediction;
    const Prediction& q = profiled.prediction;
    why.push_back({"predicted step " + fmt(p.step_ms) + " ms, peak " + fmt(p.peak_gib, 1) + " GiB, " +
                       fmt(p.samples_per_s, 2) + " samples/s",
                   "vs the profiled recipe at batch " + std::to_string(m.profiled_batch) + ": " + fmt(q.step_ms) +
                       " ms, " + fmt(q.peak_gib, 1) + " GiB, " + fmt(q.samples_per_s, 2) + " samples/s (" +
                       pct(p.samples_per_s / q.samples_per_s) + " samples/s); recompute " + fmt(p.recompute_ms) +
                       " ms, FP8 " + fmt(p.fp8_ms) + " ms, exposed communication " + fmt(p.comm_ms) +
                       " ms relative to it. Re-measure: vlatune train reports predicted vs measured",
                   {{"predicted_step_ms", p.step_ms},
                    {"predicted_peak_gib", p.peak_gib},
                    {"predicted_samples_per_s", p.samples_per_s},
                    {"micro_batch", static_cast<double>(batch)},
                    {"profiled_step_ms", q.step_ms},
                    {"profiled_peak_gib", q.peak_gib},
                    {"profiled_samples_per_s", q.samples_per_s}}});
  }

  PlanResult result;
  result.budget_gib = budget;
  result.baseline = profiled.prediction;
  result.baseline_batch = m.profiled_batch;
  result.predicted = plan_choice.prediction;
  result.recipe = make_recipe(recipe, m, plan_choice);
  result.recipe.rationale = why;

  // Ranked candidates for --grid: the plan, then the best distinct others by predicted samples/s.
  if (profiled.prediction.peak_gib <= budget) pool.push_back(profiled);
  std::stable_sort(pool.begin(), pool.end(), [](const Choice& a, const Choice& b) {
    return a.prediction.samples_per_s > b.prediction.samples_per_s;
  });
  std::set<std::string> hashes = {formats::recipe_hash(result.recipe)};
  result.candidates.push_back({result.recipe, result.predicted, describe(m, plan_choice) + " (the plan)"});
  for (const Choice& c : pool) {
    if (static_cast<int>(result.candidates.size()) >= o.candidates) break;
    Recipe r = c.origin == "profiled" ? profile.recipe : make_recipe(base, m, c);
    if (c.origin == "profiled") {
      r.optimizer = base.optimizer;
      r.rationale.clear();
      r.tuned_on = base.tuned_on;
      r.predicted = {c.prediction.step_ms, c.prediction.peak_gib, c.prediction.samples_per_s};
    } else {
      r.groups = recipe.groups;
    }
    if (!hashes.insert(formats::recipe_hash(r)).second) continue;
    const std::string summary = describe(m, c) + (c.origin == "profiled" ? " (the profiled recipe)" : "");
    r.rationale = {{"grid candidate", summary + ": ranked by predicted samples/s for `vlatune plan --grid`",
                    candidate_numbers(c)}};
    result.candidates.push_back({r, c.prediction, summary});
  }
  return result;
}

std::string format_explain(const PlanResult& r) {
  std::ostringstream os;
  const Recipe& recipe = r.recipe;
  os << "vlatune plan";
  if (recipe.tuned_on.profile) os << " from " << *recipe.tuned_on.profile;
  if (recipe.tuned_on.gpu)
    os << " (" << *recipe.tuned_on.gpu << (recipe.tuned_on.torch ? ", torch " + *recipe.tuned_on.torch : "") << ")";
  os << ", memory budget " << fmt(r.budget_gib, 1) << " GiB\n";
  std::vector<const Rationale*> frontier;
  for (const Rationale& x : recipe.rationale) {
    if (x.decision.rfind("candidate: ", 0) == 0) {
      frontier.push_back(&x);
      continue;
    }
    os << "- " << x.decision << "\n    " << x.reason << "\n";
    if (!x.numbers.empty()) {
      os << "    [";
      bool first = true;
      for (const auto& [k, v] : x.numbers) {
        os << (first ? "" : ", ") << k << " " << fmt(v, std::abs(v) < 10 ? 3 : 1);
        first = false;
      }
      os << "]\n";
    }
  }
  if (!frontier.empty()) {
    os << "candidates considered (predicted):\n";
    os << "   batch  recomputed   step ms   peak GiB   samples/s\n";
    for (const Rationale* x : frontier) {
      const auto& n = x->numbers;
      char line[160];
      std::snprintf(line, sizeof line, "  %6.0f  %10.0f  %8.1f  %9.1f  %10.2f\n", n.at("micro_batch"),
                    n.at("recomputed_modules"), n.at("predicted_step_ms"), n.at("predicted_peak_gib"),
                    n.at("predicted_samples_per_s"));
      os << line;
    }
  }
  os << "recipe: micro-batch " << recipe.batch.micro_batch << ", recompute [" << join(recipe.recompute.modules)
     << "], fp8 " << recipe.fp8.modules.size() << " patterns, " << recipe.groups.size() << " explicit groups\n";
  os << "predicted: step " << fmt(r.predicted.step_ms) << " ms, peak " << fmt(r.predicted.peak_gib, 1) << " GiB, "
     << fmt(r.predicted.samples_per_s, 2) << " samples/s; profiled baseline (batch " << r.baseline_batch
     << "): " << fmt(r.baseline.step_ms) << " ms, " << fmt(r.baseline.peak_gib, 1) << " GiB, "
     << fmt(r.baseline.samples_per_s, 2) << " samples/s (" << pct(r.predicted.samples_per_s / r.baseline.samples_per_s)
     << ")\n";
  return os.str();
}

}  // namespace vlatune::tuner
