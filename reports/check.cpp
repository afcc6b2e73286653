#include "reports/check.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "formats/json_cursor.h"
#include "formats/json_error.h"
#include "formats/json_io.h"
#include "reports/number_format.h"

namespace vlatune::reports {

namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// "812.40 ms" or "no timed steps".
std::string median_text(size_t n, double median_ms) {
  return n == 0 ? std::string("no timed steps") : fixed(median_ms, 2) + " ms";
}

std::string or_null(const std::optional<std::string>& s) {
  return s ? *s : std::string("null");
}

std::string or_null(const std::optional<int64_t>& v) {
  return v ? std::to_string(*v) : std::string("null");
}

// The environment fields a timing depends on, as "name: baseline vs candidate" for each that differs.
// vlatune_commit is left out on purpose: comparing commits is what check is for.
void environment_differences(const CheckSubject& b, const CheckSubject& c, bool timing_fields,
                             std::vector<std::string>& blocking, std::vector<std::string>& informational) {
  const formats::Environment &eb = b.environment, &ec = c.environment;
  auto add = [](std::vector<std::string>& to, const char* name, const std::string& x, const std::string& y) {
    if (x != y) to.push_back(std::string(name) + ": " + x + " vs " + y);
  };
  // Timing-only fields: a numerics comparison (--numerics) may span them, and says so.
  auto& timing = timing_fields ? blocking : informational;
  add(timing, "gpu", or_null(eb.gpu), or_null(ec.gpu));
  add(timing, "driver", or_null(eb.driver), or_null(ec.driver));
  add(timing, "cuda", or_null(eb.cuda), or_null(ec.cuda));
  add(timing, "torch", eb.torch, ec.torch);
  if (eb.recipe_hash != ec.recipe_hash) {
    std::string keys;
    if (b.recipe && c.recipe)
      for (const std::string& d : formats::recipe_differences(*b.recipe, *c.recipe))
        keys += (keys.empty() ? "" : "; ") + d;
    timing.push_back("recipe_hash: " + eb.recipe_hash + " vs " + ec.recipe_hash + " (" +
                     (keys.empty() ? std::string("no recipe.json beside both runs: the keys cannot be named")
                                   : "keys that differ: " + keys) +
                     ")");
  }
  // What the model computes: never comparable across these.
  add(blocking, "config", eb.config, ec.config);
  add(blocking, "world_size", std::to_string(eb.world_size), std::to_string(ec.world_size));
  add(blocking, "batch", std::to_string(b.batch), std::to_string(c.batch));
  add(informational, "vlatune_commit", or_null(eb.vlatune_commit), or_null(ec.vlatune_commit));
}

TimingResult compare_timing(const CheckSubject& b, const CheckSubject& c, const CheckOptions& o) {
  TimingResult t;
  t.n_baseline = b.step_ms.size();
  t.n_candidate = c.step_ms.size();
  t.median_ms_baseline = median(b.step_ms);
  t.median_ms_candidate = median(c.step_ms);
  t.change_pct = (t.median_ms_candidate / t.median_ms_baseline - 1.0) * 100.0;
  if (t.n_baseline < kMinTimingSamples || t.n_candidate < kMinTimingSamples) {
    t.status = TimingStatus::kInsufficient;
    return t;
  }
  t.u_test = mann_whitney_u(b.step_ms, c.step_ms);
  const bool significant = t.u_test->p_value < o.alpha;
  if (significant && t.change_pct >= o.threshold_pct) {
    t.status = TimingStatus::kRegression;
  } else if (significant && t.change_pct <= -o.threshold_pct) {
    t.status = TimingStatus::kImprovement;
  } else {
    t.status = TimingStatus::kUnchanged;
  }
  return t;
}

// Non-finite values and skipped steps in the candidate: hard failures. In the baseline: a note (the baseline
// should be replaced, but the candidate is not at fault).
void check_finite(const CheckSubject& s, bool is_candidate, NumericsResult& n) {
  auto& out = is_candidate ? n.failures : n.notes;
  const std::string who = is_candidate ? "candidate" : "baseline";
  if (s.skipped_steps > 0)
    out.push_back(who + " skipped " + std::to_string(s.skipped_steps) +
                  " step(s) for a non-finite loss or gradient norm");
  for (const auto& [name, series] : {std::make_pair("loss", &s.loss), std::make_pair("grad_norm", &s.grad_norm)}) {
    size_t count = 0;
    int64_t first = -1;
    for (size_t i = 0; i < series->size(); ++i) {
      if (std::isfinite((*series)[i])) continue;
      if (count++ == 0) first = s.first_step + static_cast<int64_t>(i);
    }
    if (count > 0)
      out.push_back(who + " " + name + " is NaN/inf at " + std::to_string(count) + " step(s), first at step " +
                    std::to_string(first));
  }
}

SeriesCheck compare_series(const std::string& name, const std::vector<double>& b, int64_t b_first,
                           const std::vector<double>& c, int64_t c_first, int64_t lo, int64_t hi,
                           const CheckOptions& o) {
  SeriesCheck s;
  s.name = name;
  std::vector<double> xb, xc;
  std::vector<int64_t> steps;
  for (int64_t step = lo; step < hi; ++step) {
    const double vb = b[static_cast<size_t>(step - b_first)], vc = c[static_cast<size_t>(step - c_first)];
    if (!std::isfinite(vb) || !std::isfinite(vc)) continue;  // judged by the NaN gate
    xb.push_back(vb);
    xc.push_back(vc);
    steps.push_back(step);
  }
  s.steps = xb.size();
  if (xb.empty()) return s;
  s.error = series_error(xb, xc);
  s.worst_step = steps[s.error.argmax];
  // Long is how far both runs trained (`hi`: steps counted from 0), not how many steps run.json recorded: it leaves
  // out the timing warm-up, and a 200-step gate run must not fall back to the per-step rule for that. Pearson needs
  // a few points.
  s.curve = hi >= o.long_run_steps && xb.size() >= kMinCurveSteps;
  if (s.curve) {
    s.pearson = pearson(xb, xc);
    // A constant curve has no correlation to speak of: the mean relative error alone decides.
    const bool correlated = std::isnan(s.pearson) || s.pearson >= o.pearson_min;
    s.pass = correlated && s.error.mean_relative * 100.0 <= o.mre_max_pct;
    if (name == "grad_norm" && !o.curve_gates_grad_norm) {
      s.gated = false;
      s.pass = true;
    }
  } else {
    s.pearson = std::nan("");
    s.pass = s.error.max_relative * 100.0 <= o.rtol_pct;
  }
  return s;
}

NumericsResult compare_numerics(const CheckSubject& b, const CheckSubject& c, const CheckOptions& o) {
  NumericsResult n;
  if (!b.has_numerics || !c.has_numerics) {
    n.notes.push_back("no per-step loss in " + std::string(!b.has_numerics ? "the baseline" : "the candidate") + " (" +
                      (!b.has_numerics ? b.kind : c.kind) + "): numerics gates need two run.json files");
    return n;
  }
  n.run = true;
  check_finite(b, false, n);
  check_finite(c, true, n);
  if (b.seed != c.seed || b.data != c.data) {
    n.notes.push_back("loss curves not compared: different seed or data (seed " + or_null(b.seed) + " vs " +
                      or_null(c.seed) + ", data " + or_null(b.data) + " vs " + or_null(c.data) + ")");
    return n;
  }
  const int64_t lo = std::max(b.first_step, c.first_step);
  const int64_t hi =
      std::min(b.first_step + static_cast<int64_t>(b.loss.size()), c.first_step + static_cast<int64_t>(c.loss.size()));
  if (hi <= lo) {
    n.notes.push_back("loss curves not compared: the runs share no recorded step");
    return n;
  }
  n.compared = true;
  for (const auto& [name, sb, sc] :
       {std::make_tuple("loss", &b.loss, &c.loss), std::make_tuple("grad_norm", &b.grad_norm, &c.grad_norm)}) {
    n.series.push_back(compare_series(name, *sb, b.first_step, *sc, c.first_step, lo, hi, o));
  }
  return n;
}

std::vector<ModuleDelta> grown_modules(const CheckSubject& b, const CheckSubject& c) {
  std::map<std::string, ModuleDelta> all;
  for (const auto& [fqn, ms] : b.module_ms) all[fqn].ms_baseline = ms;
  for (const auto& [fqn, ms] : c.module_ms) all[fqn].ms_candidate = ms;
  std::vector<ModuleDelta> out;
  for (auto& [fqn, d] : all) {
    d.fqn = fqn;
    if (d.delta_ms() > 0) out.push_back(d);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ModuleDelta& x, const ModuleDelta& y) { return x.delta_ms() > y.delta_ms(); });
  return out;
}

}  // namespace

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "pass";
    case Verdict::kRegression:
      return "regression";
    case Verdict::kNumericsFailure:
      return "numerics failure";
    case Verdict::kIncomparable:
      return "incomparable";
  }
  return "?";
}

const char* to_string(TimingStatus s) {
  switch (s) {
    case TimingStatus::kNotRun:
      return "not run";
    case TimingStatus::kInsufficient:
      return "insufficient";
    case TimingStatus::kUnchanged:
      return "unchanged";
    case TimingStatus::kRegression:
      return "regression";
    case TimingStatus::kImprovement:
      return "improvement";
  }
  return "?";
}

CheckSubject subject_from_run(const formats::RunRecord& run, const std::string& file) {
  CheckSubject s;
  s.file = file;
  s.kind = "run";
  s.step_ms = run.step_ms;
  s.batch = run.batch;
  s.environment = run.environment;
  s.has_numerics = true;
  s.loss = run.loss;
  s.grad_norm = run.grad_norm;
  s.first_step = run.steps - static_cast<int64_t>(run.loss.size());
  s.skipped_steps = run.skipped_steps;
  s.seed = run.seed;
  s.data = run.data;
  return s;
}

CheckSubject subject_from_profile(const formats::Profile& profile, const std::string& file) {
  CheckSubject s;
  s.file = file;
  s.kind = "profile";
  const formats::BatchProfile& b = profile.batches.at(0);  // parse_profile guarantees one
  s.step_ms = b.step_ms_samples;
  s.batch = b.batch * profile.recipe.batch.grad_accum * profile.environment.world_size;
  s.environment = profile.environment;
  for (const auto& m : b.modules) s.module_ms[m.fqn] = m.self_ms;
  return s;
}

CheckSubject read_check_subject(const std::string& path) {
  std::string file = path;
  if (is_directory(path)) {
    file = path + "/run.json";
    if (!exists(file) && exists(path + "/profile.json")) file = path + "/profile.json";
  }
  const nlohmann::json j = formats::read_json_file(file);
  const formats::JsonCursor root(j, file);
  if (!j.is_object()) root.fail("expected a run.json or profile.json object, got " + formats::describe_json(j));
  const formats::JsonCursor schema = root.at("schema");
  const std::string name = schema.get_string();
  if (name == formats::kRunSchema) {
    CheckSubject s = subject_from_run(formats::parse_run_record(j, file), file);
    const size_t slash = file.rfind('/');
    const std::string recipe = (slash == std::string::npos ? std::string() : file.substr(0, slash + 1)) + "recipe.json";
    struct stat st {};
    if (::stat(recipe.c_str(), &st) == 0) s.recipe = formats::read_recipe(recipe);
    return s;
  }
  if (name == formats::kProfileSchema) {
    const formats::Profile profile = formats::parse_profile(j, file);
    CheckSubject s = subject_from_profile(profile, file);
    s.recipe = profile.recipe;
    return s;
  }
  schema.fail(std::string("expected \"") + formats::kRunSchema + "\" (run.json) or \"" + formats::kProfileSchema +
              "\" (profile.json), got " + formats::describe_json(schema.value()));
}

CheckResult check(const CheckSubject& b, const CheckSubject& c, const CheckOptions& o) {
  CheckResult r;
  r.baseline_file = b.file;
  r.candidate_file = c.file;
  r.numerics_only = o.numerics_only;

  std::vector<std::string> blocking, informational;
  environment_differences(b, c, !o.numerics_only, blocking, informational);
  if (o.numerics_only && (b.seed != c.seed || b.data != c.data))
    blocking.push_back("seed/data: " + or_null(b.seed) + "/" + or_null(b.data) + " vs " + or_null(c.seed) + "/" +
                       or_null(c.data) + " (loss curves of different runs cannot agree)");
  for (auto& d : informational) r.notes.push_back("differs (not gated): " + d);
  if (!blocking.empty() && !o.force) {
    r.differences = std::move(blocking);
    r.verdict = Verdict::kIncomparable;
    return r;
  }
  for (auto& d : blocking) r.notes.push_back("differs (--force): " + d);

  r.numerics = compare_numerics(b, c, o);
  if (o.numerics_only && !r.numerics.compared) {
    // The user asked for exactly this comparison and there is nothing to compare.
    for (const auto& n : r.numerics.notes) r.differences.push_back(n);
    if (r.differences.empty()) r.differences.push_back("no loss curves to compare");
    r.verdict = Verdict::kIncomparable;
    return r;
  }
  if (!o.numerics_only) {
    r.timing = compare_timing(b, c, o);
    if (r.timing.status == TimingStatus::kRegression) r.grown_modules = grown_modules(b, c);
  }
  if (!r.numerics.pass()) {
    r.verdict = Verdict::kNumericsFailure;  // wrong results outrank slow ones
  } else if (r.timing.status == TimingStatus::kInsufficient) {
    // A gate that cannot judge must not pass: an empty or short candidate is not evidence of "no regression".
    const TimingResult& t = r.timing;
    r.differences.push_back("timing: " + std::to_string(t.n_baseline) + " timed steps after warm-up in the baseline, " +
                            std::to_string(t.n_candidate) +
                            " in the candidate; the timing gate needs >= " + std::to_string(kMinTimingSamples) +
                            " on each side (run more steps, or use --numerics for the numerics gates alone)");
    r.verdict = Verdict::kIncomparable;
  } else if (r.timing.status == TimingStatus::kRegression) {
    r.verdict = Verdict::kRegression;
  }
  return r;
}

std::string format_check(const CheckResult& r, const CheckOptions& o) {
  std::ostringstream s;
  s << "baseline:  " << r.baseline_file << "\n";
  s << "candidate: " << r.candidate_file << "\n";
  for (const auto& d : r.differences) s << "incomparable: " << d << "\n";
  if (r.verdict == Verdict::kIncomparable && r.timing.status != TimingStatus::kInsufficient) {
    s << "verdict: incomparable (exit 3)" << (r.numerics_only ? "" : "; rerun with --force to compare anyway") << "\n";
    return s.str();
  }
  for (const auto& n : r.notes) s << "note: " << n << "\n";

  const TimingResult& t = r.timing;
  if (t.status != TimingStatus::kNotRun) {
    s << "timing: median step " << median_text(t.n_baseline, t.median_ms_baseline) << " -> "
      << median_text(t.n_candidate, t.median_ms_candidate);
    if (t.n_baseline > 0 && t.n_candidate > 0) s << " (" << signed_pct(t.change_pct) << ")";
    s << ", n " << t.n_baseline << " vs " << t.n_candidate;
    if (t.u_test) {
      s << ", Mann-Whitney U p = " << p_value_text(t.u_test->p_value) << (t.u_test->exact ? " (exact)" : "");
    }
    s << ": " << to_string(t.status);
    switch (t.status) {
      case TimingStatus::kInsufficient:
        s << " (needs >= " << kMinTimingSamples << " timed steps after warm-up on each side)";
        break;
      case TimingStatus::kUnchanged:
        if (t.u_test && t.u_test->p_value < o.alpha) {
          s << " (significant at alpha " << fixed(o.alpha, 3) << ", within the " << fixed(o.threshold_pct, 1)
            << "% threshold)";
        } else {
          s << " (not significant at alpha " << fixed(o.alpha, 3) << ")";
        }
        break;
      default:
        s << " (alpha " << fixed(o.alpha, 3) << ", threshold " << fixed(o.threshold_pct, 1) << "%)";
    }
    s << "\n";
  }

  const NumericsResult& n = r.numerics;
  for (const auto& line : n.notes) s << "numerics: " << line << "\n";
  for (const auto& sc : n.series) {
    s << "numerics: " << sc.name << " over " << sc.steps << " steps: ";
    if (sc.curve) {
      s << "Pearson " << fixed(sc.pearson, 5) << ", mean relative error " << fixed(sc.error.mean_relative * 100, 3)
        << "% (gate: Pearson >= " << fixed(o.pearson_min, 5) << ", mean <= " << fixed(o.mre_max_pct, 3) << "%)";
    } else {
      s << "max relative error " << fixed(sc.error.max_relative * 100, 3) << "% at step " << sc.worst_step
        << " (gate: <= " << fixed(o.rtol_pct, 3) << "% per step)";
    }
    s << (!sc.gated ? ": reported, not gated (--curve-loss-only)" : sc.pass ? ": ok" : ": FAIL") << "\n";
  }
  for (const auto& f : n.failures) s << "numerics FAIL: " << f << "\n";

  if (r.verdict == Verdict::kRegression) {
    if (!r.grown_modules.empty()) {
      s << "modules whose time per step grew most:\n";
      for (size_t i = 0; i < r.grown_modules.size() && i < kModulesNamed; ++i) {
        const ModuleDelta& d = r.grown_modules[i];
        s << "  " << signed_pct(d.ms_baseline > 0 ? (d.ms_candidate / d.ms_baseline - 1) * 100 : HUGE_VAL, 1) << "  "
          << fixed(d.ms_baseline, 3) << " -> " << fixed(d.ms_candidate, 3) << " ms  " << d.fqn << "\n";
      }
    } else {
      s << "per-module times: compare two profiles (vlatune profile on both sides) to see which modules grew\n";
    }
  }
  s << "verdict: " << to_string(r.verdict) << " (exit " << verdict_exit_code(r.verdict) << ")\n";
  return s.str();
}

bool update_baseline_if_improved(const CheckResult& r) {
  if (r.verdict != Verdict::kPass || !r.improvement_significant()) return false;
  formats::write_file_atomic(r.baseline_file, formats::read_text_file(r.candidate_file));
  return true;
}

}  // namespace vlatune::reports
