// build_cost_model, one function per step (cost_model.h says what the model assumes).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"
#include "formats/numbers.h"
#include "layout/pi05.h"
#include "tuner/cost_model.h"

namespace vlatune::tuner {

namespace {

using formats::BatchProfile;
using formats::fixed;
using formats::FormatError;
using formats::ModuleCost;

// Clamps of the A/B calibration: a class measured 4x off the per-module estimate points at a measurement
// problem rather than a correction; the rationale says when a clamp applied.
constexpr double kMinTimeFactor = 0.25, kMaxTimeFactor = 4.0, kMaxMemoryFactor = 4.0;

[[noreturn]] void fail(const CostModel& m, const std::string& path, const std::string& reason) {
  throw FormatError(m.file, path, reason);
}

struct UnitSums {
  double recompute_ms = 0, act = 0, out = 0;
  bool complete = true;  // every row found
};

// A joint unit's backbone-named scope encloses the expert branch's work at run time (profile.h: rows are
// inclusive of everything that ran inside the scope), so its first alias's rows already hold both branches;
// the other aliases count only when the first has no rows.
UnitSums sum_rows(const BatchProfile& b, const std::vector<std::string>& all_aliases) {
  UnitSums s;
  std::vector<std::string> aliases = all_aliases;
  if (aliases.size() > 1 && !rows_for(b, aliases[0]).empty()) aliases.resize(1);
  for (const std::string& alias : aliases) {
    const std::vector<int> rows = rows_for(b, alias);
    if (rows.empty()) s.complete = false;
    for (int r : rows) {
      const ModuleCost& m = b.modules[static_cast<size_t>(r)];
      s.recompute_ms += m.recomputed && m.recompute_ms > 0 ? m.recompute_ms : m.forward_ms;
      s.act += static_cast<double>(m.activation_bytes);
      s.out += static_cast<double>(m.output_bytes);
    }
  }
  return s;
}

void scale_saved(UnitModel& u, double factor) {
  u.act_bytes.fixed = u.out_bytes.fixed + factor * (u.act_bytes.fixed - u.out_bytes.fixed);
  u.act_bytes.per_sample = u.out_bytes.per_sample + factor * (u.act_bytes.per_sample - u.out_bytes.per_sample);
}

double saved_bytes(const UnitModel& u, double batch) {
  return std::max(0.0, u.act_bytes.at(batch) - u.out_bytes.at(batch));
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// Resolves patterns against the rows and re-labels the error for the command line.
std::vector<std::string> resolve_flag(const std::vector<std::string>& patterns, const std::vector<std::string>& fqns,
                                      const char* flag) {
  try {
    return formats::resolve_patterns(patterns, fqns, flag, "");
  } catch (const FormatError& e) {
    throw PlanInputError(std::string(flag) + ": " + e.reason());
  }
}

// The peak of batch profile `i`: measured on the device, or, on the CPU (no device allocator to ask), estimated
// from its memory section: parameters + gradients + optimizer state + activations (the section's, else the
// outermost module rows' activation bytes: none are measured on the CPU, so they count as 0).
double profiled_peak(CostModel& m, size_t i, bool first) {
  const BatchProfile& b = m.profile.batches[i];
  const std::string path = "$.batches[" + std::to_string(i) + "]";
  if (b.peak_gib) {
    if (first) m.peak_source = "measured";
    return *b.peak_gib;
  }
  if (m.profile.settings.device != "cpu")
    fail(m, path + ".peak_gib",
         first ? "null: plan needs the device's peak memory (a CUDA profile records it)"
               : "null: the second batch size needs its peak memory too");
  if (!b.memory.parameter_bytes)
    fail(m, path + ".memory.parameter_bytes", "null: a CPU profile's peak is estimated from its memory section");
  const int64_t params = *b.memory.parameter_bytes;
  const int64_t grads = b.memory.gradient_bytes.value_or(params);
  const int64_t optimizer = b.memory.optimizer_bytes.value_or(0);
  int64_t activations = b.memory.activation_bytes.value_or(0);
  if (!b.memory.activation_bytes) {
    for (size_t r = 0; r < b.modules.size(); ++r) {
      const ModuleCost& row = b.modules[r];
      if (is_pseudo_row(row)) continue;
      const bool inner = std::any_of(b.modules.begin(), b.modules.end(), [&](const ModuleCost& other) {
        return !is_pseudo_row(other) && other.fqn != row.fqn && formats::fqn_within(row.fqn, other.fqn);
      });
      if (!inner) activations += row.activation_bytes;
    }
  }
  const double gib = static_cast<double>(params + grads + optimizer + activations) / kGiB;
  if (first)
    m.peak_source = "estimated (a CPU profile measures no device peak): parameters " +
                    fixed(static_cast<double>(params) / kGiB, 2) + " + gradients " +
                    fixed(static_cast<double>(grads) / kGiB, 2) + " + optimizer state " +
                    fixed(static_cast<double>(optimizer) / kGiB, 2) + " + activations " +
                    fixed(static_cast<double>(activations) / kGiB, 2) + " GiB" +
                    (activations == 0 ? " (none measured on the CPU: recompute cannot be priced)" : "");
  return gib;
}

// max - min of a batch's timed steps (0 for fewer than two).
double sample_spread(const std::vector<double>& samples) {
  if (samples.size() < 2) return 0;
  const auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
  return *hi - *lo;
}

// ---- 1. The module rows and the batches: fit the step time and the peak, measure the noise. ----
void fit_batches(CostModel& m) {
  const formats::Profile& profile = m.profile;
  const BatchProfile& b0 = profile.batches.at(0);
  for (const ModuleCost& row : b0.modules)
    if (!is_pseudo_row(row)) m.module_fqns.push_back(row.fqn);
  if (m.module_fqns.empty())
    fail(m, "$.batches[0].modules",
         "no module rows (tracer '" + profile.settings.tracer +
             "'): plan needs per-module times and activation bytes from a traced profile");
  m.profiled_peak_gib = profiled_peak(m, 0, true);
  m.profiled_batch = b0.batch;
  std::optional<double> b1_batch, b1_step, b1_peak;
  if (profile.batches.size() > 1) {
    const BatchProfile& b1 = profile.batches[1];
    const double peak1 = profiled_peak(m, 1, false);
    if (b1.step_ms >= b0.step_ms) {
      // A step bound by per-step overhead (the tiny config on a CPU) takes the same time at both batches, and the
      // medians can then come out in either order: within the timed steps' spread that is a flat step time (a
      // constant fit), beyond it a profile that cannot be extrapolated.
      const double spread = std::max(sample_spread(b0.step_ms_samples), sample_spread(b1.step_ms_samples));
      if (b1.step_ms - b0.step_ms > spread)
        fail(m, "$.batches[1].step_ms",
             fixed(b1.step_ms, 2) + " ms at batch " + std::to_string(b1.batch) + " is above " + fixed(b0.step_ms, 2) +
                 " ms at batch " + std::to_string(b0.batch) + " by more than the timed steps' " + "spread (" +
                 fixed(spread, 2) + " ms): the step time must grow with the batch to be extrapolated");
      m.notes.push_back("the step took " + fixed(b1.step_ms, 2) + " ms at batch " + std::to_string(b1.batch) + " and " +
                        fixed(b0.step_ms, 2) + " ms at batch " + std::to_string(b0.batch) +
                        ", within the timed steps' spread (" + fixed(spread, 2) +
                        " ms): the step time is modelled as the same at every batch");
    }
    if (peak1 > m.profiled_peak_gib)
      fail(m, "$.batches[1].peak_gib",
           fixed(peak1, 2) + " GiB at batch " + std::to_string(b1.batch) + " is above " +
               fixed(m.profiled_peak_gib, 2) + " GiB at batch " + std::to_string(b0.batch) +
               ": memory must grow with the batch");
    m.second_batch = b1.batch;
    b1_batch = static_cast<double>(b1.batch);
    b1_step = b1.step_ms;
    b1_peak = peak1;
    if (profile.batches.size() > 2) m.notes.push_back("batches[2..] ignored: the fits use the first two batch sizes");
  }
  // Accumulation (cost_model.h): what the profiled step repeats per micro-batch and what it runs once.
  m.profiled_grad_accum = std::max(1, profile.recipe.batch.grad_accum);
  for (const ModuleCost& row : b0.modules)
    if (row.fqn == "<optimizer>") m.optimizer_ms = std::min(row.self_ms, profile.batches.back().step_ms);
  if (!std::any_of(b0.modules.begin(), b0.modules.end(), [](const ModuleCost& r) { return r.fqn == "<optimizer>"; }))
    m.notes.push_back(
        "no <optimizer> row: with gradient accumulation the whole profiled step is counted per micro-batch");
  // The step is fitted without the optimizer update, which runs once per step whatever the batch: a two-point fit
  // of the whole step can put its intercept below the optimizer's time (a batch-16 step measured at half the
  // batch-32 one, within noise), and then every extra micro-batch of an accumulated plan would look cheaper than
  // its own work.
  const double bb0 = static_cast<double>(b0.batch);
  const double once = m.optimizer_ms;
  m.step_ms =
      fit_linear(bb0, b0.step_ms - once, b1_batch, b1_step ? std::optional<double>(*b1_step - once) : std::nullopt);
  m.step_ms.fixed += once;
  m.peak_gib = fit_linear(bb0, m.profiled_peak_gib, b1_batch, b1_peak);
  if (!b1_batch)
    m.notes.push_back("one batch size profiled: step time, peak and activations scale in proportion to the batch");
  const std::optional<int64_t> grads = b0.memory.gradient_bytes ? b0.memory.gradient_bytes : b0.memory.parameter_bytes;
  m.gradient_gib = static_cast<double>(grads.value_or(0)) / kGiB;
  // The profiled peak above the forward phase's: gradients it already held (cost_model.h).
  auto gap = [&](const BatchProfile& b) -> std::optional<double> {
    const auto it = b.memory.peak_gib_by_phase.find("forward");
    if (!b.peak_gib || it == b.memory.peak_gib_by_phase.end()) return std::nullopt;
    return std::max(0.0, *b.peak_gib - it->second);
  };
  if (const std::optional<double> g0 = gap(b0)) {
    std::optional<double> g1 = profile.batches.size() > 1 ? gap(profile.batches[1]) : std::nullopt;
    m.backward_over_forward_gib =
        fit_linear(static_cast<double>(b0.batch), *g0,
                   g1 ? std::optional<double>(static_cast<double>(profile.batches[1].batch)) : std::nullopt, g1);
  }
  const double med = formats::median(b0.step_ms_samples);
  std::vector<double> dev;
  for (double v : b0.step_ms_samples) dev.push_back(std::abs(v - med));
  m.noise_rel = med > 0 ? formats::median(dev) / med : 0;
}

// ---- 2a. Units that are not modules: the backbone MLPs' merged gate+up outputs. ----
// The GEMM inventory's merged GEMMs of that name, when the profile's `recomputable` list names them, or names none
// at all (a profile older than the unit; the recipe is run by a trainer that has it). The last backbone layer's,
// dead work with skip_dead, has no GEMM row and no unit. Returns indices into profile.gemms.
std::vector<int> gemm_output_units(CostModel& m) {
  const formats::Profile& profile = m.profile;
  std::vector<int> out;
  const bool listed = std::any_of(profile.recomputable.begin(), profile.recomputable.end(),
                                  [](const std::string& f) { return layout::unit_kind(f) == "backbone_mlp_gate_up"; });
  for (size_t g = 0; g < profile.gemms.size(); ++g) {
    const std::string& name = profile.gemms[g].name;
    if (layout::unit_kind(name) != "backbone_mlp_gate_up") continue;
    if (listed && !contains(profile.recomputable, name)) continue;
    if (!contains(m.module_fqns, layout::merged_gemm_module(name))) continue;  // its MLP did not run
    out.push_back(static_cast<int>(g));
  }
  m.recompute_names = m.module_fqns;
  for (int g : out) {
    const std::string& name = profile.gemms[static_cast<size_t>(g)].name;
    if (!contains(m.recompute_names, name)) m.recompute_names.push_back(name);
  }
  return out;
}

// ---- 2b. The profiled recompute selection, and no row recomputed outside it. ----
std::vector<std::string> profiled_selection(const CostModel& m) {
  const BatchProfile& b0 = m.profile.batches[0];
  const std::vector<std::string> selection = formats::resolve_patterns(
      m.profile.recipe.recompute.modules, m.recompute_names, m.file, "$.recipe.recompute.modules");
  for (size_t i = 0; i < b0.modules.size(); ++i) {
    const ModuleCost& row = b0.modules[i];
    if (!row.recomputed || is_pseudo_row(row)) continue;
    const bool selected = std::any_of(selection.begin(), selection.end(),
                                      [&](const std::string& s) { return layout::unit_covers(s, row.fqn); });
    if (!selected)
      fail(m, "$.batches[0].modules[" + std::to_string(i) + "].recomputed",
           "module '" + row.fqn + "' is marked recomputed but the profiled recipe ($.recipe.recompute.modules) " +
               "does not select it");
  }
  return selection;
}

// ---- 3a. Candidate units: defaults, the merged-GEMM outputs, the profiled selection, the A/B classes, the user's.
struct Candidates {
  std::vector<UnitSpec> specs;
  std::map<std::string, size_t> by_alias;            // every alias -> its spec
  std::vector<std::vector<std::string>> class_fqns;  // per A/B row, the FQNs its patterns select
};

Candidates collect_candidates(const CostModel& m, const std::vector<int>& gemm_units,
                              const std::vector<std::string>& baseline, const std::vector<std::string>& extra) {
  const formats::Profile& profile = m.profile;
  const BatchProfile& b0 = profile.batches[0];
  Candidates c;
  c.specs = default_recompute_units(profile.recomputable, m.module_fqns);
  for (size_t i = 0; i < c.specs.size(); ++i)
    for (const std::string& a : c.specs[i].aliases) c.by_alias.emplace(a, i);
  auto add = [&](const std::string& fqn, const std::string& kind) {
    if (c.by_alias.count(fqn)) return;
    c.specs.push_back(unit_for_fqn(fqn, kind));
    for (const std::string& a : c.specs.back().aliases) c.by_alias.emplace(a, c.specs.size() - 1);
  };
  auto kind_or = [](const std::string& fqn, const std::string& label) {
    const std::string kind = layout::unit_kind(fqn);
    return kind.empty() ? label : kind;
  };
  for (int g : gemm_units) add(profile.gemms[static_cast<size_t>(g)].name, "backbone_mlp_gate_up");
  for (const std::string& fqn : baseline) add(fqn, kind_or(fqn, "profiled"));
  // A profile whose GEMM inventory has no merged gate+up GEMM (the CPU's reference path runs gate_proj and up_proj
  // apart) has no such unit to price: an A/B row of those units alone calibrates nothing (an empty class).
  const auto is_gate_up = [](const std::string& name) {
    const std::string leaf = "." + layout::kGateUpLeaf;
    return name.size() > leaf.size() && name.compare(name.size() - leaf.size(), leaf.size(), leaf) == 0;
  };
  const bool gate_up_units = std::any_of(m.recompute_names.begin(), m.recompute_names.end(), is_gate_up);
  for (size_t r = 0; r < b0.recompute.size(); ++r) {
    const std::vector<std::string>& patterns = b0.recompute[r].patterns;
    if (!gate_up_units && !patterns.empty() && std::all_of(patterns.begin(), patterns.end(), is_gate_up)) {
      c.class_fqns.emplace_back();
      continue;
    }
    c.class_fqns.push_back(formats::resolve_patterns(b0.recompute[r].patterns, m.recompute_names, m.file,
                                                     "$.batches[0].recompute[" + std::to_string(r) + "].patterns"));
    for (const std::string& fqn : c.class_fqns.back()) add(fqn, kind_or(fqn, b0.recompute[r].name));
  }
  for (const std::string& fqn : resolve_flag(extra, m.recompute_names, "--recompute-candidate")) {
    const std::string name = unit_for_fqn(fqn, "").aliases[0];
    const bool gemm_unit = std::any_of(gemm_units.begin(), gemm_units.end(),
                                       [&](int g) { return profile.gemms[static_cast<size_t>(g)].name == name; });
    if (!profile.recomputable.empty() && !gemm_unit && !contains(profile.recomputable, name))
      throw PlanInputError("--recompute-candidate: '" + fqn +
                           "' is not recomputable by the trainer (not in the profile's `recomputable` list)");
    add(fqn, kind_or(fqn, "custom"));
  }
  return c;
}

// The GEMMs' rate in the step (TFLOP/s over the inventory's forward, input- and weight-gradient FLOPs), for
// pricing a merged GEMM's forward when the profile has no GEMM timings (--gemm-reps 0): never free.
double step_gemm_tflops(const formats::Profile& profile) {
  double gemm_time = 0, flops = 0;
  for (const formats::KernelStat& kernel : profile.batches[0].kernels)
    if (kernel.category == "gemm") gemm_time += kernel.ms;
  for (const formats::GemmEntry& e : profile.gemms)
    flops += 3.0 * 2.0 * static_cast<double>(e.m) * static_cast<double>(e.n) * static_cast<double>(e.k);
  return gemm_time > 0 && flops > 0 ? flops / (gemm_time * 1e9) : 0;
}

// A merged GEMM's output unit (no module row): recomputing it runs that GEMM's forward once more, at the profiled
// recipe's precision (FP8: the forward GEMM and its share of the casts; predict() moves it with the FP8 plan like
// any GEMM); it frees the output, held from forward to backward otherwise and rebuilt at the start of the MLP's
// backward; what the rebuild reads is kept anyway (out_bytes 0). Both scale with M = batch x tokens (proportional
// in the batch). False when the GEMM has neither a timing nor a rate to cost it with.
bool size_gemm_unit(const CostModel& m, int gemm, double tflops, UnitModel& u) {
  const formats::GemmEntry& e = m.profile.gemms[static_cast<size_t>(gemm)];
  const double bb0 = static_cast<double>(m.profiled_batch);
  double ms = e.bf16.forward_ms;
  std::string time_source = "its bf16 forward GEMM";
  if (profiled_in_fp8(m.profile, e) && e.fp8) {
    const double total = e.fp8->total(), quant = e.quant_ms.value_or(0.0);
    ms = e.fp8->forward_ms + (total > 0 ? quant * e.fp8->forward_ms / total : 0.0);
    time_source = "its FP8 forward GEMM + its share of quant_ms (the profiled recipe runs it in FP8)";
  }
  if (!(ms > 0)) {
    if (!(tflops > 0)) return false;
    ms = 2.0 * static_cast<double>(e.m) * static_cast<double>(e.n) * static_cast<double>(e.k) / (tflops * 1e9);
    time_source = "no GEMM timing in the profile (--gemm-reps 0): 2 m n k at the step's GEMM rate, " +
                  fixed(tflops, 2) + " TFLOP/s";
  }
  double bytes = static_cast<double>(e.m) * static_cast<double>(e.n) * 2.0;
  std::string bytes_source =
      "rows x N x 2 bytes (bf16 output, m " + std::to_string(e.m) + " x n " + std::to_string(e.n) + ")";
  for (const ModuleCost& row : m.profile.batches[0].modules) {
    if (row.fqn == u.spec.aliases[0] && row.output_bytes > 0) {
      bytes = static_cast<double>(row.output_bytes);
      bytes_source = "the profile's output_bytes of the unit";
    }
  }
  u.gemm = gemm;
  u.rows.clear();
  u.recompute_ms = {0, ms / bb0, true};
  u.act_bytes = {0, bytes / bb0, true};
  u.out_bytes = {0, 0, true};
  u.estimate = "time from the GEMM inventory (" + time_source + ", " + fixed(ms, 2) + " ms), bytes from " +
               bytes_source + ", " + fixed(bytes / kGiB, 2) + " GiB";
  return true;
}

// A module unit: its rows' times and bytes, fitted over the batches.
void size_module_unit(const CostModel& m, const std::vector<std::string>& baseline, UnitModel& u) {
  const BatchProfile& b0 = m.profile.batches[0];
  const BatchProfile* b1 = m.profile.batches.size() > 1 ? &m.profile.batches[1] : nullptr;
  const double bb0 = static_cast<double>(b0.batch);
  const UnitSums s0 = sum_rows(b0, u.spec.aliases);
  UnitSums s1;
  if (b1) s1 = sum_rows(*b1, u.spec.aliases);
  const bool two = b1 && s1.complete;
  const std::optional<double> batch1 = two ? std::optional<double>(static_cast<double>(b1->batch)) : std::nullopt;
  auto at1 = [&](double v) { return two ? std::optional<double>(v) : std::nullopt; };
  u.recompute_ms = fit_linear(bb0, s0.recompute_ms, batch1, at1(s1.recompute_ms));
  u.act_bytes = fit_linear(bb0, s0.act, batch1, at1(s1.act));
  u.out_bytes = fit_linear(bb0, std::min(s0.out, s0.act), batch1, at1(std::min(s1.out, s1.act)));
  u.baseline = std::any_of(u.spec.aliases.begin(), u.spec.aliases.end(),
                           [&](const std::string& a) { return contains(baseline, a); });
  const bool under_recompute = std::any_of(baseline.begin(), baseline.end(), [&](const std::string& s) {
    return formats::fqn_within(u.spec.aliases[0], s);
  });
  // Measured under recompute, a module keeps nothing but its output: its real activation size is unknown
  // until an A/B row (removing the recompute) says it.
  u.size_known = !(under_recompute && s0.act <= s0.out);
}

// ---- 3b. Size every candidate in forward order; link each to its enclosing unit. ----
// Returns the unit index of each candidate's canonical name.
std::map<std::string, int> size_units(CostModel& m, const Candidates& c, const std::vector<int>& gemm_units,
                                      const std::vector<std::string>& baseline) {
  std::vector<size_t> order(c.specs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return layout::forward_before(c.specs[a].aliases[0], c.specs[b].aliases[0]); });
  std::map<std::string, int> gemm_of, index_of;
  for (int g : gemm_units) gemm_of[m.profile.gemms[static_cast<size_t>(g)].name] = g;
  const double tflops = step_gemm_tflops(m.profile);
  int gemm_estimates = 0;
  std::string gemm_estimate;
  for (size_t k : order) {
    UnitModel u;
    u.spec = c.specs[k];
    for (const std::string& alias : u.spec.aliases)
      for (int r : rows_for(m.profile.batches[0], alias)) u.rows.push_back(r);
    if (auto g = gemm_of.find(u.spec.aliases[0]); g != gemm_of.end()) {
      if (!size_gemm_unit(m, g->second, tflops, u)) continue;
      u.baseline = contains(baseline, u.spec.aliases[0]);
      if (gemm_estimates++ == 0) gemm_estimate = u.spec.aliases[0] + ": " + u.estimate;
    } else {
      if (u.rows.empty()) continue;  // an alias without rows (e.g. the expert's attention has no scope of its own)
      size_module_unit(m, baseline, u);
    }
    index_of[u.spec.aliases[0]] = static_cast<int>(m.units.size());
    m.units.push_back(std::move(u));
  }
  if (gemm_estimates > 0)
    m.notes.push_back(std::to_string(gemm_estimates) +
                      " backbone_mlp_gate_up units (merged gate+up GEMM outputs, no module rows): each costs its "
                      "GEMM's forward once more and frees its output; e.g. " +
                      gemm_estimate + " (an A/B row of class 'backbone_mlp_gate_up' calibrates them when present)");
  return index_of;
}

// ---- 3c. Each unit's parent: the innermost unit all of whose names enclose it. ----
void link_parents(CostModel& m) {
  for (size_t i = 0; i < m.units.size(); ++i) {
    UnitModel& u = m.units[i];
    size_t best_len = 0;
    for (size_t j = 0; j < m.units.size(); ++j) {
      if (j == i) continue;
      const UnitModel& v = m.units[j];
      const bool inside = std::all_of(u.spec.aliases.begin(), u.spec.aliases.end(), [&](const std::string& a) {
        return std::any_of(v.spec.aliases.begin(), v.spec.aliases.end(),
                           [&](const std::string& va) { return formats::fqn_within(a, va) && a != va; });
      });
      if (inside && v.spec.aliases[0].size() > best_len) {
        best_len = v.spec.aliases[0].size();
        u.parent = static_cast<int>(j);
      }
    }
    if (u.parent >= static_cast<int>(i))
      throw PlanInputError("recompute candidates: '" + u.spec.aliases[0] + "' sorts before its enclosing '" +
                           m.units[static_cast<size_t>(u.parent)].spec.aliases[0] + "'");
    if (u.baseline) m.baseline_units.push_back(static_cast<int>(i));
  }
}

// ---- 4. Calibration: each A/B row is ground truth for its units at the profiled batch. ----
void calibrate(CostModel& m, const Candidates& c, const std::map<std::string, int>& index_of) {
  const BatchProfile& b0 = m.profile.batches[0];
  const double bb0 = static_cast<double>(b0.batch);
  std::set<int> calibrated;
  for (size_t r = 0; r < b0.recompute.size(); ++r) {
    if (c.class_fqns[r].empty()) continue;  // nothing of this row is a unit here (collect_candidates)
    const formats::RecomputeCandidate& row = b0.recompute[r];
    Calibration cal;
    cal.name = row.name;
    cal.added = row.added;
    std::set<int> units;
    for (const std::string& fqn : c.class_fqns[r]) {
      auto a = c.by_alias.find(fqn);
      if (a == c.by_alias.end()) continue;
      auto it = index_of.find(c.specs[a->second].aliases[0]);
      if (it != index_of.end() && !calibrated.count(it->second)) units.insert(it->second);
    }
    // An added class changes the units not already recomputed; a removed class, the ones that are.
    std::vector<int> changed;
    for (int i : units)
      if (m.units[static_cast<size_t>(i)].baseline != row.added) changed.push_back(i);
    cal.units = static_cast<int>(changed.size());
    const double sign = row.added ? 1.0 : -1.0;
    cal.measured_step_ms_delta = row.step_ms_delta;
    cal.measured_saved_gib = -sign * row.peak_gib_delta;
    if (changed.empty()) {
      cal.note = "no unit changes state under this row (already " + std::string(row.added ? "" : "not ") +
                 "recomputed or calibrated by an earlier row); not used";
      m.calibrations.push_back(cal);
      continue;
    }
    double pred_ms = 0, pred_saved = 0;
    std::vector<int> unknown;
    for (int i : changed) {
      const UnitModel& u = m.units[static_cast<size_t>(i)];
      pred_ms += u.recompute_ms.at(bb0);
      if (u.size_known)
        pred_saved += saved_bytes(u, bb0);
      else
        unknown.push_back(i);
    }
    cal.predicted_step_ms_delta = sign * pred_ms;
    cal.predicted_saved_gib = pred_saved / kGiB;
    if (pred_ms > 1e-9) {
      const double raw = row.step_ms_delta / cal.predicted_step_ms_delta;
      cal.time_factor = std::clamp(raw, kMinTimeFactor, kMaxTimeFactor);
      if (cal.time_factor != raw) cal.note += "time factor " + fixed(raw, 2) + " clamped; ";
    }
    if (!unknown.empty() && cal.measured_saved_gib > 0) {
      // The activation of modules measured only under recompute: the measured class saving, shared evenly,
      // proportional to the batch.
      const double share = (cal.measured_saved_gib * kGiB - pred_saved) / static_cast<double>(unknown.size());
      for (int i : unknown) {
        UnitModel& u = m.units[static_cast<size_t>(i)];
        const double act_b0 = u.out_bytes.at(bb0) + std::max(0.0, share);
        u.act_bytes = {0, act_b0 / bb0, true};
        u.size_known = true;
      }
      cal.note += std::to_string(unknown.size()) + " activation sizes taken from this row; ";
    } else if (pred_saved > 1e-3 * kGiB) {
      const double raw = cal.measured_saved_gib / cal.predicted_saved_gib;
      cal.memory_factor = std::clamp(raw, 0.0, kMaxMemoryFactor);
      if (cal.memory_factor != raw) cal.note += "memory factor " + fixed(raw, 2) + " clamped; ";
    }
    for (int i : changed) {
      UnitModel& u = m.units[static_cast<size_t>(i)];
      u.recompute_ms.fixed *= cal.time_factor;
      u.recompute_ms.per_sample *= cal.time_factor;
      if (u.size_known) scale_saved(u, cal.memory_factor);
      u.calibration = row.name;
      calibrated.insert(i);
    }
    m.calibrations.push_back(cal);
  }
}

// ---- 5. A parent holds at least what its child units hold (children measured under recompute, or calibrated up,
// can exceed the parent's own row). Children come after parents, so one backward pass settles every level. ----
void settle_parent_sizes(CostModel& m) {
  const double bb0 = static_cast<double>(m.profiled_batch);
  for (size_t i = m.units.size(); i-- > 0;) {
    LinearFit children;
    for (const UnitModel& c : m.units) {
      if (c.parent != static_cast<int>(i)) continue;
      children.fixed += c.act_bytes.fixed;
      children.per_sample += c.act_bytes.per_sample;
    }
    UnitModel& u = m.units[i];
    if (children.at(bb0) > u.act_bytes.at(bb0)) u.act_bytes = children;
  }
  for (const UnitModel& u : m.units) {
    if (!u.size_known)
      m.notes.push_back("'" + u.spec.aliases[0] +
                        "' was profiled recomputed and no A/B row measured its activation: it stays recomputed");
  }
}

}  // namespace

CostModel build_cost_model(const formats::Profile& profile, const std::string& file,
                           const std::vector<std::string>& extra_candidates) {
  CostModel m;
  m.file = file;
  m.profile = profile;
  fit_batches(m);
  const std::vector<int> gemm_units = gemm_output_units(m);
  const std::vector<std::string> baseline = profiled_selection(m);
  const Candidates candidates = collect_candidates(m, gemm_units, baseline, extra_candidates);
  const std::map<std::string, int> index_of = size_units(m, candidates, gemm_units, baseline);
  link_parents(m);
  calibrate(m, candidates, index_of);
  settle_parent_sizes(m);
  return m;
}

}  // namespace vlatune::tuner
