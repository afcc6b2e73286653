// `vlatune check`: compare a run (or profile) against a baseline; exit non-zero on a real regression.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"

namespace vlatune::cli {

struct CheckOptions {
  std::string baseline;
  std::string candidate;
  double threshold_pct = 3.0;
  bool numerics_only = false;
  bool force = false;
};

static int run_check(const CheckOptions&) {
  throw Unavailable("check: not available yet: the regression gate arrives with the check/report issue");
}

void setup_check(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<CheckOptions>();
  auto* cmd = app.add_subcommand("check",
                                 "Compare a candidate run.json/profile.json against a baseline "
                                 "(exit 0 pass, 1 regression, 2 numerics, 3 incomparable, 4 bad input)");
  cmd->add_option("--baseline", opts->baseline, "Baseline run.json or profile.json")->check(CLI::ExistingFile);
  cmd->add_option("--candidate", opts->candidate, "Candidate run.json or profile.json")->check(CLI::ExistingFile);
  cmd->add_option("--threshold", opts->threshold_pct, "Practical threshold on the median step time, %")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--numerics", opts->numerics_only, "Only the numerics gates (loss / grad-norm agreement)");
  cmd->add_flag("--force", opts->force, "Compare even across different GPU, driver, CUDA, torch, batch, recipe");
  cmd->callback([&ctx, opts] { ctx.action = [opts] { return run_check(*opts); }; });
}

}  // namespace vlatune::cli
