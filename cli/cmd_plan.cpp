// `vlatune plan`: profile.json -> recipe.json (recompute set, FP8 set, groups, micro-batch), explained.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"

namespace vlatune::cli {

struct PlanOptions {
  std::string profile;
  double memory_budget_gib = 0;
  int world_size = 1;
  std::string fp8 = "off";
  std::string out;
  bool explain = false;
};

static int run_plan(const PlanOptions&) {
  throw Unavailable("plan: not available yet: the tuner arrives with the planning issue");
}

void setup_plan(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<PlanOptions>();
  auto* cmd = app.add_subcommand("plan",
                                 "Choose recompute modules, FP8 Linears, groups and micro-batch from a "
                                 "profile -> recipe.json");
  cmd->add_option("--profile", opts->profile, "profile.json written by `vlatune profile`")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--memory-budget", opts->memory_budget_gib, "GiB (default: profiled GPU memory - 5%)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--world-size", opts->world_size, "Data-parallel GPUs")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--fp8", opts->fp8, "Consider FP8 Linears")->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--out", opts->out, "recipe.json to write")->required();
  cmd->add_flag("--explain", opts->explain, "Print every decision with the figures behind it");
  cmd->callback([&ctx, opts] { ctx.action = [opts] { return run_plan(*opts); }; });
}

}  // namespace vlatune::cli
