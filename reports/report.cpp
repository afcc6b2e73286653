#include "reports/report.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "reports/html.h"
#include "reports/number_format.h"
#include "reports/report_profile.h"
#include "reports/stats.h"
#include "reports/svg.h"

namespace vlatune::reports {

namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string basename_of(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string dirname_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::string opt_text(const std::optional<std::string>& s) {
  return s ? *s : std::string("-");
}

std::string opt_number(const std::optional<double>& v, int digits) {
  return v ? fixed(*v, digits) : std::string("-");
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string note(const std::string& text) {
  return "<p class=\"note\">" + escape_html(text) + "</p>";
}

// A number in the decisions table: integers without decimals, others with up to 4 significant decimals.
std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fixed(v, 0);
  const double a = std::fabs(v);
  return fixed(v, a >= 100 ? 1 : a >= 1 ? 3 : 4);
}

std::string freeze_text(const formats::Recipe::Freeze& f) {
  std::vector<std::string> parts;
  for (formats::FreezePreset p : f.presets) parts.emplace_back(formats::to_string(p));
  parts.insert(parts.end(), f.modules.begin(), f.modules.end());
  return parts.empty() ? "none" : join(parts, "\n");
}

std::string lora_text(const formats::Recipe::Lora& l) {
  std::vector<std::string> parts;
  if (l.preset) parts.push_back(std::string("preset ") + formats::to_string(*l.preset));
  for (const auto& t : l.targets)
    parts.push_back(join(t.modules, ", ") + " (rank " + std::to_string(t.rank) + ", alpha " + number_text(t.alpha) +
                    ")");
  return parts.empty() ? "none" : join(parts, "\n");
}

std::string recipe_settings(const formats::Recipe& r) {
  using formats::to_string;
  std::vector<std::vector<std::string>> rows = {
      {"model", r.model},
      {"batch.micro_batch", std::to_string(r.batch.micro_batch)},
      {"batch.grad_accum", std::to_string(r.batch.grad_accum)},
      {"data.num_images", r.data.num_images ? std::to_string(*r.data.num_images) : "null (drop empty slots)"},
      {"data.trim_text", r.data.trim_text ? "true (multiple " + std::to_string(r.data.trim_multiple) + ")" : "false"},
      {"model_options.attention", to_string(r.model_options.attention)},
      {"model_options.precision", to_string(r.model_options.precision)},
      {"model_options.skip_dead", r.model_options.skip_dead ? "true" : "false"},
      {"model_options.attention_backend", to_string(r.model_options.attention_backend)},
      {"model_options.cuda_graph", r.model_options.cuda_graph_step ? "step" : "off"},
      {"recompute.modules", r.recompute.modules.empty() ? "none" : join(r.recompute.modules, "\n")},
      {"fp8.modules", r.fp8.modules.empty() ? "none" : join(r.fp8.modules, "\n")},
      {"fp8.scaling", to_string(r.fp8.scaling)},
      {"fp8.saved_geglu_inputs", to_string(r.fp8.saved_geglu_inputs)},
      {"fp8.gemm_algorithm", to_string(r.fp8.gemm_algorithm)},
      {"freeze", freeze_text(r.freeze)},
      {"lora", lora_text(r.lora)},
      {"optimizer.state_dtype", to_string(r.optimizer.state_dtype)},
      {"groups", r.groups.empty() ? "default (one per named unit)" : std::to_string(r.groups.size()) + " groups"},
      {"distributed", "world_size " + std::to_string(r.distributed.world_size) + ", reduce " +
                          to_string(r.distributed.reduce_dtype) +
                          (r.distributed.shard_optimizer_state ? ", optimizer state sharded" : "")},
      {"tuned_on", "gpu " + opt_text(r.tuned_on.gpu) + ", torch " + opt_text(r.tuned_on.torch) + ", profile " +
                       opt_text(r.tuned_on.profile)},
      {"recipe_hash", formats::recipe_hash(r)},
  };
  return html_table({"key", "value"}, rows, 99);
}

std::string candidates_section(const formats::Recipe& r) {
  const std::vector<Candidate> cands = recipe_candidates(r);
  if (cands.empty()) {
    return note(std::string("recipe.json lists no candidate recipes: the tuner records each candidate it considered "
                            "as a rationale entry whose numbers hold \"") +
                kCandidateStepKey + "\" and \"" + kCandidatePeakKey + "\" (reports/README.md).");
  }
  svg::ScatterChart chart;
  chart.title = "Candidate recipes the tuner considered: predicted peak memory vs step time";
  chart.x_label = "predicted peak memory (GiB)";
  chart.y_label = "predicted step time (ms)";
  for (const auto& rat : r.rationale) {
    const auto it = rat.numbers.find(kCandidateBudgetKey);
    if (it != rat.numbers.end()) {
      chart.x_limit = it->second;
      chart.x_limit_label = "budget " + fixed(it->second, 1) + " GiB";
      break;
    }
  }
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = cands[i];
    chart.points.push_back({c.label, c.predicted_peak_gib, c.predicted_step_ms, c.chosen});
    rows.push_back({std::to_string(i + 1) + (c.chosen ? " (chosen)" : ""), c.label, fixed(c.predicted_step_ms, 1),
                    fixed(c.predicted_peak_gib, 2)});
  }
  return svg::scatter_chart(chart) +
         html_table({"#", "candidate", "predicted step (ms)", "predicted peak (GiB)"}, rows, 2);
}

std::string decisions_section(const formats::Recipe& r) {
  if (r.rationale.empty()) return note("recipe.json has no rationale entries.");
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < r.rationale.size(); ++i) {
    const auto& rat = r.rationale[i];
    std::vector<std::string> nums;
    for (const auto& [k, v] : rat.numbers) nums.push_back(k + " = " + number_text(v));
    rows.push_back({std::to_string(i + 1), rat.decision, rat.reason, join(nums, ", ")});
  }
  return html_table({"#", "decision", "reason", "numbers"}, rows, 99);
}

struct Measured {
  std::string source;
  std::optional<double> step_ms, peak_gib, samples_per_s;
};

std::string predicted_section(const formats::Recipe& r, const std::vector<Measured>& measured) {
  const auto& p = r.predicted;
  if (!p.step_ms && !p.peak_gib && !p.samples_per_s) return note("recipe.json has no predictions (predicted.*: null).");
  std::vector<std::vector<std::string>> rows;
  auto row = [&](const char* name, const std::optional<double>& pred, std::optional<double> Measured::*field,
                 int digits) {
    if (measured.empty()) {
      rows.push_back({name, opt_number(pred, digits), "-", "-", "-"});
      return;
    }
    for (const auto& m : measured) {
      const auto& v = m.*field;
      const std::string err = pred && v && *v != 0 ? formats::prediction_versus_measured(*pred, *v) : "-";
      rows.push_back({name, opt_number(pred, digits), opt_number(v, digits), err, m.source});
    }
  };
  row("step time (ms)", p.step_ms, &Measured::step_ms, 1);
  row("peak memory (GiB)", p.peak_gib, &Measured::peak_gib, 2);
  row("throughput (samples/s)", p.samples_per_s, &Measured::samples_per_s, 2);
  return html_table({"quantity", "predicted", "measured", "prediction vs measured", "measured by"}, rows, 1) +
         (measured.empty() ? note("No runs given (--run): nothing measured to compare with.") : std::string());
}

// Per-step (step, value) pairs of a run: metrics.jsonl when present (every step), else run.json's per_step.
svg::Series run_series(const ReportRun& rr, bool throughput) {
  svg::Series s;
  s.name = rr.name;
  if (!rr.metrics.empty()) {
    for (const auto& m : rr.metrics) {
      s.x.push_back(static_cast<double>(m.step));
      s.y.push_back(throughput ? m.samples_per_s : m.loss);
    }
    return s;
  }
  const int64_t first = rr.run.steps - static_cast<int64_t>(rr.run.step_ms.size());
  for (size_t i = 0; i < rr.run.step_ms.size(); ++i) {
    s.x.push_back(static_cast<double>(first + static_cast<int64_t>(i)));
    s.y.push_back(throughput ? static_cast<double>(rr.run.batch) * 1000.0 / rr.run.step_ms[i] : rr.run.loss[i]);
  }
  return s;
}

// The median data wait of a run's steps after warm-up, from metrics.jsonl; run.json does not record the wait, so
// without metrics it is unknown (nullopt), not 0.
std::optional<double> median_data_wait(const ReportRun& rr) {
  std::vector<double> waits;
  for (const auto& m : rr.metrics)
    if (m.step >= rr.run.warmup_steps) waits.push_back(m.data_wait_ms);
  if (waits.empty()) return std::nullopt;
  return median(waits);
}

// The run's precision from its recipe.json: "bf16", "fp32-master", with "+ FP8 (N patterns)" when it runs Linears
// in FP8; "-" when the run directory has no recipe.json.
std::string precision_text(const ReportRun& rr) {
  if (!rr.recipe) return "-";
  std::string text = formats::to_string(rr.recipe->model_options.precision);
  const size_t fp8 = rr.recipe->fp8.modules.size();
  if (fp8 > 0) text += " + FP8 (" + std::to_string(fp8) + (fp8 == 1 ? " pattern)" : " patterns)");
  return text;
}

std::string runs_table(const std::vector<ReportRun>& runs) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& rr : runs) {
    const auto& r = rr.run;
    const auto& e = r.environment;
    const auto wait = median_data_wait(rr);
    rows.push_back({rr.name, std::to_string(r.steps), std::to_string(r.warmup_steps), std::to_string(r.batch),
                    precision_text(rr), fixed(median(r.step_ms), 1), wait ? fixed(*wait, 2) : "not measured",
                    opt_number(r.samples_per_s_median, 2), opt_number(r.peak_gib, 2), std::to_string(r.skipped_steps),
                    e.config, opt_text(e.gpu), e.torch, opt_text(e.vlatune_commit), e.recipe_hash});
  }
  return html_table({"run", "steps", "warm-up", "batch", "precision", "median step (ms)", "median data wait (ms)",
                     "samples/s", "peak GiB", "skipped", "config", "gpu", "torch", "commit", "recipe"},
                    rows, 1);
}

// metrics.jsonl's data_wait_ms over steps, one series per run in run order (the throughput chart's colours); a run
// without metrics.jsonl is a legend entry without a line.
std::string data_wait_chart(const std::vector<ReportRun>& runs) {
  svg::LineChart wait;
  wait.title = "Data-loader wait per step";
  wait.x_label = "optimizer step";
  wait.y_label = "data wait (ms)";
  wait.y_from_zero = true;
  bool any = false;
  for (const auto& rr : runs) {
    svg::Series s;
    s.name = rr.metrics.empty() ? rr.name + " (not measured)" : rr.name;
    for (const auto& m : rr.metrics) {
      s.x.push_back(static_cast<double>(m.step));
      s.y.push_back(m.data_wait_ms);
    }
    any = any || !rr.metrics.empty();
    wait.series.push_back(std::move(s));
  }
  if (!any)
    return note(
        "Data wait per step: not measured (run.json does not record it; pass run directories to plot "
        "metrics.jsonl's data_wait_ms).");
  return svg::line_chart(wait);
}

// The rolling-median window of a throughput curve of n steps: about 5% of the run, odd, 5..101 steps.
size_t smoothing_window(size_t n) {
  return std::clamp<size_t>(n / 20, 5, 101) | 1;
}

// Held-out evaluation rows (`vlatune train --eval-data`): their loss as one more series of the loss chart per run,
// and a chart of the sampled chunks' action error. Nothing when no run has them.
void add_eval_series(const std::vector<ReportRun>& runs, svg::LineChart& loss, std::string& html) {
  svg::LineChart error;
  error.title = "Held-out action error over steps";
  error.x_label = "optimizer step";
  error.y_label = "mean |sampled - true| (real units)";
  error.y_from_zero = true;
  for (const auto& rr : runs) {
    if (rr.eval.empty()) continue;
    svg::Series l, e;
    l.name = e.name = rr.name + " (held-out)";
    for (const auto& row : rr.eval) {
      l.x.push_back(static_cast<double>(row.step));
      l.y.push_back(row.loss);
      e.x.push_back(static_cast<double>(row.step));
      e.y.push_back(row.action_mae);
    }
    loss.series.push_back(std::move(l));
    error.series.push_back(std::move(e));
  }
  if (error.series.empty()) return;
  html += svg::line_chart(error) +
          note(
              "Held-out rows of metrics.jsonl (vlatune train --eval-data): the flow-matching loss on held-out "
              "batches with noise and time from a fixed seed, plotted beside the training loss, and the mean "
              "absolute error of sampled action chunks against the true ones, un-normalized with the dataset's "
              "norm stats (vlatune eval computes the same numbers).");
}

std::string runs_section(const std::vector<ReportRun>& runs) {
  svg::LineChart thr;
  thr.title = "Throughput over steps";
  thr.x_label = "optimizer step";
  thr.y_label = "samples/s";
  thr.y_from_zero = true;
  svg::LineChart loss;
  loss.title = "Training loss over steps";
  loss.x_label = "optimizer step";
  loss.y_label = "loss";
  bool any_metrics = false;
  for (size_t i = 0; i < runs.size(); ++i) {
    // Every step, faint, under its rolling median in the same colour: single slow steps stay visible without
    // hiding the level.
    svg::Series raw = run_series(runs[i], true);
    raw.name += " (every step)";
    raw.color_index = static_cast<int>(i);
    raw.faint = true;
    raw.in_legend = false;
    svg::Series smooth = run_series(runs[i], true);
    smooth.y = rolling_median(smooth.y, smoothing_window(smooth.y.size()));
    smooth.color_index = static_cast<int>(i);
    thr.series.push_back(std::move(raw));
    thr.series.push_back(std::move(smooth));
    loss.series.push_back(run_series(runs[i], false));
    any_metrics = any_metrics || !runs[i].metrics.empty();
  }
  std::string eval_html;
  add_eval_series(runs, loss, eval_html);
  if (!eval_html.empty()) loss.title = "Training and held-out loss over steps";
  std::string html = runs_table(runs) + svg::line_chart(thr) +
                     note(
                         "Throughput: faint lines are every step's samples/s; solid lines their rolling median over "
                         "about 5% of the run's steps (5 to 101 steps), so single slow steps (a checkpoint, a data "
                         "stall) neither hide the level nor vanish.") +
                     data_wait_chart(runs) + svg::line_chart(loss) + eval_html;
  html +=
      note(any_metrics ? "Curves from metrics.jsonl (every step, warm-up included) where the run directory has one; "
                         "otherwise from run.json (steps after warm-up). Data wait: the time each step waited for "
                         "its batch (data_wait_ms); when it is a large share of the step, the data loader sets the "
                         "pace (more loader threads: vlatune train --workers N)."
                       : "Curves from run.json (steps after warm-up); pass run directories to plot every step "
                         "from metrics.jsonl.");
  html += note(
      "Precision: the run's recipe.json (model_options.precision, and the FP8 module patterns); '-' when "
      "the run directory has no recipe.json.");
  return html;
}

}  // namespace

std::vector<Candidate> recipe_candidates(const formats::Recipe& recipe) {
  std::vector<Candidate> out;
  for (const auto& r : recipe.rationale) {
    const auto step = r.numbers.find(kCandidateStepKey), peak = r.numbers.find(kCandidatePeakKey);
    if (step == r.numbers.end() || peak == r.numbers.end()) continue;
    const auto chosen = r.numbers.find(kCandidateChosenKey);
    out.push_back({r.decision, step->second, peak->second, chosen != r.numbers.end() && chosen->second != 0});
  }
  return out;
}

namespace {

// The directory whose metrics.jsonl and recipe.json belong to the run at `path`: the run directory itself, the
// directory of a file named run.json, or "" for a run record under another name.
std::string run_directory(const std::string& path) {
  if (is_directory(path)) return path;
  if (basename_of(path) == "run.json") return dirname_of(path);
  return "";
}

}  // namespace

std::vector<std::string> report_run_files(const std::string& path) {
  const std::string dir = run_directory(path);
  std::vector<std::string> files{is_directory(path) ? dir + "/run.json" : path};
  if (!dir.empty()) {
    for (const char* name : {"/metrics.jsonl", "/recipe.json"})
      if (is_file(dir + name)) files.push_back(dir + name);
  }
  return files;
}

ReportRun read_report_run(const std::string& path) {
  ReportRun rr;
  const std::string dir = run_directory(path);
  if (is_directory(path)) {
    rr.name = basename_of(path);
    rr.file = path + "/run.json";
  } else {
    rr.file = path;
    rr.name = basename_of(path) == "run.json" ? basename_of(dirname_of(path)) : path;
  }
  rr.run = formats::read_run_record(rr.file);
  if (!dir.empty()) {
    if (is_file(dir + "/metrics.jsonl")) {
      formats::MetricsLog log = formats::read_metrics_log(dir + "/metrics.jsonl");
      rr.metrics = std::move(log.train);
      rr.eval = std::move(log.eval);
    }
    if (is_file(dir + "/recipe.json")) rr.recipe = formats::read_recipe(dir + "/recipe.json");
  }
  return rr;
}

std::vector<ReportRun> read_report_runs(const std::vector<std::string>& paths) {
  std::vector<ReportRun> runs;
  std::map<std::string, int> seen;
  for (const auto& p : paths) {
    runs.push_back(read_report_run(p));
    const int n = ++seen[runs.back().name];
    if (n > 1) runs.back().name += " (" + std::to_string(n) + ")";
  }
  return runs;
}

std::string render_report(const ReportInput& in) {
  HtmlPage page("vlatune report");
  if (in.profile) page.add_intro("profile: " + in.profile_file);
  if (in.recipe) page.add_intro("recipe: " + in.recipe_file);
  for (const auto& rr : in.runs) page.add_intro("run: " + rr.name + " (" + rr.file + ")");

  std::vector<Measured> measured;
  for (const auto& rr : in.runs) {
    Measured m;
    m.source = "run " + rr.name;
    if (!rr.run.step_ms.empty()) m.step_ms = median(rr.run.step_ms);
    m.peak_gib = rr.run.peak_gib;
    m.samples_per_s = rr.run.samples_per_s_median;
    measured.push_back(m);
  }
  if (in.profile) {
    const formats::BatchProfile& b = in.profile->batches.at(0);
    Measured m;
    m.source = "profile, micro-batch " + std::to_string(b.batch);
    m.step_ms = b.step_ms;
    m.peak_gib = b.peak_gib;
    const formats::Recipe& pr = in.profile->recipe;
    m.samples_per_s =
        static_cast<double>(b.batch * pr.batch.grad_accum * in.profile->environment.world_size) * 1000.0 / b.step_ms;
    measured.push_back(m);
  }

  if (in.profile) add_profile_sections(page, *in.profile, in.profile_file);

  if (in.recipe) {
    page.add_section("recipe", "Recipe", recipe_settings(*in.recipe));
    page.add_section("candidates", "Candidate recipes: memory vs step time", candidates_section(*in.recipe));
    page.add_section("decisions", "Decisions and reasons", decisions_section(*in.recipe));
    page.add_section("predicted", "Predicted vs measured", predicted_section(*in.recipe, measured));
  }
  if (!in.runs.empty()) page.add_section("runs", "Runs: throughput, data wait and loss", runs_section(in.runs));
  return page.render();
}

}  // namespace vlatune::reports
