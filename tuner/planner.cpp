#include "tuner/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"
#include "formats/numbers.h"
#include "layout/pi05.h"
#include "tuner/plan_steps.h"
#include "tuner/plan_variants.h"

namespace vlatune::tuner {

namespace {

using formats::fixed;
using formats::Rationale;
using formats::Recipe;

// How a candidate's rationale says why it is not the plan although it predicts more samples/s.
constexpr const char* kNotThePlan = "; not the plan: ";

std::string pct(double ratio) {
  return formats::signed_pct(100 * (ratio - 1), 1);
}

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// ---- Flags that need no profile ----

void check_flags(const PlanOptions& o) {
  if (o.world_size < 1) throw PlanInputError("--world-size: must be >= 1");
  if (o.batch && *o.batch < 1) throw PlanInputError("--batch: must be >= 1 or 'auto'");
  if (o.global_batch && (*o.global_batch < 1 || *o.global_batch > 1048576))
    throw PlanInputError("--global-batch: must be in 1..1048576 (the recipe's size range)");
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
}

// ---- Recipe patterns ----

std::vector<std::string> recompute_patterns(const CostModel& m, const std::vector<int>& units) {
  std::vector<std::string> names;
  for (int i : units) names.push_back(m.units[static_cast<size_t>(i)].spec.aliases[0]);
  std::vector<std::string> patterns = formats::compact_patterns(names, m.recompute_names);
  // The compact form must select exactly the chosen units (and never nest): check it as the trainer would.
  std::vector<std::string> back =
      formats::resolve_patterns(patterns, m.recompute_names, "<plan>", "$.recompute.modules");
  std::sort(back.begin(), back.end());
  std::sort(names.begin(), names.end());
  if (back != names) throw std::logic_error("plan: recompute patterns do not reproduce the selection");
  return patterns;
}

std::vector<std::string> fp8_patterns(const formats::Profile& p, const std::vector<int>& gemms) {
  std::vector<std::string> members, universe;
  for (int g : gemms) {
    const auto& m = p.gemms[static_cast<size_t>(g)].members;
    members.insert(members.end(), m.begin(), m.end());
  }
  for (const auto& g : p.gemms) universe.insert(universe.end(), g.members.begin(), g.members.end());
  return formats::compact_patterns(members, universe);
}

// ---- Candidates ----

struct Choice {
  int64_t batch = 0;
  int grad_accum = 1;
  std::vector<int> recompute;
  std::vector<int> fp8;
  Prediction prediction;
  std::string origin;  // "plan", "batch", "frontier", "profiled"
  bool same_as(const Choice& o) const {
    return batch == o.batch && grad_accum == o.grad_accum && recompute == o.recompute && fp8 == o.fp8;
  }
};

std::string describe(const CostModel& m, const Choice& c) {
  std::map<std::string, int> kinds;
  for (int u : c.recompute) kinds[m.units[static_cast<size_t>(u)].spec.kind]++;
  std::vector<std::string> parts;
  for (const auto& [kind, n] : kinds) parts.push_back(std::to_string(n) + " " + kind);
  return batch_shape(c.batch, c.grad_accum) + ", recompute " + (parts.empty() ? "nothing" : join(parts)) + ", " +
         std::to_string(c.fp8.size()) + " FP8 GEMMs";
}

Recipe make_recipe(const Recipe& base, const CostModel& m, const Choice& c) {
  Recipe r = base;
  r.batch.micro_batch = static_cast<int>(c.batch);
  r.batch.grad_accum = c.grad_accum;
  r.recompute.modules = recompute_patterns(m, c.recompute);
  r.fp8.modules = fp8_patterns(m.profile, c.fp8);
  // Delayed scaling when FP8 is chosen: on the H200 it trained 67.7-68.3 samples/s against 63.8-64.7 for current
  // scaling at batch 32, and both passed the 200-step numerics gate (bench/RESULTS.md).
  if (!r.fp8.modules.empty()) r.fp8.scaling = formats::Fp8Scaling::kDelayed;
  // Timed cuBLASLt algorithms for the FP8 GEMMs: the fastest of the heuristic's first 8 candidates beat its first
  // choice by 1.3-1.5% of the FP8 step on the H200 (bench/RESULTS.md, 2026-12-03, seventh session); the profile's
  // GEMM timings are the first choice's, so the prediction errs on the slow side.
  r.fp8.gemm_algorithm =
      r.fp8.modules.empty() ? formats::Fp8GemmAlgorithm::kHeuristic : formats::Fp8GemmAlgorithm::kTimed;
  // Blocks keep an FP8 down projection's input: without one the trainer refuses the key.
  const bool fp8_down = std::any_of(c.fp8.begin(), c.fp8.end(), [&](int g) {
    const auto& members = m.profile.gemms[static_cast<size_t>(g)].members;
    return std::any_of(members.begin(), members.end(), layout::geglu_down_projection);
  });
  if (!fp8_down) r.fp8.saved_geglu_inputs = formats::SavedGegluInputs::kBf16;
  r.predicted.step_ms = c.prediction.step_ms;
  r.predicted.peak_gib = c.prediction.peak_gib;
  r.predicted.samples_per_s = c.prediction.samples_per_s;
  return r;
}

// The numbers of a candidate's rationale entry: the report plots predicted_step_ms against predicted_peak_gib
// and highlights the entry with chosen = 1 (reports/report.h).
std::map<std::string, double> candidate_numbers(const Choice& c, bool chosen) {
  std::map<std::string, double> n = {{"predicted_step_ms", c.prediction.step_ms},
                                     {"predicted_peak_gib", c.prediction.peak_gib},
                                     {"micro_batch", static_cast<double>(c.batch)},
                                     {"grad_accum", static_cast<double>(c.grad_accum)},
                                     {"predicted_samples_per_s", c.prediction.samples_per_s},
                                     {"recomputed_modules", static_cast<double>(c.recompute.size())}};
  if (chosen) n["chosen"] = 1;
  return n;
}

// Why a candidate that predicts more samples/s than the plan is not the plan: the rule that decided.
std::string passed_over(const CostModel& m, const RecomputeStep& rc, const Choice& c, double budget_gib) {
  if (c.prediction.peak_gib > budget_gib + 1e-9)
    return "its predicted peak " + fixed(c.prediction.peak_gib, 1) + " GiB is over the " + fixed(budget_gib, 1) +
           " GiB budget";
  const BatchOption& chosen = rc.choice();
  if (c.batch != chosen.batch || c.grad_accum != chosen.grad_accum) {
    for (const BatchOption& bo : rc.options) {
      if (bo.batch != c.batch || !bo.feasible) continue;
      if (bo.prediction.samples_per_s > chosen.prediction.samples_per_s && !in_profiled_range(m, c.batch))
        return "outside the profiled batches the linear fit extrapolates: an extrapolated batch is chosen only when "
               "it beats the best batch inside the profiled range by " +
               pct(kExtrapolationMargin);
    }
    return "the micro-batch is chosen by its recompute set alone (step 3), before FP8 and the groups, which "
           "make this batch the faster one";
  }
  return "at micro-batch " + std::to_string(c.batch) +
         " the plan takes the least-time recompute set within the budget; this one is faster only through its FP8 "
         "set or communication, decided afterwards";
}

// ---- 6. Prediction, candidates, recipe ----

PlanResult rank(const PlanInputs& in, const FitStep& fit, const TargetStep& target, const Recipe& base,
                const RecomputeStep& rc, const Fp8Step& fp8, const GroupsStep& groups, const ExposedMs& exposed,
                std::vector<Rationale> why) {
  const CostModel& m = fit.model;
  const PlanOptions& o = in.options;
  const BatchOption& chosen = rc.choice();
  Choice plan_choice{chosen.batch, chosen.grad_accum, chosen.recompute.best.chosen, fp8.gemms, {}, "plan"};
  plan_choice.prediction = predict(m, {chosen.batch, plan_choice.recompute, plan_choice.fp8, groups.exposed_ms},
                                   chosen.grad_accum, o.world_size);
  std::vector<int> base_fp8;
  for (size_t g = 0; g < in.profile.gemms.size(); ++g)
    if (profiled_in_fp8(in.profile, in.profile.gemms[g])) base_fp8.push_back(static_cast<int>(g));
  const int profiled_accum = m.profiled_grad_accum;
  // The profiled recipe as it ran: the model without the planned changes to what trains and how (optimizer state,
  // freezing, LoRA), so the comparison is with what the profile measured and the deltas below add up from it.
  CostModel as_profiled = m;
  as_profiled.optimizer_delta_gib = 0;
  as_profiled.trainable = TrainableChange{};
  Choice profiled{m.profiled_batch, profiled_accum, m.baseline_units, base_fp8, {}, "profiled"};
  profiled.prediction = predict(as_profiled, {m.profiled_batch, m.baseline_units, base_fp8, 0.0}, profiled_accum, 1);

  // The candidates: each batch's least-time set, and points of the chosen batch's time/memory frontier.
  std::vector<Choice> pool;
  auto make_choice = [&](int64_t b, int accum, const std::vector<int>& recompute, const std::string& origin) {
    Choice c{b, accum, recompute, fp8_selection(in, m, b, recompute), {}, origin};
    c.prediction = predict(m, {b, recompute, c.fp8, exposed(b, recompute)}, accum, o.world_size);
    return c;
  };
  for (const BatchOption& bo : rc.options)
    if (bo.feasible) pool.push_back(make_choice(bo.batch, bo.grad_accum, bo.recompute.best.chosen, "batch"));
  {
    const auto& front = chosen.recompute.frontier;
    const size_t keep = std::min<size_t>(8, front.size());
    for (size_t k = 0; k < keep; ++k) {
      const size_t idx = keep == 1 ? front.size() - 1 : k * (front.size() - 1) / (keep - 1);
      pool.push_back(make_choice(chosen.batch, chosen.grad_accum, front[idx].chosen, "frontier"));
    }
  }
  bool marked = false;
  for (const Choice& c : pool) {
    const bool is_plan = !marked && c.same_as(plan_choice);
    marked = marked || is_plan;
    std::string reason = c.origin == "batch" ? "the least-time recompute set within the budget at this micro-batch"
                                             : "on the time/memory frontier at micro-batch " + std::to_string(c.batch);
    if (!is_plan && c.prediction.samples_per_s > plan_choice.prediction.samples_per_s + 1e-9)
      reason += kNotThePlan + passed_over(m, rc, c, target.budget_gib);
    why.push_back({"candidate: " + describe(m, c), reason, candidate_numbers(c, is_plan)});
  }
  {
    const Prediction& p = plan_choice.prediction;
    const Prediction& q = profiled.prediction;
    why.push_back({"predicted step " + fixed(p.step_ms, 1) + " ms, peak " + fixed(p.peak_gib, 1) + " GiB, " +
                       fixed(p.samples_per_s, 2) + " samples/s",
                   "vs the profiled recipe as measured at " + batch_shape(m.profiled_batch, profiled_accum) + ": " +
                       fixed(q.step_ms, 1) + " ms, " + fixed(q.peak_gib, 1) + " GiB, " + fixed(q.samples_per_s, 2) +
                       " samples/s (" + pct(p.samples_per_s / q.samples_per_s) + " samples/s); recompute " +
                       fixed(p.recompute_ms, 1) + " ms, FP8 " + fixed(p.fp8_ms, 1) + " ms" +
                       (m.trainable.active ? ", freezing/LoRA " + fixed(p.trainable_ms, 1) + " ms" : "") +
                       ", exposed communication " + fixed(p.comm_ms, 1) +
                       " ms relative to it. Re-measure: vlatune train reports predicted vs measured" +
                       (target.timed_on ? "; times are " + *target.timed_on + "'s (the profiled GPU)" : ""),
                   // Not predicted_step_ms / predicted_peak_gib: those mark a candidate, and this is the plan's
                   // candidate again (the report would draw it twice).
                   {{"step_ms", p.step_ms},
                    {"peak_gib", p.peak_gib},
                    {"samples_per_s", p.samples_per_s},
                    {"micro_batch", static_cast<double>(chosen.batch)},
                    {"grad_accum", static_cast<double>(chosen.grad_accum)},
                    {"profiled_step_ms", q.step_ms},
                    {"profiled_peak_gib", q.peak_gib},
                    {"profiled_samples_per_s", q.samples_per_s}}});
  }

  PlanResult result;
  result.budget_gib = target.budget_gib;
  result.global_batch = chosen.batch * chosen.grad_accum * o.world_size;
  result.timed_on = target.timed_on;
  result.baseline = profiled.prediction;
  result.baseline_batch = m.profiled_batch;
  result.predicted = plan_choice.prediction;
  result.warnings = fit.warnings;
  Recipe recipe = base;
  recipe.groups = groups.groups;
  result.recipe = make_recipe(recipe, m, plan_choice);
  result.recipe.rationale = std::move(why);

  // Ranked candidates for --grid: the plan, then the best distinct others by predicted samples/s. The profiled
  // recipe among them when it fits, trains the kept global batch and runs on the target.
  const bool profiled_same_batch =
      in.global_batch == 0 || m.profiled_batch * profiled_accum * o.world_size == in.global_batch;
  const bool profiled_runs = base_fp8.empty() || in.fp8_unavailable.empty();
  if (profiled.prediction.peak_gib <= target.budget_gib && profiled_same_batch && profiled_runs)
    pool.push_back(profiled);
  std::stable_sort(pool.begin(), pool.end(), [](const Choice& a, const Choice& b) {
    return a.prediction.samples_per_s > b.prediction.samples_per_s;
  });
  std::set<std::string> hashes = {formats::recipe_hash(result.recipe)};
  result.candidates.push_back({result.recipe, result.predicted, describe(m, plan_choice) + " (the plan)"});
  for (const Choice& c : pool) {
    if (static_cast<int>(result.candidates.size()) >= o.candidates) break;
    Recipe r = c.origin == "profiled" ? in.profile.recipe : make_recipe(base, m, c);
    if (c.origin == "profiled") {
      r.optimizer = base.optimizer;  // its prediction is priced with the planned state and training
      r.freeze = base.freeze;
      r.lora = base.lora;
      if (m.trainable.active) r.recompute.modules = recompute_patterns(m, c.recompute);
      r.rationale.clear();
      r.tuned_on = base.tuned_on;
      r.predicted = {c.prediction.step_ms, c.prediction.peak_gib, c.prediction.samples_per_s};
    } else {
      r.groups = groups.groups;
    }
    if (!hashes.insert(formats::recipe_hash(r)).second) continue;
    const std::string summary = describe(m, c) + (c.origin == "profiled" ? " (the profiled recipe)" : "");
    r.rationale = {{"grid candidate", summary + ": ranked by predicted samples/s for `vlatune plan --grid`",
                    candidate_numbers(c, false)}};
    result.candidates.push_back({r, c.prediction, summary});
  }
  return result;
}

template <typename Step>
void append(std::vector<Rationale>& why, const Step& step) {
  why.insert(why.end(), step.why.begin(), step.why.end());
}

}  // namespace

PlanResult plan(const formats::Profile& profile, const std::string& file, const PlanOptions& o) {
  check_flags(o);
  if (profile.settings.workload != "train")
    throw formats::FormatError(file, "$.settings.workload",
                               "\"" + profile.settings.workload +
                                   "\": plan needs a training profile (`vlatune profile` without --inference); this "
                                   "one times sampled action chunks, not optimizer steps");
  for (const auto& [change, key, used] :
       {std::tuple{AllowedChange::kFreeze, "$.recipe.freeze", !formats::is_default(profile.recipe.freeze)},
        std::tuple{AllowedChange::kLora, "$.recipe.lora", !formats::is_default(profile.recipe.lora)}}) {
    if (o.allow.count(change) && used)
      throw PlanInputError("--allow " + to_string(change) + ": the profiled recipe already sets " + key + " in " +
                           file + "; freezing and LoRA are priced against full training: profile a recipe without " +
                           "freeze and lora to plan them");
  }
  const TargetStep target = target_step(profile, o);  // 1
  const GlobalBatch global = stated_global_batch(profile, o, !o.allow.count(AllowedChange::kGlobalBatch));
  const PlanInputs stated_in{profile, file, o, global.samples, target.fp8_unavailable};
  const CommSetup comm = comm_setup(stated_in);

  // Steps 2-3 for the stated training and for each change --allow permits; the rest only on failure, to say which
  // --allow choice would fit.
  std::vector<std::unique_ptr<Planned>> planned;
  std::vector<Variant> others;
  std::vector<std::string> unpriced;  // allowed changes the profile cannot price
  for (Variant& v : training_variants(profile, o, global)) {
    if (!std::includes(o.allow.begin(), o.allow.end(), v.uses.begin(), v.uses.end())) {
      others.push_back(std::move(v));
      continue;
    }
    if (v.uses.empty()) {
      planned.push_back(std::make_unique<Planned>(std::move(v), profile, file, target, comm));
      continue;
    }
    const std::string flag = allow_flag(v.uses);
    try {
      planned.push_back(std::make_unique<Planned>(std::move(v), profile, file, target, comm));
    } catch (const PlanInputError& e) {
      unpriced.push_back(flag + ": not considered: " + e.what());
    }
  }
  // The stated training unless an allowed change fits where it does not, or is faster. A variant that comes out the
  // same training (any global batch choosing the stated one) is taken at a tie: its rationale shows more candidates.
  // Of the variants that change what trains, only those changing it least (freezing less beats freezing more).
  int least_level = 0;
  for (const auto& p : planned) {
    const int level = trainable_level(p->variant);
    if (p->rc.feasible() && level > 0 && (least_level == 0 || level < least_level)) least_level = level;
  }
  const Planned* pick = nullptr;
  for (const auto& p : planned) {
    if (!p->rc.feasible() || trainable_level(p->variant) > least_level) continue;
    const bool faster = !pick || p->samples_per_s() > pick->samples_per_s() * (1 + 1e-9);
    const bool same = pick && p->samples_per_s() >= pick->samples_per_s() * (1 - 1e-9) &&
                      changes_made(*p, global, profile, o).empty();
    if (faster || same) pick = p.get();
  }
  if (!pick) throw PlanInputError(nothing_fits(planned, others, profile, file, target, comm));

  std::vector<Rationale> why = allowed_change_rationale(*pick, planned, global, target.budget_gib);
  append(why, target);
  append(why, pick->fit);  // 2
  append(why, pick->rc);   // 3
  const PlanInputs& in = pick->in;
  const BatchOption& chosen = pick->rc.choice();
  const Fp8Step fp8 = fp8_step(in, pick->fit.model, chosen.batch, chosen.recompute.best.chosen);  // 4
  append(why, fp8);
  const GroupsStep groups =
      groups_step(in, pick->fit.priced, comm, pick->base, chosen.batch, chosen.recompute.best.chosen);  // 5
  append(why, groups);
  PlanResult result =
      rank(in, pick->fit, target, pick->base, pick->rc, fp8, groups, pick->exposed, std::move(why));  // 6
  result.used = changes_made(*pick, global, profile, o);
  result.warnings.insert(result.warnings.end(), unpriced.begin(), unpriced.end());
  return result;
}

std::string format_explain(const PlanResult& r) {
  std::ostringstream os;
  const Recipe& recipe = r.recipe;
  os << "vlatune plan";
  if (recipe.tuned_on.profile) os << " from " << *recipe.tuned_on.profile;
  if (recipe.tuned_on.gpu)
    os << " (" << *recipe.tuned_on.gpu << (recipe.tuned_on.torch ? ", torch " + *recipe.tuned_on.torch : "") << ")";
  os << ", memory budget " << fixed(r.budget_gib, 1) << " GiB, global batch " << r.global_batch << "\n";
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
        os << (first ? "" : ", ") << k << " " << fixed(v, std::abs(v) < 10 ? 3 : 1);
        first = false;
      }
      os << "]\n";
    }
  }
  if (!frontier.empty()) {
    os << "candidates considered (predicted; * = the plan):\n";
    os << "    batch  accum  recomputed   step ms   peak GiB   samples/s\n";
    // Candidates that predict more than the plan, grouped by the rule that passed them over.
    std::vector<std::pair<std::string, std::vector<std::string>>> passed;
    for (const Rationale* x : frontier) {
      const auto& n = x->numbers;
      const bool chosen = n.count("chosen") && n.at("chosen") != 0;
      char line[160];
      std::snprintf(line, sizeof line, "  %s %6.0f  %5.0f  %10.0f  %8.1f  %9.1f  %10.2f\n", chosen ? "*" : " ",
                    n.at("micro_batch"), n.count("grad_accum") ? n.at("grad_accum") : 1.0, n.at("recomputed_modules"),
                    n.at("predicted_step_ms"), n.at("predicted_peak_gib"), n.at("predicted_samples_per_s"));
      os << line;
      const size_t why_not = x->reason.find(kNotThePlan);
      if (why_not == std::string::npos) continue;
      const std::string rule = x->reason.substr(why_not + std::string(kNotThePlan).size());
      auto it = std::find_if(passed.begin(), passed.end(), [&](const auto& p) { return p.first == rule; });
      if (it == passed.end()) it = passed.insert(passed.end(), {rule, {}});
      it->second.push_back("batch " + fixed(n.at("micro_batch"), 0) + " (" + fixed(n.at("predicted_samples_per_s"), 2) +
                           ")");
    }
    for (const auto& [rule, which] : passed)
      os << "  more samples/s than the plan, not chosen: " << join(which) << ": " << rule << "\n";
  }
  os << "recipe: micro-batch " << recipe.batch.micro_batch << " x grad_accum " << recipe.batch.grad_accum
     << ", recompute [" << join(recipe.recompute.modules) << "], fp8 " << recipe.fp8.modules.size() << " patterns, "
     << recipe.groups.size() << " explicit groups\n";
  os << "predicted: step " << fixed(r.predicted.step_ms, 1) << " ms, peak " << fixed(r.predicted.peak_gib, 1)
     << " GiB, " << fixed(r.predicted.samples_per_s, 2) << " samples/s; profiled baseline (batch " << r.baseline_batch
     << "): " << fixed(r.baseline.step_ms, 1) << " ms, " << fixed(r.baseline.peak_gib, 1) << " GiB, "
     << fixed(r.baseline.samples_per_s, 2) << " samples/s ("
     << pct(r.predicted.samples_per_s / r.baseline.samples_per_s) << ")\n";
  if (r.timed_on)
    os << "times are " << *r.timed_on << "'s (the profiled GPU); the peak transfers to the target GPU, the time does "
       << "not\n";
  return os.str();
}

}  // namespace vlatune::tuner
