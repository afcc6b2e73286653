#include "tuner/plan_steps.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "formats/fqn_pattern.h"
#include "formats/numbers.h"
#include "layout/pi05.h"
#include "tuner/fp8_selector.h"
#include "tuner/trainable_change.h"

namespace vlatune::tuner {

namespace {

using formats::fixed;
using formats::Rationale;
using formats::Recipe;

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

std::string pct(double ratio) {
  return formats::signed_pct(100 * (ratio - 1), 1);
}

std::vector<std::string> unit_names(const CostModel& m, const std::vector<int>& units) {
  std::vector<std::string> out;
  for (int i : units) out.push_back(m.units[static_cast<size_t>(i)].spec.aliases[0]);
  return out;
}

std::vector<int> profiled_fp8(const formats::Profile& p) {
  std::vector<int> out;
  for (size_t g = 0; g < p.gemms.size(); ++g)
    if (profiled_in_fp8(p, p.gemms[g])) out.push_back(static_cast<int>(g));
  return out;
}

Fp8Options fp8_options(const PlanInputs& in, const CostModel& m) {
  Fp8Options fo;
  fo.margin = in.options.fp8_margin;
  fo.noise_rel = m.noise_rel;
  fo.include = in.options.fp8_include;
  fo.exclude = in.options.fp8_exclude;
  return fo;
}

// The FP8 rule at a micro-batch and recompute set (GEMM times scale with M; a recomputed forward runs twice).
Fp8Selection solve_fp8_at(const PlanInputs& in, const CostModel& m, int64_t batch, const std::vector<int>& recompute) {
  Fp8Options fo = fp8_options(in, m);
  fo.batch_scale = static_cast<double>(batch) / static_cast<double>(m.profiled_batch);
  fo.recomputed = [&m, &recompute](const std::string& fqn) { return inside_selection(m, recompute, fqn); };
  return solve_fp8_set(in.profile.gemms, fo);
}

std::vector<int> selected_gemms(const Fp8Selection& fp8) {
  std::vector<int> out;
  for (const Fp8Verdict& v : fp8.verdicts)
    if (v.selected) out.push_back(v.gemm);
  return out;
}

// With --fp8 auto, the recompute solver prices each merged-GEMM output unit (the backbone gate+up) at the
// precision the FP8 rule gives its GEMM (a per-GEMM rule on measured times, decided here before the recompute set,
// the GEMM counted as recomputed): recomputing an FP8 GEMM costs its FP8 forward and its share of the casts.
// Predictions keep the profiled prices and add the FP8 change (predict()), which comes to the same number.
CostModel price_gemm_units(const PlanInputs& in, const CostModel& m) {
  CostModel out = m;
  if (!fp8_planned(in)) return out;
  Fp8Options fo = fp8_options(in, m);
  fo.recomputed = [](const std::string&) { return true; };
  std::set<int> fp8;
  for (const Fp8Verdict& v : solve_fp8_set(in.profile.gemms, fo).verdicts)
    if (v.selected) fp8.insert(v.gemm);
  const std::vector<int> profiled = profiled_fp8(in.profile);
  for (UnitModel& u : out.units) {
    if (u.gemm < 0 || !fp8.count(u.gemm) || std::count(profiled.begin(), profiled.end(), u.gemm)) continue;
    const formats::GemmEntry& e = in.profile.gemms[static_cast<size_t>(u.gemm)];
    if (!e.fp8 || !(e.bf16.forward_ms > 0) || !(e.fp8->total() > 0)) continue;
    const double fp8_ms = e.fp8->forward_ms + e.quant_ms.value_or(0.0) * e.fp8->forward_ms / e.fp8->total();
    const double factor = fp8_ms / e.bf16.forward_ms;
    u.recompute_ms.fixed *= factor;
    u.recompute_ms.per_sample *= factor;
    u.estimate += "; --fp8 auto runs its GEMM in FP8: priced at the FP8 forward + its quant_ms share, " +
                  fixed(fp8_ms, 2) + " ms";
  }
  return out;
}

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
  for (const layout::GroupPiece& gp : layout::group_pieces(m.module_fqns)) {
    CommPiece p{gp.name, gp.unit, gp.roots, 0, 0};
    const TrainableChange& t = m.trainable;
    for (const std::string& root : gp.roots) {
      if (!t.active || !formats::fqn_within_any(root, t.no_backward) || formats::fqn_within_any(root, t.kept))
        p.backward_ms += root_backward_ms(m, root, static_cast<double>(batch));
      // A frozen root has no gradient to reduce (LoRA adapters' few MB are left out).
      if (!t.active || !formats::fqn_within_any(root, t.frozen))
        p.grad_bytes += root_parameter_bytes(m, root) / param_elem * reduce_elem;
    }
    for (int u : recompute) {
      const std::string& name = m.units[static_cast<size_t>(u)].spec.aliases[0];
      if (formats::fqn_within_any(name, gp.roots)) p.backward_ms += problem.items[static_cast<size_t>(u)].cost_ms;
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
    g.modules = formats::compact_patterns(roots, universe);
    out.push_back(std::move(g));
  }
  return out;
}

// The rationale of one kind of unit the plan starts or stops recomputing.
struct KindChange {
  double ms = 0, gib = 0;  // added (start) or saved (stop) time; freed (start) or added (stop) memory
};
KindChange kind_change(const RecomputeProblem& problem, const std::vector<int>& units) {
  KindChange c;
  for (int u : units) {
    const RecomputeItem& item = problem.items[static_cast<size_t>(u)];
    c.ms += item.cost_ms;
    c.gib += static_cast<double>(item.act_bytes - item.out_bytes) / kGiB;
  }
  return c;
}

// The recompute decisions at the chosen batch: one per kind of unit added or removed, or "keep".
std::vector<Rationale> recompute_rationale(const FitStep& fit, const BatchOption& chosen, double budget_gib) {
  const CostModel& m = fit.model;
  RecomputeProblem problem;
  recompute_problem(fit.priced, chosen.batch, budget_gib, problem, chosen.grad_accum);
  const std::vector<int>& selection = chosen.recompute.best.chosen;
  const std::set<int> now(selection.begin(), selection.end());
  const std::set<int> before(m.baseline_units.begin(), m.baseline_units.end());
  std::map<std::string, std::vector<int>> added, removed;
  for (int u : now)
    if (!before.count(u)) added[m.units[static_cast<size_t>(u)].spec.kind].push_back(u);
  for (int u : before)  // a unit whose backward freezing removed is the freezing's decision, not recompute's
    if (!now.count(u) && !(m.trainable.active && m.trainable.unit_no_backward[static_cast<size_t>(u)]))
      removed[m.units[static_cast<size_t>(u)].spec.kind].push_back(u);
  const double act_peak_gib = static_cast<double>(chosen.recompute.best.peak_bytes) / kGiB;
  const double act_budget_gib = static_cast<double>(problem.budget_bytes) / kGiB;
  const std::string batch = std::to_string(chosen.batch);
  std::vector<Rationale> why;
  for (const auto& [kind, units] : added) {
    const KindChange c = kind_change(problem, units);
    const std::string& cal = m.units[static_cast<size_t>(units[0])].calibration;
    const std::string& estimate = fit.priced.units[static_cast<size_t>(units[0])].estimate;
    why.push_back(
        {"recompute " + join(formats::compact_patterns(unit_names(m, units), m.recompute_names)),
         std::to_string(units.size()) + " " + kind + " units: " + fixed(c.ms, 1) + " ms for " + fixed(c.gib, 2) +
             " GiB (" + fixed(c.gib > 0 ? c.ms / c.gib : 0, 2) +
             " ms per GiB saved); part of the least-time selection that keeps the activation peak " +
             fixed(act_peak_gib, 1) + " GiB within the " + fixed(act_budget_gib, 1) +
             " GiB the budget leaves at micro-batch " + batch +
             (cal.empty() ? " (uncalibrated estimate" + (estimate.empty() ? "" : "; per unit: " + estimate) + ")"
                          : " (calibrated by A/B '" + cal + "')"),
         {{"added_ms", c.ms},
          {"saved_gib", c.gib},
          {"ms_per_gib_saved", c.gib > 0 ? c.ms / c.gib : 0},
          {"units", static_cast<double>(units.size())}}});
  }
  for (const auto& [kind, units] : removed) {
    const KindChange c = kind_change(problem, units);
    why.push_back({"stop recomputing " + join(formats::compact_patterns(unit_names(m, units), m.recompute_names)),
                   std::to_string(units.size()) + " " + kind + " units recomputed in the profiled recipe: keeping " +
                       "their activations costs " + fixed(c.gib, 2) + " GiB and saves " + fixed(c.ms, 1) +
                       " ms; the activation peak stays " + fixed(act_peak_gib, 1) + " GiB within " +
                       fixed(act_budget_gib, 1) + " GiB",
                   {{"saved_ms", c.ms}, {"added_gib", c.gib}, {"units", static_cast<double>(units.size())}}});
  }
  if (added.empty() && removed.empty()) {
    why.push_back({"keep the profiled recompute selection",
                   "it is already the least-time selection within the budget at micro-batch " + batch +
                       " (activation peak " + fixed(act_peak_gib, 1) + " of " + fixed(act_budget_gib, 1) + " GiB)",
                   {{"activation_peak_gib", act_peak_gib}, {"activation_budget_gib", act_budget_gib}}});
  }
  return why;
}

// The micro-batch decision; when a feasible batch predicts more samples/s, the rule that passed it over.
Rationale batch_rationale(const PlanInputs& in, const RecomputeStep& step) {
  const BatchOption& chosen = step.choice();
  std::vector<std::string> seen;
  const BatchOption* runner_up = nullptr;
  for (const BatchOption& bo : step.options) {
    seen.push_back(std::to_string(bo.batch) + (bo.feasible ? "" : " (does not fit)"));
    if (bo.feasible && bo.batch != chosen.batch &&
        (!runner_up || bo.prediction.samples_per_s > runner_up->prediction.samples_per_s))
      runner_up = &bo;
  }
  const int world = in.options.world_size;
  const int64_t global = chosen.batch * chosen.grad_accum * world;
  std::string reason = in.options.batch ? "--batch " + std::to_string(*in.options.batch)
                                        : "most predicted samples/s among micro-batches " + join(seen) +
                                              " (each with its own least-time recompute set; a batch outside the "
                                              "profiled range must win by " +
                                              pct(kExtrapolationMargin) + ")";
  reason += in.global_batch > 0
                ? "; global batch " + std::to_string(global) + " kept: grad_accum " +
                      std::to_string(chosen.grad_accum) + " x micro-batch " + std::to_string(chosen.batch) + " x " +
                      std::to_string(world) + " GPU" + (world > 1 ? "s" : "") + " (the optimizer runs once per " +
                      std::to_string(chosen.grad_accum) + " micro-batches)"
                : "; grad_accum " + std::to_string(chosen.grad_accum) + " (the profiled recipe's): global batch " +
                      std::to_string(global);
  std::map<std::string, double> n = {{"micro_batch", static_cast<double>(chosen.batch)},
                                     {"grad_accum", static_cast<double>(chosen.grad_accum)},
                                     {"global_batch", static_cast<double>(global)},
                                     {"predicted_samples_per_s", chosen.prediction.samples_per_s}};
  if (runner_up) {
    reason += "; next: micro-batch " + std::to_string(runner_up->batch) + " at " +
              fixed(runner_up->prediction.samples_per_s, 2) + " samples/s";
    if (runner_up->prediction.samples_per_s > chosen.prediction.samples_per_s) {
      // choose_batch passes over a faster batch for one reason only.
      reason += ", more than batch " + std::to_string(chosen.batch) + " (" +
                pct(runner_up->prediction.samples_per_s / chosen.prediction.samples_per_s) + "), not chosen: batch " +
                std::to_string(runner_up->batch) +
                " lies outside the profiled batches, where the linear fit extrapolates, and an extrapolated batch is "
                "chosen only when it beats the best batch inside the profiled range by " +
                pct(kExtrapolationMargin);
    }
    n["runner_up_micro_batch"] = static_cast<double>(runner_up->batch);
    n["runner_up_samples_per_s"] = runner_up->prediction.samples_per_s;
  }
  return {batch_shape(chosen.batch, chosen.grad_accum), reason, n};
}

}  // namespace

bool fp8_planned(const PlanInputs& in) {
  return in.options.fp8_auto && in.fp8_unavailable.empty();
}

std::string batch_shape(int64_t micro_batch, int grad_accum) {
  return "micro-batch " + std::to_string(micro_batch) +
         (grad_accum > 1 ? " x grad_accum " + std::to_string(grad_accum) : "");
}

bool trainable_planned(const PlanInputs& in) {
  return !formats::is_default(in.options.freeze) || !formats::is_default(in.options.lora);
}

formats::StateDtype planned_state_dtype(const PlanInputs& in) {
  return in.options.optimizer_state.value_or(in.profile.recipe.optimizer.state_dtype);
}

Recipe base_recipe(const PlanInputs& in) {
  Recipe base = in.profile.recipe;
  base.optimizer.state_dtype = planned_state_dtype(in);
  if (trainable_planned(in)) {
    base.freeze = in.options.freeze;
    base.lora = in.options.lora;
  }
  base.rationale.clear();
  base.groups.clear();
  base.distributed.world_size = in.options.world_size;
  base.tuned_on = {in.profile.environment.gpu, in.profile.environment.torch,
                   in.options.profile_label.empty() ? std::optional<std::string>() : in.options.profile_label};
  return base;
}

FitStep fit_step(const PlanInputs& in) {
  FitStep out;
  out.model = build_cost_model(in.profile, in.file, in.options.recompute_candidates);
  const formats::StateDtype profiled_state = in.profile.recipe.optimizer.state_dtype;
  const formats::StateDtype state_dtype = planned_state_dtype(in);
  // The recipe keeps the profiled sharding (base_recipe): over the planned world size.
  const int shards = in.profile.recipe.distributed.shard_optimizer_state ? in.options.world_size : 1;
  const double state_delta_gib =
      plan_optimizer_state(out.model, state_dtype, shards);  // before pricing: `priced` copies it
  if (trainable_planned(in)) {
    const TrainableSelection selection =
        resolve_trainable(in.profile, in.options.freeze, in.options.lora, in.trainable_source);
    plan_trainable(out.model, selection, state_dtype, shards, in.trainable_source);
  }
  out.priced = price_gemm_units(in, out.model);
  const CostModel& m = out.model;
  const formats::BatchProfile& b0 = in.profile.batches[0];
  std::map<std::string, double> n = {{"profiled_batch", static_cast<double>(b0.batch)},
                                     {"profiled_step_ms", b0.step_ms},
                                     {"profiled_peak_gib", m.profiled_peak_gib},
                                     {"step_ms_per_sample", m.step_ms.per_sample},
                                     {"step_ms_fixed", m.step_ms.fixed},
                                     {"peak_gib_per_sample", m.peak_gib.per_sample},
                                     {"peak_gib_fixed", m.peak_gib.fixed},
                                     {"step_noise_pct", 100 * m.noise_rel}};
  std::string reason = "profiled " + std::to_string(b0.batch) + " samples: " + fixed(b0.step_ms, 1) + " ms, peak " +
                       fixed(m.profiled_peak_gib, 2) + " GiB";
  if (m.peak_source != "measured") reason += " " + m.peak_source;
  if (m.second_batch) {
    reason += "; with batch " + std::to_string(*m.second_batch) + ": step = " + fixed(m.step_ms.fixed, 1) + " + " +
              fixed(m.step_ms.per_sample, 2) + " ms x batch, peak = " + fixed(m.peak_gib.fixed, 2) + " + " +
              fixed(m.peak_gib.per_sample, 3) + " GiB x batch";
  } else {
    reason += "; one batch size only: time and memory scale in proportion to the batch";
  }
  reason += "; step noise " + fixed(100 * m.noise_rel, 2) + "% (MAD/median)";
  out.why.push_back({"cost model: linear in the micro-batch", reason, n});
  if (m.noise_rel > kHighNoiseRel) {
    const std::string warning =
        "high step noise: " + fixed(100 * m.noise_rel, 1) + "% (MAD/median of " +
        std::to_string(b0.step_ms_samples.size()) + " timed steps, above " + fixed(100 * kHighNoiseRel, 1) +
        "%): predictions closer than that cannot be told apart and the FP8 margin is raised to " +
        fixed(1 + 2 * m.noise_rel, 3) + "; profile again on an idle GPU, with more --timed-steps";
    out.warnings.push_back(warning);
    out.why.push_back({"warning: high step noise", warning, {{"step_noise_pct", 100 * m.noise_rel}}});
  }
  for (const Calibration& c : m.calibrations) {
    out.why.push_back({"calibrate recompute class '" + c.name + "' (" + std::to_string(c.units) + " units)",
                       std::string("A/B ") + (c.added ? "adding" : "removing") + " it measured " +
                           fixed(c.measured_step_ms_delta, 1) + " ms and " + fixed(c.measured_saved_gib, 2) +
                           " GiB saved vs the per-module estimate " + fixed(c.predicted_step_ms_delta, 1) + " ms and " +
                           fixed(c.predicted_saved_gib, 2) + " GiB: time x" + fixed(c.time_factor, 2) +
                           ", saved bytes x" + fixed(c.memory_factor, 2) +
                           (c.note.empty() ? "" : " (" + c.note.substr(0, c.note.find_last_not_of("; ") + 1) + ")"),
                       {{"measured_step_ms_delta", c.measured_step_ms_delta},
                        {"predicted_step_ms_delta", c.predicted_step_ms_delta},
                        {"time_factor", c.time_factor},
                        {"measured_saved_gib", c.measured_saved_gib},
                        {"predicted_saved_gib", c.predicted_saved_gib},
                        {"memory_factor", c.memory_factor}}});
  }
  for (const std::string& note : m.notes) out.why.push_back({"cost model note", note, {}});
  if (m.trainable.active) {
    const TrainableChange& t = m.trainable;
    std::vector<std::string> what;
    for (formats::FreezePreset p : in.options.freeze.presets)
      what.push_back(std::string("freeze ") + formats::to_string(p));
    if (!in.options.freeze.modules.empty()) what.push_back("freeze " + join(in.options.freeze.modules));
    if (in.options.lora.preset) what.push_back(std::string("lora ") + formats::to_string(*in.options.lora.preset));
    if (!in.options.lora.targets.empty()) what.push_back("lora targets");
    out.why.push_back(
        {"trains: " + join(what),
         in.trainable_source + ": " + describe_trainable(m, static_cast<double>(m.profiled_batch)),
         {{"frozen_parameters", t.frozen_numel},
          {"adapter_parameters", t.adapter_numel},
          {"training_state_delta_gib", t.state_delta_gib},
          {"backward_removed_ms", t.backward_removed_ms.at(static_cast<double>(m.profiled_batch))},
          {"activation_removed_gib", t.activation_removed_bytes.at(static_cast<double>(m.profiled_batch)) / kGiB},
          {"frozen_gemm_ms", t.gemm_removed_ms},
          {"adapter_ms_estimate", t.adapter_ms},
          {"optimizer_ms", t.optimizer_ms}}});
  }
  if (state_dtype != profiled_state) {
    out.why.push_back({std::string("optimizer state ") + formats::to_string(state_dtype),
                       in.state_source + ": AdamW's moments " + fixed(state_delta_gib, 2) +
                           " GiB against the profiled " + formats::to_string(profiled_state) +
                           " state, at every micro-batch",
                       {{"optimizer_delta_gib", state_delta_gib}}});
  }
  return out;
}

CommSetup comm_setup(const PlanInputs& in) {
  const PlanOptions& o = in.options;
  const formats::Profile& profile = in.profile;
  CommSetup comm;
  if (o.world_size <= 1) return comm;
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
  // Bytes per named unit as measured (the profiled groups are named units when the profile ran the default groups).
  if (profile.communication && profile.communication->world_size == o.world_size)
    for (const auto& g : profile.communication->groups) comm.measured_unit_bytes[g.name] = static_cast<double>(g.bytes);
  return comm;
}

ExposedMs exposed_ms(const CommSetup& comm, const CostModel& priced, const Recipe& base) {
  return [&comm, &priced, &base](int64_t batch, const std::vector<int>& recompute) {
    if (!comm.on) return 0.0;
    const std::vector<CommPiece> pieces = comm_pieces(priced, batch, recompute, base, comm.measured_unit_bytes);
    return solve_groups(pieces, comm.options).exposed_ms;
  };
}

double RecomputeStep::min_peak_gib() const {
  double least = std::numeric_limits<double>::infinity();
  for (const BatchOption& bo : options) least = std::min(least, bo.min_peak_gib);
  return least;
}

RecomputeStep recompute_step(const PlanInputs& in, const FitStep& fit, double budget_gib, const ExposedMs& exposed) {
  RecomputeStep out;
  const PlanOptions& o = in.options;
  const std::vector<BatchShape> shapes =
      in.global_batch > 0 ? dividing_batches(fit.model, in.global_batch / o.world_size, o.batch)
                          : candidate_batches(fit.model, o.batch, std::max(1, in.profile.recipe.batch.grad_accum));
  out.options = evaluate_batches(fit.priced, budget_gib, shapes, o.world_size, exposed);
  out.chosen = choose_batch(fit.priced, out.options);
  if (!out.feasible()) return out;
  out.why = recompute_rationale(fit, out.choice(), budget_gib);
  out.why.push_back(batch_rationale(in, out));
  return out;
}

std::string does_not_fit(const RecomputeStep& step, double budget_gib) {
  if (step.options.empty()) return "no micro-batch to try";
  const BatchOption* least = &step.options.front();
  for (const BatchOption& bo : step.options)
    if (bo.min_peak_gib < least->min_peak_gib) least = &bo;
  const std::string what =
      least->grad_accum > 1 ? batch_shape(least->batch, least->grad_accum) : "batch " + std::to_string(least->batch);
  return "memory budget " + fixed(budget_gib, 1) +
         " GiB (5% of the GPU or of --memory-budget left to the allocator) is below what " + what +
         " needs even recomputing every candidate: " + fixed(least->min_peak_gib, 1) + " GiB (of which " +
         fixed(least->at.other_gib, 1) +
         " GiB do not depend on recompute: parameters, gradients, optimizer state, non-candidate activations)";
}

std::vector<int> fp8_selection(const PlanInputs& in, const CostModel& model, int64_t batch,
                               const std::vector<int>& recompute) {
  return fp8_planned(in) ? selected_gemms(solve_fp8_at(in, model, batch, recompute)) : std::vector<int>{};
}

Fp8Step fp8_step(const PlanInputs& in, const CostModel& m, int64_t batch, const std::vector<int>& recompute) {
  const Fp8Selection fp8 = solve_fp8_at(in, m, batch, recompute);
  Fp8Step out;
  out.gemms = selected_gemms(fp8);
  const std::string selected = std::to_string(out.gemms.size()) + " of " + std::to_string(fp8.verdicts.size());
  if (!in.fp8_unavailable.empty()) {
    out.why.push_back({"FP8 off", in.fp8_unavailable, {}});
    out.gemms.clear();
    return out;
  }
  if (!in.options.fp8_auto) {
    out.why.push_back(
        {"FP8 off",
         "--fp8 off (the default); --fp8 auto would select " + selected + " GEMMs for " + fixed(fp8.saved_ms, 2) +
             " ms per step at margin " + fixed(fp8.effective_margin, 3),
         {{"would_save_ms", fp8.saved_ms}, {"would_select_gemms", static_cast<double>(out.gemms.size())}}});
    out.gemms.clear();
    return out;
  }
  for (const Fp8Verdict& v : fp8.verdicts) {
    std::map<std::string, double> n = {{"bf16_ms", v.bf16_ms}};
    if (v.fp8_ms > 0) {
      n["fp8_ms"] = v.fp8_ms;
      n["ratio"] = v.ratio;
      n["margin"] = fp8.effective_margin;
    }
    if (v.selected) n["saved_ms"] = v.saved_ms;
    out.why.push_back({std::string(v.selected ? "fp8 " : "bf16 ") + v.name, v.reason, n});
  }
  out.why.push_back({"FP8: " + selected + " GEMMs",
                     "--fp8 auto at micro-batch " + std::to_string(batch) + ", margin " +
                         fixed(fp8.effective_margin, 3) + ": " + fixed(fp8.saved_ms, 2) + " ms saved per step",
                     {{"saved_ms", fp8.saved_ms},
                      {"selected_gemms", static_cast<double>(out.gemms.size())},
                      {"margin", fp8.effective_margin}}});
  if (!out.gemms.empty())
    out.why.push_back({"fp8.gemm_algorithm timed",
                       "each FP8 GEMM problem runs the fastest of cuBLASLt's first 8 heuristic candidates, timed on "
                       "its first call (1.3-1.5% faster FP8 steps than the heuristic's first choice on the H200); the "
                       "profile timed the first choice, so the predicted step errs on the slow side",
                       {}});
  return out;
}

GroupsStep groups_step(const PlanInputs& in, const CostModel& priced, const CommSetup& comm, const Recipe& base,
                       int64_t batch, const std::vector<int>& recompute) {
  GroupsStep out;
  if (!comm.on) {
    out.why.push_back({"groups: the named units (default)",
                       "one GPU: no gradient all-reduce to hide; groups: [] keeps one group per named unit",
                       {}});
    return out;
  }
  const std::vector<CommPiece> pieces = comm_pieces(priced, batch, recompute, base, comm.measured_unit_bytes);
  const GroupPlan def = simulate_groups(pieces, default_groups(pieces), comm.options);
  GroupPlan best = solve_groups(pieces, comm.options);
  // The named units unless the change hides a measurable amount (0.05 ms or 1% of the exposed time).
  const bool keep_default = def.exposed_ms - best.exposed_ms < std::max(0.05, 0.01 * def.exposed_ms);
  if (keep_default) best = def;
  out.exposed_ms = best.exposed_ms;
  out.groups = recipe_groups(pieces, best);
  std::vector<std::string> names;
  for (const auto& g : out.groups) names.push_back(g.name);
  out.why.push_back(
      {"groups: " + std::to_string(out.groups.size()) + " (" + join(names) + ")",
       std::string(keep_default ? "the named units: merging or splitting hides nothing measurable"
                                : "merged/split so each all-reduce hides under the backward still to run") +
           "; all-reduce " + fixed(best.comm_ms, 2) + " ms per step at " + fixed(comm.options.bus_gbps, 1) +
           " GB/s bus bandwidth (" + comm.source + "), " + std::to_string(in.options.world_size) + " GPUs; exposed " +
           fixed(best.exposed_ms, 2) + " ms (named units: " + fixed(def.exposed_ms, 2) + " ms)",
       {{"exposed_ms", best.exposed_ms},
        {"default_exposed_ms", def.exposed_ms},
        {"allreduce_ms", best.comm_ms},
        {"allreduce_gbps", comm.options.bus_gbps},
        {"groups", static_cast<double>(out.groups.size())}}});
  return out;
}

}  // namespace vlatune::tuner
