// `vlatune plan --grid N`: the plan and the next N-1 best distinct candidates written as recipes
// (DIR/candidate_<i>.json, candidate_0 = the plan), measured on the GPU by scripts/plan-grid.sh (each trained with
// `vlatune train --recipe ... --out DIR/run_<i>`), then compared here: predicted vs measured samples/s and peak,
// and how close the plan is to the best measured candidate. The tuner only enumerates and ranks; the runner is
// the trainer.
#pragma once

#include <string>
#include <vector>

#include "tuner/planner.h"

namespace vlatune::tuner {

// Writes the candidates; returns the paths in rank order. Creates `dir`; removes stale candidate_*.json there.
std::vector<std::string> write_grid(const PlanResult& result, const std::string& dir);

struct GridRow {
  int index = 0;
  int micro_batch = 0;
  std::optional<double> predicted_samples_per_s, predicted_peak_gib;
  std::optional<double> measured_samples_per_s, measured_peak_gib;
};

struct GridComparison {
  std::vector<GridRow> rows;
  int measured = 0;         // rows with a run.json
  int best = -1;            // index of the best measured row
  double plan_vs_best = 0;  // measured samples/s of candidate_0 / best measured (0 when either is missing)
  std::string text;         // the table and the verdict
};

// Reads DIR/candidate_<i>.json and DIR/run_<i>/run.json. Throws formats::FormatError for unreadable files and
// PlanInputError when DIR holds no candidate.
GridComparison compare_grid(const std::string& dir);

}  // namespace vlatune::tuner
