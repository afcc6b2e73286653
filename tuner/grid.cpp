#include "tuner/grid.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "formats/numbers.h"
#include "formats/recipe.h"
#include "formats/run_record.h"

namespace vlatune::tuner {

namespace fs = std::filesystem;

namespace {

std::string candidate_path(const std::string& dir, size_t i) {
  return (fs::path(dir) / ("candidate_" + std::to_string(i) + ".json")).string();
}

std::string cell(const std::optional<double>& v, int digits) {
  return v ? formats::fixed(*v, digits) : "-";
}

std::string error_pct(const std::optional<double>& predicted, const std::optional<double>& measured) {
  if (!predicted || !measured || *measured == 0) return "-";
  return formats::signed_pct(100 * (*predicted / *measured - 1), 1);
}

}  // namespace

std::vector<std::string> write_grid(const PlanResult& result, const std::string& dir) {
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("candidate_", 0) == 0 && entry.path().extension() == ".json") fs::remove(entry.path());
  }
  std::vector<std::string> paths;
  for (size_t i = 0; i < result.candidates.size(); ++i) {
    paths.push_back(candidate_path(dir, i));
    formats::write_recipe(result.candidates[i].recipe, paths.back());
  }
  return paths;
}

GridComparison compare_grid(const std::string& dir) {
  GridComparison out;
  for (size_t i = 0; fs::exists(candidate_path(dir, i)); ++i) {
    const formats::Recipe recipe = formats::read_recipe(candidate_path(dir, i));
    GridRow row;
    row.index = static_cast<int>(i);
    row.micro_batch = recipe.batch.micro_batch;
    row.predicted_samples_per_s = recipe.predicted.samples_per_s;
    row.predicted_peak_gib = recipe.predicted.peak_gib;
    const std::string run_path = (fs::path(dir) / ("run_" + std::to_string(i)) / "run.json").string();
    if (fs::exists(run_path)) {
      const formats::RunRecord run = formats::read_run_record(run_path);
      row.measured_samples_per_s = run.samples_per_s_median;
      row.measured_peak_gib = run.peak_gib;
      if (run.samples_per_s_median) {
        ++out.measured;
        if (out.best < 0 || *run.samples_per_s_median > *out.rows[static_cast<size_t>(out.best)].measured_samples_per_s)
          out.best = row.index;
      }
    }
    out.rows.push_back(row);
  }
  if (out.rows.empty())
    throw PlanInputError("--compare-grid: no candidate_0.json in '" + dir +
                         "' (write one with plan --grid N --grid-dir)");
  std::ostringstream os;
  os << "candidate  batch  samples/s pred  measured  error    peak GiB pred  measured  error\n";
  for (const GridRow& r : out.rows) {
    char line[200];
    std::snprintf(line, sizeof line, "%-9s  %5d  %14s  %8s  %6s   %13s  %8s  %6s\n",
                  ("#" + std::to_string(r.index) + (r.index == 0 ? " plan" : "")).c_str(), r.micro_batch,
                  cell(r.predicted_samples_per_s, 2).c_str(), cell(r.measured_samples_per_s, 2).c_str(),
                  error_pct(r.predicted_samples_per_s, r.measured_samples_per_s).c_str(),
                  cell(r.predicted_peak_gib, 1).c_str(), cell(r.measured_peak_gib, 1).c_str(),
                  error_pct(r.predicted_peak_gib, r.measured_peak_gib).c_str());
    os << line;
  }
  const GridRow& plan_row = out.rows.front();
  if (out.best >= 0 && plan_row.measured_samples_per_s) {
    const GridRow& best = out.rows[static_cast<size_t>(out.best)];
    out.plan_vs_best = *plan_row.measured_samples_per_s / *best.measured_samples_per_s;
    char line[200];
    std::snprintf(line, sizeof line,
                  "plan: %.2f samples/s measured = %.1f%% of the best measured (candidate #%d, %.2f samples/s); "
                  "goal: within 3%%\n",
                  *plan_row.measured_samples_per_s, 100 * out.plan_vs_best, best.index, *best.measured_samples_per_s);
    os << line;
  } else {
    os << "plan vs best: not measured yet (" << out.measured << " of " << out.rows.size()
       << " candidates have run_<i>/run.json)\n";
  }
  out.text = os.str();
  return out;
}

}  // namespace vlatune::tuner
