// `vlatune check`: compare a run (or profile) against a baseline; exit non-zero on a real regression.
// Exit codes: 0 pass, 1 performance regression, 2 numerics failure, 3 incomparable (too few timed steps included),
// 4 bad input or any other error (never 1, which is the regression verdict). The rules live
// in reports/check.h (documented in reports/README.md); this file reads flags and files and prints the verdict.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"
#include "cli/validators.h"
#include "formats/json_error.h"
#include "reports/check.h"

namespace vlatune::cli {

namespace {

struct CheckCliOptions {
  std::string baseline;
  std::string candidate;
  reports::CheckOptions check;
  bool update_baseline = false;
};

int check_and_report(const CheckCliOptions& o, Context& ctx) {
  const reports::CheckSubject baseline = reports::read_check_subject(o.baseline);  // FormatError: exit 4
  const reports::CheckSubject candidate = reports::read_check_subject(o.candidate);
  const reports::CheckResult result = reports::check(baseline, candidate, o.check);
  ctx.out << reports::format_check(result, o.check);
  if (o.update_baseline) {
    if (reports::update_baseline_if_improved(result)) {
      ctx.out << "baseline updated: " << result.baseline_file << " <- " << result.candidate_file << "\n";
    } else {
      ctx.out << "baseline kept: --update-baseline replaces it only on a pass with a significant improvement\n";
    }
  }
  return reports::verdict_exit_code(result.verdict);
}

// Exit 1 is the regression verdict here, so an error that is not a verdict (a baseline that could not be
// rewritten, say) exits 4 like bad input, never 1: a CI job must not mistake it for a regression.
int run_check(const CheckCliOptions& o, Context& ctx) {
  try {
    return check_and_report(o, ctx);
  } catch (const formats::FormatError&) {
    throw;
  } catch (const std::exception& e) {
    ctx.err << "vlatune: error: " << e.what() << "\n";
    return kExitBadInput;
  }
}

}  // namespace

void setup_check(CLI::App& app, Context& ctx) {
  auto o = std::make_shared<CheckCliOptions>();
  auto& c = o->check;
  auto* cmd = app.add_subcommand("check",
                                 "Compare a candidate run.json/profile.json against a baseline "
                                 "(exit 0 pass, 1 regression, 2 numerics, 3 incomparable, 4 bad input)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--baseline,baseline", o->baseline,
                  "Baseline run.json, run directory, profile.json or profile directory")
      ->required()
      ->check(file_or_directory());
  cmd->add_option("--candidate,candidate", o->candidate,
                  "Candidate run.json, run directory, profile.json or profile directory")
      ->required()
      ->check(file_or_directory());
  cmd->add_option("--threshold", c.threshold_pct, "Practical threshold on the median step time, %")
      ->check(finite_range(0.0, 1000.0));
  cmd->add_option("--alpha", c.alpha, "Significance level of the two-sided Mann-Whitney U test")
      ->check(finite_range(1e-9, 0.5));
  cmd->add_option("--rtol", c.rtol_pct, "Per-step loss and grad-norm relative error, %")
      ->check(finite_range(0.0, 1000.0));
  cmd->add_option("--pearson-min", c.pearson_min,
                  "Runs of >= --long-run-steps steps: minimum Pearson correlation of the loss and grad-norm "
                  "curves")
      ->check(finite_range(-1.0, 1.0));
  cmd->add_option("--mre-max", c.mre_max_pct, "... and maximum mean relative error, %")
      ->check(finite_range(0.0, 1000.0));
  cmd->add_flag(
      "--curve-loss-only", [cp = &c](int64_t) { cp->curve_gates_grad_norm = false; },
      "Long runs: gate the loss curve only and report the gradient-norm curve (the FP8 numerics gate is on losses)");
  cmd->add_option("--long-run-steps", c.long_run_steps,
                  "Steps both runs trained (warm-up included) from which the curves are gated instead of each step")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 40));
  cmd->add_flag("--numerics", c.numerics_only,
                "Only the numerics gates (NaN/skipped steps, loss and grad-norm agreement); runs may differ in "
                "recipe, GPU and software, not in seed, data, batch or config");
  cmd->add_flag("--force", c.force, "Compare even across different GPU, driver, CUDA, torch, batch or recipe");
  cmd->add_flag("--update-baseline", o->update_baseline,
                "Copy the candidate over the baseline when it passes with a significant improvement");
  cmd->callback([&ctx, o] { ctx.action = [&ctx, o] { return run_check(*o, ctx); }; });
}

}  // namespace vlatune::cli
