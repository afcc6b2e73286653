// `vlatune check` and `vlatune report` through the command line: exit codes per verdict, bad input as 4 with the
// file named, the positional --numerics form, --update-baseline, and a report file written.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli_test_util.h"
#include "formats/json_io.h"
#include "formats/recipe.h"
#include "formats/run_record.h"

namespace {

using vlatune::test::CliResult;
CliResult cli(std::vector<std::string> args) {
  return vlatune::test::run_cli(std::move(args));
}

std::string temp_dir() {
  return vlatune::test::temp_dir("cli-check");
}

// 20 steps after 3 warm-up steps; step times around `ms` (+-0.4%).
vlatune::formats::RunRecord run(double ms) {
  vlatune::formats::RunRecord r;
  r.warmup_steps = 3;
  r.steps = 23;
  r.batch = 32;
  r.seed = 0;
  r.data = "synthetic";
  for (int i = 0; i < 20; ++i) {
    r.step_ms.push_back(ms * (1 + 0.002 * ((i * 7) % 5 - 2)));
    r.loss.push_back(1.0 / (1 + 0.1 * i));
    r.grad_norm.push_back(1.0);
  }
  r.environment.gpu = "NVIDIA H200";
  r.environment.torch = "2.11.0+cu130";
  r.environment.config = "full";
  r.environment.recipe_hash = "0123456789abcdef";
  return r;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("vlatune check exits with its verdict: 0 pass, 1 regression, 2 numerics, 3 incomparable, 4 bad input",
          "[cli][check]") {
  const std::string d = temp_dir();
  const std::string base = d + "/base.json";
  vlatune::formats::write_run_record(run(800), base);
  auto write = [&](const std::string& name, const vlatune::formats::RunRecord& r) {
    vlatune::formats::write_run_record(r, d + "/" + name);
    return d + "/" + name;
  };

  auto pass = cli({"check", "--baseline", base, "--candidate", write("same.json", run(801))});
  CHECK(pass.code == 0);
  CHECK(has(pass.out, "verdict: pass (exit 0)"));

  auto slow = cli({"check", "--baseline", base, "--candidate", write("slow.json", run(850))});
  CHECK(slow.code == 1);
  CHECK(has(slow.out, "verdict: regression (exit 1)"));
  // The same data under a 10% threshold passes.
  CHECK(cli({"check", "--baseline", base, "--candidate", d + "/slow.json", "--threshold", "10"}).code == 0);

  auto nan_run = run(800);
  nan_run.loss[2] = NAN;
  nan_run.skipped_steps = 1;
  auto nan = cli({"check", "--baseline", base, "--candidate", write("nan.json", nan_run)});
  CHECK(nan.code == 2);
  CHECK(has(nan.out, "candidate skipped 1 step(s)"));

  auto other_gpu = run(800);
  other_gpu.environment.gpu = "NVIDIA H100";
  auto incomparable = cli({"check", "--baseline", base, "--candidate", write("h100.json", other_gpu)});
  CHECK(incomparable.code == 3);
  CHECK(has(incomparable.out, "incomparable: gpu: NVIDIA H200 vs NVIDIA H100"));
  CHECK(cli({"check", "--baseline", base, "--candidate", d + "/h100.json", "--force"}).code == 0);

  std::ofstream(d + "/broken.json") << R"({"schema": "vlatune.run/1", "steps": "many"})";
  auto broken = cli({"check", "--baseline", base, "--candidate", d + "/broken.json"});
  CHECK(broken.code == 4);
  CHECK(has(broken.err, d + "/broken.json"));
  CHECK(has(broken.err, "$.steps"));
  CHECK(cli({"check", "--baseline", base, "--candidate", d + "/missing.json"}).code == 4);
  CHECK(cli({"check", "--baseline", base}).code == 4);
  CHECK(cli({"check", "--baseline", base, "--candidate", base, "--alpha", "2"}).code == 4);
}

TEST_CASE("vlatune check --numerics BASE CAND compares runs of different recipes", "[cli][check]") {
  const std::string d = temp_dir();
  auto fp8 = run(600);
  fp8.environment.recipe_hash = "fedcba9876543210";
  vlatune::formats::write_run_record(run(800), d + "/bf16.json");
  vlatune::formats::write_run_record(fp8, d + "/fp8.json");
  auto r = cli({"check", "--numerics", d + "/bf16.json", d + "/fp8.json"});
  CHECK(r.code == 0);
  CHECK(has(r.out, "differs (not gated): recipe_hash"));
  CHECK_FALSE(has(r.out, "timing:"));
  CHECK(cli({"check", d + "/bf16.json", d + "/fp8.json"}).code == 3);
}

TEST_CASE("vlatune check --update-baseline replaces the baseline only on a significant improvement", "[cli][check]") {
  const std::string d = temp_dir();
  const std::string base = d + "/base.json";
  vlatune::formats::write_run_record(run(800), base);
  vlatune::formats::write_run_record(run(801), d + "/same.json");
  vlatune::formats::write_run_record(run(700), d + "/fast.json");
  auto kept = cli({"check", "--baseline", base, "--candidate", d + "/same.json", "--update-baseline"});
  CHECK(kept.code == 0);
  CHECK(has(kept.out, "baseline kept"));
  CHECK(vlatune::formats::read_run_record(base) == run(800));
  auto updated = cli({"check", "--baseline", base, "--candidate", d + "/fast.json", "--update-baseline"});
  CHECK(updated.code == 0);
  CHECK(has(updated.out, "baseline updated"));
  CHECK(vlatune::formats::read_run_record(base) == run(700));
}

TEST_CASE("vlatune report writes one HTML file from a recipe and runs; bad input exits 4", "[cli][report]") {
  const std::string d = temp_dir();
  vlatune::formats::Recipe recipe;
  recipe.predicted.step_ms = 790;
  recipe.rationale = {{"candidate: as is", "fastest", {{"predicted_step_ms", 790}, {"predicted_peak_gib", 100}}}};
  vlatune::formats::write_recipe(recipe, d + "/recipe.json");
  ::mkdir((d + "/run_a").c_str(), 0755);
  vlatune::formats::write_run_record(run(800), d + "/run_a/run.json");
  auto r = cli({"report", "--recipe", d + "/recipe.json", "--run", d + "/run_a", "--out", d + "/report.html"});
  CHECK(r.code == 0);
  CHECK(has(r.out, "wrote " + d + "/report.html"));
  const std::string html = vlatune::formats::read_text_file(d + "/report.html");
  CHECK(has(html, "<svg"));
  CHECK(has(html, "run_a"));

  CHECK(cli({"report", "--out", d + "/empty.html"}).code == 4);
  std::ofstream(d + "/bad_recipe.json") << R"({"schema": "vlatune.recipe/1", "batch": {"micro_batch": 0}})";
  auto bad = cli({"report", "--recipe", d + "/bad_recipe.json", "--out", d + "/x.html"});
  CHECK(bad.code == 4);
  CHECK(has(bad.err, "$.batch.micro_batch"));
}

TEST_CASE("vlatune check refuses non-finite and out-of-range thresholds instead of passing a regression",
          "[cli][check]") {
  const std::string d = temp_dir();
  vlatune::formats::write_run_record(run(800), d + "/base.json");
  vlatune::formats::write_run_record(run(1600), d + "/doubled.json");  // twice as slow: a regression
  CHECK(cli({"check", "--baseline", d + "/base.json", "--candidate", d + "/doubled.json"}).code == 1);
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{{"--alpha", "nan"},
                                                                                    {"--alpha", "inf"},
                                                                                    {"--threshold", "nan"},
                                                                                    {"--threshold", "-inf"},
                                                                                    {"--threshold", "1e400"},
                                                                                    {"--rtol", "nan"},
                                                                                    {"--pearson-min", "nan"},
                                                                                    {"--mre-max", "inf"},
                                                                                    {"--alpha", "0.9"}}) {
    INFO(flag << " " << value);
    auto r = cli({"check", "--baseline", d + "/base.json", "--candidate", d + "/doubled.json", flag, value});
    CHECK(r.code == 4);
    CHECK(has(r.err, flag));
    CHECK_FALSE(has(r.out, "verdict: pass"));
  }
}

TEST_CASE("vlatune check: an empty or short candidate is incomparable (exit 3) with the counts, never a pass",
          "[cli][check]") {
  const std::string d = temp_dir();
  vlatune::formats::write_run_record(run(800), d + "/base.json");
  auto empty = run(800);
  empty.step_ms.clear();
  empty.loss.clear();
  empty.grad_norm.clear();
  empty.steps = 3;
  vlatune::formats::write_run_record(empty, d + "/empty.json");
  auto r = cli({"check", "--baseline", d + "/base.json", "--candidate", d + "/empty.json"});
  CHECK(r.code == 3);
  CHECK(has(r.out, "20 timed steps after warm-up in the baseline, 0 in the candidate"));
  CHECK(has(r.out, "needs >= 9"));
  CHECK_FALSE(has(r.out, "nan"));
  auto short_run = run(800);
  short_run.step_ms.resize(5);
  short_run.loss.resize(5);
  short_run.grad_norm.resize(5);
  short_run.steps = 8;  // steps 3..7: the same losses as the baseline's there
  vlatune::formats::write_run_record(short_run, d + "/short.json");
  CHECK(cli({"check", "--baseline", d + "/base.json", "--candidate", d + "/short.json"}).code == 3);
}

TEST_CASE("vlatune check: a file that does not parse exits 4 naming the file and the JSON path, never 1",
          "[cli][check]") {
  const std::string d = temp_dir();
  vlatune::formats::write_run_record(run(800), d + "/base.json");
  std::string text = vlatune::formats::read_text_file(d + "/base.json");
  const std::string key = "\"samples_per_s_median\": ";
  text.replace(text.find(key) + key.size(), text.find(',', text.find(key)) - text.find(key) - key.size(), "1e400");
  std::ofstream(d + "/overflow.json") << text;
  auto r = cli({"check", "--baseline", d + "/base.json", "--candidate", d + "/overflow.json"});
  CHECK(r.code == 4);
  CHECK(has(r.err, d + "/overflow.json: $.samples_per_s_median"));
  REQUIRE(::mkfifo((d + "/fifo.json").c_str(), 0600) == 0);
  auto fifo = cli({"check", "--baseline", d + "/base.json", "--candidate", d + "/fifo.json"});
  CHECK(fifo.code == 4);
  CHECK(has(fifo.err, "not a regular file"));
}

TEST_CASE("vlatune check and report accept run directories and profile directories", "[cli][check][report]") {
  const std::string d = temp_dir();
  ::mkdir((d + "/base").c_str(), 0755);
  ::mkdir((d + "/cand").c_str(), 0755);
  vlatune::formats::write_run_record(run(800), d + "/base/run.json");
  vlatune::formats::write_run_record(run(801), d + "/cand/run.json");
  auto r = cli({"check", d + "/base", d + "/cand/"});
  CHECK(r.code == 0);
  CHECK(has(r.out, "baseline:  " + d + "/base/run.json"));
  const std::string fixture = std::string(VLATUNE_FIXTURES_DIR) + "/profile_synthetic_pi05.json";
  ::mkdir((d + "/prof").c_str(), 0755);
  vlatune::formats::write_file_atomic(d + "/prof/profile.json", vlatune::formats::read_text_file(fixture));
  auto p = cli({"check", d + "/prof", d + "/prof"});
  CHECK(p.code == 3);  // read as a profile; its 6 timed steps are too few to gate on
  CHECK(has(p.out, "baseline:  " + d + "/prof/profile.json"));
  CHECK(has(p.out, "6 timed steps after warm-up in the baseline"));
  auto rep = cli({"report", "--profile", d + "/prof", "--out", d + "/r.html"});
  CHECK(rep.code == 0);
  CHECK(has(vlatune::formats::read_text_file(d + "/r.html"), "profile: " + d + "/prof/profile.json"));
}

TEST_CASE("vlatune report refuses an output that is one of its inputs and shows each run's precision",
          "[cli][report]") {
  const std::string d = temp_dir();
  ::mkdir((d + "/run_a").c_str(), 0755);
  vlatune::formats::write_run_record(run(800), d + "/run_a/run.json");
  vlatune::formats::Recipe fp32;
  fp32.model_options.precision = vlatune::formats::Precision::kFp32Master;
  fp32.fp8.modules = {"action_out_proj"};
  vlatune::formats::write_recipe(fp32, d + "/run_a/recipe.json");
  const std::string before = vlatune::formats::read_text_file(d + "/run_a/run.json");
  for (const std::string& out : {d + "/run_a/run.json", d + "/run_a/recipe.json", d + "/run_a/./run.json"}) {
    INFO(out);
    auto r = cli({"report", "--run", d + "/run_a", "--out", out});
    CHECK(r.code == 4);
    CHECK(has(r.err, "same file as --run"));
  }
  CHECK(cli({"report", "--run", d + "/run_a", "--out", d + "/run_a"}).code == 4);  // a directory
  CHECK(vlatune::formats::read_text_file(d + "/run_a/run.json") == before);
  auto ok = cli({"report", "--run", d + "/run_a", "--out", d + "/report.html"});
  REQUIRE(ok.code == 0);
  CHECK(has(vlatune::formats::read_text_file(d + "/report.html"), "fp32-master + FP8 (1 pattern)"));
  // An output that cannot be written is a failure (exit 1), not bad input.
  auto unwritable = cli({"report", "--run", d + "/run_a", "--out", d + "/no/such/dir/report.html"});
  CHECK(unwritable.code == 1);
  CHECK(has(unwritable.err, d + "/no/such/dir/report.html"));
}
