// `vlatune check`: is a candidate run (or profile) a regression against a baseline? Pure logic on parsed files;
// the CLI (cli/cmd_check.cpp) only reads flags, calls check() and returns verdict_exit_code(). The rules, and why
// each exists, are in reports/README.md ("check"); in short:
//   1. Comparable?  Different gpu, driver, cuda, torch, config, world_size, recipe_hash or batch -> kIncomparable
//      (unless force), naming every difference. --numerics compares runs of different recipes on purpose (FP8 vs
//      bf16): there only config, world_size, batch, seed and data must agree.
//   2. Numerics (hard gates, independent of timing): no NaN loss/grad-norm and no skipped step in the candidate;
//      for runs of the same seed and data, per-step loss and grad-norm within `rtol` of the baseline — or, when
//      both runs trained >= long_run_steps steps (the timing warm-up run.json leaves out counts), the curves over
//      the steps both recorded: Pearson >= pearson_min and mean relative error <= mre_max (one noisy step does not
//      fail a long run, a drifting curve does).
//   3. Timing: step_ms after warm-up, >= kMinTimingSamples per side, two-sided Mann-Whitney U at alpha AND the
//      median grown by >= threshold: both, or it is not a regression. Fewer samples (an empty or short run):
//      kIncomparable naming the counts found and needed, never a pass.
//   4. On a regression: the modules whose time per step grew most (both sides profiles).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/profile.h"
#include "formats/run_record.h"
#include "reports/stats.h"

namespace vlatune::reports {

inline constexpr size_t kMinTimingSamples = 9;  // Google Benchmark's UTEST_OPTIMAL_REPETITIONS
inline constexpr size_t kMinCurveSteps = 3;     // finite shared steps below which a long run is judged per step

// The verdicts are the exit codes of `vlatune check` (4, bad input, is the CLI's: unreadable files, bad flags).
enum class Verdict : int { kPass = 0, kRegression = 1, kNumericsFailure = 2, kIncomparable = 3 };
const char* to_string(Verdict v);  // "pass" | "regression" | "numerics failure" | "incomparable"
inline int verdict_exit_code(Verdict v) {
  return static_cast<int>(v);
}

// One side of a comparison, from run.json or profile.json.
struct CheckSubject {
  std::string file;
  std::string kind;             // "run" | "profile"
  std::vector<double> step_ms;  // timing samples, warm-up already dropped
  int64_t batch = 0;            // samples per optimizer step
  formats::Environment environment;
  // The recipe it ran (a run directory's recipe.json beside run.json, a profile's own), to name the keys behind a
  // recipe_hash difference; unset when there is none.
  std::optional<formats::Recipe> recipe;
  // Numerics (runs only; empty for profiles).
  bool has_numerics = false;
  std::vector<double> loss, grad_norm;  // per step; NaN = non-finite
  int64_t first_step = 0;               // the optimizer step of loss[0] (per_step holds the run's last steps)
  int64_t skipped_steps = 0;
  std::optional<int64_t> seed;
  std::optional<std::string> data;
  // Per-module exclusive time per step, ms (profiles only), for naming the modules that grew.
  std::map<std::string, double> module_ms;
};

CheckSubject subject_from_run(const formats::RunRecord& run, const std::string& file);
// A profile's requested batch (batches[0]): its timed steps (step_ms_samples) and each module's exclusive time
// (self_ms: summing to the attributed time, so a grown parent is not listed for its children's growth).
// batch is samples per optimizer step, as in run.json: micro-batch x grad_accum x world_size.
CheckSubject subject_from_profile(const formats::Profile& profile, const std::string& file);
// Reads a run.json, a run directory (DIR/run.json), a profile.json or a profile directory (DIR/profile.json when
// there is no DIR/run.json), told apart by "schema".
// Errors: formats::FormatError naming the file (and the JSON path).
CheckSubject read_check_subject(const std::string& path);

struct CheckOptions {
  double threshold_pct = 3.0;  // practical threshold on the median step time, %
  double alpha = 0.05;         // significance level of the two-sided U test
  double rtol_pct = 2.0;       // per-step loss / grad-norm relative error, %
  double pearson_min = 0.999;  // long runs: loss / grad-norm curve correlation
  double mre_max_pct = 1.0;    // long runs: mean relative error of the curves, %
  int64_t long_run_steps = 200;
  bool curve_gates_grad_norm = true;  // false (--curve-loss-only): long runs gate the loss curve only
  bool numerics_only = false;         // --numerics: only the numerics gates
  bool force = false;                 // compare despite environment differences
};

enum class TimingStatus {
  kNotRun,        // --numerics, or incomparable
  kInsufficient,  // fewer than kMinTimingSamples on a side: the verdict is kIncomparable
  kUnchanged,     // not significant, or significant but within the threshold
  kRegression,    // significant and the median grew by >= threshold
  kImprovement,   // significant and the median shrank by >= threshold
};
const char* to_string(TimingStatus s);

struct TimingResult {
  TimingStatus status = TimingStatus::kNotRun;
  size_t n_baseline = 0, n_candidate = 0;
  double median_ms_baseline = 0, median_ms_candidate = 0;
  double change_pct = 0;  // (candidate / baseline - 1) * 100 of the medians
  std::optional<MannWhitney> u_test;
};

struct SeriesCheck {
  std::string name;  // "loss" | "grad_norm"
  size_t steps = 0;  // steps compared (both finite)
  SeriesError error;
  int64_t worst_step = 0;  // the optimizer step of error.max_relative
  double pearson = 0;      // NaN when a curve is constant; only meaningful for the curve method
  bool curve = false;      // judged by pearson + mean relative error (long run) rather than per step
  bool gated = true;       // false: reported only (the grad-norm curve under curve_gates_grad_norm = false)
  bool pass = true;
};

struct NumericsResult {
  bool run = false;       // false: nothing to compare (profiles, or --numerics with nothing comparable)
  bool compared = false;  // loss/grad-norm curves compared (same seed and data, overlapping steps)
  std::vector<SeriesCheck> series;
  std::vector<std::string> failures;  // NaN / skipped steps in the candidate, one line each
  std::vector<std::string> notes;     // why curves were not compared, baseline problems
  bool pass() const {
    for (const auto& s : series) {
      if (!s.pass) return false;
    }
    return failures.empty();
  }
};

struct ModuleDelta {
  std::string fqn;
  double ms_baseline = 0, ms_candidate = 0;  // per step; 0 when absent on that side
  double delta_ms() const { return ms_candidate - ms_baseline; }
};

struct CheckResult {
  Verdict verdict = Verdict::kPass;
  std::string baseline_file, candidate_file;
  bool numerics_only = false;
  std::vector<std::string> differences;  // "gpu: NVIDIA H200 vs NVIDIA H100" (blocking unless forced)
  std::vector<std::string> notes;        // non-blocking differences (commits, forced comparisons, ...)
  TimingResult timing;
  NumericsResult numerics;
  std::vector<ModuleDelta> grown_modules;  // largest growth first, only modules that grew (profiles)
  bool improvement_significant() const { return timing.status == TimingStatus::kImprovement; }
};

inline constexpr size_t kModulesNamed = 10;  // grown modules listed on a failure

CheckResult check(const CheckSubject& baseline, const CheckSubject& candidate, const CheckOptions& options);

// The multi-line human-readable verdict `vlatune check` prints (deterministic).
std::string format_check(const CheckResult& result, const CheckOptions& options);

// --update-baseline: when the result is a pass with a significant improvement, copies the candidate file over the
// baseline (atomically) and returns true; otherwise leaves the baseline alone and returns false.
bool update_baseline_if_improved(const CheckResult& result);

}  // namespace vlatune::reports
