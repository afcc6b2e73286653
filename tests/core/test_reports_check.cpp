// `vlatune check`'s gates on synthetic runs: timing needs significance AND the threshold, too few samples are
// incomparable (never a pass), numerics are hard gates, environments must match, and the baseline only moves on a
// real improvement.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>

#include "formats/json_error.h"
#include "formats/json_io.h"
#include "formats/run_record.h"
#include "reports/check.h"
#include "temp_dir.h"

namespace {

using vlatune::reports::CheckOptions;
using vlatune::reports::CheckSubject;
using vlatune::reports::TimingStatus;
using vlatune::reports::Verdict;

// n step times around `median_ms` with +-0.5% deterministic noise, and a smooth decreasing loss curve.
vlatune::formats::RunRecord synthetic_run(size_t n, double median_ms, unsigned seed = 1) {
  vlatune::formats::RunRecord r;
  r.warmup_steps = 3;
  r.steps = r.warmup_steps + static_cast<int64_t>(n);
  r.batch = 32;
  r.seed = 0;
  r.data = "synthetic";
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> noise(-0.005, 0.005);
  for (size_t i = 0; i < n; ++i) {
    r.step_ms.push_back(median_ms * (1 + noise(gen)));
    r.loss.push_back(1.0 / (1.0 + 0.05 * static_cast<double>(i)));
    r.grad_norm.push_back(2.0 / (1.0 + 0.01 * static_cast<double>(i)));
  }
  r.environment.gpu = "NVIDIA H200";
  r.environment.driver = "580.95.05";
  r.environment.cuda = "13.0";
  r.environment.torch = "2.11.0+cu130";
  r.environment.vlatune_commit = "aaaaaaaaaaaa";
  r.environment.config = "full";
  r.environment.recipe_hash = "0123456789abcdef";
  return r;
}

CheckSubject subject(const vlatune::formats::RunRecord& r, const std::string& name = "run.json") {
  return vlatune::reports::subject_from_run(r, name);
}

vlatune::reports::CheckResult run_check(const vlatune::formats::RunRecord& b, const vlatune::formats::RunRecord& c,
                                        const CheckOptions& o = {}) {
  return vlatune::reports::check(subject(b, "base.json"), subject(c, "cand.json"), o);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("Same distribution passes; a significant 5% slowdown is a regression (exit 1)", "[reports][check]") {
  const auto base = synthetic_run(20, 800.0, 1);
  auto same = synthetic_run(20, 800.0, 2);
  auto r = run_check(base, same);
  CHECK(r.verdict == Verdict::kPass);
  CHECK(r.timing.status == TimingStatus::kUnchanged);
  CHECK(vlatune::reports::verdict_exit_code(r.verdict) == 0);

  const auto slow = synthetic_run(20, 840.0, 2);
  r = run_check(base, slow);
  CHECK(r.verdict == Verdict::kRegression);
  CHECK(vlatune::reports::verdict_exit_code(r.verdict) == 1);
  CHECK(r.timing.change_pct == Approx(5.0).margin(0.6));
  REQUIRE(r.timing.u_test);
  CHECK(r.timing.u_test->p_value < 0.001);
  const std::string text = vlatune::reports::format_check(r, {});
  CHECK(contains(text, "regression"));
  CHECK(contains(text, "verdict: regression (exit 1)"));
  // Runs carry no per-module times: the message says how to get them.
  CHECK(contains(text, "compare two profiles"));
}

TEST_CASE("A significant change within the threshold is not a regression", "[reports][check]") {
  // Noise +-0.5%, shift 1.5%: every candidate sample is slower (p tiny), but 1.5% < 3%.
  const auto r = run_check(synthetic_run(20, 800.0, 1), synthetic_run(20, 812.0, 2));
  REQUIRE(r.timing.u_test);
  CHECK(r.timing.u_test->p_value < 0.05);
  CHECK(r.timing.status == TimingStatus::kUnchanged);
  CHECK(r.verdict == Verdict::kPass);
  CHECK(contains(vlatune::reports::format_check(r, {}), "within the 3.0% threshold"));
  // A lower threshold makes the same data a regression.
  CheckOptions strict;
  strict.threshold_pct = 1.0;
  CHECK(run_check(synthetic_run(20, 800.0, 1), synthetic_run(20, 812.0, 2), strict).verdict == Verdict::kRegression);
}

TEST_CASE("A large median shift in noisy, overlapping samples is not significant", "[reports][check]") {
  // Bimodal step times (the newton-physics #2534 pattern): the medians differ by ~4.5%, the distributions do not.
  auto base = synthetic_run(9, 100.0), cand = synthetic_run(9, 100.0);
  base.step_ms = {90, 95, 100, 105, 110, 190, 200, 205, 210};
  cand.step_ms = {93, 98, 106, 108, 115, 185, 195, 210, 220};
  const auto r = run_check(base, cand);
  CHECK(r.timing.change_pct > 3.0);
  REQUIRE(r.timing.u_test);
  CHECK(r.timing.u_test->p_value > 0.05);
  CHECK(r.timing.status == TimingStatus::kUnchanged);
  CHECK(r.verdict == Verdict::kPass);
}

TEST_CASE("Fewer than 9 timing samples are incomparable (exit 3), naming the counts found and needed",
          "[reports][check]") {
  const auto r = run_check(synthetic_run(8, 800.0, 1), synthetic_run(20, 1000.0, 2));
  CHECK(r.timing.status == TimingStatus::kInsufficient);
  CHECK_FALSE(r.timing.u_test);
  CHECK(r.verdict == Verdict::kIncomparable);
  CHECK(vlatune::reports::verdict_exit_code(r.verdict) == 3);
  const std::string text = vlatune::reports::format_check(r, {});
  CHECK(contains(text, "8 timed steps after warm-up in the baseline, 20 in the candidate"));
  CHECK(contains(text, "needs >= 9 on each side"));
  CHECK(contains(text, "verdict: incomparable (exit 3)"));
  CHECK_FALSE(contains(text, "--force"));  // forcing cannot make too few samples enough
}

TEST_CASE("An empty candidate is incomparable, printed without NaN", "[reports][check]") {
  auto empty = synthetic_run(0, 800.0, 2);
  const auto r = run_check(synthetic_run(20, 800.0, 1), empty);
  CHECK(r.verdict == Verdict::kIncomparable);
  const std::string text = vlatune::reports::format_check(r, {});
  CHECK(contains(text, "0 in the candidate"));
  CHECK(contains(text, "-> no timed steps"));
  CHECK_FALSE(contains(text, "nan"));
  CHECK_FALSE(contains(text, "verdict: pass"));
  // A numerics failure still outranks: a run whose loss went NaN says so.
  auto broken = synthetic_run(4, 800.0, 2);
  broken.loss[1] = NAN;
  CHECK(run_check(synthetic_run(20, 800.0, 1), broken).verdict == Verdict::kNumericsFailure);
}

TEST_CASE("A significant improvement is reported and only then moves the baseline", "[reports][check]") {
  vlatune::test::TempDir dir("check_update");
  const auto base = synthetic_run(20, 800.0, 1);
  vlatune::formats::write_run_record(base, dir.file("base.json"));
  for (double ms : {760.0, 797.0}) {
    INFO("candidate median " << ms);
    const auto cand = synthetic_run(20, ms, 2);
    vlatune::formats::write_run_record(cand, dir.file("cand.json"));
    const auto r = vlatune::reports::check(vlatune::reports::read_check_subject(dir.file("base.json")),
                                           vlatune::reports::read_check_subject(dir.file("cand.json")), {});
    CHECK(r.verdict == Verdict::kPass);
    const bool improved = ms < 780;
    CHECK(r.improvement_significant() == improved);
    CHECK(vlatune::reports::update_baseline_if_improved(r) == improved);
    CHECK(vlatune::formats::read_run_record(dir.file("base.json")) == (improved ? cand : base));
    vlatune::formats::write_run_record(base, dir.file("base.json"));
  }
}

TEST_CASE("Different GPU, driver, CUDA, torch, recipe or batch: incomparable (exit 3) unless forced",
          "[reports][check]") {
  const auto base = synthetic_run(20, 800.0, 1);
  auto cand = synthetic_run(20, 800.0, 2);
  cand.environment.gpu = "NVIDIA H100 80GB HBM3";
  cand.environment.torch = "2.10.0+cu128";
  cand.batch = 16;
  cand.environment.vlatune_commit = "bbbbbbbbbbbb";  // comparing commits is the point: never blocks
  auto r = run_check(base, cand);
  CHECK(r.verdict == Verdict::kIncomparable);
  CHECK(vlatune::reports::verdict_exit_code(r.verdict) == 3);
  REQUIRE(r.differences.size() == 3);
  CHECK(r.differences[0] == "gpu: NVIDIA H200 vs NVIDIA H100 80GB HBM3");
  CHECK(r.differences[1] == "torch: 2.11.0+cu130 vs 2.10.0+cu128");
  CHECK(r.differences[2] == "batch: 32 vs 16");
  CHECK(r.timing.status == TimingStatus::kNotRun);
  const std::string text = vlatune::reports::format_check(r, {});
  CHECK(contains(text, "incomparable: gpu: NVIDIA H200 vs NVIDIA H100 80GB HBM3"));
  CHECK(contains(text, "--force"));

  CheckOptions force;
  force.force = true;
  r = run_check(base, cand, force);
  CHECK(r.verdict == Verdict::kPass);
  CHECK(r.timing.status == TimingStatus::kUnchanged);
  CHECK(contains(vlatune::reports::format_check(r, force), "differs (--force): gpu"));
  CHECK(contains(vlatune::reports::format_check(r, force), "differs (not gated): vlatune_commit"));
}

TEST_CASE("NaN losses and skipped steps fail the numerics gate (exit 2), even when timing regresses too",
          "[reports][check]") {
  const auto base = synthetic_run(20, 800.0, 1);
  auto cand = synthetic_run(20, 900.0, 2);
  cand.loss[5] = NAN;
  cand.skipped_steps = 1;
  const auto r = run_check(base, cand);
  CHECK(r.verdict == Verdict::kNumericsFailure);
  CHECK(vlatune::reports::verdict_exit_code(r.verdict) == 2);
  CHECK(r.timing.status == TimingStatus::kRegression);
  const std::string text = vlatune::reports::format_check(r, {});
  CHECK(contains(text, "candidate skipped 1 step(s)"));
  CHECK(contains(text, "candidate loss is NaN/inf at 1 step(s), first at step 8"));  // warm-up 3 + index 5
}

TEST_CASE("Per-step loss and grad-norm must agree within the tolerance for the same seed and data",
          "[reports][check]") {
  const auto base = synthetic_run(20, 800.0, 1);
  auto cand = synthetic_run(20, 800.0, 2);
  cand.loss[10] *= 1.03;  // 3% off at one step
  auto r = run_check(base, cand);
  CHECK(r.verdict == Verdict::kNumericsFailure);
  REQUIRE(r.numerics.series.size() == 2);
  CHECK(r.numerics.series[0].name == "loss");
  CHECK(r.numerics.series[0].worst_step == 13);
  CHECK(contains(vlatune::reports::format_check(r, {}),
                 "loss over 20 steps: max relative error 3.000% at step 13 (gate: <= 2.000% per step): FAIL"));
  CHECK(r.numerics.series[1].pass);

  cand.loss[10] = base.loss[10] * 1.015;  // within 2%
  CHECK(run_check(base, cand).verdict == Verdict::kPass);

  // Different seeds: the curves are not compared (noted), and nothing fails.
  cand.loss[10] *= 1.5;
  cand.seed = 1;
  r = run_check(base, cand);
  CHECK(r.verdict == Verdict::kPass);
  CHECK_FALSE(r.numerics.compared);
  CHECK(contains(vlatune::reports::format_check(r, {}), "different seed or data"));
}

TEST_CASE("Per-step losses are aligned by optimizer step, not by array index", "[reports][check]") {
  const auto base = synthetic_run(20, 800.0, 1);  // steps 3..22
  auto cand = synthetic_run(20, 800.0, 2);
  // A resumed run's per_step holds its last 15 steps: 8..22.
  cand.steps = base.steps;
  cand.warmup_steps = 3;
  cand.loss.assign(base.loss.begin() + 5, base.loss.end());
  cand.grad_norm.assign(base.grad_norm.begin() + 5, base.grad_norm.end());
  cand.step_ms.resize(15);
  const auto r = run_check(base, cand);
  CHECK(r.verdict == Verdict::kPass);
  REQUIRE(r.numerics.series.size() == 2);
  CHECK(r.numerics.series[0].steps == 15);
  CHECK(r.numerics.series[0].error.max_relative == 0.0);
}

TEST_CASE("Long runs are judged on curves: Pearson and mean relative error", "[reports][check]") {
  const auto base = synthetic_run(250, 800.0, 1);
  auto spike = synthetic_run(250, 800.0, 2);
  spike.loss[100] *= 1.05;  // one noisy step: a per-step gate would fail, the curve gate does not
  auto r = run_check(base, spike);
  CHECK(r.verdict == Verdict::kPass);
  REQUIRE(r.numerics.series.size() == 2);
  CHECK(r.numerics.series[0].curve);
  CHECK(r.numerics.series[0].pearson > 0.999);

  auto drift = synthetic_run(250, 800.0, 2);
  for (auto& l : drift.loss) l *= 1.02;  // a systematic 2% offset: mean relative error 2% > 1%
  r = run_check(base, drift);
  CHECK(r.verdict == Verdict::kNumericsFailure);
  CHECK(contains(vlatune::reports::format_check(r, {}),
                 "loss over 250 steps: Pearson 1.00000, mean relative error 2.000% (gate: Pearson >= 0.99900, mean <= "
                 "1.000%): FAIL"));

  // A nearly flat curve with +-0.9% alternating noise: mean relative error 0.9% passes, the shape does not.
  auto flat = synthetic_run(250, 800.0, 1), decorrelated = synthetic_run(250, 800.0, 2);
  for (size_t i = 0; i < flat.loss.size(); ++i) {
    flat.loss[i] = 1.0 + 0.01 * static_cast<double>(i) / 250.0;
    decorrelated.loss[i] = flat.loss[i] * (1 + (i % 2 ? 0.009 : -0.009));
  }
  r = run_check(flat, decorrelated);
  CHECK(r.numerics.series[0].pearson < 0.999);
  CHECK(r.verdict == Verdict::kNumericsFailure);
}

TEST_CASE("A run is long by the steps it trained: the warm-up that run.json leaves out counts", "[reports][check]") {
  // 200 steps trained, 197 recorded after the 3 warm-up steps: the curves are judged, and one noisy step passes.
  const auto base = synthetic_run(197, 800.0, 1);
  auto spike = synthetic_run(197, 800.0, 2);
  spike.loss[100] *= 1.05;
  auto r = run_check(base, spike);
  CHECK(r.verdict == Verdict::kPass);
  REQUIRE(r.numerics.series.size() == 2);
  CHECK(r.numerics.series[0].curve);
  CHECK(r.numerics.series[0].steps == 197);
  // One step fewer trained: the per-step rule, which that step fails.
  const auto short_base = synthetic_run(196, 800.0, 1);
  auto short_spike = synthetic_run(196, 800.0, 2);
  short_spike.loss[100] *= 1.05;
  r = run_check(short_base, short_spike);
  CHECK_FALSE(r.numerics.series[0].curve);
  CHECK(r.verdict == Verdict::kNumericsFailure);
  // Trained long, but only two shared steps recorded (a warm-up of 198): too few points for a curve.
  auto late_base = synthetic_run(2, 800.0, 1), late_spike = synthetic_run(2, 800.0, 2);
  late_base.warmup_steps = late_spike.warmup_steps = 198;
  late_base.steps = late_spike.steps = 200;
  late_spike.loss[1] *= 1.05;
  r = run_check(late_base, late_spike);
  CHECK_FALSE(r.numerics.series[0].curve);
  CHECK(r.verdict == Verdict::kNumericsFailure);
}

TEST_CASE("--curve-loss-only gates the loss curve and reports the gradient-norm curve", "[reports][check]") {
  const auto base = synthetic_run(250, 800.0, 1);
  auto noisy_norm = synthetic_run(250, 800.0, 2);
  for (auto& g : noisy_norm.grad_norm) g *= 1.02;  // the gradient norm off by 2%, the loss as the baseline's
  CHECK(run_check(base, noisy_norm).verdict == Verdict::kNumericsFailure);
  CheckOptions loss_only;
  loss_only.curve_gates_grad_norm = false;
  auto r = run_check(base, noisy_norm, loss_only);
  CHECK(r.verdict == Verdict::kPass);
  REQUIRE(r.numerics.series.size() == 2);
  CHECK_FALSE(r.numerics.series[1].gated);
  CHECK(contains(vlatune::reports::format_check(r, loss_only), "reported, not gated (--curve-loss-only)"));
  auto bad_loss = noisy_norm;
  for (auto& l : bad_loss.loss) l *= 1.02;  // the loss curve is still gated
  CHECK(run_check(base, bad_loss, loss_only).verdict == Verdict::kNumericsFailure);
}

TEST_CASE("--numerics compares runs of different recipes and GPUs, not of different seeds", "[reports][check]") {
  const auto base = synthetic_run(250, 800.0, 1);
  auto fp8 = synthetic_run(250, 600.0, 2);
  fp8.environment.recipe_hash = "fedcba9876543210";
  fp8.environment.gpu = "NVIDIA H100";
  CheckOptions numerics;
  numerics.numerics_only = true;
  auto r = run_check(base, fp8, numerics);
  CHECK(r.verdict == Verdict::kPass);
  CHECK(r.timing.status == TimingStatus::kNotRun);
  CHECK(r.numerics.series.at(0).curve);
  CHECK(contains(vlatune::reports::format_check(r, numerics), "differs (not gated): recipe_hash"));
  // Without --numerics the same pair is incomparable.
  CHECK(run_check(base, fp8).verdict == Verdict::kIncomparable);

  fp8.seed = 7;
  r = run_check(base, fp8, numerics);
  CHECK(r.verdict == Verdict::kIncomparable);
  CHECK(contains(r.differences.at(0), "seed/data"));
}

TEST_CASE("read_check_subject reads run.json or a run directory and names bad input", "[reports][check]") {
  vlatune::test::TempDir dir("check_read");
  vlatune::formats::write_run_record(synthetic_run(10, 800.0), dir.file("run.json"));
  const auto s = vlatune::reports::read_check_subject(dir.path);
  CHECK(s.file == dir.file("run.json"));
  CHECK(s.kind == "run");
  CHECK(s.step_ms.size() == 10);
  CHECK(s.first_step == 3);

  std::ofstream(dir.file("other.json")) << R"({"schema": "vlatune.recipe/1"})";
  try {
    vlatune::reports::read_check_subject(dir.file("other.json"));
    FAIL("expected a FormatError");
  } catch (const vlatune::formats::FormatError& e) {
    CHECK(e.file() == dir.file("other.json"));
    CHECK(e.json_path() == "$.schema");
    CHECK(contains(e.reason(), "vlatune.run/1"));
  }
  std::ofstream(dir.file("array.json")) << "[1, 2]";
  CHECK_THROWS_AS(vlatune::reports::read_check_subject(dir.file("array.json")), vlatune::formats::FormatError);
}

TEST_CASE("A number beyond a double in a check input is a FormatError naming the file and JSON path",
          "[reports][check]") {
  vlatune::test::TempDir dir("check_overflow");
  std::string text = vlatune::formats::dump_json_file(vlatune::formats::run_record_to_json(synthetic_run(10, 800.0)));
  const std::string key = "\"samples_per_s_median\": ";
  const size_t at = text.find(key);
  REQUIRE(at != std::string::npos);
  text.replace(at + key.size(), text.find_first_of(",\n", at + key.size()) - at - key.size(), "1e400");
  std::ofstream(dir.file("run.json")) << text;
  try {
    vlatune::reports::read_check_subject(dir.file("run.json"));
    FAIL("expected a FormatError");
  } catch (const vlatune::formats::FormatError& e) {
    CHECK(e.file() == dir.file("run.json"));
    CHECK(e.json_path() == "$.samples_per_s_median");
    CHECK(contains(e.reason(), "1e400"));
  }
}
