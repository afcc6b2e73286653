// `vlatune report`'s HTML: self-contained, deterministic, with the charts its inputs call for; and, in headless
// Chromium (Debian's chromium, installed by scripts/setup.sh), a screenshot that is not blank.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "formats/json_io.h"
#include "reports/report.h"
#include "reports/stats.h"
#include "reports/svg.h"
#include "temp_dir.h"
#if VLATUNE_HAVE_ZLIB
#include "png_pixels.h"
#endif

namespace {

using vlatune::formats::MetricsRow;
using vlatune::formats::Rationale;
using vlatune::formats::Recipe;
using vlatune::formats::RunRecord;
using vlatune::reports::ReportInput;
using vlatune::reports::ReportRun;

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t p = text.find(part); p != std::string::npos; p = text.find(part, p + 1)) ++n;
  return n;
}

Recipe sample_recipe() {
  Recipe r;
  r.recompute.modules = {"paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.*"};
  r.predicted.step_ms = 812.0;
  r.predicted.peak_gib = 118.5;
  r.predicted.samples_per_s = 39.4;
  r.tuned_on.gpu = "NVIDIA H200";
  r.rationale = {
      {"memory budget", "profiled GPU memory minus 5%", {{"budget_gib", 132.0}}},
      {"candidate: nothing recomputed, micro-batch 32",
       "over budget",
       {{"predicted_step_ms", 790.0}, {"predicted_peak_gib", 151.0}}},
      {"candidate: ViT recomputed, micro-batch 32",
       "fits, fastest that fits",
       {{"predicted_step_ms", 812.0}, {"predicted_peak_gib", 118.5}, {"chosen", 1}}},
      {"candidate: ViT + LM MLPs recomputed, micro-batch 32",
       "fits, slower",
       {{"predicted_step_ms", 905.0}, {"predicted_peak_gib", 96.0}}},
      {"recompute <vision_tower>.encoder.layers.*",
       "cheapest memory: 0.8 ms per GiB saved",
       {{"ms_per_gib_saved", 0.8}, {"saved_gib", 32.5}}},
  };
  return r;
}

// `wait_ms`: the median data wait after warm-up (the warm-up steps wait 250 ms: a loader filling its queue).
ReportRun sample_run(const std::string& name, double step_ms, double loss_scale, double wait_ms) {
  ReportRun rr;
  rr.name = name;
  rr.file = name + "/run.json";
  RunRecord& r = rr.run;
  r.steps = 60;
  r.warmup_steps = 3;
  r.batch = 32;
  r.peak_gib = 117.9;
  r.samples_per_s_median = 32 * 1000.0 / step_ms;
  r.environment.torch = "2.11.0+cu130";
  r.environment.config = "full";
  r.environment.recipe_hash = "0123456789abcdef";
  for (int64_t s = 0; s < r.steps; ++s) {
    const double ms = s < 3 ? 5000.0 : step_ms * (1 + 0.01 * ((s * 7) % 5 - 2) / 2.0);
    const double loss = loss_scale / (1 + 0.1 * static_cast<double>(s));
    MetricsRow m;
    m.step = s;
    m.loss = loss;
    m.grad_norm = 1.0;
    m.step_ms = ms;
    m.samples_per_s = 32 * 1000.0 / ms;
    m.data_wait_ms = s < 3 ? 250.0 : wait_ms * (1 + 0.1 * static_cast<double>(s % 3 - 1));
    rr.metrics.push_back(m);
    if (s >= 3) {
      r.step_ms.push_back(ms);
      r.loss.push_back(loss);
      r.grad_norm.push_back(1.0);
    }
  }
  return rr;
}

ReportInput sample_input() {
  ReportInput in;
  in.recipe = sample_recipe();
  in.recipe_file = "recipe.json";
  in.runs = {sample_run("bf16", 812.0, 1.0, 1.25), sample_run("fp8 <test & \"quote\">", 700.0, 1.01, 0.5)};
  return in;
}

// The first of chromium / chromium-browser / google-chrome on PATH, or "".
std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return name;
  }
  return "";
}

// Headless Chromium: screenshot (PNG) and serialized DOM of `html_file`. Returns false when Chromium failed.
bool chromium_render(const std::string& chromium, const vlatune::test::TempDir& dir, const std::string& html_file,
                     const std::string& png, const std::string& dom) {
  const std::string common = "timeout 120 " + chromium +
                             " --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run"
                             " --user-data-dir=" +
                             dir.file("profile") + " --window-size=1100,1600 ";
  const std::string url = "file://" + html_file;
  const int shot =
      std::system((common + "--screenshot=" + png + " " + url + " >" + dir.file("chromium.log") + " 2>&1").c_str());
  const int dump = std::system((common + "--dump-dom " + url + " >" + dom + " 2>>" + dir.file("chromium.log")).c_str());
  return shot == 0 && dump == 0;
}

#if VLATUNE_HAVE_ZLIB
struct PixelStats {
  double non_white_fraction = 0;
  size_t colors = 0;  // distinct RGB values (capped count)
};

PixelStats pixel_stats(const vlatune::test::RgbImage& img) {
  PixelStats s;
  std::set<uint32_t> colors;
  size_t non_white = 0;
  for (size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    const uint8_t r = img.rgb[i], g = img.rgb[i + 1], b = img.rgb[i + 2];
    if (r < 250 || g < 250 || b < 250) ++non_white;
    if (colors.size() < 4096) colors.insert((uint32_t{r} << 16) | (uint32_t{g} << 8) | b);
  }
  s.non_white_fraction = static_cast<double>(non_white) / static_cast<double>(img.rgb.size() / 3);
  s.colors = colors.size();
  return s;
}
#endif

}  // namespace

TEST_CASE("The report is self-contained, deterministic and has the charts its inputs call for", "[reports][html]") {
  const ReportInput in = sample_input();
  const std::string html = vlatune::reports::render_report(in);
  CHECK(html == vlatune::reports::render_report(in));
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  // No scripts, no external resources: the only URL is the SVG namespace.
  CHECK(count(html, "<script") == 0);
  CHECK(count(html, "http") == count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  CHECK(count(html, " src=") == 0);
  // Candidates scatter + throughput + data wait + loss.
  CHECK(count(html, "<svg") == 4);
  CHECK(count(html, "class=\"point\"") == 3);
  CHECK(count(html, "(chosen)") >= 2);          // the chart label and the table row
  CHECK(count(html, "budget 132.0 GiB") == 1);  // the budget line
  CHECK(count(html, "class=\"series\"") == 8);  // two runs x (throughput raw + smoothed, data wait, loss)
  CHECK(count(html, "cheapest memory: 0.8 ms per GiB saved") == 1);  // decisions table
  CHECK(count(html, "ms_per_gib_saved = 0.8000") == 1);
  // Names are escaped everywhere they appear.
  CHECK(count(html, "fp8 <test") == 0);
  CHECK(count(html, "fp8 &lt;test &amp; &quot;quote&quot;&gt;") >= 3);
  // Predicted vs measured: 812 ms predicted vs the bf16 run's median.
  CHECK(count(html, "Predicted vs measured") >= 1);
  CHECK(count(html, ">812.0<") >= 1);
}

TEST_CASE("The runs section plots metrics.jsonl's data wait and tabulates its median", "[reports][html]") {
  ReportInput in = sample_input();
  const std::string html = vlatune::reports::render_report(in);
  // The chart sits between the throughput and the loss charts, one line per run.
  const size_t thr = html.find("<title>Throughput over steps</title>"),
               wait = html.find("<title>Data-loader wait per step</title>"),
               loss = html.find("<title>Training loss over steps</title>");
  REQUIRE(wait != std::string::npos);
  CHECK(thr < wait);
  CHECK(wait < loss);
  const std::string chart = html.substr(wait, loss - wait);
  CHECK(count(chart, "class=\"series\"") == 2);
  CHECK(count(chart, "data wait (ms)") == 1);  // the y axis
  CHECK(count(chart, ">250</text>") == 1);     // the warm-up's 250 ms waits are plotted: the top tick
  // The table: the median over the steps after warm-up (warm-up's 250 ms left out), beside the median step.
  CHECK(count(html, "<th>median data wait (ms)</th>") == 1);
  CHECK(count(html, "<td class=\"num\">812.0</td><td class=\"num\">1.25</td>") == 1);
  CHECK(count(html, "<td class=\"num\">0.50</td>") == 1);
  CHECK(count(html, "not measured") == 0);

  // run.json records no data wait: without metrics.jsonl it is "not measured", never 0.
  in.runs[1].metrics.clear();
  const std::string partial = vlatune::reports::render_report(in);
  CHECK(count(partial, "<svg") == 4);
  CHECK(count(partial, "<td class=\"num\">not measured</td>") == 1);
  CHECK(count(partial, "fp8 &lt;test &amp; &quot;quote&quot;&gt; (not measured)") >= 1);  // its legend entry
  in.runs[0].metrics.clear();
  const std::string none = vlatune::reports::render_report(in);
  CHECK(count(none, "<svg") == 3);
  CHECK(count(none, "Data-loader wait per step") == 0);
  CHECK(count(none, "Data wait per step: not measured") == 1);
  CHECK(count(none, "<td class=\"num\">not measured</td>") == 2);
}

TEST_CASE("The report's recipe table names every key that changes what a run computes", "[reports][html]") {
  vlatune::reports::ReportInput in;
  Recipe r = sample_recipe();
  r.fp8.modules = {"a.*.down_proj"};
  r.fp8.scaling = vlatune::formats::Fp8Scaling::kDelayed;
  r.fp8.saved_geglu_inputs = vlatune::formats::SavedGegluInputs::kE4m3Blocks;
  r.fp8.gemm_algorithm = vlatune::formats::Fp8GemmAlgorithm::kTimed;
  r.model_options.cuda_graph_step = true;
  r.optimizer.state_dtype = vlatune::formats::StateDtype::kInt8Blockwise;
  r.freeze.presets = {vlatune::formats::FreezePreset::kFreezeVisionEncoder};
  r.lora.targets = {{{"b.*.q_proj"}, 8, 16.0}};
  r.distributed.shard_optimizer_state = true;
  in.recipe = r;
  const std::string html = vlatune::reports::render_report(in);
  for (const char* row :
       {"<td>fp8.scaling</td><td>delayed</td>", "<td>fp8.saved_geglu_inputs</td><td>e4m3-blocks</td>",
        "<td>fp8.gemm_algorithm</td><td>timed</td>", "<td>model_options.cuda_graph</td><td>step</td>",
        "<td>optimizer.state_dtype</td><td>int8-blockwise</td>", "<td>freeze</td><td>freeze_vision_encoder</td>",
        "<td>lora</td><td>b.*.q_proj (rank 8, alpha 16)</td>", ", optimizer state sharded</td>"}) {
    INFO(row);
    CHECK(count(html, row) == 1);
  }
}

TEST_CASE("The report matches its golden file byte for byte", "[reports][html]") {
  // Same inputs, same bytes on every machine (fixed number formatting, no clocks). An intended change of the
  // page: VLATUNE_UPDATE_GOLDEN=1 vlatune_tests_core "[html]" and commit tests/fixtures/report_golden.html.
  const std::string golden = std::string(VLATUNE_FIXTURES_DIR) + "/report_golden.html";
  const std::string html = vlatune::reports::render_report(sample_input());
  if (std::getenv("VLATUNE_UPDATE_GOLDEN")) {
    vlatune::formats::write_file_atomic(golden, html);
    WARN("wrote " << golden);
    SUCCEED("golden updated");
    return;
  }
  const std::string expected = vlatune::formats::read_text_file(golden);
  size_t at = 0;
  while (at < html.size() && at < expected.size() && html[at] == expected[at]) ++at;
  INFO("first difference at byte " << at << ": got \"" << html.substr(at, 80) << "\", golden \""
                                   << expected.substr(at, 80) << "\"");
  CHECK(html == expected);
}

TEST_CASE("Recipe rationale entries with predicted_step_ms and predicted_peak_gib are the candidates",
          "[reports][html]") {
  const auto cands = vlatune::reports::recipe_candidates(sample_recipe());
  REQUIRE(cands.size() == 3);
  CHECK(cands[1].label == "candidate: ViT recomputed, micro-batch 32");
  CHECK(cands[1].chosen);
  CHECK_FALSE(cands[0].chosen);
  CHECK(cands[2].predicted_peak_gib == 96.0);
  // Without candidates the section says what the tuner should emit.
  Recipe plain;
  ReportInput in;
  in.recipe = plain;
  const std::string html = vlatune::reports::render_report(in);
  CHECK(count(html, "lists no candidate recipes") == 1);
  CHECK(count(html, "<svg") == 0);
}

TEST_CASE("Line charts average long series into a bounded number of points", "[reports][html]") {
  vlatune::reports::svg::LineChart c;
  c.title = "t";
  vlatune::reports::svg::Series s;
  s.name = "long";
  for (int i = 0; i < 100000; ++i) {
    s.x.push_back(i);
    s.y.push_back(i % 2);
  }
  c.series.push_back(s);
  const std::string svg = vlatune::reports::svg::line_chart(c);
  CHECK(count(svg, "L") < vlatune::reports::svg::kMaxLinePoints + 50);
  CHECK(svg.size() < 40000);
  // NaN breaks the line: two pen-down runs.
  vlatune::reports::svg::LineChart gap;
  gap.series.push_back({"gap", {0, 1, 2, 3, 4}, {1, 2, NAN, 3, 4}});
  CHECK(count(vlatune::reports::svg::line_chart(gap), "M") == 2 + 1);  // + the axis path
}

TEST_CASE("nice_ticks covers the range with 1/2/5 steps", "[reports][html]") {
  const auto t = vlatune::reports::svg::nice_ticks(0.0, 97.0);
  REQUIRE(t.size() >= 2);
  CHECK(t.front() == 0.0);
  CHECK(t.back() >= 97.0);
  CHECK(t[1] - t[0] == Approx(20.0));
  const auto small = vlatune::reports::svg::nice_ticks(0.071, 0.093);
  CHECK(small.front() <= 0.071);
  CHECK(small.back() >= 0.093);
}

TEST_CASE("The report renders in headless Chromium: not blank, and the SVGs are in the DOM", "[reports][html]") {
  const std::string chromium = find_chromium();
  if (chromium.empty()) FAIL("chromium not found on PATH: scripts/setup.sh installs Debian's chromium");
  vlatune::test::TempDir dir("report_chromium");
  const std::string html_file = dir.file("report.html"), blank_file = dir.file("blank.html");
  vlatune::formats::write_file_atomic(html_file, vlatune::reports::render_report(sample_input()));
  vlatune::formats::write_file_atomic(blank_file, "<!DOCTYPE html><html><body></body></html>\n");

  REQUIRE(chromium_render(chromium, dir, html_file, dir.file("report.png"), dir.file("report.dom")));
  std::ifstream dom_in(dir.file("report.dom"));
  const std::string dom((std::istreambuf_iterator<char>(dom_in)), std::istreambuf_iterator<char>());
  CHECK(count(dom, "<svg") == 4);
  CHECK(count(dom, "class=\"series\"") == 8);
#if VLATUNE_HAVE_ZLIB
  const auto img = vlatune::test::read_png_rgb(dir.file("report.png"));
  CHECK(img.width == 1100);
  CHECK(img.height == 1600);
  const PixelStats report = pixel_stats(img);
  INFO("non-white " << report.non_white_fraction << ", colors " << report.colors);
  CHECK(report.non_white_fraction > 0.02);  // text, tables and coloured chart marks
  CHECK(report.colors > 20);                // palette colours plus anti-aliasing

  // The control: the same check on a blank page must see it as blank (so the check above can fail).
  REQUIRE(chromium_render(chromium, dir, blank_file, dir.file("blank.png"), dir.file("blank.dom")));
  const PixelStats blank = pixel_stats(vlatune::test::read_png_rgb(dir.file("blank.png")));
  CHECK(blank.non_white_fraction < 0.001);
  CHECK(blank.colors <= 2);
#else
  WARN("built without zlib: the screenshot's pixels are not checked, only the SVGs in the DOM");
#endif
}

TEST_CASE("Throughput is drawn raw (faint) under its rolling median; each run's precision is in the table",
          "[reports][html]") {
  ReportInput in = sample_input();
  in.runs[1].recipe = Recipe{};
  in.runs[1].recipe->fp8.modules = {"a.*.b", "c"};
  const std::string html = vlatune::reports::render_report(in);
  const size_t thr = html.find("<title>Throughput over steps</title>"),
               wait = html.find("<title>Data-loader wait per step</title>");
  const std::string chart = html.substr(thr, wait - thr);
  CHECK(count(chart, "class=\"series\"") == 4);
  CHECK(count(chart, "stroke-opacity=\"0.3\"") == 2);  // the raw curves
  CHECK(count(chart, "(every step)</title>") == 2);
  CHECK(count(chart, ">bf16</text>") == 1);  // one legend entry per run
  CHECK(count(html, "rolling median") >= 1);
  CHECK(count(html, "<th>precision</th>") == 1);
  CHECK(count(html, "<td class=\"num\">bf16 + FP8 (2 patterns)</td>") == 1);
  CHECK(count(html, "<td class=\"num\">-</td>") >= 1);  // the run without a recipe.json
}

TEST_CASE("rolling_median follows the level and ignores single spikes", "[reports][stats]") {
  std::vector<double> v(21, 10.0);
  v[10] = 1000.0;  // one slow step
  const auto m = vlatune::reports::rolling_median(v, 5);
  REQUIRE(m.size() == v.size());
  for (double x : m) CHECK(x == 10.0);
  CHECK(vlatune::reports::rolling_median({1, 2, 3}, 1) == std::vector<double>{1, 2, 3});
  const auto edges = vlatune::reports::rolling_median({1, 2, 3, 4, 5}, 3);
  CHECK(edges == std::vector<double>{1.5, 2, 3, 4, 4.5});
  CHECK(vlatune::reports::rolling_median({}, 5).empty());
  CHECK(std::isnan(vlatune::reports::rolling_median({NAN}, 3)[0]));
}

TEST_CASE("Held-out evaluation rows are plotted beside the training loss, with their action error", "[reports][html]") {
  ReportInput in = sample_input();
  for (int64_t s = 9; s < 60; s += 10) {
    vlatune::formats::EvalRow e;
    e.step = s;
    e.loss = 2.0 / (1 + 0.05 * static_cast<double>(s));
    e.action_mae = 0.5 / (1 + 0.05 * static_cast<double>(s));
    e.action_rmse = 2 * e.action_mae;
    e.action_mae_per_dim = {e.action_mae};
    e.action_rmse_per_dim = {e.action_rmse};
    in.runs[0].eval.push_back(e);
  }
  const std::string html = vlatune::reports::render_report(in);
  const size_t loss = html.find("<title>Training and held-out loss over steps</title>"),
               error = html.find("<title>Held-out action error over steps</title>");
  REQUIRE(loss != std::string::npos);
  REQUIRE(error != std::string::npos);
  CHECK(loss < error);
  // The loss chart: both runs' training loss and the first run's held-out loss; the error chart: that run only.
  const std::string loss_chart = html.substr(loss, error - loss);
  CHECK(count(loss_chart, "class=\"series\"") == 3);
  CHECK(count(loss_chart, "bf16 (held-out)") >= 1);
  CHECK(count(html.substr(error), "class=\"series\"") == 1);
  CHECK(count(html, "real units") >= 1);
  // Without evaluation rows the section draws the training loss alone (the golden file covers its bytes).
  CHECK(count(vlatune::reports::render_report(sample_input()), "held-out") == 0);
}
