#include "tuner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "formats/fqn_pattern.h"
#include "formats/json_error.h"
#include "kernels/adamw.h"

namespace vlatune::tuner {

namespace {

using formats::BatchProfile;
using formats::FormatError;
using formats::ModuleCost;

// Clamps of the A/B calibration: a class measured 4x off the per-module estimate points at a measurement
// problem rather than a correction; the rationale says when a clamp applied.
constexpr double kMinTimeFactor = 0.25, kMaxTimeFactor = 4.0, kMaxMemoryFactor = 4.0;

std::string fmt(double v, int precision = 2) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(precision);
  os << v;
  return os.str();
}

bool is_pseudo(const ModuleCost& m) {
  return m.kind == "pseudo" || (!m.fqn.empty() && m.fqn.front() == '<');
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The rows summed for `alias`: its own row, else the outermost rows inside it.
std::vector<int> rows_for(const BatchProfile& b, const std::string& alias) {
  std::vector<int> inside;
  for (size_t i = 0; i < b.modules.size(); ++i) {
    if (is_pseudo(b.modules[i])) continue;
    if (b.modules[i].fqn == alias) return {static_cast<int>(i)};
    if (fqn_within(b.modules[i].fqn, alias)) inside.push_back(static_cast<int>(i));
  }
  std::vector<int> outermost;
  for (int i : inside) {
    const std::string& fqn = b.modules[static_cast<size_t>(i)].fqn;
    const bool nested = std::any_of(inside.begin(), inside.end(), [&](int j) {
      return j != i && fqn_within(fqn, b.modules[static_cast<size_t>(j)].fqn);
    });
    if (!nested) outermost.push_back(i);
  }
  return outermost;
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

// Resolves patterns against the rows and re-labels the error for the command line.
std::vector<std::string> resolve_flag(const std::vector<std::string>& patterns, const std::vector<std::string>& fqns,
                                      const char* flag) {
  try {
    return formats::resolve_patterns(patterns, fqns, flag, "");
  } catch (const FormatError& e) {
    throw PlanInputError(std::string(flag) + ": " + e.reason());
  }
}

}  // namespace

LinearFit fit_linear(double b0, double v0, std::optional<double> b1, std::optional<double> v1) {
  LinearFit f;
  if (b1 && v1 && *b1 != b0) {
    f.per_sample = (v0 - *v1) / (b0 - *b1);
    f.fixed = v0 - f.per_sample * b0;
    if (f.per_sample < 0) return {v0, 0, false};
    if (f.fixed >= 0) return f;
  }
  f.fixed = 0;
  f.per_sample = b0 > 0 ? v0 / b0 : 0;
  f.proportional = true;
  return f;
}

double gemm_ms(const formats::GemmEntry& gemm, bool fp8, bool recomputed, double batch_scale) {
  double t = 0;
  if (fp8 && gemm.fp8) {
    const double quant = gemm.quant_ms.value_or(0.0);
    const double total = gemm.fp8->total();
    t = total + quant;
    // The recomputed forward runs the forward GEMM and its share of the casts again.
    if (recomputed) t += gemm.fp8->forward_ms + (total > 0 ? quant * gemm.fp8->forward_ms / total : 0.0);
  } else {
    t = gemm.bf16.total() + (recomputed ? gemm.bf16.forward_ms : 0.0);
  }
  return t * batch_scale;
}

double root_backward_ms(const CostModel& model, const std::string& root, double batch) {
  const auto& batches = model.profile.batches;
  auto sum = [&](const BatchProfile& b, bool& found) {
    double ms = 0;
    const std::vector<int> rows = rows_for(b, root);
    found = !rows.empty();
    for (int r : rows) ms += b.modules[static_cast<size_t>(r)].backward_ms;
    return ms;
  };
  bool found0 = false, found1 = false;
  const double v0 = sum(batches[0], found0);
  std::optional<double> b1, v1;
  if (batches.size() > 1) {
    const double v = sum(batches[1], found1);
    if (found1) {
      b1 = static_cast<double>(batches[1].batch);
      v1 = v;
    }
  }
  return fit_linear(static_cast<double>(batches[0].batch), v0, b1, v1).at(batch);
}

double root_parameter_bytes(const CostModel& model, const std::string& root) {
  const BatchProfile& b = model.profile.batches[0];
  double bytes = 0;
  for (int r : rows_for(b, root)) bytes += static_cast<double>(b.modules[static_cast<size_t>(r)].parameter_bytes);
  return bytes;
}

bool inside_selection(const CostModel& model, const std::vector<int>& selection, const std::string& fqn) {
  for (int i : selection) {
    for (const std::string& alias : model.units[static_cast<size_t>(i)].spec.aliases)
      if (unit_covers(alias, fqn)) return true;
  }
  return false;
}

CostModel build_cost_model(const formats::Profile& profile, const std::string& file,
                           const std::vector<std::string>& extra_candidates) {
  CostModel m;
  m.file = file;
  m.profile = profile;
  const BatchProfile& b0 = profile.batches.at(0);
  auto fail = [&](const std::string& path, const std::string& reason) { throw FormatError(file, path, reason); };

  // ---- 1. What planning needs beyond what the reader checks. ----
  for (const ModuleCost& row : b0.modules)
    if (!is_pseudo(row)) m.module_fqns.push_back(row.fqn);
  if (m.module_fqns.empty())
    fail("$.batches[0].modules", "no module rows (tracer '" + profile.settings.tracer +
                                     "'): plan needs per-module times and activation bytes from a traced profile");
  if (!b0.peak_gib) fail("$.batches[0].peak_gib", "null: plan needs the device's peak memory (profile on the GPU)");
  m.profiled_batch = b0.batch;
  std::optional<double> b1_batch, b1_step, b1_peak;
  if (profile.batches.size() > 1) {
    const BatchProfile& b1 = profile.batches[1];
    if (!b1.peak_gib) fail("$.batches[1].peak_gib", "null: the second batch size needs its peak memory too");
    if (b1.step_ms >= b0.step_ms)
      fail("$.batches[1].step_ms", fmt(b1.step_ms) + " ms at batch " + std::to_string(b1.batch) + " is not below " +
                                       fmt(b0.step_ms) + " ms at batch " + std::to_string(b0.batch) +
                                       ": the step time must grow with the batch to be extrapolated");
    if (*b1.peak_gib > *b0.peak_gib)
      fail("$.batches[1].peak_gib", fmt(*b1.peak_gib) + " GiB at batch " + std::to_string(b1.batch) + " is above " +
                                        fmt(*b0.peak_gib) + " GiB at batch " + std::to_string(b0.batch) +
                                        ": memory must grow with the batch");
    m.second_batch = b1.batch;
    b1_batch = static_cast<double>(b1.batch);
    b1_step = b1.step_ms;
    b1_peak = *b1.peak_gib;
    if (profile.batches.size() > 2) m.notes.push_back("batches[2..] ignored: the fits use the first two batch sizes");
  }
  const double bb0 = static_cast<double>(b0.batch);
  m.step_ms = fit_linear(bb0, b0.step_ms, b1_batch, b1_step);
  m.peak_gib = fit_linear(bb0, *b0.peak_gib, b1_batch, b1_peak);
  if (!b1_batch)
    m.notes.push_back("one batch size profiled: step time, peak and activations scale in proportion to the batch");
  {
    const double med = median(b0.step_ms_samples);
    std::vector<double> dev;
    for (double v : b0.step_ms_samples) dev.push_back(std::abs(v - med));
    m.noise_rel = med > 0 ? median(dev) / med : 0;
  }

  // ---- 2. Units that are not modules, the profiled recompute selection, and rows recomputed outside it. ----
  // The backbone MLPs' merged gate+up outputs: the GEMM inventory's merged GEMMs of that name, when the profile's
  // `recomputable` list names them, or names none at all (a profile older than the unit; the recipe is run by a
  // trainer that has it). The last backbone layer's, dead work with skip_dead, has no GEMM row and no unit.
  std::vector<int> gemm_units;
  {
    const bool listed = std::any_of(profile.recomputable.begin(), profile.recomputable.end(),
                                    [](const std::string& f) { return unit_kind(f) == "backbone_mlp_gate_up"; });
    for (size_t g = 0; g < profile.gemms.size(); ++g) {
      const std::string& name = profile.gemms[g].name;
      if (unit_kind(name) != "backbone_mlp_gate_up") continue;
      if (listed &&
          std::find(profile.recomputable.begin(), profile.recomputable.end(), name) == profile.recomputable.end())
        continue;
      if (std::find(m.module_fqns.begin(), m.module_fqns.end(), name.substr(0, name.rfind('.'))) == m.module_fqns.end())
        continue;  // its MLP did not run
      gemm_units.push_back(static_cast<int>(g));
    }
  }
  m.recompute_names = m.module_fqns;
  for (int g : gemm_units) {
    const std::string& name = profile.gemms[static_cast<size_t>(g)].name;
    if (std::find(m.recompute_names.begin(), m.recompute_names.end(), name) == m.recompute_names.end())
      m.recompute_names.push_back(name);
  }
  const std::vector<std::string> baseline_fqns = formats::resolve_patterns(
      profile.recipe.recompute.modules, m.recompute_names, file, "$.recipe.recompute.modules");
  for (size_t i = 0; i < b0.modules.size(); ++i) {
    const ModuleCost& row = b0.modules[i];
    if (!row.recomputed || is_pseudo(row)) continue;
    const bool selected = std::any_of(baseline_fqns.begin(), baseline_fqns.end(),
                                      [&](const std::string& s) { return unit_covers(s, row.fqn); });
    if (!selected)
      fail("$.batches[0].modules[" + std::to_string(i) + "].recomputed",
           "module '" + row.fqn + "' is marked recomputed but the profiled recipe ($.recipe.recompute.modules) " +
               "does not select it");
  }

  // ---- 3. Units: defaults, the profiled selection, the A/B classes, the user's candidates. ----
  std::vector<UnitSpec> specs = default_recompute_units(profile.recomputable, m.module_fqns);
  std::map<std::string, size_t> by_alias;
  auto add = [&](const std::string& fqn, const std::string& kind) -> size_t {
    auto it = by_alias.find(fqn);
    if (it != by_alias.end()) return it->second;
    specs.push_back(unit_for_fqn(fqn, kind));
    for (const std::string& a : specs.back().aliases) by_alias.emplace(a, specs.size() - 1);
    return specs.size() - 1;
  };
  for (size_t i = 0; i < specs.size(); ++i)
    for (const std::string& a : specs[i].aliases) by_alias.emplace(a, i);
  for (int g : gemm_units) add(profile.gemms[static_cast<size_t>(g)].name, "backbone_mlp_gate_up");
  for (const std::string& fqn : baseline_fqns) add(fqn, unit_kind(fqn).empty() ? "profiled" : unit_kind(fqn));
  std::vector<std::vector<std::string>> class_fqns;
  for (size_t c = 0; c < b0.recompute.size(); ++c) {
    class_fqns.push_back(formats::resolve_patterns(b0.recompute[c].patterns, m.recompute_names, file,
                                                   "$.batches[0].recompute[" + std::to_string(c) + "].patterns"));
    for (const std::string& fqn : class_fqns.back())
      add(fqn, unit_kind(fqn).empty() ? b0.recompute[c].name : unit_kind(fqn));
  }
  for (const std::string& fqn : resolve_flag(extra_candidates, m.recompute_names, "--recompute-candidate")) {
    const std::string name = unit_for_fqn(fqn, "").aliases[0];
    const bool gemm_unit = std::any_of(gemm_units.begin(), gemm_units.end(),
                                       [&](int g) { return profile.gemms[static_cast<size_t>(g)].name == name; });
    if (!profile.recomputable.empty() && !gemm_unit &&
        std::find(profile.recomputable.begin(), profile.recomputable.end(), name) == profile.recomputable.end())
      throw PlanInputError("--recompute-candidate: '" + fqn +
                           "' is not recomputable by the trainer (not in the profile's `recomputable` list)");
    add(fqn, unit_kind(fqn).empty() ? "custom" : unit_kind(fqn));
  }

  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return forward_before(specs[a].aliases[0], specs[b].aliases[0]); });
  const BatchProfile* b1p = profile.batches.size() > 1 ? &profile.batches[1] : nullptr;
  std::map<std::string, int> index_of;
  std::map<std::string, int> gemm_of;
  for (int g : gemm_units) gemm_of[profile.gemms[static_cast<size_t>(g)].name] = g;
  int gemm_estimates = 0;
  std::string gemm_estimate;
  // A profile made with --gemm-reps 0 has no GEMM timings (zeros): a merged GEMM's forward is then costed from its
  // FLOPs at the step's own GEMM rate (the GEMM kernels' time per step over the inventory's forward, input- and
  // weight-gradient FLOPs), never as free.
  double step_gemm_tflops = 0;
  {
    double gemm_ms = 0, flops = 0;
    for (const formats::KernelStat& kernel : b0.kernels)
      if (kernel.category == "gemm") gemm_ms += kernel.ms;
    for (const formats::GemmEntry& e : profile.gemms)
      flops += 3.0 * 2.0 * static_cast<double>(e.m) * static_cast<double>(e.n) * static_cast<double>(e.k);
    if (gemm_ms > 0 && flops > 0) step_gemm_tflops = flops / (gemm_ms * 1e9);
  }
  for (size_t k : order) {
    UnitModel u;
    u.spec = specs[k];
    for (const std::string& alias : u.spec.aliases)
      for (int r : rows_for(b0, alias)) u.rows.push_back(r);
    if (auto g = gemm_of.find(u.spec.aliases[0]); g != gemm_of.end()) {
      // A merged GEMM's output (no module row): recomputing it runs that GEMM's forward once more, at the profiled
      // recipe's precision (FP8: the forward GEMM and its share of the casts; predict() moves it with the FP8
      // plan like any GEMM); it frees the output, held from forward to backward otherwise and rebuilt at the start
      // of the MLP's backward; what the rebuild reads is kept anyway (out_bytes 0). Both scale with M = batch x
      // tokens (proportional in the batch).
      const formats::GemmEntry& e = profile.gemms[static_cast<size_t>(g->second)];
      bool fp8 = false;
      for (const std::string& member : e.members)
        for (const std::string& pattern : profile.recipe.fp8.modules)
          fp8 = fp8 || formats::fqn_matches(pattern, member);
      double ms = e.bf16.forward_ms;
      std::string time_source = "its bf16 forward GEMM";
      if (fp8 && e.fp8) {
        const double total = e.fp8->total(), quant = e.quant_ms.value_or(0.0);
        ms = e.fp8->forward_ms + (total > 0 ? quant * e.fp8->forward_ms / total : 0.0);
        time_source = "its FP8 forward GEMM + its share of quant_ms (the profiled recipe runs it in FP8)";
      }
      if (!(ms > 0)) {
        if (!(step_gemm_tflops > 0)) continue;  // no timing and no GEMM rate: not a candidate it can cost
        ms = 2.0 * static_cast<double>(e.m) * static_cast<double>(e.n) * static_cast<double>(e.k) /
             (step_gemm_tflops * 1e9);
        time_source = "no GEMM timing in the profile (--gemm-reps 0): 2 m n k at the step's GEMM rate, " +
                      fmt(step_gemm_tflops) + " TFLOP/s";
      }
      double bytes = static_cast<double>(e.m) * static_cast<double>(e.n) * 2.0;
      std::string bytes_source =
          "rows x N x 2 bytes (bf16 output, m " + std::to_string(e.m) + " x n " + std::to_string(e.n) + ")";
      for (const ModuleCost& row : b0.modules) {
        if (row.fqn == u.spec.aliases[0] && row.output_bytes > 0) {
          bytes = static_cast<double>(row.output_bytes);
          bytes_source = "the profile's output_bytes of the unit";
        }
      }
      u.gemm = g->second;
      u.rows.clear();
      u.recompute_ms = {0, ms / bb0, true};
      u.act_bytes = {0, bytes / bb0, true};
      u.out_bytes = {0, 0, true};
      u.estimate = "time from the GEMM inventory (" + time_source + ", " + fmt(ms) + " ms), bytes from " +
                   bytes_source + ", " + fmt(bytes / kGiB) + " GiB";
      u.baseline = std::find(baseline_fqns.begin(), baseline_fqns.end(), u.spec.aliases[0]) != baseline_fqns.end();
      index_of[u.spec.aliases[0]] = static_cast<int>(m.units.size());
      if (gemm_estimates++ == 0) gemm_estimate = u.spec.aliases[0] + ": " + u.estimate;
      m.units.push_back(std::move(u));
      continue;
    }
    if (u.rows.empty()) continue;  // an alias without rows (e.g. the expert's attention has no scope of its own)
    const UnitSums s0 = sum_rows(b0, u.spec.aliases);
    UnitSums s1;
    if (b1p) s1 = sum_rows(*b1p, u.spec.aliases);
    const bool two = b1p && s1.complete;
    u.recompute_ms = fit_linear(bb0, s0.recompute_ms, two ? b1_batch : std::nullopt,
                                two ? std::optional<double>(s1.recompute_ms) : std::nullopt);
    u.act_bytes =
        fit_linear(bb0, s0.act, two ? b1_batch : std::nullopt, two ? std::optional<double>(s1.act) : std::nullopt);
    u.out_bytes = fit_linear(bb0, std::min(s0.out, s0.act), two ? b1_batch : std::nullopt,
                             two ? std::optional<double>(std::min(s1.out, s1.act)) : std::nullopt);
    u.baseline = std::find(baseline_fqns.begin(), baseline_fqns.end(), u.spec.aliases[0]) != baseline_fqns.end() ||
                 std::any_of(u.spec.aliases.begin(), u.spec.aliases.end(), [&](const std::string& a) {
                   return std::find(baseline_fqns.begin(), baseline_fqns.end(), a) != baseline_fqns.end();
                 });
    const bool under_recompute = std::any_of(baseline_fqns.begin(), baseline_fqns.end(),
                                             [&](const std::string& s) { return fqn_within(u.spec.aliases[0], s); });
    // Measured under recompute, a module keeps nothing but its output: its real activation size is unknown
    // until an A/B row (removing the recompute) says it.
    u.size_known = !(under_recompute && s0.act <= s0.out);
    index_of[u.spec.aliases[0]] = static_cast<int>(m.units.size());
    m.units.push_back(std::move(u));
  }
  for (size_t i = 0; i < m.units.size(); ++i) {
    UnitModel& u = m.units[i];
    size_t best_len = 0;
    for (size_t j = 0; j < m.units.size(); ++j) {
      if (j == i) continue;
      const UnitModel& v = m.units[j];
      const bool contains = std::all_of(u.spec.aliases.begin(), u.spec.aliases.end(), [&](const std::string& a) {
        return std::any_of(v.spec.aliases.begin(), v.spec.aliases.end(),
                           [&](const std::string& va) { return fqn_within(a, va) && a != va; });
      });
      if (contains && v.spec.aliases[0].size() > best_len) {
        best_len = v.spec.aliases[0].size();
        u.parent = static_cast<int>(j);
      }
    }
    if (u.parent >= static_cast<int>(i))
      throw PlanInputError("recompute candidates: '" + u.spec.aliases[0] + "' sorts before its enclosing '" +
                           m.units[static_cast<size_t>(u.parent)].spec.aliases[0] + "'");
    if (u.baseline) m.baseline_units.push_back(static_cast<int>(i));
  }

  // ---- 4. Calibration: each A/B row is ground truth for its units at the profiled batch. ----
  std::set<int> calibrated;
  for (size_t c = 0; c < b0.recompute.size(); ++c) {
    const formats::RecomputeCandidate& row = b0.recompute[c];
    Calibration cal;
    cal.name = row.name;
    cal.added = row.added;
    std::set<int> units;
    for (const std::string& fqn : class_fqns[c]) {
      auto a = by_alias.find(fqn);
      if (a == by_alias.end()) continue;
      auto it = index_of.find(specs[a->second].aliases[0]);
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
      if (cal.time_factor != raw) cal.note += "time factor " + fmt(raw) + " clamped; ";
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
      if (cal.memory_factor != raw) cal.note += "memory factor " + fmt(raw) + " clamped; ";
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
  // A parent holds at least what its child units hold (children measured under recompute, or calibrated up,
  // can exceed the parent's own row). Children come after parents, so one backward pass settles every level.
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
  if (gemm_estimates > 0)
    m.notes.push_back(std::to_string(gemm_estimates) +
                      " backbone_mlp_gate_up units (merged gate+up GEMM outputs, no module rows): each costs its "
                      "GEMM's forward once more and frees its output; e.g. " +
                      gemm_estimate + " (an A/B row of class 'backbone_mlp_gate_up' calibrates them when present)");
  for (const UnitModel& u : m.units) {
    if (!u.size_known)
      m.notes.push_back("'" + u.spec.aliases[0] +
                        "' was profiled recomputed and no A/B row measured its activation: it stays recomputed");
  }
  return m;
}

RecomputeAtBatch recompute_problem(const CostModel& model, int64_t batch, double budget_gib,
                                   RecomputeProblem& problem) {
  const double b = static_cast<double>(batch);
  problem = RecomputeProblem{};
  problem.quantum_bytes = int64_t{1} << 20;  // 1 MiB: at most ~0.1 GiB conservative over 100 segments
  for (const UnitModel& u : model.units) {
    RecomputeItem item;
    item.parent = u.parent;
    item.act_bytes = static_cast<int64_t>(std::llround(std::max(0.0, u.act_bytes.at(b))));
    item.out_bytes = std::min(item.act_bytes, static_cast<int64_t>(std::llround(std::max(0.0, u.out_bytes.at(b)))));
    item.cost_ms = std::max(0.0, u.recompute_ms.at(b));
    item.forced = u.baseline && !u.size_known;
    problem.items.push_back(item);
  }
  RecomputeAtBatch at;
  at.batch = b;
  const RecomputeEvaluation base = evaluate_recompute(problem, model.baseline_units);
  at.baseline_act_peak_bytes = static_cast<double>(base.peak_bytes);
  at.other_gib = model.peak_gib.at(b) - at.baseline_act_peak_bytes / kGiB + model.optimizer_delta_gib;
  const double budget_bytes = (budget_gib - at.other_gib) * kGiB;
  problem.budget_bytes = budget_bytes < 0 ? -1 : static_cast<int64_t>(budget_bytes);
  return at;
}

Prediction predict(const CostModel& model, const Candidate& c, int grad_accum, int world_size) {
  const double b = static_cast<double>(c.micro_batch);
  RecomputeProblem problem;
  const RecomputeAtBatch at = recompute_problem(model, c.micro_batch, 0.0, problem);
  Prediction p;
  for (int i : c.recompute) p.recompute_ms += problem.items[static_cast<size_t>(i)].cost_ms;
  for (int i : model.baseline_units) p.recompute_ms -= problem.items[static_cast<size_t>(i)].cost_ms;
  const RecomputeEvaluation e = evaluate_recompute(problem, c.recompute);
  p.peak_gib = at.other_gib + static_cast<double>(e.peak_bytes) / kGiB;

  // FP8: each GEMM at the precision the candidate gives it minus the one the profiled recipe gave it.
  const double scale = b / static_cast<double>(model.profiled_batch);
  std::set<int> chosen(c.fp8.begin(), c.fp8.end());
  for (size_t g = 0; g < model.profile.gemms.size(); ++g) {
    const formats::GemmEntry& gemm = model.profile.gemms[g];
    bool profiled_fp8 = false;
    for (const std::string& member : gemm.members)
      for (const std::string& pattern : model.profile.recipe.fp8.modules)
        profiled_fp8 = profiled_fp8 || formats::fqn_matches(pattern, member);
    const bool planned_fp8 = chosen.count(static_cast<int>(g)) > 0;
    if (planned_fp8 == profiled_fp8) continue;
    const bool recomputed = inside_selection(model, c.recompute, gemm.members[0]);
    p.fp8_ms += gemm_ms(gemm, planned_fp8, recomputed, scale) - gemm_ms(gemm, profiled_fp8, recomputed, scale);
  }
  p.comm_ms = c.comm_exposed_ms;
  p.step_ms = model.step_ms.at(b) + p.recompute_ms + p.fp8_ms + p.comm_ms;
  p.samples_per_s = p.step_ms > 0 ? b * grad_accum * world_size / (p.step_ms / 1e3) : 0;
  return p;
}

double adamw_moment_bytes(double numel, double element_bytes, formats::StateDtype state_dtype) {
  if (state_dtype == formats::StateDtype::kAuto) return 2 * numel * element_bytes;
  const double blocks = std::ceil(numel / static_cast<double>(kernels::kAdamwQuantBlock));
  return 2 * (numel + 4 * blocks);
}

double plan_optimizer_state(CostModel& model, formats::StateDtype planned) {
  model.optimizer_delta_gib = 0;
  const formats::Recipe& profiled = model.profile.recipe;
  if (planned == profiled.optimizer.state_dtype) return 0;
  const std::optional<int64_t> parameter_bytes = model.profile.batches[0].memory.parameter_bytes;
  if (!parameter_bytes || *parameter_bytes <= 0)
    throw PlanInputError(std::string("--optimizer-state ") + formats::to_string(planned) +
                         ": the profile has no parameter bytes (batches[0].memory.parameter_bytes) to size the "
                         "optimizer state from");
  // Parameters are bf16 under precision bf16 and fp32 under fp32-master (the trainer's model dtype on the GPU).
  const double element_bytes = profiled.model_options.precision == formats::Precision::kBf16 ? 2 : 4;
  const double numel = static_cast<double>(*parameter_bytes) / element_bytes;
  model.optimizer_delta_gib = (adamw_moment_bytes(numel, element_bytes, planned) -
                               adamw_moment_bytes(numel, element_bytes, profiled.optimizer.state_dtype)) /
                              kGiB;
  return model.optimizer_delta_gib;
}

}  // namespace vlatune::tuner
