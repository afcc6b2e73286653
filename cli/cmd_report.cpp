// `vlatune report`: profile/plan/runs rendered as one self-contained HTML page with plots (reports/report.h).
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/cli.h"
#include "cli/validators.h"
#include "formats/json_io.h"
#include "formats/profile.h"
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
  std::vector<std::pair<std::string, std::string>> inputs;
  if (!o.profile.empty()) {
    in.profile_file = formats::profile_file(o.profile);
    inputs.push_back({"--profile", in.profile_file});
  }
  if (!o.recipe.empty()) inputs.push_back({"--recipe", o.recipe});
  for (const auto& run : o.runs)
    for (const auto& file : reports::report_run_files(run)) inputs.push_back({"--run", file});
  require_distinct_output("--out", o.out, inputs);

  // Unreadable or invalid inputs are formats::FormatError: exit 4 with the file and JSON path.
  if (!o.profile.empty()) in.profile = formats::read_profile(in.profile_file);
  if (!o.recipe.empty()) {
    in.recipe = formats::read_recipe(o.recipe);
    in.recipe_file = o.recipe;
  }
  in.runs = reports::read_report_runs(o.runs);
  const std::string html = reports::render_report(in);
  formats::write_file_atomic(o.out, html);  // a failed write is formats::WriteError: exit 1
  ctx.out << "wrote " << o.out << " (" << html.size() / 1024 << " KiB)\n";
  return kExitOk;
}

}  // namespace

void setup_report(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<ReportOptions>();
  auto* cmd = app.add_subcommand("report", "Render a profile, a recipe and runs as one HTML page with plots");
  cmd->add_option("--profile", opts->profile,
                  "profile.json, or the directory `vlatune profile --out` wrote (default: none)")
      ->check(file_or_directory());
  cmd->add_option("--recipe", opts->recipe, "recipe.json (default: none)")->check(regular_file());
  cmd->add_option("--run", opts->runs,
                  "Run directories (run.json + metrics.jsonl + recipe.json) or run.json files; repeatable "
                  "(default: none)")
      ->check(file_or_directory());
  cmd->add_option("--out", opts->out, "HTML file to write")->required();
  cmd->callback([&ctx, opts] { ctx.action = [&ctx, opts] { return run_report(*opts, ctx); }; });
}

}  // namespace vlatune::cli
