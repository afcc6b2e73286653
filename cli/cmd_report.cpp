// `vlatune report`: profile/plan/runs rendered as one self-contained HTML page with plots (reports/report.h).
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"
#include "formats/json_error.h"
#include "formats/json_io.h"
#include "reports/report.h"

namespace vlatune::cli {

namespace {

struct ReportOptions {
  std::string profile;
  std::string recipe;
  std::vector<std::string> runs;
  std::string out;
};

int run_report(const ReportOptions& o, Context& ctx) {
  if (o.profile.empty() && o.recipe.empty() && o.runs.empty())
    throw BadInput("report: nothing to render: give --profile, --recipe and/or --run");
  reports::ReportInput in;
  try {
    if (!o.profile.empty()) {
      in.profile = formats::read_profile(o.profile);
      in.profile_file = o.profile;
    }
    if (!o.recipe.empty()) {
      in.recipe = formats::read_recipe(o.recipe);
      in.recipe_file = o.recipe;
    }
    in.runs = reports::read_report_runs(o.runs);
  } catch (const formats::FormatError& e) {
    throw BadInput(e.what());
  }
  const std::string html = reports::render_report(in);
  formats::write_file_atomic(o.out, html);
  ctx.out << "wrote " << o.out << " (" << html.size() / 1024 << " KiB)\n";
  return kExitOk;
}

}  // namespace

void setup_report(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<ReportOptions>();
  auto* cmd = app.add_subcommand("report", "Render a profile, a recipe and runs as one HTML page with plots");
  cmd->add_option("--profile", opts->profile, "profile.json")->check(CLI::ExistingFile);
  cmd->add_option("--recipe", opts->recipe, "recipe.json")->check(CLI::ExistingFile);
  cmd->add_option("--run", opts->runs, "Run directories (run.json + metrics.jsonl) or run.json files")
      ->check(CLI::ExistingPath);
  cmd->add_option("--out", opts->out, "HTML file to write")->required();
  cmd->callback([&ctx, opts] { ctx.action = [&ctx, opts] { return run_report(*opts, ctx); }; });
}

}  // namespace vlatune::cli
