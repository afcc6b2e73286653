// metrics.jsonl: header, per-line validation reported as file:LINE: $.field, appending writer, resume.
#include <catch2/catch.hpp>

#include "temp_dir.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "formats/json_error.h"
#include "formats/json_io.h"
#include "formats/metrics_jsonl.h"

using namespace vlatune::formats;

namespace vlatune::formats {
// For Catch's expansion of failed comparisons.
std::ostream& operator<<(std::ostream& os, const MetricsRow& r) {
  return os << metrics_row_to_line(r);
}
}  // namespace vlatune::formats

using vlatune::test::TempDir;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

MetricsRow row_at(int64_t step) {
  MetricsRow r;
  r.step = step;
  r.loss = 0.5 / static_cast<double>(step + 1);
  r.grad_norm = 1.0 + 0.1 * static_cast<double>(step);
  r.lr = 2.5e-5;
  r.samples_per_s = 39.4;
  r.step_ms = 812.0 + static_cast<double>(step);
  r.data_wait_ms = 0.25;
  r.peak_gib = 71.3;
  r.skipped = false;
  return r;
}

const char* kHeader = "{\"schema\":\"vlatune.metrics/1\"}\n";   // read, no longer written
const char* kHeader2 = "{\"schema\":\"vlatune.metrics/2\"}\n";  // what writers write
const char* kRow =
    R"({"step":0,"loss":0.5,"grad_norm":1.0,"lr":0.0001,"samples_per_s":40.0,"step_ms":800.0,"data_wait_ms":0.1,"peak_gib":70.0,"skipped":false})";

// kRow with one field replaced by raw JSON text.
std::string row_with(const std::string& key, const std::string& value) {
  auto j = nlohmann::json::parse(kRow);
  j[key] = nlohmann::json::parse(value);
  return j.dump();
}

FormatError error_of(const std::string& text) {
  try {
    parse_metrics(text, "metrics.jsonl");
  } catch (const FormatError& e) {
    return e;
  }
  FAIL("accepted: " << text);
  throw;  // unreachable
}

}  // namespace

TEST_CASE("Metrics rows written one by one read back equal, with a header first", "[formats][metrics]") {
  TempDir dir("metrics");
  const std::string path = dir.file("metrics.jsonl");
  std::vector<MetricsRow> rows = {row_at(0), row_at(1), row_at(3)};
  rows[1].loss = kNaN;
  rows[1].grad_norm = std::numeric_limits<double>::infinity();
  rows[1].skipped = true;
  rows[2].peak_gib = kNaN;  // not measured
  {
    MetricsWriter w = MetricsWriter::create(path);
    for (const auto& r : rows) w.append(r);
    CHECK(w.last_step() == 3);
    // Flushed per line: readable while the writer is still open.
    CHECK(read_metrics(path).size() == 3);
  }
  const std::string text = read_text_file(path);
  CHECK(text.rfind(kHeader2, 0) == 0);
  CHECK(std::count(text.begin(), text.end(), '\n') == 4);
  const auto back = read_metrics(path);
  std::vector<MetricsRow> expected = rows;
  expected[1].grad_norm = kNaN;  // any non-finite value is written as null and reads back as NaN
  CHECK(back == expected);
  CHECK(std::isnan(back[1].grad_norm));
  CHECK(back[1].skipped);
}

TEST_CASE("write_metrics and read_metrics round-trip, including an empty run", "[formats][metrics]") {
  TempDir dir("metrics");
  const std::string path = dir.file("m.jsonl");
  write_metrics({}, path);
  CHECK(read_text_file(path) == kHeader2);
  CHECK(read_metrics(path).empty());
  const std::vector<MetricsRow> rows = {row_at(5), row_at(6)};
  write_metrics(rows, path);
  CHECK(read_metrics(path) == rows);
}

TEST_CASE("Bad metrics lines are reported as file:LINE: $.field", "[formats][metrics]") {
  struct Case {
    std::string line;
    const char* path;
    const char* reason;
  };
  const Case cases[] = {
      {row_with("step_ms", "\"fast\""), "$.step_ms", "expected a finite number >= 0, got string \"fast\""},
      {row_with("step", "1.5"), "$.step", "expected an integer >= 0, got 1.5"},
      {row_with("step", "-1"), "$.step", "got -1"},
      {row_with("lr", "null"), "$.lr", "got null"},
      {row_with("data_wait_ms", "-0.1"), "$.data_wait_ms", ">= 0"},
      {row_with("skipped", "0"), "$.skipped", "expected true or false"},
      {row_with("grad_norm", "-1"), "$.grad_norm", ">= 0 or null"},
      {row_with("tokens_per_s", "3"), "$.tokens_per_s", "unknown key"},
      {R"({"step":0})", "$.loss", "missing required key"},
      {"[1, 2]", "$", "expected an object, got an array"},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    const std::string text = std::string(kHeader) + kRow + "\n" + c.line + "\n";
    // The bad line is line 3 (after the header and a good row with step 0): step must also increase, so make the
    // step differ where the case does not test it.
    std::string fixed = text;
    if (c.line.find("\"step\":0,") != std::string::npos && std::string(c.path) != "$.step") {
      fixed = std::string(kHeader) + c.line + "\n";
    }
    const bool on_line_2 = fixed != text;
    const FormatError e = error_of(fixed);
    CHECK(e.file() == std::string("metrics.jsonl:") + (on_line_2 ? "2" : "3"));
    CHECK(e.json_path() == c.path);
    CHECK_THAT(e.reason(), Catch::Contains(c.reason));
    CHECK_THAT(e.what(), Catch::StartsWith(e.file() + ": " + c.path + ": "));
  }
}

TEST_CASE("Metrics steps must increase from line to line", "[formats][metrics]") {
  const std::string text = std::string(kHeader) + kRow + "\n" + row_with("step", "1") + "\n" + kRow + "\n";
  const FormatError e = error_of(text);
  CHECK(e.file() == "metrics.jsonl:4");
  CHECK(e.json_path() == "$.step");
  CHECK_THAT(e.reason(), Catch::Contains("step 0 does not follow step 1"));
}

TEST_CASE("A metrics file needs its header on line 1 and only there", "[formats][metrics]") {
  CHECK_THAT(error_of("").what(), Catch::StartsWith("metrics.jsonl:1: empty file"));
  CHECK_THAT(error_of(std::string(kRow) + "\n").what(), Catch::StartsWith("metrics.jsonl:1: $.schema: missing header"));
  CHECK_THAT(error_of("{\"schema\":\"vlatune.metrics/3\"}\n").what(),
             Catch::StartsWith("metrics.jsonl:1: $.schema: expected \"vlatune.metrics/2\" (or \"vlatune.metrics/1\")"));
  CHECK_THAT(error_of("{\"schema\":\"vlatune.metrics/1\",\"x\":1}\n").what(),
             Catch::StartsWith("metrics.jsonl:1: $.x: unknown key"));
  CHECK_THAT(error_of(std::string(kHeader) + kHeader).what(),
             Catch::StartsWith("metrics.jsonl:2: $.schema: a header is only valid on line 1"));
}

TEST_CASE("Broken metrics lines report the line and byte", "[formats][metrics]") {
  CHECK_THAT(error_of(std::string(kHeader) + kRow + "\n{\"step\":1,\n").what(),
             Catch::StartsWith("metrics.jsonl:3: not valid JSON: at byte"));
  CHECK_THAT(error_of(std::string(kHeader) + "\n" + kRow + "\n").what(),
             Catch::StartsWith("metrics.jsonl:2: empty line"));
  CHECK_THAT(error_of(std::string(kHeader) + R"({"step":0,"step":1})" + "\n").what(),
             Catch::StartsWith("metrics.jsonl:2: $.step: duplicate key"));
}

TEST_CASE("Reading a missing metrics file names the file", "[formats][metrics]") {
  CHECK_THROWS_WITH(read_metrics("/nonexistent/metrics.jsonl"),
                    Catch::StartsWith("/nonexistent/metrics.jsonl: cannot read"));
}

TEST_CASE("The metrics writer refuses rows that would make the file unreadable", "[formats][metrics]") {
  TempDir dir("metrics");
  const std::string path = dir.file("metrics.jsonl");
  MetricsWriter w = MetricsWriter::create(path);
  w.append(row_at(4));
  CHECK_THROWS_WITH(w.append(row_at(4)), Catch::StartsWith(path + ":3: $.step: step 4 does not follow step 4"));
  MetricsRow bad = row_at(5);
  bad.step_ms = kNaN;
  CHECK_THROWS_WITH(w.append(bad), Catch::StartsWith(path + ":3: $.step_ms: "));
  w.append(row_at(5));
  CHECK(read_metrics(path) == std::vector<MetricsRow>{row_at(4), row_at(5)});
}

TEST_CASE("Resuming metrics drops a torn last line and the rows after the checkpoint", "[formats][metrics]") {
  TempDir dir("metrics");
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsWriter w = MetricsWriter::create(path);
    for (int64_t s = 0; s < 6; ++s) w.append(row_at(s));
  }
  std::ofstream(path, std::ios::app) << R"({"step":6,"loss":0.)";  // the process died mid-line
  CHECK_THROWS_WITH(read_metrics(path), Catch::StartsWith(path + ":8: not valid JSON"));
  {
    MetricsWriter w = MetricsWriter::resume(path, 3);  // checkpoint after step 3
    CHECK(w.last_step() == 3);
    for (int64_t s = 4; s < 8; ++s) w.append(row_at(s));
  }
  std::vector<MetricsRow> expected;
  for (int64_t s = 0; s < 8; ++s) expected.push_back(row_at(s));
  CHECK(read_metrics(path) == expected);
}

TEST_CASE("Resuming an intact metrics file appends after its last row", "[formats][metrics]") {
  TempDir dir("metrics");
  const std::string path = dir.file("metrics.jsonl");
  { MetricsWriter::create(path).append(row_at(0)); }
  {
    MetricsWriter w = MetricsWriter::resume(path, 10);
    CHECK(w.last_step() == 0);
    w.append(row_at(1));
    CHECK_THROWS_WITH(w.append(row_at(1)), Catch::StartsWith(path + ":4: $.step: "));
  }
  CHECK(read_metrics(path) == std::vector<MetricsRow>{row_at(0), row_at(1)});
}

TEST_CASE("Resuming a missing or corrupt metrics file is an error naming it", "[formats][metrics]") {
  TempDir dir("metrics");
  CHECK_THROWS_WITH(MetricsWriter::resume(dir.file("none.jsonl"), 3), Catch::Contains("none.jsonl: cannot read"));
  const std::string path = dir.file("m.jsonl");
  std::ofstream(path) << kHeader << row_with("lr", "\"x\"") << "\n";
  CHECK_THROWS_WITH(MetricsWriter::resume(path, 3), Catch::StartsWith(path + ":2: $.lr: "));
}

namespace {

EvalRow eval_at(int64_t step) {
  EvalRow r;
  r.step = step;
  r.loss = 0.25 + 0.01 * static_cast<double>(step);
  r.action_mae = 0.013;
  r.action_rmse = 0.021;
  r.action_mae_per_dim = {0.01, 0.02, 0.005};
  r.action_rmse_per_dim = {0.015, 0.03, 0.006};
  r.samples = 64;
  r.batches = 8;
  r.sample_steps = 10;
  r.eval_ms = 812.5;
  return r;
}

const char* kEval =
    R"({"kind":"eval","step":0,"loss":0.2,"action_mae":0.1,"action_rmse":0.2,"action_mae_per_dim":[0.1,0.1],"action_rmse_per_dim":[0.2,0.2],"samples":8,"batches":2,"sample_steps":10,"eval_ms":5.0})";

std::string eval_with(const std::string& key, const std::string& value) {
  auto j = nlohmann::json::parse(kEval);
  j[key] = nlohmann::json::parse(value);
  return j.dump();
}

}  // namespace

namespace vlatune::formats {
std::ostream& operator<<(std::ostream& os, const EvalRow& r) {
  return os << eval_row_to_json(r).dump();
}
}  // namespace vlatune::formats

TEST_CASE("Evaluation rows interleave with training rows and read back by kind", "[formats][metrics]") {
  TempDir dir("metrics");
  const std::string path = dir.file("metrics.jsonl");
  std::vector<EvalRow> evals = {eval_at(1), eval_at(3)};
  evals[1].loss = kNaN;  // a diverged model: written as null
  evals[1].action_mae_per_dim[2] = std::numeric_limits<double>::infinity();
  {
    MetricsWriter w = MetricsWriter::create(path);
    for (int64_t s = 0; s < 4; ++s) {
      w.append(row_at(s));
      if (s == 1 || s == 3) w.append(evals[s == 1 ? 0 : 1]);
    }
    CHECK(w.last_eval_step() == 3);
  }
  const MetricsLog log = read_metrics_log(path);
  CHECK(log.train.size() == 4);
  evals[1].action_mae_per_dim[2] = kNaN;
  CHECK(log.eval == evals);
  CHECK(read_metrics(path) == log.train);  // the training rows alone
  // write_metrics_log puts each evaluation after its step's training row: the same bytes as the writer's.
  const std::string again = dir.file("again.jsonl");
  write_metrics_log(log, again);
  CHECK(read_text_file(again) == read_text_file(path));
  CHECK(read_text_file(path).find(R"("loss":null)") != std::string::npos);
}

TEST_CASE("Bad evaluation rows are reported as file:LINE: $.field", "[formats][metrics]") {
  struct Case {
    std::string line;
    const char* path;
    const char* reason;
  };
  const Case cases[] = {
      {eval_with("kind", "\"train\""), "$.kind", "expected \"eval\" (training rows carry no \"kind\")"},
      {eval_with("action_rmse_per_dim", "[0.1]"), "$.action_rmse_per_dim", "expected 2 entries"},
      {eval_with("action_mae_per_dim", "[]"), "$.action_mae_per_dim", "at least one entry"},
      {eval_with("action_mae_per_dim", "[0.1, -1]"), "$.action_mae_per_dim[1]", ">= 0 or null"},
      {eval_with("samples", "0"), "$.samples", "expected an integer >= 1"},
      {eval_with("sample_steps", "2.5"), "$.sample_steps", "expected an integer >= 1"},
      {eval_with("eval_ms", "null"), "$.eval_ms", "got null"},
      {eval_with("grad_norm", "1"), "$.grad_norm", "unknown key"},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    const FormatError e = error_of(std::string(kHeader2) + kRow + "\n" + c.line + "\n");
    CHECK(e.file() == "metrics.jsonl:3");
    CHECK(e.json_path() == c.path);
    CHECK_THAT(e.reason(), Catch::Contains(c.reason));
  }
  // Evaluation steps increase among themselves, independently of the training rows.
  const FormatError order = error_of(std::string(kHeader2) + kEval + "\n" + kRow + "\n" + kEval + "\n");
  CHECK(order.file() == "metrics.jsonl:4");
  CHECK_THAT(order.reason(), Catch::Contains("evaluation step 0 does not follow evaluation step 0"));
  // A version-1 file has no evaluation rows.
  const FormatError v1 = error_of(std::string(kHeader) + kRow + "\n" + kEval + "\n");
  CHECK(v1.json_path() == "$.kind");
  CHECK_THAT(v1.reason(), Catch::Contains("evaluation rows need the header \"vlatune.metrics/2\""));
}

TEST_CASE("The metrics writer refuses evaluation rows out of order or unreadable", "[formats][metrics]") {
  TempDir dir("metrics");
  const std::string path = dir.file("metrics.jsonl");
  MetricsWriter w = MetricsWriter::create(path);
  w.append(row_at(0));
  w.append(eval_at(0));
  CHECK_THROWS_WITH(w.append(eval_at(0)), Catch::StartsWith(path + ":4: $.step: evaluation step 0 does not follow"));
  EvalRow bad = eval_at(1);
  bad.action_rmse_per_dim.pop_back();
  CHECK_THROWS_WITH(w.append(bad), Catch::StartsWith(path + ":4: $.action_rmse_per_dim: "));
  bad = eval_at(1);
  bad.eval_ms = kNaN;
  CHECK_THROWS_WITH(w.append(bad), Catch::StartsWith(path + ":4: $.eval_ms: "));
  w.append(row_at(1));
  CHECK(read_metrics_log(path).eval == std::vector<EvalRow>{eval_at(0)});
}

TEST_CASE("Resuming drops evaluation rows after the checkpoint and upgrades a version-1 header", "[formats][metrics]") {
  TempDir dir("metrics");
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsWriter w = MetricsWriter::create(path);
    for (int64_t s = 0; s < 6; ++s) {
      w.append(row_at(s));
      if (s % 2 == 1) w.append(eval_at(s));
    }
  }
  {
    MetricsWriter w = MetricsWriter::resume(path, 3);
    CHECK(w.last_step() == 3);
    CHECK(w.last_eval_step() == 3);
    w.append(row_at(4));
    w.append(eval_at(4));
  }
  const MetricsLog log = read_metrics_log(path);
  CHECK(log.train.size() == 5);
  CHECK(log.eval == std::vector<EvalRow>{eval_at(1), eval_at(3), eval_at(4)});

  const std::string old = dir.file("v1.jsonl");
  std::ofstream(old) << kHeader << kRow << "\n";
  {
    MetricsWriter w = MetricsWriter::resume(old, 10);
    w.append(eval_at(0));
  }
  CHECK(read_text_file(old).rfind(kHeader2, 0) == 0);
  CHECK(read_metrics_log(old).eval.size() == 1);
}
