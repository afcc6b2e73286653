// run.json reader/writer: round trip (NaN losses included), strict validation with file + JSON path.
#include <catch2/catch.hpp>

#include "temp_dir.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "formats/json_error.h"
#include "formats/recipe.h"
#include "formats/run_record.h"

using namespace vlatune::formats;
using nlohmann::json;

using vlatune::test::TempDir;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

RunRecord sample_run() {
  RunRecord r;
  r.steps = 6;
  r.warmup_steps = 2;
  r.skipped_steps = 1;
  r.batch = 32;
  r.seed = 7;
  r.data = "synthetic";
  r.step_ms = {812.5, 811.0, 0.1 + 0.2, 813.25};
  r.loss = {0.5, kNaN, 0.25, -0.0};
  r.grad_norm = {1.5, kNaN, 1.25, 1.0};
  r.samples_per_s_median = 39.4;
  r.peak_gib = 71.3;
  r.environment.gpu = "NVIDIA H200";
  r.environment.driver = "580.95.05";
  r.environment.cuda = "13.0";
  r.environment.torch = "2.11.0+cu130";
  r.environment.vlatune_commit = "cddd58e";
  r.environment.config = "full";
  r.environment.recipe_hash = recipe_hash(Recipe{});
  r.environment.world_size = 1;
  return r;
}

FormatError error_of(const json& j) {
  try {
    parse_run_record(j, "run.json");
  } catch (const FormatError& e) {
    return e;
  }
  FAIL("accepted: " << j.dump());
  throw;  // unreachable
}

// The sample record's JSON with one change applied at a JSON pointer (or removed when `value` is discarded).
json with(const std::string& pointer, const json& value) {
  json j = run_record_to_json(sample_run());
  j[json::json_pointer(pointer)] = value;
  return j;
}

json without(const std::string& parent, const std::string& key) {
  json j = run_record_to_json(sample_run());
  j[json::json_pointer(parent)].erase(key);
  return j;
}

}  // namespace

TEST_CASE("A run record round-trips through a file, non-finite losses as null", "[formats][run]") {
  TempDir dir("run");
  const std::string path = dir.file("run.json");
  const RunRecord r = sample_run();
  write_run_record(r, path);
  const RunRecord back = read_run_record(path);
  CHECK(back == r);
  CHECK(std::isnan(back.loss[1]));
  CHECK(std::signbit(back.loss[3]));
  CHECK(back.step_ms[2] == 0.1 + 0.2);
  const json j = run_record_to_json(r);
  CHECK(j["per_step"]["loss"][1].is_null());
  CHECK(j["schema"] == "vlatune.run/1");
}

TEST_CASE("A CPU run record with nulls for GPU fields round-trips", "[formats][run]") {
  RunRecord r = sample_run();
  r.environment.gpu.reset();
  r.environment.driver.reset();
  r.environment.cuda.reset();
  r.environment.vlatune_commit.reset();
  r.seed.reset();
  r.data.reset();
  r.peak_gib.reset();
  r.samples_per_s_median.reset();
  CHECK(parse_run_record(run_record_to_json(r), "run.json") == r);
}

TEST_CASE("An empty run record (no steps after warm-up) is valid", "[formats][run]") {
  RunRecord r = sample_run();
  r.steps = 2;
  r.skipped_steps = 0;
  r.step_ms.clear();
  r.loss.clear();
  r.grad_norm.clear();
  r.samples_per_s_median.reset();
  CHECK(parse_run_record(run_record_to_json(r), "run.json") == r);
}

TEST_CASE("Bad run records are rejected with the file and JSON path", "[formats][run]") {
  struct Case {
    json j;
    const char* path;
    const char* reason;
  };
  const Case cases[] = {
      {with("/schema", "vlatune.run/2"), "$.schema", "expected \"vlatune.run/1\""},
      {without("", "schema"), "$.schema", "missing required key"},
      {with("/extra", 1), "$.extra", "unknown key"},
      {with("/environment/host", "x"), "$.environment.host", "unknown key"},
      {with("/steps", -1), "$.steps", "expected an integer >= 0, got -1"},
      {with("/steps", "6"), "$.steps", "got string \"6\""},
      {with("/warmup_steps", 7), "$.warmup_steps", "7 warm-up steps, but the run has only 6 steps"},
      {with("/skipped_steps", 9), "$.skipped_steps", "9 skipped steps"},
      {with("/batch", 0), "$.batch", "expected an integer >= 1, got 0"},
      {with("/peak_gib", -0.5), "$.peak_gib", "expected a finite number >= 0 or null, got -0.5"},
      {with("/samples_per_s_median", "fast"), "$.samples_per_s_median", "or null"},
      {with("/per_step/step_ms/2", nullptr), "$.per_step.step_ms[2]", "expected a finite number >= 0, got null"},
      {with("/per_step/step_ms/1", 0), "$.per_step.step_ms[1]", "expected a step time > 0 ms"},
      {with("/per_step/loss/0", "nan"), "$.per_step.loss[0]", "got string \"nan\""},
      {with("/per_step/grad_norm/3", -1.0), "$.per_step.grad_norm[3]", ">= 0"},
      {with("/per_step/loss", json::array({1.0, 2.0, 3.0})), "$.per_step.loss",
       "3 entries, but $.per_step.step_ms has 4 (the per-step arrays must have equal lengths)"},
      {with("/per_step/step_ms", json::array({1, 2, 3, 4, 5})), "$.per_step.step_ms",
       "5 entries, but steps - warmup_steps = 4"},
      {without("/per_step", "grad_norm"), "$.per_step.grad_norm", "missing required key"},
      {with("/environment/recipe_hash", "XYZ"), "$.environment.recipe_hash", "16 lowercase hex digits"},
      {with("/environment/world_size", 0), "$.environment.world_size", "expected an integer in 1..1048576, got 0"},
      {with("/environment/torch", ""), "$.environment.torch", "non-empty string"},
      {with("/environment/gpu", 3), "$.environment.gpu", "expected a string or null"},
      {without("/environment", "driver"), "$.environment.driver", "missing required key"},
  };
  for (const Case& c : cases) {
    INFO(c.j.dump());
    const FormatError e = error_of(c.j);
    CHECK(e.file() == "run.json");
    CHECK(e.json_path() == c.path);
    CHECK_THAT(e.reason(), Catch::Contains(c.reason));
  }
}

TEST_CASE("Reading a run record names the file for missing files and bad JSON", "[formats][run]") {
  TempDir dir("run");
  CHECK_THROWS_WITH(read_run_record(dir.file("nope.json")), Catch::Contains("nope.json: cannot read"));
  const std::string path = dir.file("run.json");
  std::ofstream(path) << "{\"schema\": \"vlatune.run/1\"";
  CHECK_THROWS_WITH(read_run_record(path), Catch::StartsWith(path + ": not valid JSON: at byte"));
}

TEST_CASE("Writing a run record with a non-finite step time is refused", "[formats][run]") {
  TempDir dir("run");
  RunRecord r = sample_run();
  r.step_ms[0] = std::numeric_limits<double>::infinity();
  const std::string path = dir.file("run.json");
  CHECK_THROWS_WITH(write_run_record(r, path), Catch::StartsWith(path + ": $.per_step.step_ms[0]: "));
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("Environment differences are listed by field name", "[formats][run]") {
  const Environment a = sample_run().environment;
  Environment b = a;
  CHECK(environment_differences(a, b).empty());
  CHECK(a == b);
  b.torch = "2.12.0";
  b.gpu.reset();
  CHECK(environment_differences(a, b) == std::vector<std::string>{"gpu", "torch"});
}
