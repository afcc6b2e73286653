// check and report on profile.json: profiles are timing subjects whose per-module times name what grew, and
// the report's module bars, FP8 classes and memory charts come from them.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "formats/profile.h"
#include "reports/check.h"
#include "reports/report.h"
#include "reports/report_profile.h"
#include "reports/svg.h"
#include "temp_dir.h"

namespace {

using vlatune::formats::ModuleCost;
using vlatune::formats::Profile;

ModuleCost module(const std::string& fqn, double fwd, double bwd, double self, const std::string& kind = "Linear") {
  ModuleCost m;
  m.fqn = fqn;
  m.kind = kind;
  m.forward_ms = fwd;
  m.backward_ms = bwd;
  m.self_ms = self;
  m.kernels = 3;
  return m;
}

// A small model: "m" holds two layers (each with an mlp) and a head; plus the optimizer pseudo-module.
// `mlp1_ms` is layer 1's MLP forward time (backward twice that).
Profile small_profile(double step_ms, double mlp1_ms = 2.0) {
  Profile p;
  p.environment.gpu = "NVIDIA H200";
  p.environment.torch = "2.11.0+cu130";
  p.environment.config = "full";
  p.environment.recipe_hash = "0123456789abcdef";
  p.settings.device = "cuda";
  p.settings.tracer = "cupti";
  p.settings.steps = 3;
  p.settings.gpu_memory_gib = 139.8;
  vlatune::formats::BatchProfile b;
  b.batch = 32;
  b.step_ms = step_ms;
  for (int i = 0; i < 10; ++i) b.step_ms_samples.push_back(step_ms * (1 + 0.002 * (i % 3 - 1)));
  b.peak_gib = 90.0;
  b.memory.parameter_bytes = int64_t{6} << 30;
  b.memory.gradient_bytes = int64_t{6} << 30;
  b.memory.optimizer_bytes = int64_t{12} << 30;
  b.memory.activation_bytes = int64_t{60} << 30;
  b.memory.peak_gib_by_phase = {{"forward", 88.0}, {"backward", 90.0}, {"optimizer", 26.0}};
  const double l1 = 1.0 + mlp1_ms;
  b.modules = {
      module("m", 3 + l1 + 0.5 + 0.5, 6 + 2 * l1 + 1.0 + 1.0, 1.5, "Model"),  // its own 0.5 + 1.0
      module("m.layers.0", 3.0, 6.0, 3.0, "Layer"),
      module("m.layers.0.mlp", 2.0, 4.0, 6.0, "MLP"),
      module("m.layers.1", l1, 2 * l1, 3.0, "Layer"),
      module("m.layers.1.mlp", mlp1_ms, 2 * mlp1_ms, 3 * mlp1_ms, "MLP"),
      module("m.head", 0.5, 1.0, 1.5),
      module("<optimizer>", 0, 0, 12.0, "pseudo"),
  };
  b.kernels = {{"nvjet_sm90_tst_128x256",
                "gemm",
                12,
                9.0,
                {{"m.layers.*.mlp", "backward", 4, 4.0}, {"m.layers.*.mlp", "forward", 2, 2.0}}},
               {"adamw_kernel", "optimizer", 1, 12.0, {{"<optimizer>", "optimizer", 1, 12.0}}}};
  b.attribution.gpu_ms = step_ms;
  b.attribution.attributed_fraction = 0.95;
  vlatune::formats::RecomputeCandidate rc;
  rc.name = "mlp";
  rc.patterns = {"m.layers.*.mlp"};
  rc.step_ms_delta = 4.0;
  rc.peak_gib_delta = -10.0;
  rc.ms_per_gib_saved = 0.4;
  b.recompute = {rc};
  p.batches = {b};
  for (int layer = 0; layer < 2; ++layer) {
    vlatune::formats::GemmEntry g;
    g.name = "m.layers." + std::to_string(layer) + ".mlp.up";
    g.members = {g.name};
    g.m = 16384;
    g.k = 2048;
    g.n = 16384;
    g.bf16 = {1.0, 1.0, 1.0};
    g.fp8 = vlatune::formats::GemmTimes{0.5, 0.5, 0.5};
    g.quant_ms = 0.5;
    p.gemms.push_back(g);
  }
  vlatune::formats::GemmEntry head;
  head.name = head.members.emplace_back("m.head");
  head.m = 16384;
  head.k = 2048;
  head.n = 30;  // not divisible by 16: no FP8
  head.bf16 = {0.1, 0.1, 0.1};
  p.gemms.push_back(head);
  return p;
}

}  // namespace

TEST_CASE("check on two profiles names the modules whose time grew most", "[reports][check][profile]") {
  vlatune::test::TempDir dir("check_profile");
  vlatune::formats::write_profile(small_profile(100.0), dir.file("base.json"));
  vlatune::formats::write_profile(small_profile(106.0, 5.0), dir.file("cand.json"));
  const auto base = vlatune::reports::read_check_subject(dir.file("base.json"));
  const auto cand = vlatune::reports::read_check_subject(dir.file("cand.json"));
  CHECK(base.kind == "profile");
  CHECK(base.step_ms.size() == 10);
  CHECK(base.batch == 32);
  CHECK_FALSE(base.has_numerics);
  const auto r = vlatune::reports::check(base, cand, {});
  CHECK(r.verdict == vlatune::reports::Verdict::kRegression);
  REQUIRE(r.grown_modules.size() == 1);  // exclusive times: only the MLP grew, not its layer or the model
  CHECK(r.grown_modules[0].fqn == "m.layers.1.mlp");
  CHECK(r.grown_modules[0].delta_ms() == Approx(9.0));
  const std::string text = vlatune::reports::format_check(r, {});
  CHECK(text.find("modules whose time per step grew most:\n  +150.0%  6.000 -> 15.000 ms  m.layers.1.mlp") !=
        std::string::npos);
  CHECK(text.find("numerics gates need two run.json files") != std::string::npos);

  // --numerics on profiles: nothing to compare is an incomparable verdict, not a silent pass.
  vlatune::reports::CheckOptions numerics;
  numerics.numerics_only = true;
  CHECK(vlatune::reports::check(base, cand, numerics).verdict == vlatune::reports::Verdict::kIncomparable);
}

TEST_CASE("Module bars fold layer indices, expand the largest classes and partition the time",
          "[reports][html][profile]") {
  const auto b = small_profile(100.0).batches[0];
  const auto bars = vlatune::reports::module_bars(b, 32);
  std::vector<std::string> labels;
  double total = 0;
  for (const auto& bar : bars) {
    labels.push_back(bar.label);
    total += bar.total();
  }
  // m expands to its [rest] (the model's own 0.5 + 1.0 ms), the layer class (x2) and the head; the layer class
  // expands to its [rest] and the MLP class.
  CHECK(labels == std::vector<std::string>{"m [rest]", "m.layers.* \u00d72 [rest]", "m.layers.*.mlp \u00d72", "m.head",
                                           "<optimizer>"});
  const double roots = b.modules[0].forward_ms + b.modules[0].backward_ms + 12.0;
  CHECK(total == Approx(roots));
  CHECK(bars.back().other_ms == 12.0);
  // With room for only two bars nothing can expand: the roots.
  const auto two = vlatune::reports::module_bars(b, 2);
  REQUIRE(two.size() == 2);
  CHECK(two[0].label == "m");
}

TEST_CASE("FP8 speedups are per Linear class, with quantization, and skip unmeasured GEMMs",
          "[reports][html][profile]") {
  const auto classes = vlatune::reports::gemm_classes(small_profile(100.0).gemms);
  REQUIRE(classes.size() == 2);
  CHECK(classes[0].pattern == "m.layers.*.mlp.up");
  CHECK(classes[0].count == 2);
  CHECK(classes[0].bf16_ms == Approx(6.0));
  CHECK(classes[0].fp8_ms == Approx(4.0));  // 2 x (1.5 + 0.5 quantization)
  CHECK(classes[0].speedup() == Approx(1.5));
  CHECK(classes[1].with_fp8 == 0);
}

TEST_CASE("The report renders a profile's sections", "[reports][html][profile]") {
  vlatune::reports::ReportInput in;
  in.profile = small_profile(100.0);
  in.profile_file = "profile.json";
  const std::string html = vlatune::reports::render_report(in);
  for (const char* id : {"id=\"profile\"", "id=\"modules\"", "id=\"recompute\"", "id=\"fp8\"", "id=\"memory\""}) {
    INFO(id);
    CHECK(html.find(id) != std::string::npos);
  }
  // module bars, recompute, FP8, memory by kind, peak by phase
  size_t svgs = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++svgs;
  CHECK(svgs == 5);
  CHECK(html.find("1.0 = no gain") != std::string::npos);
  CHECK(html.find("GPU 139.8 GiB") != std::string::npos);
  // The kernel table: the largest kernels with their sites (module pattern, phase, ms).
  CHECK(html.find("Largest kernels and where they ran") != std::string::npos);
  CHECK(html.find("m.layers.*.mlp (backward) 4.000 ms") != std::string::npos);
  CHECK(html == vlatune::reports::render_report(in));
}

TEST_CASE("The profile section shows the data wait beside the step time, and says when the step is input-bound",
          "[reports][html][profile]") {
  auto render = [](const Profile& p) {
    vlatune::reports::ReportInput in;
    in.profile = p;
    in.profile_file = "profile.json";
    return vlatune::reports::render_report(in);
  };
  auto with_wait = [](double ms) {
    Profile p = small_profile(100.0);
    p.batches[0].data_wait_ms = ms;
    p.batches[0].data_wait_ms_samples.assign(p.batches[0].step_ms_samples.size(), ms);
    return p;
  };
  // Through profile.json and back: what the report reads.
  vlatune::test::TempDir dir("report_data_wait");
  vlatune::formats::write_profile(with_wait(0.4), dir.file("profile.json"));
  const std::string html = render(vlatune::formats::read_profile(dir.file("profile.json")));
  CHECK(html.find("Data wait 0.40 ms/step (0.4% of the step) at micro-batch 32") != std::string::npos);
  CHECK(html.find("<th>data wait (ms, median; share of step)</th>") != std::string::npos);
  CHECK(html.find("<td class=\"num\">100.00</td><td class=\"num\">0.40 (0.4%)</td>") != std::string::npos);
  CHECK(html.find("Input-bound") == std::string::npos);
  CHECK(html.find("not measured") == std::string::npos);

  // A measured zero (synthetic data) is a zero, not "not measured".
  const std::string synthetic = render(with_wait(0.0));
  CHECK(synthetic.find("Data wait 0.00 ms/step (0.0% of the step)") != std::string::npos);
  CHECK(synthetic.find("not measured") == std::string::npos);

  // A profile written before data_wait_ms: unknown, never shown as 0.
  const std::string old = render(small_profile(100.0));
  CHECK(old.find("Data wait per step: not measured") != std::string::npos);
  CHECK(old.find("<td class=\"num\">not measured</td>") != std::string::npos);
  CHECK(old.find("0.00 (0.0%)") == std::string::npos);
  CHECK(old.find("Input-bound") == std::string::npos);

  // Over 5% of the step: input-bound, with the loader's knob.
  const std::string slow = render(with_wait(12.0));
  CHECK(slow.find("Data wait 12.00 ms/step (12.0% of the step)") != std::string::npos);
  CHECK(slow.find("<strong>Input-bound:</strong> steps wait 12.00 ms for their batch (median), 12.0% of the step "
                  "(more than 5%)") != std::string::npos);
  CHECK(slow.find("<code>vlatune train --workers N</code>") != std::string::npos);
  // At exactly 5% it is not (more than 5% is).
  CHECK(render(with_wait(5.0)).find("Input-bound") == std::string::npos);
  CHECK(render(with_wait(5.1)).find("Input-bound") != std::string::npos);

  CHECK(vlatune::reports::data_wait_share(with_wait(12.0).batches[0]) == Approx(0.12));
  CHECK_FALSE(vlatune::reports::data_wait_share(small_profile(100.0).batches[0]).has_value());
}

TEST_CASE("Hot spots fold the layers of one class into one row (layers.* xN) with their times summed",
          "[reports][html][profile]") {
  const auto spots = vlatune::reports::hot_spots(small_profile(100.0).batches[0]);
  REQUIRE(spots.size() == 5);                   // m, m.layers.*, m.layers.*.mlp, m.head, <optimizer>
  CHECK(spots[0].pattern == "m.layers.*.mlp");  // 6 + 6 ms: ties with the optimizer, seen first
  CHECK(spots[0].count == 2);
  CHECK(spots[0].self_ms == Approx(6.0 + 6.0));
  CHECK(spots[0].forward_ms == Approx(2.0 + 2.0));
  CHECK(spots[0].kernels == 6);
  CHECK(spots[1].pattern == "<optimizer>");
  CHECK(spots[2].pattern == "m.layers.*");
  CHECK(spots[2].self_ms == Approx(3.0 + 3.0));
  vlatune::reports::ReportInput in;
  in.profile = small_profile(100.0);
  in.profile_file = "profile.json";
  const std::string html = vlatune::reports::render_report(in);
  const size_t hot = html.find("Hot spots (exclusive time)");
  REQUIRE(hot != std::string::npos);
  const std::string table = html.substr(hot, html.find("</table>", hot) - hot);
  CHECK(table.find("<td>m.layers.*.mlp \u00d72</td>") != std::string::npos);
  CHECK(table.find("m.layers.0.mlp") == std::string::npos);
  CHECK(table.find("m.layers.1") == std::string::npos);
}

TEST_CASE("The recompute table folds per-layer patterns and the module chart explains [rest]",
          "[reports][html][profile]") {
  Profile p = small_profile(100.0);
  p.batches[0].recompute[0].patterns = {"m.layers.0.mlp", "m.layers.1.mlp", "m.head"};
  vlatune::reports::ReportInput in;
  in.profile = p;
  in.profile_file = "profile.json";
  const std::string html = vlatune::reports::render_report(in);
  const size_t rec = html.find("id=\"recompute\"");
  REQUIRE(rec != std::string::npos);
  const std::string section = html.substr(rec, html.find("</section>", rec) - rec);
  CHECK(section.find("<td>m.layers.*.mlp \u00d72\nm.head</td>") != std::string::npos);
  CHECK(section.find("m.layers.0.mlp") == std::string::npos);
  // The chart has [rest] bars (small_profile: m and m.layers.* have time of their own): the note says what they are.
  CHECK(html.find("[rest] is the part of its time that none of its child modules accounts for") != std::string::npos);
}

TEST_CASE("Long bar labels are cut at their end, keeping the xN count; the chart grows for them", "[reports][html]") {
  using vlatune::reports::svg::shorten_label;
  const std::string fqn = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.*.mlp";
  CHECK(shorten_label(fqn, 200) == fqn);
  const std::string cut = shorten_label(fqn + " \u00d727", 40);
  CHECK(cut.rfind("paligemma_with_expert.paligemma", 0) == 0);  // the start stays
  CHECK(cut.size() <= 40);
  CHECK(cut.substr(cut.size() - 5) == " \u00d727");
  CHECK(cut.find("\u2026") != std::string::npos);
  const std::string rest = shorten_label(fqn + " \u00d727 [rest]", 40);
  CHECK(rest.substr(rest.size() - 12) == " \u00d727 [rest]");
  CHECK(shorten_label("a\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9", 9) ==
        "a\u00e9\u00e9\u2026");  // whole characters
  vlatune::reports::svg::BarChart chart;
  chart.components = {"ms"};
  chart.bars = {{fqn + " \u00d727", {1.0}}};
  const std::string svg = vlatune::reports::svg::bar_chart(chart);
  CHECK(svg.find(">" + fqn + " \u00d727</text>") != std::string::npos);  // fits whole in the wider chart
  CHECK(svg.find("width=\"720\"") == std::string::npos);
}
