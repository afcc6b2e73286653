// `vlatune report`: a profile, a recipe and runs rendered as one self-contained HTML page (inline SVG, no
// scripts, no network), deterministic so it can be a golden file. Renderers take parsed structs and measure
// nothing. Sections appear when their input is there:
//   profile: data wait beside step time (input-bound above 5% of the step), step time by module (stacked by
//            phase), recompute ms/GiB per candidate, FP8 speedup per Linear, memory by phase
//   recipe:  settings, the candidate recipes the tuner considered (memory vs step time), every decision with its
//            reason, predicted vs measured (measured = the runs, else the profile)
//   runs:    summary table (precision and median data wait included), throughput (every step, faint, and its
//            rolling median), data-loader wait and loss over steps; with held-out evaluation rows in metrics.jsonl,
//            their loss beside the training loss and their action error
// The candidate convention (what the tuner emits so the trade-off plot finds it) is in reports/README.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "formats/metrics_jsonl.h"
#include "formats/profile.h"
#include "formats/recipe.h"
#include "formats/run_record.h"

namespace vlatune::reports {

struct ReportRun {
  std::string name;  // legend label: the run directory's name, or the file's path
  std::string file;  // run.json
  formats::RunRecord run;
  std::vector<formats::MetricsRow> metrics;  // every step (warm-up included) when metrics.jsonl was found
  std::optional<formats::Recipe> recipe;     // the run's recipe.json, when its directory has one
  std::vector<formats::EvalRow> eval;        // metrics.jsonl's held-out evaluation rows
};

struct ReportInput {
  std::optional<formats::Profile> profile;
  std::string profile_file;
  std::optional<formats::Recipe> recipe;
  std::string recipe_file;
  std::vector<ReportRun> runs;
};

// A run directory (run.json; metrics.jsonl and recipe.json when present) or a run.json file (and the metrics.jsonl
// and recipe.json beside it when it is named run.json). Errors: formats::FormatError.
ReportRun read_report_run(const std::string& path);
// The files read_report_run reads for `path` (those that exist), so an output can be checked against them.
std::vector<std::string> report_run_files(const std::string& path);
// read_report_run of each path; repeated names get " (2)", " (3)", ... so the legend tells them apart.
std::vector<ReportRun> read_report_runs(const std::vector<std::string>& paths);

std::string render_report(const ReportInput& input);

// A candidate recipe the tuner considered, read from a rationale entry (reports/README.md, "Candidates").
struct Candidate {
  std::string label;  // the rationale's decision
  double predicted_step_ms = 0, predicted_peak_gib = 0;
  bool chosen = false;  // numbers["chosen"] != 0
};
inline constexpr const char* kCandidateStepKey = "predicted_step_ms";
inline constexpr const char* kCandidatePeakKey = "predicted_peak_gib";
inline constexpr const char* kCandidateChosenKey = "chosen";
inline constexpr const char* kCandidateBudgetKey = "budget_gib";
std::vector<Candidate> recipe_candidates(const formats::Recipe& recipe);

}  // namespace vlatune::reports
